"""shard_exchange: under Horovod, lookups and applies exchange with each key's owner rank.

Its rewrite needs ranks that run (tests/test_horovod.py starts them); here:
what its check refuses on several ranks and why, and that on one rank it
accepts everything and changes nothing."""
import dataclasses

import pytest
import tensorflow as tf

from graphmod.horovod import placement
from graphmod.rewrite.rule import Refused
from graphmod.settings import TableSettings
from graphmod.rewrite_rules import (collisionless_keys, dense_reads, l2_penalties,
                                    optimizer_updates, shard_exchange)
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


def test_the_planner_replicates_tiny_tables_that_move_alike_on_every_copy():
    """auto: a table whose copy fits REPLICATE_MAX_BYTES is replicated unless
    it admits, evicts, is bounded or has a disk tier (each counts or evicts by
    its own rank's use); TableSettings(placement=...) overrides; a plan's
    placement is kept by the model's later graphs."""
    with tf.Graph().as_default() as g:
        tiny_model()
        c = only_conversion(g, training=False)
        context = context_for(g, training=False, ranks=2)

        def placed(conversion=c, **settings):
            conversion = dataclasses.replace(conversion, settings=TableSettings(**settings))
            context = context_for(g, training=False, ranks=2)  # (it files the choice)
            shard_exchange.replicates(conversion, context)
            return context.built(shard_exchange.Placed, conversion).choice
        assert placed().placement == "replicated"
        assert placed(placement="sharded").placement == "sharded"
        assert placed(placement="sharded").why == "TableSettings(placement=...)"
        for settings, why in [(dict(access_threshold=2), "admits or evicts"),
                              (dict(eviction_threshold=5), "admits or evicts"),
                              (dict(max_rows=100), "max_rows"),
                              (dict(memory_budget=0.5, storage_path="/tmp/x"), "disk tier")]:
            choice = placed(**settings)
            assert choice.placement == "sharded" and why in choice.why, (settings, choice)
            with pytest.raises(ValueError, match=f"table 'emb' cannot be replicated.*{why}"):
                placed(placement="replicated", **settings)
        replayed = dataclasses.replace(c, planned_placement="sharded")
        assert placed(replayed).placement == "sharded"
        assert not shard_exchange.replicates(c, context_for(g, training=False))  # one rank


def test_the_estimates_follow_the_exchange_and_the_copies():
    """Per rank and step: sharded sends each distinct id other ranks own
    (24 B), its row back and its gradient row (dim + 1 floats each),
    and waits for the rows; replicated allreduces its [rows, dim + 2]
    gradient and counts and waits for nothing; memory is a part or the whole of the
    rows. auto replicates a tiny table only where its allreduce sends no
    more than its exchange would."""
    shape = placement.TableShape("t", rows=10**9, dim=8, slots=1, ids_per_step=1000)
    d = placement.distinct_ids(1000, 10**9)
    assert 999 < d < 1000  # few repeats among 1000 uniform ids of 1e9
    sharded = placement.estimate(shape, "sharded", 4)
    assert sharded.bytes_per_step == round(d * 0.75 * (24 + 4 * 9 + 4 * 9))
    assert sharded.waited_bytes == round(d * 0.75 * 4 * 9)
    assert sharded.memory_bytes == 10**9 // 4 * (4 * 8 * 2 + placement.ROW_OVERHEAD_BYTES)
    replicated = placement.estimate(shape, "replicated", 4)
    assert replicated.bytes_per_step == round(1.5 * 10**9 * 4 * 10)
    assert replicated.waited_bytes == 0
    assert replicated.memory_bytes == 4 * sharded.memory_bytes
    assert placement.distinct_ids(4096, 50) == pytest.approx(50)  # every row, surely
    assert placement.place(shape, 4).placement == "sharded"  # a copy: 104 GB
    tiny = placement.TableShape("t", rows=500, dim=8, slots=1, ids_per_step=1024)
    assert placement.place(tiny, 2).placement == "replicated"  # 20 KB against 21 KB
    assert placement.place(dataclasses.replace(tiny, rows=2000), 2).placement == "sharded"
    unknown = dataclasses.replace(tiny, ids_per_step=None)  # a dynamic batch size
    assert placement.place(unknown, 2).placement == "replicated"  # 500 rows
    choice = placement.place(dataclasses.replace(unknown, rows=2000), 2)
    assert choice.placement == "sharded" and "unknown" in choice.why
    unknown = placement.estimate(dataclasses.replace(shape, ids_per_step=None), "sharded", 2)
    assert unknown.bytes_per_step is None and unknown.memory_bytes > 0


def test_collision_free_keys_are_not_replicated():
    """A replicated table's gradient is allreduced densely, indexed by row
    number: a hashed column's full keys cannot be, so its table is sharded."""
    with tf.Graph().as_default() as g:
        raw = tf1.placeholder(tf.int64, [None], name="raw")
        tiny_model(rows=1000, ids=tf.math.floormod(raw, 1000, name="bucket"))
        applied = apply_rules(g, *READING_RULES, training=False)
        c = applied.only()
        context = context_for(g, training=False, ranks=2)
        context.build(applied.context.built(collisionless_keys.Keys, c), c)
        assert not shard_exchange.replicates(c, context)
        assert "not the row numbers" in context.built(shard_exchange.Placed, c).choice.why
        forced = dataclasses.replace(c, settings=TableSettings(placement="replicated"))
        context = context_for(g, training=False, ranks=2)
        context.build(applied.context.built(collisionless_keys.Keys, c), forced)
        with pytest.raises(ValueError, match="table 'emb' cannot be replicated"):
            shard_exchange.replicates(forced, context)
