"""l2_penalties: tf.nn.l2_loss(variable) becomes the penalty of the distinct rows read."""
import numpy as np
import pytest
import tensorflow as tf

from graphmod.rewrite.rule import Refused
from graphmod.rewrite_rules import l2_penalties
from graphmod.rewrite_rules.l2_penalties import PenaltyGrads
from graphmod.rewrite_rules.optimizer_updates import Apply

from .helpers import (READING_RULES, TRAINING_RULES, apply_rules, context_for, exported,
                      only_conversion, settings, the_table, tiny_model)

tf1 = tf.compat.v1
LR, SCALE = 0.5, 0.1


def _penalised(optimizer=None):
    """The tiny model plus SCALE * l2_loss(emb) (a dense gradient term)."""
    m = tiny_model()
    penalty = tf.nn.l2_loss(m.variable, name="penalty")
    loss = tf.identity(m.loss + SCALE * penalty, name="loss")
    train = optimizer.minimize(loss) if optimizer is not None else None
    return m, penalty, loss, train


def test_matches_the_penalty_and_its_gradient_term():
    with tf.Graph().as_default() as g:
        _, penalty, _, _ = _penalised(tf1.train.GradientDescentOptimizer(LR))
        c = only_conversion(g)
        assert c.penalties == [penalty.op]
        assert len(c.update.penalty_grads) == 1  # the planner split x * g off the gradient
        context = context_for(g)
        assert l2_penalties.check(c, context) is None
        assert context.approximations == {"emb": [l2_penalties.APPROXIMATION]}


def test_the_penalty_covers_the_distinct_rows_read_and_trains_them():
    """ids [1, 2, 1]: the penalty is l2 over rows 1 and 2 once each; the step
    moves rows 1 and 2 as the dense SGD step does (weights' gradient plus
    SCALE * row); row 3, not read, gets no penalty gradient (the dense step
    would shrink it: the approximation)."""
    with tf.Graph().as_default() as g:
        m, penalty, loss, train = _penalised(tf1.train.GradientDescentOptimizer(LR))
        reader = tf.identity(penalty)  # what reads the penalty
        applied = apply_rules(g, *TRAINING_RULES)
        c = applied.only()
        parts = applied.context.built(PenaltyGrads, c).parts
        assert len(parts) == 1  # [(rows * g, keys)] for optimizer_updates
        assert "L2Loss" in applied.built_by("l2_penalties")
        assert "Unique" in applied.built_by("l2_penalties")
        assert reader.op.inputs[0].op.type == "L2Loss" and reader.op.inputs[0] is not penalty
        apply = applied.context.built(Apply, c).op
        assert apply.get_attr("optimizer") == b"sgd"
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            before = sess.run(m.rows, {m.ids: [1, 2]})  # inserts rows 1, 2 and reads them
            value = sess.run(reader, {m.ids: [1, 2, 1]})
            sess.run(train, {m.ids: [1, 2, 1]})
            after = exported(sess, the_table(g))
    np.testing.assert_allclose(value, 0.5 * np.sum(before ** 2), rtol=1e-6)  # rows 1, 2 once
    weights = np.arange(1, 7, dtype=np.float32).reshape(3, 2)  # tiny_model's loss weights
    grad = {1: weights[0] + weights[2] + SCALE * before[0], 2: weights[1] + SCALE * before[1]}
    np.testing.assert_allclose(after[1], before[0] - LR * grad[1], rtol=1e-6)
    np.testing.assert_allclose(after[2], before[1] - LR * grad[2], rtol=1e-6)
    assert sorted(after) == [1, 2]  # row 3 was never read: not in the table, no penalty


def test_outside_training_only_the_forward_penalty_changes():
    with tf.Graph().as_default() as g:
        m, penalty, _, _ = _penalised()
        reader = tf.identity(penalty)
        applied = apply_rules(g, *READING_RULES, l2_penalties, training=False)
        c = applied.only()
        assert applied.context.built(PenaltyGrads, c) is None  # no gradient parts
        with tf1.Session() as sess:
            rows, value = sess.run([m.rows, reader], {m.ids: [4, 4]})
        np.testing.assert_allclose(value, 0.5 * np.sum(rows[0] ** 2), rtol=1e-6)


def test_a_variable_without_a_penalty_is_left_alone():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.GradientDescentOptimizer(LR))
        c = only_conversion(g)
        context = context_for(g, exact=True)
        assert l2_penalties.check(c, context) is None and context.approximations == {}
        applied = apply_rules(g, *TRAINING_RULES)
        assert applied.built_by("l2_penalties") == []
        assert applied.context.built(PenaltyGrads, applied.only()) is None


def test_refuses_under_exact():
    with tf.Graph().as_default() as g:
        _penalised(tf1.train.GradientDescentOptimizer(LR))
        c = only_conversion(g)
        with pytest.raises(Refused, match=r"^an L2 penalty over the whole variable "
                                          r"\(tf.nn.l2_loss\) would cover only the rows each "
                                          r"step reads \(exact=True keeps it dense\)$"):
            l2_penalties.check(c, context_for(g, exact=True))
        applied = apply_rules(g, *TRAINING_RULES, rewrite_settings=settings(exact=True))
        assert applied.conversions == [] and "L2 penalty" in applied.refused["emb"]
        # A graph that does not train it reads the penalty of the rows read, also when exact.
        c = only_conversion(g, training=False)
        assert l2_penalties.check(c, context_for(g, training=False, exact=True)) is None
