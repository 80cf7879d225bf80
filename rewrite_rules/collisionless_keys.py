"""Rule: ids squeezed into a fixed range feed the tables unsqueezed.

A variable of N rows forces ids into [0, N): hash-bucket columns hash strings
to Fingerprint64(s) % N (StringToHashBucketFast; Strong and the legacy op
alike) and models write `ids % N` (FloorMod), so distinct feature values share
rows. A table needs no range: this rule makes the squeezing op's consumers
read the unsqueezed key instead, the string's full fingerprint or the raw id,
both kept non-negative (63 bits; feature columns prune negative ids, and a
sign check must answer as it did for the squeezed id).

Matches a squeezing op found by walking back from a converted variable's
gather ids through ops that carry ids unchanged (reshapes, unique, sparse
plumbing, gathers of the ids, casts that keep 64 bits). Refuses (leaves the op
alone, so those ids keep sharing rows, reported) when any path from it reaches
something that reads id values: a dense variable indexed by them, a cast to
32 bits, a comparison with anything but a non-positive constant (a range
check against N would now fail), Max, one_hot and the like.

Keeps squeezed (reported) the sources of a variable the table_saver rule
adopts from a dense checkpoint: its trained rows are the buckets', and a
table keyed by bucket starts from them exactly, as the dense model would go
on (a table of full ids would have no row for a key it has not seen).

When a training plan is replayed (evaluation, prediction, export, resume),
the table gets exactly the keys training gave it: the plan's squeezing ops are
unsqueezed, and no other. Where this graph also reads the squeezed ids as
values (an evaluation metric over the bucket ids, a one_hot of them), only
the path to the table's lookups gets the full keys (its id carriers copied)
and every other reader keeps the bucket ids it always read; an error names
the table when even that path cannot carry 63-bit keys (a cast to 32 bits).
"""
import dataclasses
from typing import Dict, List, NamedTuple, Optional, Set

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod.rewrite.ids import carried, carrying_inputs, is_gather, is_squeezer
from graphmod.rewrite.index import GraphIndex, walk
from graphmod.rewrite.plan import SEGMENT_READS, Conversion, PlanMismatch
from graphmod.rewrite.rule import Context

NAME = "collisionless_keys"


@dataclasses.dataclass(frozen=True)
class Keys:
    """The squeezing ops whose consumers now read the full keys, per
    conversion (their names and op types, saved in the model's plan)."""
    names: List[str]
    types: List[str]

    def table_entry(self) -> dict:
        return dict(unsqueezed=self.names)

    def plan_entry(self) -> dict:
        return dict(unsqueezed=self.names, unsqueezed_types=self.types)


# For the report: the squeezing ops unsqueezed, and those kept ({op, reason})
Unsqueezed = NamedTuple("Unsqueezed", [("unsqueezed_keys", list), ("squeezed_keys_kept", list)])
# Consumers that only look at how many ids there are.
_POSITIONAL = {"Shape", "Size", "Rank"}
# Comparisons `ids OP c` whose answer is the same for every non-negative id
# (squeezed and unsqueezed ids both are) when c lies below the bound:
# OP -> (c must be <= bound, or < bound); operands swapped mirror the OP.
_CONSTANT_FOR_NON_NEGATIVE = {"GreaterEqual": 0, "Less": 0}
_CONSTANT_FOR_NEGATIVE_C = {"Greater", "LessEqual", "Equal", "NotEqual"}
_MIRROR = {"Less": "Greater", "Greater": "Less", "LessEqual": "GreaterEqual",
           "GreaterEqual": "LessEqual", "Equal": "Equal", "NotEqual": "NotEqual"}


def _sign_check(op: tf.Operation, t: tf.Tensor) -> bool:
    """A comparison of the ids with a constant that answers alike for all
    non-negative ids (e.g. feature columns' `ids >= 0` pruning)."""
    if op.type not in _MIRROR or len(op.inputs) != 2:
        return False
    kind, other = (op.type, op.inputs[1]) if op.inputs[0] is t else (_MIRROR[op.type],
                                                                     op.inputs[0])
    value = tensor_util.constant_value(other)
    if value is None or value.size != 1:
        return False
    c = float(value.reshape(-1)[0])
    if kind in _CONSTANT_FOR_NON_NEGATIVE:
        return c <= 0
    return kind in _CONSTANT_FOR_NEGATIVE_C and c < 0


