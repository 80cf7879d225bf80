"""dense_reads: a graph that does not train a converted variable may read it whole: it
reads the table's rows for ids 0..rows-1."""
import numpy as np
import tensorflow as tf

from graphmod.rewrite import pipeline, plan_file
from graphmod.rewrite_rules import RULES, dense_reads
from graphmod.rewrite_rules.dense_reads import DenseRead
from graphmod.rewrite_rules.gather_to_lookup import Lookups

from .helpers import READING_RULES, apply_rules, settings, tiny_model

tf1 = tf.compat.v1
SEED = tf1.random_normal_initializer(seed=5)


def _trained_plan(model_dir) -> dict:
    """The plan a training graph of the tiny model saves in model_dir."""
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1), initializer=SEED)
        pipeline.rewrite(g, settings(), "train", rules=RULES, model_dir=str(model_dir))
    return plan_file.read(str(model_dir))


def _scoring_graph():
    """An evaluation graph that scores a user vector against every row of emb
    (a full softmax) beside the ordinary lookup."""
    m = tiny_model(initializer=SEED)
    user = tf1.placeholder(tf.float32, [1, 2])
    scores = tf.matmul(user, m.variable, transpose_b=True, name="scores")
    return m, user, scores


def test_a_whole_read_reads_the_tables_rows_of_ids_0_to_rows(tmp_path):
    replay = _trained_plan(tmp_path)
    with tf.Graph().as_default() as g:
        m, user, scores = _scoring_graph()
        applied = apply_rules(g, *READING_RULES, dense_reads, training=False, replay=replay)
        c = applied.only()
        assert [t.op.type for t in c.dense_reads] == ["ReadVariableOp"]
        rows = applied.context.built(DenseRead, c).rows
        assert rows.op.type == "EnsureShape" and rows.shape.as_list() == [8, 2]
        assert scores.op.inputs[1] is rows  # the matmul reads the table's rows now
        built = applied.built_by("dense_reads")
        assert {"Range", "GraphmodTableFind", "EnsureShape"} <= set(built)
        assert built.count("GraphmodTableFind") == 1
        vector = np.array([[1.0, -2.0]], np.float32)
        with tf1.Session() as sess:
            got, whole = sess.run([scores, rows], {user: vector})
            looked_up = sess.run(m.rows, {m.ids: np.arange(8)})
            size = sess.run(applied.context.built(Lookups, c).table.size())
        np.testing.assert_array_equal(whole, looked_up)  # row i is the lookup of id i
        np.testing.assert_allclose(got, vector @ looked_up.T, rtol=1e-6)
        assert not np.allclose(looked_up[0], looked_up[1])
        assert size == 0  # reading whole inserts nothing


def test_a_graph_without_whole_reads_gets_nothing(tmp_path):
    replay = _trained_plan(tmp_path)
    with tf.Graph().as_default() as g:
        tiny_model(initializer=SEED)
        applied = apply_rules(g, *READING_RULES, dense_reads, training=False, replay=replay)
        assert applied.only().dense_reads == []
        assert applied.context.built(DenseRead, applied.only()) is None
        assert applied.built_by("dense_reads") == []
