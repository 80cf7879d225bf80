"""optimizer_updates: a converted variable's optimizer update becomes the table's apply."""
import numpy as np
import pytest
import tensorflow as tf

from graphmod.rewrite.rule import Refused
from graphmod.rewrite_rules import optimizer_updates
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Apply

from .helpers import (TRAINING_RULES, apply_rules, context_for, exported, exported_slots,
                      only_conversion, settings, the_table, tiny_model)

tf1 = tf.compat.v1

# name -> (optimizer factory, kind, hyper-parameters the apply takes, slot initial values)
OPTIMIZERS = {
    "sgd": (lambda: tf1.train.GradientDescentOptimizer(0.25), "sgd", [0.25], ()),
    "adagrad": (lambda: tf1.train.AdagradOptimizer(0.25, initial_accumulator_value=0.3),
                "adagrad", [0.25, 0.0], (0.3,)),
    "momentum": (lambda: tf1.train.MomentumOptimizer(0.25, 0.75, use_nesterov=True),
                 "momentum", [0.25, 0.75], (0.0,)),
    "ftrl": (lambda: tf1.train.FtrlOptimizer(0.25, learning_rate_power=-0.5,
                                             l1_regularization_strength=0.01,
                                             l2_regularization_strength=0.02),
             "ftrl", [0.25, 0.01, 0.02, 0.0, -0.5], (0.1, 0.0)),
    "rmsprop": (lambda: tf1.train.RMSPropOptimizer(0.25, decay=0.8, momentum=0.5, epsilon=1e-3),
                "rmsprop", [0.25, 0.8, 0.5, 1e-3], (1.0, 0.0)),
    "adam": (lambda: tf1.train.AdamOptimizer(0.25, 0.8, 0.9, 1e-4), "adam",
             [0.25, 0.8, 0.9, 1e-4, 0.8, 0.9], (0.0, 0.0)),  # beta powers start at the betas
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_match_is_the_updates_translation(name):
    make, kind, hparams, slot_init = OPTIMIZERS[name]
    with tf.Graph().as_default() as g:
        m = tiny_model(make())
        c = only_conversion(g)
        context = context_for(g)
        translation = optimizer_updates.check(c, context)
        assert translation.kind == kind
        assert translation.nesterov == (name == "momentum")
        assert not translation.dense  # a sparse update
        assert translation.layout.slot_init == pytest.approx(slot_init)
        assert translation.slot_vars == c.update.slots and len(c.update.slots) == len(slot_init)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            values = sess.run([h if isinstance(h, tf.Tensor) else tf.constant(h)
                               for h in translation.hparams])
        assert values == pytest.approx(hparams)
        if kind == "adam":  # the approximation it accepts, reported
            assert context.approximations == {"emb": [optimizer_updates.LAZY_ADAM]}
        else:
            assert context.approximations == {}
        del m


def _train(make, rewrite: bool, steps):
    """{id: row} and {id: [slot rows]} of ids 1, 2, 5 after steps of the tiny
    model, with its variable converted (the table's) or dense (the variable's)."""
    ids = (1, 2, 5)
    with tf.Graph().as_default() as g:
        m = tiny_model(make())
        if rewrite:
            apply_rules(g, *TRAINING_RULES)
        # the optimizer's slots of emb, in creation order (the table's slot order)
        slot_vars = [v for v in tf1.global_variables()
                     if v is not m.variable and v.shape == m.variable.shape]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for batch in steps:
                sess.run(m.train, {m.ids: batch})
            if rewrite:
                rows, slots = exported(sess, the_table(g)), exported_slots(sess, the_table(g))
                return {k: rows[k] for k in ids}, {k: slots[k] for k in ids}
            dense, dense_slots = sess.run([m.variable, slot_vars])
            return ({k: dense[k] for k in ids},
                    {k: np.array([s[k] for s in dense_slots]).reshape([-1, 2]) for k in ids})


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_apply_moves_rows_as_the_dense_update_does(name):
    """Two steps (id 1 twice in the first batch: gradients summed; id 5 only in
    the second): every row read moves exactly as the dense variable's, slots
    included. Adam is lazy on a table: a row the last batch did not read keeps
    its value, where dense Adam's decaying moments move it on."""
    make = OPTIMIZERS[name][0]
    steps = [[1, 2, 1], [2, 5]]
    rows, slots = _train(make, True, steps)
    dense_rows, dense_slots = _train(make, False, steps)
    for k in (2, 5) if name == "adam" else (1, 2, 5):
        np.testing.assert_allclose(rows[k], dense_rows[k], rtol=1e-5, err_msg=f"row {k}")
        np.testing.assert_allclose(slots[k], dense_slots[k], rtol=1e-5, err_msg=f"slots {k}")
    if name == "adam":
        assert not np.allclose(rows[1], dense_rows[1])
    assert not np.allclose(rows[1], 0.5) and not np.allclose(rows[5], 0.5)  # rows moved


def test_the_train_op_waits_for_the_apply_instead_of_the_update():
    with tf.Graph().as_default() as g:
        m = tiny_model(tf1.train.AdagradOptimizer(0.1))
        old = only_conversion(g).update.update_op
        assert old in m.train.control_inputs
        applied = apply_rules(g, *TRAINING_RULES)
        c = applied.only()
        apply = applied.context.built(Apply, c).op
        assert apply.type == "GraphmodTableApply"
        assert apply.get_attr("optimizer") == b"adagrad" and not apply.get_attr("by_address")
        assert apply.inputs[0] is applied.context.built(Lookups, c).table.handle
        assert apply in m.train.control_inputs and old not in m.train.control_inputs
        # keyed by the ids the lookup read (the gradient's indices), rows [n, dim]
        assert apply.inputs[2].shape.as_list() == [None, 2]
        assert "GraphmodTableApply" in applied.built_by("optimizer_updates")


def test_variables_of_one_optimizer_share_one_hyper_parameter_vector():
    with tf.Graph().as_default() as g:
        a = tiny_model(name="a")
        b = tiny_model(name="b")
        tf1.train.AdagradOptimizer(0.1).minimize(a.loss + b.loss)
        applied = apply_rules(g, *TRAINING_RULES)
        assert len(applied.conversions) == 2
        applies = [applied.context.built(Apply, c).op for c in applied.conversions]
        assert applies[0].inputs[3] is applies[1].inputs[3]
        assert applied.built_by("optimizer_updates").count("Pack") == 1


def test_outside_training_there_is_nothing_to_translate():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        c = only_conversion(g, training=False)
        assert optimizer_updates.check(c, context_for(g, training=False)) is None
        applied = apply_rules(g, *TRAINING_RULES, training=False)
        assert applied.context.built(Apply, applied.only()) is None
        assert applied.built_by("optimizer_updates") == []


@pytest.mark.parametrize("make, exact, reason", [
    (lambda: tf1.train.RMSPropOptimizer(0.1, centered=True), False,
     "^centered RMSProp has no table equivalent$"),
    (lambda: tf1.train.AdadeltaOptimizer(0.1), False, "^ApplyAdadelta has no table equivalent$"),
    (lambda: tf1.train.ProximalAdagradOptimizer(0.1), False,
     "^ApplyProximalAdagrad has no table equivalent$"),
    (lambda: tf1.train.AdamOptimizer(0.1), True,
     r"^its Adam update would become lazy Adam on a table \(exact=True keeps it dense\)$"),
], ids=["centered-rmsprop", "adadelta", "proximal-adagrad", "adam-exact"])
def test_refuses_updates_a_table_cannot_follow(make, exact, reason):
    with tf.Graph().as_default() as g:
        tiny_model(make())
        c = only_conversion(g)
        with pytest.raises(Refused, match=reason):
            optimizer_updates.check(c, context_for(g, exact=exact))
        # Run as the pipeline runs it, the variable stays dense with that reason.
        applied = apply_rules(g, *TRAINING_RULES, rewrite_settings=settings(exact=exact))
        assert applied.conversions == [] and list(applied.refused) == ["emb"]
        assert applied.rw.record()["built"] == {}