def _reads_rows(op: tf.Operation) -> bool:
    """A gather, or a sparse segment op reading a variable's value (its input
    1 then picks the variable's rows; over gathered rows it picks batch rows)."""
    if is_gather(op):
        return True
    if op.type not in SEGMENT_READS:
        return False
    data = op.inputs[0].op
    return data.type == "ReadVariableOp" or (
        data.type == "Identity" and data.inputs[0].op.type in ("VariableV2", "Variable"))


def sources(gather_ids: List[tf.Tensor]) -> List[tf.Operation]:
    """Squeezing ops upstream of the given gather ids."""
    # any cast: refusal() then says why a narrowing one stops it
    return [op for op in walk([t.op for t in gather_ids], lambda op: [] if is_squeezer(op)
                              else [t.op for t in carrying_inputs(op)]) if is_squeezer(op)]


def refusal(graph: GraphIndex, source: tf.Operation, converted_gathers: Set[str],
            replaced_ops: Set[str]) -> Optional[str]:
    """Why the source cannot be unsqueezed, or None when it can. replaced_ops
    are the converted variables' old optimizer updates, which will not run."""
    reasons = []

    def readers(t):  # the tensors carrying t's ids on; notes a reader of their values
        carriers = []
        for op in graph.consumers(t):
            index = [i for i, x in enumerate(op.inputs) if x is t]
            if _reads_rows(op) and 1 in index and 0 not in index:
                if op.name not in converted_gathers:
                    reasons.append(f"its ids also index '{op.inputs[0].op.name}', which "
                                   "stays dense")
                continue
            if op.type in SEGMENT_READS and 0 not in index:
                continue  # positions in the batch, segment ids or counts
            if op.type in _POSITIONAL or op.name in replaced_ops or _sign_check(op, t):
                continue
            outs = [carried(op, i) for i in index]
            if all(o is not None for o in outs):
                carriers.extend(x for o in outs for x in o)
            elif not graph.feeds_only(op, replaced_ops):
                what = (f"a cast to {op.outputs[0].dtype.name}" if op.type == "Cast"
                        else op.type)
                reasons.append(f"its ids also reach {what} '{op.name}', which reads their "
                               "values")
        return [] if reasons else carriers

    for _ in walk([source.outputs[0]], readers):
        if reasons:
            return reasons[0]
    return reasons[0] if reasons else None


def _full_keys(source: tf.Operation) -> tf.Tensor:
    """The ids the source squeezed, non-negative in the ids' own width (a
    sign check must answer as before)."""
    dtype = source.outputs[0].dtype
    if source.type == "FloorMod":
        raw = source.inputs[0]
    else:
        strings = source.inputs[0]
        raw = tf.cast(tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])),
                                            tf.int64), tf.shape(strings)), dtype)
    return tf.bitwise.bitwise_and(raw, tf.constant(dtype.max, dtype))


def _unsqueeze(rw, source: tf.Operation) -> None:
    """Makes the source's consumers read the unsqueezed keys."""
    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/keys/{source.name}"):
        rw.reroute(source.outputs[0], _full_keys(source))


