"""Which embedding variables of a graph become tables, and how they are used.

The planner only reads the graph (through GraphView). For every rank-2
variable it classifies each use: a gather (the embedding read the rules
replace), an optimizer update (translated by the optimizer rule), graph
plumbing (initializer, is-initialized checks, dead snapshot reads), or
anything else. A variable with any other use, an update the rules cannot
translate, or fewer than `min_rows` rows stays as it is, with the reason.
"""
import bisect
import dataclasses
import fnmatch
import re
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from graphmod.features import TablePolicy, check_policy
from graphmod.graph_view import GraphView

tf1 = tf.compat.v1

_SPARSE_APPLY = re.compile(r"^(Resource)?SparseApply\w+$")
_APPLY = re.compile(r"^(Resource)?(Sparse)?Apply\w+$")
_UPDATE_SCOPE = re.compile(r"(^|/)update_")  # an optimizer's update_<variable> scope
# Fused reads: embedding_lookup_sparse on one variable (TF's fast path, taken
# for reference variables) sums/averages rows straight from the variable.
SEGMENT_READS = {"SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                 "SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments",
                 "SparseSegmentSqrtNWithNumSegments"}
_WRITES = {"ResourceScatterAdd", "ResourceScatterSub", "ScatterAdd", "ScatterSub",
           "AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp", "AssignSub",
           "AssignAdd", "Assign", "ResourceScatterUpdate", "ScatterUpdate"}


@dataclasses.dataclass
class TableSettings:
    """Per-table settings of the hook; None inherits from the variable / defaults.

    initializer, default_value, max_rows, when_full, num_shards and
    admission_sketch_width are those of graphmod.create_table; access_threshold, eviction_threshold and
    eviction_unit those of graphmod.FeatureSpec; convert=False keeps the
    variable dense.
    """
    initializer: Any = None
    default_value: Optional[float] = None
    max_rows: Optional[int] = None
    when_full: str = "lru"
    num_shards: int = 16
    access_threshold: int = -1
    eviction_threshold: int = -1
    eviction_unit: str = "seconds"
    admission_sketch_width: Optional[int] = None
    convert: bool = True

    def __post_init__(self):
        check_policy("TableSettings", self.access_threshold, self.eviction_threshold,
                     self.eviction_unit)
        if self.when_full not in ("lru", "lfu", "refuse"):
            raise ValueError(f"TableSettings: when_full must be 'lru', 'lfu' or 'refuse', "
                             f"got {self.when_full!r}")
        if self.max_rows is not None and (isinstance(self.max_rows, bool) or
                                          not isinstance(self.max_rows, int) or
                                          self.max_rows <= 0):
            raise ValueError(f"TableSettings: max_rows must be a positive integer or None, "
                             f"got {self.max_rows!r}")

    @property
    def policy(self) -> TablePolicy:
        return TablePolicy(self.access_threshold, self.eviction_threshold, self.eviction_unit)


@dataclasses.dataclass
class Gather:
    """A read of rows by id: a gather, or a fused sparse-segment read
    (op.type in SEGMENT_READS: rows of ids combined by segment)."""
    op: tf.Operation
    ids: tf.Tensor
    grads: List[tf.Tensor]  # gradient w.r.t. the op's output, one per tf.gradients call


@dataclasses.dataclass
class Update:
    """The optimizer's update of one variable."""
    scope: str                 # e.g. "Adagrad/update_emb"
    update_op: tf.Operation    # what the optimizer's finishing ops wait for
    ops: List[tf.Operation]    # every op in the scope
    writes: List[tf.Operation]  # ops writing the variable or its slots
    slots: List[tf.Variable]


@dataclasses.dataclass
class Conversion:
    variable: tf.Variable
    table_name: str
    settings: TableSettings
    gathers: List[Gather]
    update: Optional[Update]
    table: Any = None            # set by the gather rule
    lookups: List[Tuple[tf.Tensor, tf.Tensor]] = dataclasses.field(default_factory=list)
    # (row handles, gradient of the rows: handles' shape + [dim]) per lookup
    summaries: List[tf.Operation] = dataclasses.field(default_factory=list)
    # summaries that read the variable densely (they leave the graph's collections)
    outputs: List[tf.Tensor] = dataclasses.field(default_factory=list)  # lookup rows
    apply: Optional[tf.Operation] = None  # set by the optimizer rule

    @property
    def rows(self) -> int:
        return int(self.variable.shape[0])

    @property
    def dim(self) -> int:
        return int(self.variable.shape[1])

    training: bool = False  # the graph trains this variable (lookups insert new ids)


