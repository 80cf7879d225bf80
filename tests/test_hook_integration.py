"""The hook where Estimator users put it: an Estimator subclass (as NPUEstimator
subclasses Estimator), train_and_evaluate, and MonitoredTrainingSession used
directly."""
import os

import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow
VOCAB = 20_000
RNG = np.random.default_rng(5)
POOL = RNG.choice(3 * VOCAB, 500, replace=False)  # ids beyond the variable's rows, folded below
IDS = POOL[RNG.integers(0, len(POOL), size=(2048, 2))]
LABELS = np.isin(IDS[:, 0], POOL[:250]).astype(np.float32)  # a per-id label: learnable


def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"ids": IDS}, LABELS)).repeat().batch(128)


def model_fn(features, labels, mode):
    emb = tf1.get_variable("emb", [VOCAB, 4], initializer=tf1.truncated_normal_initializer(0.1))
    e = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"] % VOCAB), 1)
    logits = tf.reduce_sum(e, 1)  # no dense layer: the embeddings carry the label
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf1.train.AdagradOptimizer(1.0).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                      eval_metric_ops={"auc": tf1.metrics.auc(labels, tf.sigmoid(logits))})


class SubclassedEstimator(tf.estimator.Estimator):
    """Adds behaviour around the model_fn, as vendor Estimators do."""

    def __init__(self, model_dir):
        super().__init__(model_fn, model_dir=model_dir)


def test_estimator_subclass(tmp_path):
    est = SubclassedEstimator(str(tmp_path))
    hook = graphmod.GraphModifierHook()
    est.train(input_fn, steps=60, hooks=[hook])
    assert hook.report.graph == "train" and [t["table"] for t in hook.report.tables] == ["emb"]
    assert os.path.exists(tmp_path / "graphmod" / "rewrite_report_train.json")
    assert not list((tmp_path / "graphmod").glob("*.tmp"))  # written aside, then renamed
    keys = tf.train.load_checkpoint(str(tmp_path)).get_tensor("emb-keys")
    assert keys.max() >= VOCAB  # collision-free: the raw ids, not ids % VOCAB
    assert est.evaluate(input_fn, steps=4, hooks=[graphmod.GraphModifierHook()])["auc"] > 0.6


def test_train_and_evaluate(tmp_path):
    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path),
                                 config=tf.estimator.RunConfig(save_checkpoints_steps=40))
    train = tf.estimator.TrainSpec(input_fn, max_steps=80, hooks=[graphmod.GraphModifierHook()])
    evaluate = tf.estimator.EvalSpec(input_fn, steps=4, hooks=[graphmod.GraphModifierHook()],
                                     throttle_secs=0)
    metrics, _ = tf.estimator.train_and_evaluate(est, train, evaluate)
    assert metrics["global_step"] == 80 and metrics["auc"] > 0.6
    names = {n for n, _ in tf.train.list_variables(str(tmp_path))}
    assert "emb-keys" in names and "emb" not in names


def test_monitored_training_session_directly(tmp_path):
    def build():
        step = tf1.train.get_or_create_global_step()
        (features, labels) = tf1.data.make_one_shot_iterator(input_fn()).get_next()
        spec = model_fn(features, labels, tf.estimator.ModeKeys.TRAIN)
        return spec.train_op, step

    with tf.Graph().as_default():
        train, step = build()
        hook = graphmod.GraphModifierHook()
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=[hook],
                                                save_checkpoint_steps=30) as sess:
            for _ in range(30):
                sess.run(train)
    first = tf.train.load_checkpoint(str(tmp_path)).get_tensor("emb-values")
    assert first.shape[0] > 0 and hook.report.tables[0]["table"] == "emb"
    with tf.Graph().as_default():  # resumes: the table comes back from the checkpoint
        train, step = build()
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path),
                                                hooks=[graphmod.GraphModifierHook()]) as sess:
            assert sess.run(step) == 30
            sess.run(train)
