"""Which embedding variables of a graph become tables, and how they are used.

The planner only reads the graph (through the rewrite's GraphIndex). For every rank-2
float32 variable it classifies each use: a row read (gather or fused
sparse-segment read, which the rules replace), an optimizer update (whose
consumed gradient the table's apply will take), a read of its static shape,
graph plumbing (initializer, is-initialized checks, dead snapshot reads), or
a dense read of the whole value. It then decides, with the reason whenever a
variable stays dense:

- size: at least `min_rows` rows, or its ids squeezed by a hash bucket or a
  modulo (collisions the table removes), or a `tables` pattern;
- faithfulness: the variable's initializer has a table equivalent (same
  distribution, seed from the graph and op seeds), the update's gradient (the
  IndexedSlices the optimizer consumes, after whatever the model did to it)
  can be found and all its rows come from the variable's lookups
  (graphmod.rewrite.gradients), the variable is trained by at most one
  update, and it is not frozen (a table would start from random rows);
  a warm start from checkpoint rows is kept (rewrite_rules.warm_start);
- dense reads: summaries only are dropped; a graph that does not train the
  variable may read it whole when a training plan converted it (the table's
  rows for ids 0..rows-1 then stand in, see rewrite_rules.dense_reads).

A replayed plan (graphmod.rewrite.plan_file, written by training) fixes which
variables convert and their table settings in every later graph; a planned
variable that cannot convert there is an error, not a silent dense fallback.
"""
import dataclasses
import re
import zlib
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from graphmod.settings import RewriteSettings, TableSettings  # noqa: F401 (read here)
from graphmod.embeddings.initializers import (TableInitializer, Unreadable, default_initializer,
                                   from_variable, to_table_initializer)
from graphmod.rewrite import collectives, gradients
from graphmod.rewrite.ids import squeezed_ids
from graphmod.rewrite.index import GraphIndex, strip_identity, walk

tf1 = tf.compat.v1

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
_SHAPE_READS = {"Shape", "VariableShape", "Size", "Rank"}


class PlanMismatch(ValueError):
    """A graph that cannot follow the model's conversion plan."""


@dataclasses.dataclass
class Gather:
    """A read of rows by id: a gather, or a fused sparse-segment read
    (op.type in SEGMENT_READS: rows of ids combined by segment)."""
    op: tf.Operation
    ids: tf.Tensor


@dataclasses.dataclass(frozen=True)
class Update:
    """The optimizer's update of one variable and the gradient it consumes."""
    scope: str                 # e.g. "Adagrad/update_emb"
    update_op: tf.Operation    # what the optimizer's finishing ops wait for
    ops: List[tf.Operation]    # every op in the scope
    writes: List[tf.Operation]  # ops writing the variable or its slots
    slots: List[tf.Variable]
    # The gradient the update consumes, as (values, indices) IndexedSlices
    # parts: gradient rows and the variable rows they update.
    gradients: List[Tuple[tf.Tensor, tf.Tensor]] = dataclasses.field(default_factory=list)
    # Scalars g of the L2 penalties' gradient terms (x * g over the whole
    # variable) in a dense gradient; the rule adds rows * g for the rows read.
    penalty_grads: List[tf.Tensor] = dataclasses.field(default_factory=list)
    # Set when Horovod's DistributedOptimizer combined the gradient across
    # ranks before the update consumed it (graphmod.rewrite.collectives).
    combined: Optional["Combined"] = None

    @property
    def local_gradients(self) -> List[Tuple[tf.Tensor, tf.Tensor]]:
        """This rank's own gradient parts (the consumed ones without Horovod)."""
        return self.combined.parts if self.combined is not None else self.gradients


@dataclasses.dataclass
class Combined:
    """A gradient Horovod combined across ranks: this rank's parts, the
    collective, and the scalars the model applied after it (clipping,
    multipliers), as (scalar, divides) in order."""
    collective: collectives.Collective
    parts: List[Tuple[tf.Tensor, tf.Tensor]]
    scales: List[Tuple[tf.Tensor, bool]]