def table_name_for(variable: tf.Variable) -> str:
    return variable.op.name


def _variable_tensor(v: tf.Variable) -> tf.Tensor:
    return v.op.outputs[0]


def _uses(view: GraphView, v: tf.Variable) -> Dict[str, List[tf.Operation]]:
    """gathers / updates / plumbing / other uses of v."""
    out = {"gathers": [], "updates": [], "plumbing": [], "other": []}
    handle = _variable_tensor(v)
    init = v.initializer

    def is_write(op):
        return (_SPARSE_APPLY.match(op.type) or op.type in _WRITES) and op.inputs[0] is handle

    def dead(op):
        return not any(view.consumers(t) for t in op.outputs)

    def reads_rows(op, value):  # a gather or fused segment read of value's rows
        return op.inputs[0] is value and (op.type == "GatherV2" or op.type in SEGMENT_READS)

    for op in view.consumers(handle):
        if op is init or op.type in ("VarIsInitializedOp", "IsVariableInitialized"):
            out["plumbing"].append(op)
        elif op.type == "ResourceGather" and op.inputs[0] is handle:
            out["gathers"].append(op)
        elif is_write(op):
            out["updates"].append(op)
        elif op.type == "ReadVariableOp" and dead(op):
            out["plumbing"].append(op)  # snapshot reads nothing consumes
        elif op.type == "ReadVariableOp" or (  # a resource or a reference variable's value
                op.type == "Identity" and op.name == v.op.name + "/read"):
            for c in view.consumers(op.outputs[0]):
                out["gathers" if reads_rows(c, op.outputs[0]) else "other"].append(c)
        else:
            out["other"].append(op)
    return out


def _gradients_of(view: GraphView, gather: tf.Operation) -> List[tf.Tensor]:
    """Gradients w.r.t. the gather's output (shape ids.shape + [dim]).

    The gather's gradient function (ResourceGather and GatherV2 alike) builds,
    under '<gradients scope>/<gather name>_grad/', Reshape_1(ids -> [N]) and
    Reshape(gradient of the output -> [N, dim]), whose shape it reads from the
    variable; the gradient of the output is that Reshape's first input. (Its
    Size(ids) is a constant when the batch shape is static, so match Reshape_1.)
    """
    if gather.type in SEGMENT_READS:
        return _segment_gradients_of(view, gather)
    pattern = re.compile(r"(^|/)gradients(_\d+)?/" + re.escape(gather.name)
                         + r"_grad/Reshape_1$")
    out = []
    for op in view.consumers(gather.inputs[1]):
        if op.type == "Reshape" and pattern.search(op.name):
            scope = op.name[:-len("Reshape_1")]
            out.append(view.graph.get_operation_by_name(scope + "Reshape").inputs[0])
    return out


def _segment_gradients_of(view: GraphView, read: tf.Operation) -> List[tf.Tensor]:
    """Gradients w.r.t. a fused segment read's output: the first input of the
    SparseSegment*Grad(V2) op its gradient function builds under
    '<gradients scope>/<read name>_grad/' from the same ids."""
    pattern = re.compile(r"(^|/)gradients(_\d+)?/" + re.escape(read.name) + r"_grad/")
    return [op.inputs[0] for op in view.consumers(read.inputs[1])
            if op.type.startswith("SparseSegment") and "Grad" in op.type
            and pattern.search(op.name)]


class _Scopes:
    """Ops under a name scope, by binary search over the sorted op names."""

    def __init__(self, graph: tf.Graph):
        self.ops = sorted(graph.get_operations(), key=lambda op: op.name)
        self.names = [op.name for op in self.ops]

    def under(self, scope: str) -> List[tf.Operation]:
        # "/" sorts just before "0", so "scope/" ... "scope0" spans the scope.
        lo = bisect.bisect_left(self.names, scope + "/")
        hi = bisect.bisect_left(self.names, scope + "0")
        return self.ops[lo:hi]


