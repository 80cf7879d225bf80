"""saver_swap: converted variables, their slots and their dense summaries leave the collections."""
import tensorflow as tf

from graphmod.rewrite_rules import saver_swap

from .helpers import READING_RULES, TRAINING_RULES, apply_rules, tiny_model

tf1 = tf.compat.v1
GLOBAL, TRAINABLE, SUMMARIES = (tf1.GraphKeys.GLOBAL_VARIABLES, tf1.GraphKeys.TRAINABLE_VARIABLES,
                                tf1.GraphKeys.SUMMARIES)


def _model():
    """emb [8, 2] (converted) and w [3, 1] (dense: under min_rows), both
    trained by Adagrad; a histogram summary of emb's whole value."""
    m = tiny_model()
    w = tf1.get_variable("w", [3, 1], use_resource=True)
    loss = m.loss + tf.reduce_sum(w)
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss)
    histogram = tf1.summary.histogram("emb_values", m.variable)
    return m, w, train, histogram


def test_a_converted_variable_and_its_slots_leave_the_collections():
    with tf.Graph().as_default() as g:
        m, w, _, histogram = _model()
        emb_slot, w_slot = [v for v in tf1.global_variables() if "Adagrad" in v.op.name]
        applied = apply_rules(g, *TRAINING_RULES, saver_swap)
        c = applied.only()
        assert c.update.slots == [emb_slot] and c.summaries == [histogram.op]
        assert tf1.global_variables() == [w, w_slot]
        assert tf1.trainable_variables() == [w]
        assert histogram not in g.get_collection(SUMMARIES)
        # variable and Adagrad accumulator: 8 x 2 float32 each
        assert applied.reported("dense_bytes_freed") == 2 * 8 * 2 * 4
        assert applied.built_by("saver_swap") == []  # it builds nothing
        assert applied.rw.summary()["saver_swap"] == {"collection_remove": 4}  # 2 + 1 + 1
        del m


def test_outside_training_the_slots_leave_too():
    """Evaluation graphs restore a table without its optimizer slots."""
    with tf.Graph().as_default() as g:
        _, w, _, _ = _model()
        w_slot = next(v for v in tf1.global_variables() if v.op.name == "w/Adagrad")
        applied = apply_rules(g, *READING_RULES, saver_swap, training=False)
        assert tf1.global_variables() == [w, w_slot]
        assert applied.reported("dense_bytes_freed") == 2 * 8 * 2 * 4


def test_undo_puts_everything_back():
    with tf.Graph().as_default() as g:
        _, _, _, histogram = _model()
        before = {k: list(g.get_collection(k)) for k in (GLOBAL, TRAINABLE, SUMMARIES)}
        applied = apply_rules(g, *TRAINING_RULES, saver_swap)
        applied.rw.undo()
        assert {k: list(g.get_collection(k)) for k in before} == before
        assert histogram in g.get_collection(SUMMARIES)
