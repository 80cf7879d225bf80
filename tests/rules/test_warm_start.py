"""warm_start: a variable warm-started from checkpoint rows starts its table from them."""
import numpy as np
import tensorflow as tf

from graphmod.rewrite_rules import warm_start

from .helpers import TRAINING_RULES, apply_rules, exported, the_table, tiny_model

tf1 = tf.compat.v1
ROWS = np.arange(16, dtype=np.float32).reshape(8, 2) / 10  # row i: [i/5, i/5 + 0.1]
FLAG = "graphmod/emb/graphmod_warm_started"


def _checkpoint(directory) -> str:
    with tf.Graph().as_default():
        tf1.get_variable("emb", initializer=ROWS, use_resource=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return tf1.train.Saver().save(sess, str(directory / "source.ckpt"))


def _warm_started_model(path):
    m = tiny_model(tf1.train.AdagradOptimizer(0.1))
    tf1.train.init_from_checkpoint(path, {"emb": "emb"})
    return m


def test_the_table_starts_from_the_checkpoints_rows(tmp_path):
    path = _checkpoint(tmp_path)
    with tf.Graph().as_default() as g:
        m = _warm_started_model(path)
        applied = apply_rules(g, *TRAINING_RULES, warm_start)
        c = applied.only()
        assert c.warm_start is not None and c.warm_start.op.type == "RestoreV2"
        flag = next(v for v in tf1.global_variables() if v.op.name == FLAG)
        assert {"GraphmodTableImport", "VarHandleOp"} <= set(applied.built_by("warm_start"))
        assert not applied.refused  # it refuses nothing
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())  # runs the flag's import
            held = exported(sess, the_table(g))
            read = sess.run(m.rows, {m.ids: [3, 6]})
            assert sess.run(flag)
    assert sorted(held) == list(range(8))
    for k in range(8):  # every id its own checkpoint row, not a shared one
        np.testing.assert_array_equal(held[k], ROWS[k])
    np.testing.assert_array_equal(read, ROWS[[3, 6]])


def test_a_restore_of_a_model_checkpoint_without_the_flag_builds_nothing(tmp_path):
    """A model_dir checkpoint (written before the warm start) restores the
    table: no import is built. With the flag in it, the import is built (and
    the Saver restores the flag, so it never runs)."""
    path = _checkpoint(tmp_path)
    with tf.Graph().as_default() as g:
        _warm_started_model(path)
        applied = apply_rules(g, *TRAINING_RULES, warm_start,
                              checkpoint_names=frozenset({"emb-keys", "emb-values"}))
        assert applied.built_by("warm_start") == []
        assert FLAG not in [v.op.name for v in tf1.global_variables()]
    with tf.Graph().as_default() as g:
        _warm_started_model(path)
        applied = apply_rules(g, *TRAINING_RULES, warm_start,
                              checkpoint_names=frozenset({"emb-keys", FLAG}))
        assert "GraphmodTableImport" in applied.built_by("warm_start")


def test_a_variable_without_a_warm_start_gets_nothing():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *TRAINING_RULES, warm_start)
        assert applied.only().warm_start is None
        assert applied.built_by("warm_start") == []