def _update_of(view: GraphView, scopes: _Scopes, v: tf.Variable, writes: List[tf.Operation],
               variables_by_op: Dict[tf.Operation, tf.Variable]) -> Update:
    scope = writes[0].name.rsplit("/", 1)[0]
    ops = scopes.under(scope)
    update_op = None
    for op in ops:
        if any(not c.name.startswith(scope + "/") for c in view.control_consumers(op)):
            update_op = op
    in_scope_writes = [op for op in ops if _SPARSE_APPLY.match(op.type) or op.type in _WRITES]
    slots = []
    for op in in_scope_writes:
        for t in op.inputs:
            s = variables_by_op.get(t.op)
            if s is not None and s is not v and s not in slots:
                slots.append(s)
    return Update(scope, update_op, ops, in_scope_writes, slots)


def _summary_sinks(view: GraphView, ops: List[tf.Operation]) -> Optional[List[tf.Operation]]:
    """The summary ops every forward path from ops ends in (canned linear
    models summarise the fraction of zero weights, reading them densely), or
    None when some path ends elsewhere."""
    seen, stack, sinks = set(), list(ops), []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        consumers = [c for t in op.outputs for c in view.consumers(t)]
        if not consumers:
            if not op.type.endswith("Summary"):
                return None
            sinks.append(op)
        stack.extend(consumers)
    return sinks


def plan(graph: tf.Graph, min_rows: int, tables: Dict[str, TableSettings], training: bool
         ) -> Tuple[List[Conversion], List[Tuple[str, str]]]:
    """Returns the conversions to make and the (variable, reason) pairs skipped.

    training says whether the graph is run to train (an Estimator's TRAIN
    mode); only then do lookups insert ids and optimizer updates translate.

    tables maps fnmatch patterns of variable names to settings; a variable
    matching a pattern is converted whatever its size (unless convert=False).
    """
    view = GraphView(graph)
    scopes = _Scopes(graph)
    variables = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
    by_op = {v.op: v for v in variables}
    conversions, skipped = [], []
    for v in variables:
        if v.shape.ndims != 2 or not v.dtype.base_dtype == tf.float32:
            continue
        name = v.op.name
        settings = next((s for p, s in tables.items() if fnmatch.fnmatchcase(name, p)), None)
        uses = _uses(view, v)
        if not uses["gathers"]:
            if settings is not None and settings.convert:
                skipped.append((name, "matches a table pattern but is never read by a gather"))
            elif settings is None and int(v.shape[0] or 0) >= min_rows:
                # As big as an embedding: say why it is not one. Optimizer
                # slots stay silent: only optimizer updates (ops in an
                # optimizer's update_<variable> scope) use them.
                kinds = sorted({op.type for op in uses["other"]
                                if not _APPLY.match(op.type) and op.type not in _WRITES
                                and not _UPDATE_SCOPE.search(op.name)})
                if kinds:
                    skipped.append((name, "never read by a gather, only by " + ", ".join(kinds)))
            continue
        if settings is None:
            if int(v.shape[0]) < min_rows:
                continue  # small gathered variables stay dense, silently (as configured)
            settings = TableSettings()
        if not settings.convert:
            skipped.append((name, "excluded by its table pattern (convert=False)"))
            continue
        summaries = _summary_sinks(view, uses["other"]) if uses["other"] else []
        if summaries is None:
            kinds = sorted({op.type for op in uses["other"]})
            skipped.append((name, "read other than by gathers (" + ", ".join(kinds)
                            + f", e.g. {uses['other'][0].name})"))
            continue
        if len(v.shape) != 2 or v.shape[0] is None:
            skipped.append((name, "has no static [rows, dim] shape"))
            continue
        gathers = [Gather(op, op.inputs[1], _gradients_of(view, op)) for op in uses["gathers"]]
        update = _update_of(view, scopes, v, uses["updates"], by_op) if uses["updates"] else None
        if update is not None and update.update_op is None and training:
            skipped.append((name, f"its update in '{update.scope}' is not a step of an optimizer"))
            continue
        if update is not None and training and not all(g.grads for g in gathers):
            skipped.append((name, "updated by an optimizer, but a gather has no gradient"))
            continue
        conversions.append(Conversion(v, table_name_for(v), settings, gathers, update,
                                      training=training and update is not None,
                                      summaries=summaries))
    return conversions, skipped
