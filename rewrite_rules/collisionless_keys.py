"""Rule: ids squeezed into a fixed range feed the tables unsqueezed.

A variable of N rows forces ids into [0, N): hash-bucket columns hash strings
to Fingerprint64(s) % N (StringToHashBucketFast; Strong and the legacy op
alike) and models write `ids % N` (FloorMod), so distinct feature values share
rows. A table needs no range: this rule makes the squeezing op's consumers
read the unsqueezed key instead, the string's full fingerprint (63 bits, kept
non-negative because feature columns prune negative ids) or the raw id.

Matches a squeezing op found by walking back from a converted variable's
gather ids through ops that carry ids unchanged (casts, reshapes, unique,
sparse plumbing, gathers of the ids). Refuses (leaves the op alone) when any
path from it reaches something other than converted gathers or ops that only
look at positions, shapes or signs: a dense variable indexed by those ids
would break on ids beyond its rows.
"""
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod.conversion import SEGMENT_READS

NAME = "collisionless_keys"

_SQUEEZERS = ("StringToHashBucketFast", "StringToHashBucketStrong", "StringToHashBucket",
              "FloorMod")
# Ops whose outputs carry their id input's values (walked through both ways).
_CARRIERS = {"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "Unique", "UniqueV2",
             "SparseFillEmptyRows", "SparseReshape", "StridedSlice", "Slice", "ConcatV2",
             "Pack", "SparseSlice", "Select", "SelectV2", "IdentityN", "GatherV2", "Gather",
             "ResourceGather", "DynamicPartition", "Where"}
# Consumers that only look at where ids are, how many, or their sign.
# (Sparse segment reads are not here: their input 1 indexes rows like a
# gather's ids; see _reads_rows.)
_HARMLESS = {"Shape", "Size", "Rank", "GreaterEqual", "Greater", "Less", "LessEqual",
             "NotEqual", "Equal", "UnsortedSegmentSum", "Range", "Max", "Min",
             "SparseSegmentSumGrad", "SparseSegmentMeanGrad", "SparseSegmentSqrtNGrad",
             "SparseSegmentSumGradV2", "SparseSegmentMeanGradV2", "SparseSegmentSqrtNGradV2"}


def _is_gather(op: tf.Operation) -> bool:
    return op.type in ("ResourceGather", "GatherV2", "Gather")


def _reads_rows(op: tf.Operation) -> bool:
    """A gather, or a sparse segment op reading a variable's value (its input
    1 then picks the variable's rows; over gathered rows it picks batch rows)."""
    if _is_gather(op):
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
        if op.type in _SQUEEZERS:
            if op.type != "FloorMod" or tensor_util.constant_value(op.inputs[1]) is not None:
                found.append(op)
            continue
        if op.type in _CARRIERS:
            # a gather of the ids themselves carries input 0; others, every input
            inputs = op.inputs[:1] if _is_gather(op) else op.inputs
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
            if op.type in _HARMLESS or op.name in replaced_ops:
                continue
            if op.type in _CARRIERS:
                stack.extend(o for o in op.outputs if o.dtype.is_integer)
                continue
            return f"its ids also reach {op.type} '{op.name}'"
    return None


def rewrite(rw, source: tf.Operation) -> tf.Tensor:
    """Makes the source's consumers read the unsqueezed keys."""
    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/keys/{source.name}"):
        if source.type == "FloorMod":
            keys = tf.cast(source.inputs[0], source.outputs[0].dtype)
        else:
            strings = source.inputs[0]
            flat = tf.bitcast(tf.fingerprint(tf.reshape(strings, [-1])), tf.int64)
            keys = tf.reshape(tf.bitwise.bitwise_and(flat, tf.constant(2**63 - 1, tf.int64)),
                              tf.shape(strings))
        rw.reroute(source.outputs[0], keys)
    return keys


def unsqueeze(rw, gathers_by_conversion: Dict[str, List[tf.Operation]], replaced_ops: Set[str]
              ) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Runs the rule for every source upstream of the converted gathers.
    Returns (sources replaced, (source, reason) refused)."""
    converted = {g.name for gathers in gathers_by_conversion.values() for g in gathers}
    replaced, refused, done = [], [], set()
    for gathers in gathers_by_conversion.values():
        for source in sources([g.inputs[1] for g in gathers]):
            if source.name in done:
                continue
            done.add(source.name)
            reason = refusal(source, converted, replaced_ops)
            if reason is None:
                rewrite(rw, source)
                replaced.append(source.name)
            else:
                refused.append((source.name, reason))
    return replaced, refused