@dataclasses.dataclass(frozen=True)
class Conversion:
    """The planner's facts about one variable to convert; rules read them and
    keep what they build in their own results (graphmod.rewrite.rule)."""
    variable: tf.Variable
    table_name: str
    settings: TableSettings
    gathers: List[Gather]
    update: Optional[Update]
    initializer: TableInitializer
    seed: Optional[int]          # None: the table's own (derived from its name)
    training: bool = False       # the graph trains this variable (lookups insert new ids)
    # summaries that read the variable densely (they leave the graph's collections)
    summaries: List[tf.Operation] = dataclasses.field(default_factory=list)
    # whole-value reads in a graph that does not train the variable
    dense_reads: List[tf.Tensor] = dataclasses.field(default_factory=list)
    # reads of its static shape
    shape_reads: List[tf.Tensor] = dataclasses.field(default_factory=list)
    warm_start: Optional[tf.Tensor] = None  # checkpoint rows the variable starts from
    # L2Loss ops over the whole variable (become the penalty of the rows read)
    penalties: List[tf.Operation] = dataclasses.field(default_factory=list)
    # A replayed plan's squeezing ops that training unsqueezed, and their op types
    planned_keys: Optional[List[str]] = None
    planned_key_types: Optional[List[str]] = None
    # Where training placed its table across Horovod ranks ("" unplanned)
    planned_placement: str = ""

    @property
    def name(self) -> str:
        return self.variable.op.name

    @property
    def rows(self) -> int:
        return int(self.variable.shape[0])

    @property
    def dim(self) -> int:
        return int(self.variable.shape[1])


def checkpoint_name(v: tf.Variable) -> str:
    """A variable's name in checkpoints (a partitioned variable's parts are
    saved as slices of the whole)."""
    info = getattr(v, "_save_slice_info", None)
    return info.full_name if info is not None else v.op.name


def trains_anything(graph) -> bool:
    """Whether any optimizer step in graph (a tf.Graph or its GraphIndex)
    updates a variable."""
    index = graph if isinstance(graph, GraphIndex) else GraphIndex(graph)
    types = index.types()
    return any(_APPLY.match(t) for t in types) or any(
        _UPDATE_SCOPE.search(op.name) for op in index.of_type(*_WRITES.intersection(types)))


def table_name_for(variable: tf.Variable) -> str:
    return variable.op.name


def _variable_tensor(v: tf.Variable) -> tf.Tensor:
    return v.op.outputs[0]


def _uses(view: GraphIndex, v: tf.Variable) -> Dict[str, list]:
    """gathers / updates / shapes / plumbing / other (ops) and values (the
    tensors holding the whole value that `other` ops read) of v."""
    out = {"gathers": [], "updates": [], "shapes": [], "plumbing": [], "other": [],
           "values": [], "penalties": [], "penalty_grads": [], "broadcasts": []}
    handle = _variable_tensor(v)
    init = _initializer_op(v)
    # The variable's original initializer, left behind when another replaced
    # it (init_from_checkpoint): never run.
    original = v.op.name + "/Assign"

    def is_write(op):
        return (_APPLY.match(op.type) or op.type in _WRITES) and op.inputs[0] is handle

    def dead(op):
        return not any(view.consumers(t) for t in op.outputs)

    def reads_rows(op, value):  # a gather or fused segment read of value's rows
        return op.inputs[0] is value and (op.type == "GatherV2" or op.type in SEGMENT_READS)

    for op in view.consumers(handle):
        if op is init or op.type in ("VarIsInitializedOp", "IsVariableInitialized"):
            out["plumbing"].append(op)
        elif _broadcast(op):
            out["broadcasts"].append(op)
        elif op.type == "ResourceGather" and op.inputs[0] is handle:
            out["gathers"].append(op)
        elif op.name == original and op is not init and dead(op) and \
                not view.control_consumers(op):
            out["plumbing"].append(op)
        elif is_write(op):
            out["updates"].append(op)
        elif op.type in _SHAPE_READS:
            out["shapes"].append(op.outputs[0])
        elif op.type == "ReadVariableOp" and dead(op):
            out["plumbing"].append(op)  # snapshot reads nothing consumes
        elif op.type == "ReadVariableOp" or (  # a resource or a reference variable's value
                op.type == "Identity" and op.name == v.op.name + "/read"):
            value = op.outputs[0]
            for c in view.consumers(value):
                if reads_rows(c, value):
                    out["gathers"].append(c)
                elif c.type == "HorovodBroadcast":
                    out["broadcasts"].append(c)
                elif c.type in _SHAPE_READS:
                    out["shapes"].append(c.outputs[0])
                elif c.type == "L2Loss":
                    out["penalties"].append(c)
                else:
                    out["other"].append(c)
                    if not any(x is value for x in out["values"]):
                        out["values"].append(value)
        else:
            out["other"].append(op)
    # The penalties' own gradients (x * g, built by tf.gradients) read the value too.
    grads_of = [re.compile(r"(^|/)gradients(_\d+)?/" + re.escape(p.name) + r"_grad/")
                for p in out["penalties"]]
    for op in out["other"]:
        if op.type == "Mul" and any(g.search(op.name) for g in grads_of):
            out["penalty_grads"].append(op)
    out["other"] = [op for op in out["other"] if op not in out["penalty_grads"]]
    return out


