"""table_saver: the graph's Saver becomes a TableSaver, which adopts dense checkpoints."""
import numpy as np
import pytest
import tensorflow as tf

from graphmod.rewrite import pipeline
from graphmod.rewrite.rule import Refused, registry
from graphmod.rewrite_rules import optimizer_updates, saver_swap, table_saver
from graphmod.checkpoint.saver import TableSaver

from .helpers import (TRAINING_RULES, apply_rules, context_for, exported, exported_slots,
                      only_conversion, plan_graph, settings, the_table, tiny_model)

tf1 = tf.compat.v1
SAVERS = tf1.GraphKeys.SAVERS
DENSE = frozenset({"emb", "emb/Adagrad"})  # a checkpoint holding emb densely, with its slot
HOLDS = "(the checkpoint in model_dir holds it densely)"


def _deferred_saver():
    """The Saver an Estimator puts in SAVERS before the hooks run."""
    saver = tf1.train.Saver(sharded=True, defer_build=True, max_to_keep=3)
    tf1.add_to_collection(SAVERS, saver)
    return saver


def _check(graph, checkpoint_names, training=True, **fields):
    """table_saver.check of the graph's one conversion, after optimizer_updates'
    match (which names the slots), as the pipeline runs them."""
    c = only_conversion(graph, training=training)
    context = context_for(graph, training=training, checkpoint_names=checkpoint_names, **fields)
    context.build(optimizer_updates.check(c, context), c)
    return table_saver.check(c, context)


def test_accepts_a_variable_the_checkpoint_does_not_hold_densely():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        _deferred_saver()
        assert _check(g, frozenset()) is None  # no checkpoint
        assert _check(g, DENSE | {"emb-keys"}) is None  # it holds the table already
        assert _check(g, DENSE) is None  # adopted: nothing to refuse


def test_refuses_adopting_a_part_of_a_partitioned_variable():
    with tf.Graph().as_default() as g:
        ids = tf1.placeholder(tf.int64, [None])
        emb = tf1.get_variable("emb", [8, 2], partitioner=tf1.fixed_size_partitioner(2),
                               use_resource=True)
        tf.nn.embedding_lookup(emb, ids)
        conversions, _ = plan_graph(g, training=False, min_rows=2)
        assert [c.name for c in conversions] == ["emb/part_0", "emb/part_1"]
        for c in conversions:  # both parts are saved as slices of "emb"
            with pytest.raises(Refused, match=r"^adopting a part of a partitioned variable is "
                                              r"not built \(the checkpoint"):
                table_saver.check(c, context_for(g, training=False,
                                                 checkpoint_names=frozenset({"emb"})))


@pytest.mark.parametrize("names, fields, reason", [
    (frozenset({"emb"}), {}, "its optimizer slots emb/Adagrad are not in the checkpoint " + HOLDS),
    (DENSE, dict(scaffold_saver=True), "the model's Scaffold brings its own Saver, which "
                                       "cannot restore its table from the checkpoint " + HOLDS),
], ids=["missing-slot", "scaffold-saver"])
def test_refuses_what_cannot_adopt_the_checkpoints_rows(names, fields, reason):
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        _deferred_saver()
        with pytest.raises(Refused) as e:
            _check(g, names, **fields)
        assert str(e.value) == reason


def test_adopts_into_tables_split_across_horovod_ranks():
    """Each rank's part imports the keys it owns (tests/test_distributed.py
    adopts a dense 2-rank model_dir so)."""
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        _deferred_saver()
        assert _check(g, DENSE, ranks=2) is None


def test_refuses_adopting_when_the_savers_cannot_become_a_table_saver():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        _deferred_saver()
        _deferred_saver()
        with pytest.raises(Refused, match=r"^the graph has several Savers, which cannot restore "
                                          r"its table from the checkpoint"):
            _check(g, DENSE)
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        tf1.add_to_collection(SAVERS, _OwnSaver(defer_build=True))
        with pytest.raises(Refused, match=r"^the graph's Saver is built already, or is not a "
                                          r"tf.compat.v1.train.Saver, which cannot restore"):
            _check(g, DENSE)
        assert _check(g, frozenset()) is None  # nothing to adopt: it keeps that Saver


