"""Where ids flow: the ops that squeeze ids into a variable's rows (hash
buckets, modulo) and the ops that carry ids on unchanged, by position.

The planner asks which variables are read by hashed ids (they convert at any
size); the collisionless_keys rule asks which squeezing ops it may feed the
full keys through, walking the carriers both ways.
"""
from typing import List, Optional

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod.rewrite.index import walk


# Ops that squeeze ids into a variable's rows (hash buckets, `ids % N`); the
# collisionless_keys rule feeds tables the unsqueezed key instead. A modulo by
# less than MIN_MODULO_BUCKETS is taken as meaning, not hashing (hour of day,
# day of week, the partition of a partitioned variable) and left alone.
SQUEEZERS = ("StringToHashBucketFast", "StringToHashBucketStrong", "StringToHashBucket",
             "FloorMod")
MIN_MODULO_BUCKETS = 1000

# Ops whose outputs carry ids from their inputs unchanged (by position):
# op type -> (the inputs that carry, the outputs that receive; None = all).
# Outputs that hold positions (Unique's idx, a SparseTensor's indices) do not.
_CARRY = {
    "Identity": ((0,), None), "IdentityN": (None, None), "Cast": ((0,), None),
    "Reshape": ((0,), None), "ExpandDims": ((0,), None), "Squeeze": ((0,), None),
    "Unique": ((0,), (0,)), "UniqueV2": ((0,), (0,)), "StridedSlice": ((0,), None),
    "Slice": ((0,), None), "ConcatV2": (None, None), "Pack": (None, None),
    "Select": ((1, 2), None), "SelectV2": ((1, 2), None), "GatherV2": ((0,), None),
    "Gather": ((0,), None), "ResourceGather": ((0,), None), "DynamicPartition": ((0,), None),
    "SparseFillEmptyRows": ((1,), (1,)), "SparseSlice": ((1,), (1,)),
    # A feature column's dense input becomes sparse values by GatherNd of the
    # ids (input 0) at the non-missing positions (input 1, positions).
    "GatherNd": ((0,), None),
}


def carried(op: tf.Operation, index: int, keep_64_bits: bool = True) -> Optional[List[tf.Tensor]]:
    """The outputs of op that carry the ids op reads at input `index`, or None
    when op does not pass them on (it reads their values, or only positions).
    keep_64_bits: a Cast carries only when it keeps int64 (a cast to int32
    would truncate 63-bit keys)."""
    spec = _CARRY.get(op.type)
    if spec is None or (spec[0] is not None and index not in spec[0]):
        return None
    if op.type == "Cast" and keep_64_bits and op.outputs[0].dtype != tf.int64:
        return None
    if op.type == "IdentityN":
        return [op.outputs[index]]
    outs = op.outputs if spec[1] is None else [op.outputs[i] for i in spec[1]]
    return [o for o in outs if o.dtype.is_integer]


def carrying_inputs(op: tf.Operation) -> List[tf.Tensor]:
    """The inputs whose ids op passes on (any cast counts)."""
    spec = _CARRY.get(op.type)
    if spec is None:
        return []
    inputs = op.inputs if spec[0] is None else [op.inputs[i] for i in spec[0]]
    return [t for t in inputs if t.dtype.is_integer]


def is_squeezer(op: tf.Operation) -> bool:
    if op.type not in SQUEEZERS:
        return False
    if op.type != "FloorMod":
        return True
    n = tensor_util.constant_value(op.inputs[1])
    return n is not None and n.size == 1 and int(n.reshape(-1)[0]) >= MIN_MODULO_BUCKETS


def is_gather(op: tf.Operation) -> bool:
    return op.type in ("ResourceGather", "GatherV2", "Gather")


def squeezed_ids(index) -> set:
    """Refs of the integer tensors that carry the output of a squeezing op
    (through any cast: narrowed hashed ids are still hashed ids), in the
    graph of index (a graphmod.rewrite.index.GraphIndex)."""
    def carriers(t):
        return [o for c in index.consumers(t) for i, x in enumerate(c.inputs) if x is t
                for o in carried(c, i, keep_64_bits=False) or []]
    starts = [t for op in index.of_type(*SQUEEZERS) if is_squeezer(op) for t in op.outputs]
    return {t.ref() for t in walk(starts, carriers)}