def _broadcast(op: tf.Operation) -> bool:
    """Horovod's broadcast of the variable from rank 0 (BroadcastGlobalVariablesHook,
    broadcast_global_variables): it reads the variable and assigns it; the
    rule horovod_broadcast takes converted variables out of it."""
    return op.type == "HorovodBroadcast" or (
        op.type in ("AssignVariableOp", "Assign") and len(op.inputs) == 2 and
        op.inputs[1].op.type == "HorovodBroadcast")


def _is_slot(uses: Dict[str, list]) -> bool:
    """Only optimizer updates use it (ops in an update_<variable> scope)."""
    ops = uses["other"] + uses["updates"]
    return bool(ops) and all(_UPDATE_SCOPE.search(op.name) or _APPLY.match(op.type)
                             for op in ops)


def _update_of(view: GraphIndex, v: tf.Variable, writes: List[tf.Operation],
               variables_by_op: Dict[tf.Operation, tf.Variable]) -> Tuple[Optional[Update], str]:
    """The update of v and its consumed gradient, and why that gradient cannot
    be taken ("" when it can); (None, why) when the update is no optimizer step."""
    scope_names = sorted({op.name.rsplit("/", 1)[0] for op in writes})
    if len(scope_names) > 1:
        return None, ("updated by several optimizer steps (" + ", ".join(scope_names)
                      + "): their order is undefined, a table applies one update a step")
    scope = scope_names[0]
    ops = view.under(scope)
    update_op = None
    for op in ops:
        if any(not c.name.startswith(scope + "/") for c in view.control_consumers(op)):
            update_op = op
    if update_op is None:
        return None, f"its update in '{scope}' is not a step of an optimizer"
    in_scope_writes = [op for op in ops if _APPLY.match(op.type) or op.type in _WRITES]
    slots = []
    for op in in_scope_writes:
        for t in op.inputs:
            s = variables_by_op.get(t.op)
            if s is not None and s is not v and s not in slots:
                slots.append(s)
    values, indices, why = gradients.consumed_gradient(ops, int(v.shape[1]))
    parts, penalty_grads, combined = ([(values, indices)] if values is not None else []), [], None
    if values is not None:
        combined, why = _combined_sparse(values, indices)
    elif why.startswith(gradients.DENSE):
        combined, parts, penalty_grads, why = _combined_dense(gradients.dense_gradient(ops), v)
    return Update(scope, update_op, ops, in_scope_writes, slots, parts, penalty_grads,
                  combined), why


def _combined_sparse(values: tf.Tensor, indices: tf.Tensor) -> Tuple[Optional[Combined], str]:
    """How Horovod combined an IndexedSlices gradient (None when it did not)."""
    index_end, index_scales, _ = collectives.scale_chain(indices, collectives.is_combined)
    if not collectives.is_combined(index_end) or index_scales:
        return None, ""
    end, scales, why = collectives.scale_chain(values, collectives.is_combined)
    if why or end.op is not index_end.op:
        return None, ("its gradient is changed after Horovod combined it across ranks ("
                      + (why or "values and indices from different conds") + "): only "
                      "scaling by scalars can be applied at each key's owner")
    local_values, collective, why = collectives.through_collective(end)
    if why:
        return None, f"its gradient's Horovod collective is not understood: {why}"
    local_indices, _, why = collectives.through_collective(index_end)
    if why:
        return None, f"its gradient's Horovod collective is not understood: {why}"
    return Combined(collective, [(local_values, local_indices)], scales), ""


def _combined_dense(dense: tf.Tensor, v: tf.Variable):
    """(how Horovod combined a dense gradient (sparse_as_dense=True, or an
    L2 penalty over the variable) or None, its row parts and penalty
    scalars (graphmod.rewrite.gradients.split_dense_gradient), why not)."""
    end, scales, _ = collectives.scale_chain(dense, collectives.is_combined)
    if not collectives.is_combined(end):
        return (None,) + gradients.split_dense_gradient(dense, v)
    local, collective, why = collectives.through_collective(end)
    if why:
        return None, [], [], f"its gradient's Horovod collective is not understood: {why}"
    parts, penalties, why = gradients.split_dense_gradient(local, v)
    if penalties and not why:
        if collective.runs or scales:
            why = ("its whole-variable L2 penalty's gradient is combined by Horovod: not built "
                   "for tables sharded across ranks yet")
        else:  # one rank: the cond passes the gradient on as it is
            return None, parts, penalties, ""
    return Combined(collective, parts, scales), parts, [], why


