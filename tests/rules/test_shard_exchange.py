"""shard_exchange: under Horovod, lookups and applies exchange with each key's owner rank.

Its rewrite needs ranks that run (tests/test_horovod.py starts them); here:
what its check refuses on several ranks and why, and that on one rank it
accepts everything and changes nothing."""
import dataclasses

import pytest
import tensorflow as tf

from graphmod.rewrite.rule import Refused
from graphmod.rewrite_rules import (dense_reads, l2_penalties, optimizer_updates, shard_exchange)
from graphmod.rewrite_rules.optimizer_updates import Apply

from .helpers import READING_RULES, apply_rules, context_for, only_conversion, tiny_model

tf1 = tf.compat.v1
RULES = READING_RULES + (dense_reads, l2_penalties, optimizer_updates, shard_exchange)


def test_refuses_a_variable_each_rank_trains_on_its_own():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))  # no hvd.DistributedOptimizer
        c = only_conversion(g)
        assert c.update.combined is None
        with pytest.raises(Refused) as e:
            shard_exchange.check(c, context_for(g, ranks=2))
        assert str(e.value) == (
            "each of the 2 Horovod ranks trains its own copy of it (its gradient goes through no "
            "Horovod collective): one table sharded across the ranks cannot follow copies that "
            "differ")
        applied = apply_rules(g, *RULES, ranks=2)
        assert applied.conversions == [] and "trains its own copy" in applied.refused["emb"]


def test_refuses_whole_reads_on_several_ranks_and_takes_warm_starts():
    """The planner's facts of a graph reading the variable whole, or warm
    starting it, are made by hand (each needs a saved plan or a checkpoint:
    see test_dense_reads and test_warm_start). A warm start imports each
    rank's keys (tests/test_distributed.py)."""
    with tf.Graph().as_default() as g:
        m = tiny_model()
        c = only_conversion(g, training=False)
        context = context_for(g, training=False, ranks=2)
        assert shard_exchange.check(c, context) is None  # it only reads rows: accepted
        whole = dataclasses.replace(c, dense_reads=[m.variable.value()])
        with pytest.raises(Refused, match="^it is read whole, which tables sharded across "
                                          "Horovod ranks cannot serve$"):
            shard_exchange.check(whole, context)
        warm = dataclasses.replace(c, warm_start=tf.zeros([8, 2]))
        assert shard_exchange.check(warm, context) is None
        # On one rank the same facts are fine.
        assert shard_exchange.check(whole, context_for(g, training=False)) is None


def test_on_one_rank_it_accepts_everything_and_changes_nothing():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        c = only_conversion(g)
        assert shard_exchange.check(c, context_for(g)) is None
        applied = apply_rules(g, *RULES)
        c = applied.only()
        assert "shard_exchange" not in applied.rw.summary()
        assert applied.built_by("shard_exchange") == []
        assert applied.context.built(Apply, c).op.type == "GraphmodTableApply"
