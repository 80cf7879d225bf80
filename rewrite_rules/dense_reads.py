"""Rule: a whole-value read of a converted variable, in a graph that does not
train it, reads the table's rows for ids 0..rows-1.

Matches a converted variable that the model's training plan turned into a
table and that this graph (evaluation, prediction, export) reads whole: the
full softmax of a model trained with sampled softmax, a dot product with
every item. The variable's value is then exactly the table's rows for the
variable's declared ids (unseen ids read their initial row, or the table's
default_value), so the read stays what the trained model computes.
Refuses nothing itself: the planner refuses tables keyed by unsqueezed ids,
which have no row numbers to read. Builds a DenseRead per conversion it rewrote.
"""
from typing import NamedTuple

import tensorflow as tf

from graphmod._ops import ops
from graphmod.rewrite.rule import Context
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "dense_reads"
AFTER = ("gather_to_lookup",)
DenseRead = NamedTuple("DenseRead", [("rows", tf.Tensor)])  # the table's rows 0..rows-1


def rewrite(rw, conversions, context: Context) -> None:
    for c in conversions:
        if not c.dense_reads:
            continue
        table = context.built(Lookups, c).table
        with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/{table.name}/dense_read"):
            ids = tf.range(c.rows, dtype=tf.int64)
            rows = tf.ensure_shape(ops.graphmod_table_find(table.handle, ids, dim=c.dim),
                                   [c.rows, c.dim])
            for value in c.dense_reads:
                rw.reroute(value, rows)
        context.build(DenseRead(rows), c)
