"""The gradient an optimizer's update of a variable consumes, read off the graph.

A table's apply must take exactly what the variable's update would: the
IndexedSlices (values, indices) its update scope reads from outside, after
whatever the model did between tf.gradients and apply_gradients (clipping,
scaling, tower averaging). This module finds them, splits a dense gradient
(made dense by an L2 penalty over the whole variable) into its row parts and
penalty terms, and checks that every index comes from the variable's own
lookups, so each gradient row has a table row to go to.
"""
from typing import List, Optional, Tuple

import tensorflow as tf

from graphmod.rewrite.index import reads_variable, walk

DENSE = "its update consumes a dense gradient"


def consumed_gradient(ops: List[tf.Operation], dim: int
                       ) -> Tuple[Optional[tf.Tensor], Optional[tf.Tensor], str]:
    """(values, indices, why not) of the IndexedSlices an update scope consumes:
    the tensors from outside the scope that its ops read, apart from variables
    and scalars (hyper-parameters). Everything the model did to the gradient
    (clipping, scaling, multipliers, tower averaging) is upstream of these."""
    inside = set(ops)
    values, indices = [], []
    for op in ops:
        for t in op.inputs:
            if t.op in inside or t.dtype == tf.resource or t.dtype != t.dtype.base_dtype:  # a ref
                continue
            if t.shape.rank == 0 or reads_variable(t):
                continue  # a hyper-parameter, or a slot's value
            if t.dtype == tf.float32 and not any(x is t for x in values):
                values.append(t)
            elif t.dtype in (tf.int32, tf.int64) and not any(x is t for x in indices):
                indices.append(t)
    if len(values) == 1 and len(indices) == 1:
        if values[0].shape.rank not in (None, 2) or (
                values[0].shape.rank == 2 and values[0].shape[1] not in (None, dim)):
            return None, None, f"its gradient {values[0].name} is not [n, {dim}] rows"
        return values[0], indices[0], ""
    if len(values) == 1 and not indices:
        return None, None, f"{DENSE} ({values[0].name})"
    names = ", ".join(t.name for t in values + indices)[:300]
    return None, None, f"cannot tell the gradient its update consumes among {names or 'nothing'}"

def dense_gradient(ops: List[tf.Operation]) -> tf.Tensor:
    """The dense gradient an update scope consumes (see consumed_gradient)."""
    inside = set(ops)
    return next(t for op in ops for t in op.inputs if t.op not in inside
                and t.dtype == tf.float32 and t.shape.rank != 0 and not reads_variable(t))

# Ops that pass ids on by position, as gradients carry them from a gather's
# ids to the indices an update consumes: op type -> the inputs that carry.
_INDEX_CARRIERS = {"Identity": (0,), "Reshape": (0,), "Cast": (0,), "ExpandDims": (0,),
                   "Squeeze": (0,), "Unique": (0,), "UniqueV2": (0,), "StridedSlice": (0,),
                   "Slice": (0,), "GatherV2": (0,), "Gather": (0,), "DynamicPartition": (0,),
                   "SparseSegmentSumGradV2": (1,), "SparseSegmentMeanGradV2": (1,),
                   "SparseSegmentSqrtNGradV2": (1,)}


# The outputs of those ops that hold ids, where not all do (Unique's idx
# holds positions, a segment gradient's output 0 holds gradient rows).
_INDEX_OUTPUTS = {"Unique": (0,), "UniqueV2": (0,), "SparseSegmentSumGradV2": (1,),
                  "SparseSegmentMeanGradV2": (1,), "SparseSegmentSqrtNGradV2": (1,)}


def from_lookups(gradients: List[Tuple[tf.Tensor, tf.Tensor]], gathers: List[tf.Operation]
                 ) -> str:
    """Why the update's gradient rows cannot be matched to the lookups' keys,
    or "": every index must be one of the variable's gather ids, passed on by
    position (reshapes, concatenation, deduplication...). Indices from
    anywhere else (another worker's, a placeholder's) name rows no lookup of
    this step read, so no table row would take their gradient."""
    ids = {g.inputs[1].ref() for g in gathers}

    def carriers(t):  # the tensors t's ids come from
        op = t.op
        if t.ref() in ids:
            return []
        if op.type in ("ConcatV2", "Concat", "Pack"):
            return [x for x in op.inputs if x.shape.rank != 0 or op.type == "Pack"]
        return [op.inputs[i] for i in _INDEX_CARRIERS[op.type]]

    for t in walk([indices for _, indices in gradients], carriers):
        op = t.op
        if t.ref() not in ids and op.type not in ("ConcatV2", "Concat", "Pack") and not (
                op.type in _INDEX_CARRIERS and t.value_index in _INDEX_OUTPUTS.get(
                    op.type, range(len(op.outputs)))):
            return (f"its gradient's indices do not all come from its lookups' ids "
                    f"({op.type} {op.name}): rows no lookup read would get no gradient")
    return ""

def split_dense_gradient(grad: tf.Tensor, v: tf.Variable):
    """(IndexedSlices parts, penalty scalars, why not) of a dense gradient that sums
    IndexedSlices made dense (UnsortedSegmentSum, as tf.gradients adds them to
    dense terms) and L2 penalty terms over the whole variable (x * g). A term
    added twice counts twice, so this is a match over the sum's terms, not a
    visit-once walk."""
    parts, penalties, stack = [], [], [grad]
    while stack:
        t = stack.pop()
        op = t.op
        if op.type in ("AddN", "Add", "AddV2"):
            stack.extend(op.inputs)
        elif op.type == "Identity":
            stack.append(op.inputs[0])
        elif op.type == "UnsortedSegmentSum" and op.inputs[1].shape.rank in (None, 1):
            parts.append((op.inputs[0], op.inputs[1]))
        elif op.type == "Mul" and any(reads_variable(x) and x.op.inputs[0].op is v.op
                                      for x in op.inputs):
            other = op.inputs[1] if reads_variable(op.inputs[0]) else op.inputs[0]
            if other.shape.rank != 0:
                return [], [], f"its dense gradient scales the variable by {other.name}"
            penalties.append(other)
        else:
            return [], [], (f"{DENSE} ({grad.name}) with a term graphmod cannot map to rows "
                            f"({op.type} {op.name})")
    if not parts:
        return [], [], f"{DENSE} ({grad.name}) of no rows"
    return parts, penalties, ""