def _unsqueeze_along(rw, source: tf.Operation, gathers: List[tf.Operation], table: str) -> None:
    """Feeds the full keys to the given gathers only, through copies of the id
    carriers between them and the source; other readers keep the source's ids.
    What reads a copied carrier's positions (Unique's idx, by which
    embedding_lookup_sparse combines the unique ids' rows) reads the copy's:
    they are the positions of the keys the gathers now read."""
    memo: Dict = {}

    def on_path(t: tf.Tensor) -> bool:  # t carries the source's ids
        if t.ref() not in memo:
            memo[t.ref()] = t.op is source or any(on_path(x) for x in carrying_inputs(t.op))
        return memo[t.ref()]

    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/keys/{source.name}"):
        full = {source.outputs[0].ref(): _full_keys(source)}

        def copy(t: tf.Tensor) -> tf.Tensor:
            if t.ref() not in full:
                op = t.op
                ids_out = set()
                for i, x in enumerate(op.inputs):
                    if not on_path(x):
                        continue
                    outs = carried(op, i)
                    if outs is None or GraphIndex.in_control_flow(op):
                        raise PlanMismatch(
                            f"graphmod: table '{table}' was trained on the unsqueezed ids of "
                            f"'{source.name}', but here they reach it through {op.type} "
                            f"'{op.name}', which cannot carry them"
                            + (" (inside v1 control flow)" if outs is not None else ""))
                    ids_out.update(o.ref() for o in outs)
                with tf.device(op.device):
                    clone = rw.graph.create_op(
                        op.type, [copy(x) if on_path(x) else x for x in op.inputs],
                        [o.dtype for o in op.outputs], name=op.name.rsplit("/", 1)[-1],
                        attrs=dict(op.node_def.attr))
                for old, new in zip(op.outputs, clone.outputs):
                    full[old.ref()] = new
                    if old.ref() not in ids_out:  # positions (Unique's idx)
                        rw.reroute(old, new)
            return full[t.ref()]

        for g in gathers:
            if on_path(g.inputs[1]):
                rw.reroute(g.inputs[1], copy(g.inputs[1]), consumers=[g])


def rewrite(rw, conversions: List[Conversion], context: Context) -> None:
    """Unsqueezes every source upstream of the converted gathers that can be
    (or, replaying a plan, exactly the plan's); builds each conversion's Keys."""
    if not context.collision_free and not any(c.planned_keys for c in conversions):
        return  # (exact=True implies collision_free=False: see the pipeline)
    converted = {g.op.name for c in conversions for g in c.gathers}
    replaced_ops = {op.name for c in conversions if c.update is not None for op in c.update.ops}
    decided: Dict[str, Optional[str]] = {}  # source -> refusal reason (None: unsqueezed)
    outcome = Unsqueezed([], [])
    for c in conversions:
        if c.planned_keys is None and context.held_densely(c):
            for source in sources([g.op.inputs[1] for g in c.gathers]):
                decided.setdefault(source.name, (
                    f"'{c.variable.op.name}' is adopted from the dense checkpoint in "
                    f"model_dir, whose trained rows are its buckets': its table is keyed by "
                    f"bucket, so it goes on as the dense model would"))
    for c in conversions:
        found = sources([g.op.inputs[1] for g in c.gathers])
        planned = c.planned_keys
        if planned is not None:
            found = _as_planned(c, found, planned)
        elif not context.collision_free:
            found = []
        keys = Keys([], [])
        for source in found:
            if source.name not in decided:
                decided[source.name] = refusal(rw.index, source, converted, replaced_ops)
                if decided[source.name] is None:
                    _unsqueeze(rw, source)
                elif planned is not None:  # the plan's keys, along the lookups' path only
                    _unsqueeze_along(rw, source, [g.op for d in conversions for g in d.gathers],
                                     c.table_name)
                    decided[source.name] = None
                if decided[source.name] is None:
                    outcome.unsqueezed_keys.append(source.name)
            reason = decided[source.name]
            if reason is None:
                keys.names.append(source.name)
                keys.types.append(source.type)
            elif dict(op=source.name, reason=reason) not in outcome.squeezed_keys_kept:
                outcome.squeezed_keys_kept.append(dict(op=source.name, reason=reason))
        context.build(keys, c)
        if keys.names:
            context.approximate(
                c, "keyed by the full ids of " + ", ".join(keys.names) + ": ids that shared a "
                "row (hash-bucket or modulo collisions) have rows of their own")
    context.build(outcome)


def _as_planned(c: Conversion, found: List[tf.Operation], planned: List[str]
                ) -> List[tf.Operation]:
    """The squeezing ops of this graph that the plan unsqueezed: by name, or,
    when names differ between modes (a name scope per mode), by the same
    number of ops of the same types reaching the variable."""
    by_name = [s for s in found if s.name in planned]
    if len(by_name) == len(planned):
        return by_name
    if sorted(s.type for s in found) == sorted(c.planned_key_types or []):
        return found
    raise PlanMismatch(f"graphmod: table '{c.table_name}' was trained on the unsqueezed ids of "
                       f"{', '.join(planned)}, which do not reach '{c.variable.op.name}' in this "
                       f"graph (found: {', '.join(s.name for s in found) or 'none'})")