class _OwnSaver(tf1.train.Saver):
    """A model's own Saver class, which a TableSaver would not replace faithfully."""


def test_the_deferred_saver_becomes_a_table_saver_with_its_settings():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        old = _deferred_saver()
        applied = apply_rules(g, *TRAINING_RULES, table_saver)
        (saver,) = g.get_collection(SAVERS)
        assert type(saver) is TableSaver and saver is not old
        assert saver._max_to_keep == 3 and saver._sharded  # pylint: disable=protected-access
        assert saver.adoptions == [] and applied.reported("adopted") == []
        assert applied.rw.summary()["table_saver"] == {"collection_remove": 1, "collection_add": 1}


def test_a_saver_of_its_own_class_or_a_scaffolds_own_is_kept():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        own = _OwnSaver(defer_build=True)
        tf1.add_to_collection(SAVERS, own)
        applied = apply_rules(g, *TRAINING_RULES, table_saver)
        assert len(applied.conversions) == 1  # converted (its tables saved by that Saver)
        assert g.get_collection(SAVERS) == [own] and "table_saver" not in applied.rw.summary()
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *TRAINING_RULES, table_saver, scaffold_saver=True)
        assert g.get_collection(SAVERS) == [] and "table_saver" not in applied.rw.summary()


def _dense_checkpoint(directory, init, global_step: bool):
    """Trains the tiny model densely one step and saves it; returns the
    checkpoint's path, emb's rows and its Adagrad accumulator."""
    with tf.Graph().as_default():
        step = tf1.train.get_or_create_global_step() if global_step else None
        m = tiny_model(initializer=init)
        train = tf1.train.AdagradOptimizer(0.1).minimize(m.loss, step)
        slot = next(v for v in tf1.global_variables() if v.op.name == "emb/Adagrad")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {m.ids: [1, 2, 1]})
            rows, accum = sess.run([m.variable, slot])
            return tf1.train.Saver().save(sess, str(directory / "model.ckpt")), rows, accum


def _adopt(directory, init, global_step: bool):
    """The same model converted in a model_dir holding it densely (the pipeline
    reads the checkpoint's names); the TableSaver's restore; the table's
    rows, slots and the Saver."""
    path, rows, accum = _dense_checkpoint(directory, init, global_step)
    with tf.Graph().as_default() as g:
        step = tf1.train.get_or_create_global_step() if global_step else None
        m = tiny_model(initializer=init)
        tf1.train.AdagradOptimizer(0.1).minimize(m.loss, step)
        _deferred_saver()
        report = pipeline.rewrite(g, settings(), "train", model_dir=str(directory),
                                  rules=registry(*TRAINING_RULES, saver_swap, table_saver))
        assert report.adopted == ["emb"] and report.skipped == []
        (saver,) = g.get_collection(SAVERS)
        assert [(a.variable, a.slots, a.rows) for a in saver.adoptions] == [
            ("emb", ["emb/Adagrad"], 8)]
        with tf1.Session() as sess:
            saver.restore(sess, path)
            held, slots = exported(sess, the_table(g)), exported_slots(sess, the_table(g))
            restored_step = sess.run(step) if global_step else None
    return rows, accum, held, slots, restored_step


def test_adopts_the_rows_and_slots_of_a_dense_checkpoint(tmp_path):
    """The TableSaver's restore imports row i as key i, with its Adagrad
    accumulator, and restores the rest (the global step) as usual."""
    rows, accum, held, slots, step = _adopt(tmp_path, tf1.random_normal_initializer(seed=7),
                                            global_step=True)
    assert sorted(held) == list(range(8)) and step == 1
    for k in range(8):
        np.testing.assert_array_equal(held[k], rows[k])
        np.testing.assert_array_equal(slots[k][0], accum[k])
    assert not np.allclose(accum[1], accum[3])  # row 1 trained, row 3 not: slots differ


def test_adopts_a_checkpoint_that_holds_nothing_else(tmp_path):
    """The adopted table is the graph's only saveable: the Saver of everything
    else restores nothing (it once restored every saveable, the table included,
    from the dense checkpoint, and failed)."""
    _, _, held, _, _ = _adopt(tmp_path, tf1.random_normal_initializer(seed=7),
                              global_step=False)
    assert sorted(held) == list(range(8))
