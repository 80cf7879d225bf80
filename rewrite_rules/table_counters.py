"""Rule: a training graph reports its tables' counters to TensorBoard.

Matches every table a training graph converted; builds one summary op of
their counters (graphmod/<table>/rows, admitted, rejected, evicted, pending;
see graphmod.embeddings.features.add_summaries) and adds it to the SUMMARIES
collection, which Estimators merge after the hooks' begin(), and, where the
tables are split across Horovod ranks, the bytes this rank sends the others
a step (graphmod/exchange/bytes_sent, beside the placement planner's
estimates in `graphmod inspect`). Refuses nothing.
The counters are also handed to the hook, which logs them at the end.
"""
from typing import NamedTuple

import tensorflow as tf

from graphmod.embeddings import features
from graphmod.horovod.exchange import BYTES_SENT
from graphmod.rewrite.rule import Context
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "table_counters"
# (RULES also runs it after shard_exchange, which counts the bytes sent.)
AFTER = ("gather_to_lookup",)
Counters = NamedTuple("Counters", [("counters", dict)])  # for the report: {table: {name: tensor}}


def rewrite(rw, conversions, context: Context) -> None:
    tables = [context.built(Lookups, c).table for c in conversions if c.training]
    if not tables:
        return
    with rw.rule(NAME):
        context.build(Counters(features.add_summaries(tables)[0]))
        sent = tf.compat.v1.get_collection(BYTES_SENT)
        if sent:
            tf.compat.v1.summary.scalar("graphmod/exchange/bytes_sent",
                                        tf.cast(tf.add_n(sent), tf.float32))
