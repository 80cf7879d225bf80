"""warm_start_sources: a fresh training start imports other models' checkpoints
(GraphModifierHook(warm_start=graphmod.WarmStartSettings(...)))."""
import numpy as np
import pytest
import tensorflow as tf

from graphmod.rewrite_rules import saver_swap, warm_start_sources
from graphmod.checkpoint.warm_start import WarmStartSettings

from .helpers import TRAINING_RULES, apply_rules, exported, the_table, tiny_model

tf1 = tf.compat.v1
RULES = TRAINING_RULES + (saver_swap, warm_start_sources)
ROWS = np.arange(16, dtype=np.float32).reshape(8, 2) / 10
W = np.array([[1.0], [2.0], [3.0]], np.float32)


def _source(directory) -> str:
    """Another model's dense checkpoint: 'item_emb' [8, 2] and 'w' [3, 1]."""
    with tf.Graph().as_default():
        tf1.get_variable("item_emb", initializer=ROWS, use_resource=True)
        tf1.get_variable("w", initializer=W, use_resource=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return tf1.train.Saver().save(sess, str(directory / "source.ckpt"))


def _model():
    m = tiny_model()
    w = tf1.get_variable("w", [3, 1], use_resource=True)
    train = tf1.train.AdagradOptimizer(0.1).minimize(m.loss + tf.reduce_sum(w))
    return m, w, train


def test_the_table_and_the_dense_variables_start_from_the_sources(tmp_path):
    settings = WarmStartSettings([_source(tmp_path)], mapping={"emb": "item_emb"})
    with tf.Graph().as_default() as g:
        m, w, _ = _model()
        applied = apply_rules(g, *RULES, warm_start=settings)
        assert len(applied.conversions) == 1 and not applied.refused
        assert applied.reported("warm_started") == ["emb", "w"]
        assert "graphmod_warm_start/done" in [v.op.name for v in tf1.global_variables()]
        # The rows are read a stored slice at a time, in a loop that imports each.
        built = applied.built_by("warm_start_sources")
        assert "GraphmodCheckpointRowSlices" in built and {"While", "StatelessWhile"} & set(built)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())  # the fresh start's initialization
            held = exported(sess, the_table(g))
            read, dense = sess.run([m.rows, w], {m.ids: [2, 7]})
    assert sorted(held) == list(range(8))
    for k in range(8):  # row i of the source's variable is key i
        np.testing.assert_array_equal(held[k], ROWS[k])
    np.testing.assert_array_equal(read, ROWS[[2, 7]])
    np.testing.assert_array_equal(dense, W)


def test_a_key_filter_keeps_the_keys_it_accepts(tmp_path):
    settings = WarmStartSettings([_source(tmp_path)], mapping={"emb": "item_emb"},
                                 key_filter=lambda table, keys: keys % 2 == 0)
    with tf.Graph().as_default() as g:
        _model()
        apply_rules(g, *RULES, warm_start=settings)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            assert sorted(exported(sess, the_table(g))) == [0, 2, 4, 6]


def test_without_warm_start_settings_it_builds_nothing():
    with tf.Graph().as_default() as g:
        _model()
        applied = apply_rules(g, *RULES)
        assert applied.reported("warm_started") == []
        assert applied.built_by("warm_start_sources") == []


def test_a_mapping_naming_nothing_in_the_graph_is_an_error(tmp_path):
    """It refuses nothing: a wrong mapping fails the rewrite (which the pipeline undoes)."""
    settings = WarmStartSettings([_source(tmp_path)], mapping={"user_emb": "item_emb"})
    with tf.Graph().as_default() as g:
        _model()
        with pytest.raises(ValueError, match="mapping names user_emb, which are neither tables "
                                             "nor trainable variables of this graph"):
            apply_rules(g, *RULES, warm_start=settings)
