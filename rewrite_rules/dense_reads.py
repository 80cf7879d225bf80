"""Rule: a whole-value read of a converted variable, in a graph that does not
train it, reads the table's rows for ids 0..rows-1.

Matches a converted variable that the model's training plan turned into a
table and that this graph (evaluation, prediction, export) reads whole: the
full softmax of a model trained with sampled softmax, a dot product with
every item. The variable's value is then exactly the table's rows for the
variable's declared ids (unseen ids read their initial row, or the table's
default_value), so the read stays what the trained model computes.
Refuses nothing itself: the planner refuses tables keyed by unsqueezed ids,
which have no row numbers to read.
"""
import tensorflow as tf

from graphmod._ops import ops
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context

NAME = "dense_reads"


def check(conversion: Conversion, context: Context) -> None:
    del conversion, context


def rewrite(rw, conversions, context: Context) -> None:
    del context
    for c in conversions:
        if not c.dense_reads:
            continue
        with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/{c.table.name}/dense_read"):
            ids = tf.range(c.rows, dtype=tf.int64)
            rows = tf.ensure_shape(ops.graphmod_table_find(c.table.handle, ids, dim=c.dim),
                                   [c.rows, c.dim])
            for value in c.dense_reads:
                rw.reroute(value, rows)
            c.outputs.append(rows)
