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

When a training plan is replayed (evaluation, prediction, export, resume),
the table gets exactly the keys training gave it: the plan's squeezing ops are
unsqueezed (an error if this graph cannot), and no other.
"""
from typing import Dict, List, Optional, Set

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod.rewrite.plan import (CARRIERS, SEGMENT_READS, Conversion, PlanMismatch, carries,
                                   is_gather, is_squeezer)
from graphmod.rewrite.rule import Context

NAME = "collisionless_keys"

# Consumers that only look at where ids are or how many there are.
_POSITIONAL = {"Shape", "Size", "Rank", "UnsortedSegmentSum",
               "SparseSegmentSumGrad", "SparseSegmentMeanGrad", "SparseSegmentSqrtNGrad",
               "SparseSegmentSumGradV2", "SparseSegmentMeanGradV2", "SparseSegmentSqrtNGradV2"}
# Comparisons: harmless against a constant <= 0 (a sign or validity check),
# since squeezed and unsqueezed ids are both non-negative.
_COMPARISONS = {"GreaterEqual", "Greater", "Less", "LessEqual", "NotEqual", "Equal"}


def _sign_check(op: tf.Operation, t: tf.Tensor) -> bool:
    if op.type not in _COMPARISONS:
        return False
    other = op.inputs[1] if op.inputs[0] is t else op.inputs[0]
    value = tensor_util.constant_value(other)
    return value is not None and value.size == 1 and float(value.reshape(-1)[0]) <= 0


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
    found, seen, stack = [], set(), [t.op for t in gather_ids]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if is_squeezer(op):
            found.append(op)
            continue
        if op.type in CARRIERS:  # any cast: refusal() then says why a narrowing one stops it
            # a gather of the ids themselves carries input 0; others, every input
            inputs = op.inputs[:1] if is_gather(op) else op.inputs
            stack.extend(t.op for t in inputs if t.dtype.is_integer)
    return found


def refusal(source: tf.Operation, converted_gathers: Set[str], replaced_ops: Set[str]
            ) -> Optional[str]:
    """Why the source cannot be unsqueezed, or None when it can. replaced_ops
    are the converted variables' old optimizer updates, which will not run."""
    seen, stack = set(), [source.outputs[0]]
    while stack:
        t = stack.pop()
        if t.ref() in seen:
            continue
        seen.add(t.ref())
        for op in t.consumers():
            index = [i for i, x in enumerate(op.inputs) if x is t]
            if _reads_rows(op) and 1 in index and 0 not in index:
                if op.name not in converted_gathers:
                    return f"its ids also index '{op.inputs[0].op.name}', which stays dense"
                continue
            if op.type in SEGMENT_READS and 0 not in index:
                continue  # positions in the batch, segment ids or counts
            if op.type in _POSITIONAL or op.name in replaced_ops or _sign_check(op, t):
                continue
            if carries(op):
                stack.extend(o for o in op.outputs if o.dtype.is_integer)
                continue
            what = (f"a cast to {op.outputs[0].dtype.name}" if op.type == "Cast"
                    else op.type)
            return f"its ids also reach {what} '{op.name}', which reads their values"
    return None


def _unsqueeze(rw, source: tf.Operation) -> tf.Tensor:
    """Makes the source's consumers read the unsqueezed keys."""
    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/keys/{source.name}"):
        if source.type == "FloorMod":
            raw = tf.cast(source.inputs[0], tf.int64)
        else:
            strings = source.inputs[0]
            raw = tf.reshape(tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64),
                             tf.shape(strings))
        keys = tf.bitwise.bitwise_and(raw, tf.constant(2**63 - 1, tf.int64))
        keys = tf.cast(keys, source.outputs[0].dtype)
        rw.reroute(source.outputs[0], keys)
    return keys


def check(conversion: Conversion, context: Context) -> None:
    del conversion, context


def rewrite(rw, conversions: List[Conversion], context: Context) -> None:
    """Unsqueezes every source upstream of the converted gathers that can be
    (or, replaying a plan, exactly the plan's); notes each conversion's."""
    if not context.collision_free and not any(c.unsqueezed for c in conversions):
        return
    converted = {g.op.name for c in conversions for g in c.gathers}
    replaced_ops = {op.name for c in conversions if c.update is not None for op in c.update.ops}
    decided: Dict[str, Optional[str]] = {}  # source -> refusal reason (None: unsqueezed)
    for c in conversions:
        found = sources([g.op.inputs[1] for g in c.gathers])
        planned = c.unsqueezed
        if planned is not None:
            missing = sorted(set(planned) - {s.name for s in found})
            if missing:
                raise PlanMismatch(f"graphmod: table '{c.table_name}' was trained on the "
                                   f"unsqueezed ids of {', '.join(missing)}, which do not reach "
                                   f"'{c.variable.op.name}' in this graph")
            found = [s for s in found if s.name in planned]
        elif not context.collision_free:
            found = []
        c.unsqueezed = []
        for source in found:
            if source.name not in decided:
                reason = refusal(source, converted, replaced_ops)
                decided[source.name] = reason
                if reason is None:
                    _unsqueeze(rw, source)
                    context.unsqueezed.append(source.name)
                elif planned is not None:
                    raise PlanMismatch(f"graphmod: table '{c.table_name}' was trained on the "
                                       f"unsqueezed ids of '{source.name}', but here {reason}")
                else:
                    context.squeezed_kept.append((source.name, reason))
            if decided[source.name] is None:
                c.unsqueezed.append(source.name)
