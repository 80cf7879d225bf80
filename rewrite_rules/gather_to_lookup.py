"""Rule: reads of a converted embedding variable become table lookups.

Matches every gather of the variable (ResourceGather with batch_dims 0, or
GatherV2 on axis 0 of its value) and every fused sparse-segment read
(SparseSegmentSum/Mean/SqrtN straight from the variable, which
embedding_lookup_sparse builds for reference variables): the lookup reads the
rows of its ids, and the segment op then combines those rows. Builds the variable's
table (its initializer inherited from the variable's, its optimizer slots
from the optimizer rule) and, per gather, a lookup on the gather's ids:
find_or_insert in a graph that trains the variable (recording row handles
and gradient rows for the optimizer rule), read-only find otherwise. The
gather's consumers then read the lookup's rows, which have the same shape.
Refuses gathers with batch dimensions or on another axis.
"""
import tensorflow as tf
from tensorflow.python.framework import tensor_util

import graphmod
from graphmod._ops import ops
from graphmod.conversion import SEGMENT_READS, Conversion, Gather
from graphmod.initializers import from_variable
from graphmod.lookup import find_or_insert

NAME = "gather_to_lookup"


class Refused(Exception):
    pass


def check(conversion: Conversion) -> None:
    """Raises Refused when a gather of the variable cannot become a lookup."""
    for g in conversion.gathers:
        if g.op.type in SEGMENT_READS:
            if not g.ids.dtype.is_integer:
                raise Refused(f"{g.op.name} has {g.ids.dtype.name} ids")
            continue
        if g.op.type == "ResourceGather" and g.op.get_attr("batch_dims") != 0:
            raise Refused(f"{g.op.name} gathers with batch_dims")
        if g.op.type == "GatherV2" and tensor_util.constant_value(g.op.inputs[2]) != 0:
            raise Refused(f"{g.op.name} gathers along an axis other than 0")
        if not g.ids.dtype.is_integer:
            raise Refused(f"{g.op.name} has {g.ids.dtype.name} ids")


def rewrite(rw, conversion: Conversion, slot_layout) -> None:
    v = conversion.variable
    s = conversion.settings
    with rw.rule(NAME):
        init = s.initializer if s.initializer is not None else from_variable(v)
        table = graphmod.create_table(
            conversion.table_name, conversion.dim, initializer=init, optimizer=slot_layout,
            default_value=s.default_value, num_shards=s.num_shards, max_rows=s.max_rows,
            when_full=s.when_full, admission_sketch_width=s.admission_sketch_width,
            shape_hint=[conversion.rows, conversion.dim])
        rw.track_added(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                       tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)[-1],
                       label=f"table {table.name}")
        conversion.table = table
        for g in conversion.gathers:
            with tf.compat.v1.name_scope(f"graphmod/{table.name}/lookup"):
                keys = g.op.inputs[1]  # the current input: keys may have been unsqueezed
                if keys.dtype != tf.int64:
                    keys = tf.cast(keys, tf.int64)
                grads = g.grads
                if conversion.training:
                    rows, handles = find_or_insert(table, keys)
                else:
                    rows = ops.graphmod_table_find(table.handle, keys, dim=table.dim)
                if g.op.type in SEGMENT_READS:
                    rows, grads = _combine_by_segment(g, rows)
                if conversion.training:
                    # The gradient of the rows has the handles' shape + [dim],
                    # as the apply wants (TF's own gradient reshapes it using the
                    # variable's shape, and the variable is never initialized now).
                    conversion.lookups.extend((handles, grad) for grad in grads)
            rw.reroute(g.op.outputs[0], rows)
            conversion.outputs.append(rows)


def _combine_by_segment(read: Gather, rows: tf.Tensor):
    """The fused read's combination over the looked-up rows (row i is id i),
    and the gradients of those rows from the gradients of its output."""
    op = read.op
    indices, segments = op.inputs[1], op.inputs[2]
    n = tf.size(indices, out_type=indices.dtype)
    positions = tf.range(n)
    kind = op.type.replace("WithNumSegments", "")  # SparseSegmentSum / Mean / SqrtN
    combine = getattr(tf.raw_ops, op.type)
    extra = {"num_segments": op.inputs[3]} if "WithNumSegments" in op.type else {}
    out = combine(data=rows, indices=positions, segment_ids=segments, **extra)
    row_grad = getattr(tf.raw_ops, kind + "Grad")
    grads = [row_grad(grad=g, indices=positions, segment_ids=segments,
                      output_dim0=tf.cast(n, tf.int32)) for g in read.grads]
    return out, grads
