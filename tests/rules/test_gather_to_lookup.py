"""gather_to_lookup: every row read of a converted variable becomes a table lookup."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from graphmod._ops import ops
from graphmod.rewrite.plan import Gather
from graphmod.rewrite.rule import Refused
from graphmod.rewrite_rules import gather_to_lookup
from graphmod.rewrite_rules.gather_to_lookup import Lookups

from .helpers import (READING_RULES, TRAINING_RULES, apply_rules, context_for, exported,
                      only_conversion, the_table, tiny_model)

tf1 = tf.compat.v1


def test_each_gather_becomes_a_training_lookup_reading_the_tables_rows():
    with tf.Graph().as_default() as g:
        m = tiny_model(tf1.train.AdagradOptimizer(0.1),
                       initializer=tf1.random_normal_initializer(seed=3))
        other_ids = tf1.placeholder(tf.int64, [None])
        second = tf.nn.embedding_lookup(m.variable, other_ids)
        # (tf.shape would fold the static shape itself)
        shape = tf.identity(tf.raw_ops.Shape(input=m.variable.value(), out_type=tf.int64))
        old_gathers = [g.get_operation_by_name("embedding_lookup"),
                       g.get_operation_by_name("embedding_lookup_1")]
        applied = apply_rules(g, *TRAINING_RULES)
        (c,) = applied.conversions
        assert [x.op for x in c.gathers] == old_gathers
        assert [x.op.type for x in c.gathers] == ["ResourceGather"] * 2

        lookups = applied.context.built(Lookups, c)
        assert lookups.table.name == "emb" and lookups.table.num_slots == 1  # Adagrad's accum
        assert [rows.op.type for _, rows in lookups.reads] == ["GraphmodTableFindOrInsert"] * 2
        assert [keys.op.type for keys, _ in lookups.reads] == ["Placeholder"] * 2  # int64: no cast
        # The gathers' readers read the lookups now; nothing reads the gathers.
        assert m.rows.op.inputs[0] is lookups.reads[0][1]
        assert second.op.inputs[0] is lookups.reads[1][1]
        assert not any(t.consumers() for op in old_gathers for t in op.outputs)
        assert applied.built_by("gather_to_lookup").count("GraphmodTableFindOrInsert") == 2
        assert applied.built_by("gather_to_lookup").count("GraphmodTable") == 1
        # The static shape read is a constant: the variable is never initialized now.
        assert shape.op.inputs[0].op.type == "Const"

        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            a, b, s = sess.run([m.rows, second, shape], {m.ids: [3, 5, 3], other_ids: [6]})
            held = exported(sess, the_table(g))
        assert sorted(held) == [3, 5, 6]  # training lookups insert the ids they read
        np.testing.assert_array_equal(a, [held[3], held[5], held[3]])
        np.testing.assert_array_equal(b, [held[6]])
        assert not np.allclose(held[3], held[5])  # rows of their own (seeded normal)
        assert s.tolist() == [8, 2]


def test_outside_training_lookups_only_find():
    """An evaluation graph reads the table and never inserts (no optimizer needed)."""
    with tf.Graph().as_default() as g:
        m = tiny_model(initializer=tf1.random_normal_initializer(seed=3))
        applied = apply_rules(g, *READING_RULES, training=False)
        lookups = applied.context.built(Lookups, applied.only())
        assert [rows.op.type for _, rows in lookups.reads] == ["GraphmodTableFind"]
        assert lookups.table.num_slots == 0
        assert "GraphmodTableFindOrInsert" not in applied.built_by("gather_to_lookup")
        with tf1.Session() as sess:
            rows = sess.run(m.rows, {m.ids: [4, 6, 4]})
            size = sess.run(lookups.table.size())
        assert size == 0
        np.testing.assert_array_equal(rows[0], rows[2])  # an unseen id reads its initial row
        assert not np.allclose(rows[0], rows[1])


def test_a_fused_sparse_segment_read_combines_the_looked_up_rows():
    """embedding_lookup_sparse on a reference variable reads rows with one
    SparseSegmentSum straight from the variable: the lookup reads the rows of
    its ids, and the same segment op sums them."""
    with tf.Graph().as_default() as g:
        emb = tf1.get_variable("emb", [8, 2], initializer=tf1.random_normal_initializer(seed=1),
                               use_resource=False)
        sparse = tf1.sparse_placeholder(tf.int64)
        combined = tf.identity(tf1.nn.embedding_lookup_sparse(emb, sparse, None, combiner="sum"))
        applied = apply_rules(g, *READING_RULES, training=False)
        (c,) = applied.conversions
        assert [x.op.type for x in c.gathers] == ["SparseSegmentSum"]
        built = applied.built_by("gather_to_lookup")
        assert built.count("GraphmodTableFind") == 1 and built.count("SparseSegmentSum") == 1
        lookups = applied.context.built(Lookups, c)
        assert combined.op.inputs[0].op.type == "SparseSegmentSum"
        assert combined.op.inputs[0].op.inputs[0] is lookups.reads[0][1]  # over the looked-up rows
        table = lookups.table
        single = ops.graphmod_table_find(table.handle, tf.constant([1, 2], tf.int64), dim=2)
        feed = {sparse: tf1.SparseTensorValue([[0, 0], [0, 1], [1, 0]], [1, 2, 2], [2, 2])}
        with tf1.Session() as sess:
            out, rows = sess.run([combined, single], feed)
        np.testing.assert_allclose(out, [rows[0] + rows[1], rows[1]], rtol=1e-6)


def _refusal(build) -> str:
    with tf.Graph().as_default() as g:
        build()
        c = only_conversion(g, training=False)
        with pytest.raises(Refused) as e:
            gather_to_lookup.check(c, context_for(g, training=False))
        return str(e.value)


def test_refuses_a_gather_with_batch_dims():
    def build():
        emb = tf1.get_variable("emb", [8, 2], use_resource=True)
        tf.raw_ops.ResourceGather(resource=emb.handle, indices=tf.zeros([8, 1], tf.int64),
                                  dtype=tf.float32, batch_dims=1, name="batched")
    assert _refusal(build) == "batched gathers with batch_dims"


def test_refuses_a_gather_on_another_axis():
    def build():
        emb = tf1.get_variable("emb", [8, 2], use_resource=True)
        tf.gather(emb.value(), tf.constant([1]), axis=1, name="columns")
    assert _refusal(build) == "columns gathers along an axis other than 0"


def test_refuses_non_integer_ids():
    """TF's gathers take integer ids only, so the planner's fact is made by
    hand here: the check itself must refuse what it cannot key a table by."""
    with tf.Graph().as_default() as g:
        m = tiny_model()
        c = only_conversion(g, training=False)
        gather = c.gathers[0]
        floats = dataclasses.replace(c, gathers=[Gather(gather.op, tf.cast(m.ids, tf.float32))])
        with pytest.raises(Refused, match="^embedding_lookup has float32 ids$"):
            gather_to_lookup.check(floats, context_for(g, training=False))
        assert gather_to_lookup.check(c, context_for(g, training=False)) is None  # int64: accepted
