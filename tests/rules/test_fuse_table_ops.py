"""fuse_table_ops: the lookups and applies of several tables run as one fused op each."""
import numpy as np
import tensorflow as tf

from graphmod.rewrite_rules import (collisionless_keys, dense_reads, fuse_table_ops,
                                    gather_to_lookup, l2_penalties, optimizer_updates,
                                    ps_shards, shard_exchange)
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Apply

from .helpers import apply_rules, exported, tiny_model

tf1 = tf.compat.v1
UNFUSED = (collisionless_keys, gather_to_lookup, dense_reads, l2_penalties, optimizer_updates,
           shard_exchange, ps_shards)
STEPS = [[1, 2, 1], [2, 5]]


def _two_tables(shared_ids: bool):
    """Tables a and b read by one batch's ids (or each by its own
    placeholder), trained by one Adagrad step."""
    a = tiny_model(name="a", initializer=tf1.random_normal_initializer(seed=1))
    b = tiny_model(name="b", ids=a.ids if shared_ids else None,
                   initializer=tf1.random_normal_initializer(seed=2))
    train = tf1.train.AdagradOptimizer(0.1).minimize(a.loss + b.loss)
    return a, b, train


def _run(fuse: bool):
    with tf.Graph().as_default() as g:
        a, b, train = _two_tables(shared_ids=True)
        applied = apply_rules(g, *UNFUSED, *((fuse_table_ops,) if fuse else ()))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for ids in STEPS:
                sess.run(train, {a.ids: ids})
            read = sess.run([a.rows, b.rows], {a.ids: [5, 1]})
            tables = {c.name: exported(sess, applied.context.built(Lookups, c).table)
                      for c in applied.conversions}
        return applied, a, b, train, read, tables


def test_the_lookups_and_applies_of_one_step_become_one_op_each():
    applied, a, b, train, _, _ = _run(fuse=True)
    context = applied.context
    assert applied.reported("fused") == {"GraphmodTableFindOrInsert": [2, 1],
                                         "GraphmodTableApply": [2, 1]}
    assert applied.built_by("fuse_table_ops").count("GraphmodFusedFindOrInsert") == 1
    assert applied.built_by("fuse_table_ops").count("GraphmodFusedApply") == 1
    ca, cb = applied.conversions
    # The readers read the fused lookup; the train op waits for the fused apply.
    assert a.rows.op.inputs[0].op.type == "GraphmodFusedFindOrInsert"
    assert a.rows.op.inputs[0].op is b.rows.op.inputs[0].op
    fused_apply = context.built(Apply, ca).op
    assert fused_apply.type == "GraphmodFusedApply"
    assert fused_apply is context.built(Apply, cb).op
    assert fused_apply in train.control_inputs
    assert not any(op.type == "GraphmodTableApply" for op in train.control_inputs)
    # Results the other rules filed follow the replacement (nobody patched them).
    assert context.built(Lookups, ca).reads[0][1].op.type == "GraphmodFusedFindOrInsert"


def test_fusing_changes_no_number():
    _, _, _, _, fused_read, fused_tables = _run(fuse=True)
    _, _, _, _, read, tables = _run(fuse=False)
    for x, y in zip(fused_read, read):
        np.testing.assert_array_equal(x, y)
    assert fused_tables.keys() == tables.keys()
    for name in tables:
        assert sorted(fused_tables[name]) == sorted(tables[name]) == [1, 2, 5]
        for k in tables[name]:
            np.testing.assert_array_equal(fused_tables[name][k], tables[name][k])


def test_lookups_of_different_inputs_stay_apart():
    """Fusing refuses nothing: ops that cannot run as one stay as they are.
    Lookups feeding on different placeholders (two towers) are not fused."""
    with tf.Graph().as_default() as g:
        a, b, _ = _two_tables(shared_ids=False)
        applied = apply_rules(g, *UNFUSED, fuse_table_ops)
        assert len(applied.conversions) == 2
        assert "GraphmodTableFindOrInsert" not in applied.reported("fused")
        assert a.rows.op.inputs[0].op.type == "GraphmodTableFindOrInsert"
        assert a.rows.op.inputs[0].op is not b.rows.op.inputs[0].op


def test_a_single_table_has_nothing_to_fuse():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *UNFUSED, fuse_table_ops)
        assert applied.reported("fused") == {} and applied.built_by("fuse_table_ops") == []