def _summary_sinks(view: GraphIndex, ops: List[tf.Operation]) -> Optional[List[tf.Operation]]:
    """The summary ops every forward path from ops ends in (canned linear
    models summarise the fraction of zero weights, reading them densely), or
    None when some path ends elsewhere, or in a merge the model built (a
    Scaffold or SummarySaverHook may run it, whatever the collections say)."""
    for op in walk(ops, view.op_consumers):
        if op.type == "MergeSummary":
            return None
    sinks = view.sinks(ops)
    return sinks if all(op.type.endswith("Summary") for op in sinks) else None


def _seed_of(v: tf.Variable) -> Optional[int]:
    """A table seed from the seeds of the variable's random initializer op, so
    that the graph seed (RunConfig(tf_random_seed=...)) changes the initial
    rows as it changes the variable's; None when the op is unseeded."""
    for op in walk([v.initial_value.op], lambda op: [t.op for t in op.inputs]):
        if "seed2" in op.node_def.attr:
            seeds = (op.get_attr("seed"), op.get_attr("seed2"))
            return zlib.crc32(f"{seeds[0]}/{seeds[1]}".encode()) if any(seeds) else None
        if op.type.startswith("Stateless"):
            from graphmod import folding
            value = folding.fold(op.inputs[1])
            return None if value is None else zlib.crc32(
                "/".join(str(int(x)) for x in value.reshape(-1)).encode())
    return None


def _initializer_op(v: tf.Variable) -> tf.Operation:
    """The op that initializes v (Estimator warm starts may leave a tensor there)."""
    return getattr(v.initializer, "op", v.initializer)


def _initializer_replaced(v: tf.Variable) -> bool:
    """v's initializer no longer assigns v.initial_value (a vocabulary-remapping
    warm start, or another library's): the rows it starts from are unknown."""
    init = _initializer_op(v)
    return not (init.type in ("AssignVariableOp", "Assign") and len(init.inputs) == 2 and
                strip_identity(init.inputs[1]) is strip_identity(v.initial_value))


def _warm_start_rows(v: tf.Variable) -> Optional[tf.Tensor]:
    """The checkpoint rows init_from_checkpoint (and so tf.estimator's
    WarmStartSettings) made the variable's initial value, or None."""
    t = strip_identity(v.initial_value)
    return t if t.op.type in ("RestoreV2", "Restore", "RestoreSlice") else None


