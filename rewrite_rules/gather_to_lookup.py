"""Rule: reads of a converted embedding variable's rows become table lookups.

Matches every gather of the variable (ResourceGather with batch_dims 0, or
GatherV2 on axis 0 of its value) and every fused sparse-segment read
(SparseSegmentSum/Mean/SqrtN straight from the variable, which
embedding_lookup_sparse builds for reference variables): the lookup reads the
rows of its ids, and the same segment op then combines those rows. Builds the
variable's table (initializer and seed as planned, optimizer slots from the
optimizer rule's match) and, per read, a lookup on its ids: find_or_insert in
a graph that trains the variable, read-only find otherwise. The read's
consumers then read the lookup's output, which has the same shape; reads of
the variable's static shape become constants. Gradients are not taken here:
the optimizer rule takes the one the variable's update consumes, so whatever
the model did between tf.gradients and the update still applies.
Refuses gathers with batch dimensions, on another axis, or with non-integer ids.
Builds, per conversion, its Lookups: the table, and each lookup's keys and rows.
"""
import contextlib
import dataclasses
from typing import List, NamedTuple, Tuple

import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod import optimizers
from graphmod._ops import ops
from graphmod.embeddings import stored_rows
from graphmod.embeddings.lookup import find_or_insert
from graphmod.embeddings.table import create_table
from graphmod.rewrite.plan import SEGMENT_READS, Conversion, Gather
from graphmod.rewrite.rule import Context, Refused

NAME = "gather_to_lookup"
AFTER = ("collisionless_keys",)  # lookups read the keys as that rule left them
# The slot layout a table is created with: filed by optimizer_updates' check
# (which runs before any rewrite), declared here so that rule imports this one.
SlotLayout = NamedTuple("SlotLayout", [("optimizer", optimizers.SparseOptimizer)])


@dataclasses.dataclass(frozen=True)
class Lookups:
    table: "graphmod.Table"
    reads: List[Tuple[tf.Tensor, tf.Tensor]]  # (int64 keys, rows read) of each lookup

    def table_entry(self) -> dict:
        values, slots = stored_rows.forms(self.table.storage_dtype,
                                          self.table.slot_storage_dtype)
        return dict(table=self.table.name, slots=self.table.num_slots,
                    initializer=dataclasses.asdict(self.table.initializer),
                    storage_dtype=values, slot_storage_dtype=slots)


def check(conversion: Conversion, context: Context) -> None:
    s = conversion.settings
    stored = stored_rows.approximation(*stored_rows.forms(s.storage_dtype,
                                                          s.slot_storage_dtype))
    if stored and context.exact and conversion.training:
        raise Refused(f"its settings ask for rows stored as {s.storage_dtype} (slots "
                      f"{s.slot_storage_dtype or s.storage_dtype}), which rounds every update "
                      "(exact=True keeps it dense)")
    if stored:
        context.approximate(conversion, stored)
    for g in conversion.gathers:
        if not g.ids.dtype.is_integer:
            raise Refused(f"{g.op.name} has {g.ids.dtype.name} ids")
        if g.op.type == "ResourceGather" and g.op.get_attr("batch_dims") != 0:
            raise Refused(f"{g.op.name} gathers with batch_dims")
        if g.op.type == "GatherV2" and tensor_util.constant_value(g.op.inputs[2]) != 0:
            raise Refused(f"{g.op.name} gathers along an axis other than 0")


def rewrite(rw, conversions, context: Context) -> None:
    for c in conversions:
        # The table keeps the slots of the update optimizer_updates matched
        # (none in a registry without it, or in a graph that does not train).
        layout = context.built(SlotLayout, c)
        context.build(_rewrite_one(rw, c, layout.optimizer if layout else None), c)


def _rewrite_one(rw, conversion: Conversion, optimizer) -> Lookups:
    s = conversion.settings
    reads = []
    # The table lives where the variable did: on the ps task the Estimator's
    # replica_device_setter gave it (a GraphmodTable is not one of the op
    # types it places). Its lookups and updates follow it there: TF's placer
    # runs an op taking a resource on the resource's device.
    device = tf.device(conversion.variable.device) if conversion.variable.device \
        else contextlib.nullcontext()
    with rw.rule(NAME), device:
        table = create_table(
            conversion.table_name, conversion.dim, initializer=conversion.initializer,
            optimizer=optimizer, seed=conversion.seed,
            shape_hint=[conversion.rows, conversion.dim], **s.table_kwargs())
        for g in conversion.gathers:
            with tf.compat.v1.name_scope(f"graphmod/{table.name}/lookup"):
                keys = g.op.inputs[1]  # the current input: keys may have been unsqueezed
                if keys.dtype != tf.int64:
                    keys = tf.cast(keys, tf.int64)
                if conversion.training:
                    rows, _ = find_or_insert(table, keys)
                else:
                    rows = ops.graphmod_table_find(table.handle, keys, dim=table.dim)
                reads.append((keys, rows))
                if g.op.type in SEGMENT_READS:
                    rows = _combine_by_segment(g, rows)
            rw.reroute(g.op.outputs[0], rows)
        for read in conversion.shape_reads:  # the variable is never initialized now
            rows, dim = conversion.rows, conversion.dim
            value = {"Rank": 2, "Size": rows * dim}.get(read.op.type, [rows, dim])
            rw.reroute(read, tf.constant(value, read.dtype))
    return Lookups(table, reads)


def _combine_by_segment(read: Gather, rows: tf.Tensor) -> tf.Tensor:
    """The fused read's combination over the looked-up rows (row i is id i)."""
    op = read.op
    positions = tf.range(tf.size(op.inputs[1], out_type=op.inputs[1].dtype))
    extra = {"num_segments": op.inputs[3]} if "WithNumSegments" in op.type else {}
    return getattr(tf.raw_ops, op.type)(data=rows, indices=positions, segment_ids=op.inputs[2],
                                        **extra)