def plan(view: GraphIndex, settings: RewriteSettings, training: bool,
         replay: Optional[Dict[str, Any]] = None
         ) -> Tuple[List[Conversion], List[Tuple[str, str]]]:
    """Returns the conversions to make and the (variable, reason) pairs skipped.

    training says whether the graph is run to train (an Estimator's TRAIN
    mode); only then do lookups insert ids and optimizer updates translate.
    replay ({variable: graphmod.rewrite.plan_file.Planned}) is the model's
    saved plan: its variables must convert, with its settings; without
    training, no other variable converts. Raises PlanMismatch naming the
    variable when one of them cannot.
    """
    graph = view.graph
    variables = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
    by_op = {v.op: v for v in variables}
    conversions, skipped = [], []
    squeezed = squeezed_ids(view) if settings.collision_free else set()
    for v in variables:
        if v.shape.ndims != 2 or not v.dtype.base_dtype == tf.float32:
            continue
        name = v.op.name
        planned = replay.get(name) if replay is not None else None
        if replay is not None and planned is None and not training:
            continue  # the plan decides what converts outside training
        # Training may change a planned table's settings (admission, eviction...);
        # other graphs read the tables as training last built them.
        own = settings.table_settings(name)
        table_settings = own if training or planned is None else None
        if table_settings is None and planned is not None:
            table_settings = planned.settings
            if own is not None:  # what unseen ids read is the serving graph's choice
                table_settings = dataclasses.replace(table_settings,
                                                     default_value=own.default_value)

        def refuse(reason, name=name, planned=planned):
            if planned is not None:
                raise PlanMismatch(f"graphmod: '{name}' was converted to table "
                                   f"'{planned.table}' when training, but cannot be in this "
                                   f"graph: {reason}")
            skipped.append((name, reason))

        uses = _uses(view, v)
        # Only a training graph runs an update: elsewhere (a model_fn may build
        # its optimizer in every mode) updates do not count as uses.
        trains = training and bool(uses["updates"])
        if not uses["gathers"]:
            if _is_slot(uses) and planned is None:
                continue  # an optimizer's slot: it follows its variable
            if planned is not None and not trains:
                pass  # unused or read whole where it does not train: the table stands in
            elif table_settings is not None and table_settings.convert:
                refuse("matches a table pattern but is never read by a gather")
                continue
            else:
                if table_settings is None and int(v.shape[0] or 0) >= settings.min_rows:
                    # As big as an embedding: say why it is not one.
                    kinds = sorted({op.type for op in uses["other"] + uses["penalties"]
                                    if not _APPLY.match(op.type) and op.type not in _WRITES
                                    and not _UPDATE_SCOPE.search(op.name)})
                    if kinds:
                        skipped.append((name, "never read by a gather, only by "
                                        + ", ".join(kinds)))
                continue
        if v.shape[0] is None:
            refuse("has no static [rows, dim] shape")
            continue
        hashed = any(g.inputs[1].ref() in squeezed for g in uses["gathers"])
        if table_settings is None:
            if int(v.shape[0]) < settings.min_rows and not hashed:
                continue  # small identity-indexed variables stay dense, silently (as configured)
            table_settings = TableSettings()
        if not table_settings.convert:
            if planned is not None:
                refuse("its table pattern now says convert=False, but the checkpoint "
                       "holds it as a table")
            skipped.append((name, "excluded by its table pattern (convert=False)"))
            continue
        summaries, dense_reads = [], []
        if uses["other"]:
            summaries = _summary_sinks(view, uses["other"])
            if summaries is None:
                summaries = []
                if planned is not None and not trains:
                    dense_reads = uses["values"]
                    if planned.unsqueezed:
                        refuse("it is read whole here, but its table is keyed by the "
                               "unsqueezed ids of " + ", ".join(planned.unsqueezed))
                        continue
                else:
                    kinds = sorted({op.type for op in uses["other"]})
                    refuse("read other than by gathers (" + ", ".join(kinds)
                           + f", e.g. {uses['other'][0].name})")
                    continue
        if _initializer_replaced(v):
            refuse("its initializer was replaced (e.g. a warm start that remaps a "
                   "vocabulary): graphmod cannot tell the rows it starts from")
            continue
        warm_start = _warm_start_rows(v) if training else None
        if warm_start is not None and hashed and settings.collision_free and not settings.exact:
            refuse("it is warm-started from checkpoint rows indexed by bucket, which a "
                   "collision-free table cannot hold (collision_free=False converts it)")
            continue
        if training and not uses["updates"]:
            if planned is None:
                skipped.append((name, "it is not trained (frozen, e.g. trainable=False): a "
                                "table would replace its values with random rows"))
                continue
        if planned is not None:
            initializer, seed = planned.initializer, planned.seed
            if [planned.rows, planned.dim] != [int(v.shape[0]), int(v.shape[1])]:
                refuse(f"its shape is {v.shape.as_list()} here, "
                       f"[{planned.rows}, {planned.dim}] in the plan")
                continue
        else:
            try:
                if table_settings.initializer is not None:
                    initializer = to_table_initializer(table_settings.initializer, name,
                                                       int(v.shape[1]), v.shape.as_list())
                elif warm_start is not None:  # every id has a row from the start
                    initializer = default_initializer(int(v.shape[1]))
                else:
                    initializer = from_variable(v)
            except Unreadable as e:
                refuse(str(e))
                continue
            seed = _seed_of(v)
        update, why = None, ""
        if uses["updates"]:  # also outside training: its slots leave the Saver
            update, why = _update_of(view, v, uses["updates"], by_op)
            if trains and not why:
                why = gradients.from_lookups(update.local_gradients, uses["gathers"])
            if not trains:
                why = ""  # the update never runs in this graph
        ends = {op.name for op in update.ops} if update is not None else set()
        stray = next((op for op in uses["penalty_grads"]
                      if not view.feeds_only(op, ends)), None)
        if stray is not None and not why:
            why = (f"the gradient of its L2 penalty ({stray.name}) is read by more than its "
                   "update (e.g. a gradient summary), which needs the whole variable")
        if why:
            refuse(why)
            continue
        conversions.append(Conversion(
            v, planned.table if planned is not None else table_name_for(v), table_settings,
            [Gather(op, op.inputs[1]) for op in uses["gathers"]], update, initializer, seed,
            training=trains, summaries=summaries, dense_reads=dense_reads,
            shape_reads=uses["shapes"], penalties=uses["penalties"], warm_start=warm_start,
            planned_keys=planned.unsqueezed if planned is not None else None,
            planned_key_types=planned.unsqueezed_types if planned is not None else None,
            planned_placement=planned.placement if planned is not None else ""))
    return conversions, skipped

