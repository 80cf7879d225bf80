"""A graph's mode (train, eval, predict) is read from the graph, not from
the names of the methods that built it."""
import json

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.rewrite.mode import graph_mode

tf1 = tf.compat.v1
VOCAB = 64
DIM = 4


def model_fn(features, labels, mode):
    """Builds its loss and optimizer in every mode, as some models do."""
    emb = tf1.get_variable("emb", [VOCAB, DIM],
                           initializer=tf1.truncated_normal_initializer(stddev=0.1, seed=1))
    e = tf.reshape(tf.nn.embedding_lookup(emb, features["ids"]), [-1, 2 * DIM])
    logits = tf.squeeze(tf1.layers.dense(e, 1, name="out"), 1)
    target = labels if labels is not None else tf.zeros_like(logits)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=target, logits=logits))
    train = tf1.train.AdagradOptimizer(0.5).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train, predictions={"p": tf.sigmoid(logits), "emb": e},
        eval_metric_ops={"mean_p": tf1.metrics.mean(tf.sigmoid(logits))})


class HelperEstimator(tf.estimator.Estimator):
    """An Estimator subclass with a helper around predict, as users write them."""

    def predict_all(self, input_fn, hooks):
        return np.concatenate([p["emb"] for p in self.predict(input_fn, hooks=hooks,
                                                               yield_single_examples=False)])


def input_fn(ids, labels=None):
    data = ({"ids": ids}, labels) if labels is not None else {"ids": ids}
    return lambda: tf.data.Dataset.from_tensor_slices(data).batch(32)


@pytest.mark.slow
def test_mode_comes_from_the_graph_not_from_the_methods_names(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(256, 2))
    labels = (ids[:, 0] % 2).astype(np.float32)
    est = HelperEstimator(model_fn, model_dir=str(tmp_path))
    hook = graphmod.GraphModifierHook(min_rows=32)
    est.train(input_fn(ids, labels), steps=8, hooks=[hook])
    assert hook.report.graph == "train" and [t["table"] for t in hook.report.tables] == ["emb"]
    out = tmp_path / "graphmod"
    trained = (out / "rewrite_report_train.json").read_text()
    assert json.loads(trained)["tables"][0]["optimizer"] == "adagrad"

    hook = graphmod.GraphModifierHook()
    est.evaluate(input_fn(ids[:64], labels[:64]), hooks=[hook])
    assert hook.report.graph == "eval"

    query = np.concatenate([ids[:20], [[VOCAB + 3, 1]]])  # and an id no row ever held
    hook = graphmod.GraphModifierHook()
    helped = est.predict_all(input_fn(query), hooks=[hook])
    assert hook.report.graph == "predict"
    with open(out / "rewrite_report_predict.json") as f:
        predicted = json.load(f)
    assert predicted["graph"] == "predict" and predicted["tables"][0]["optimizer"] is None
    assert (out / "rewrite_report_train.json").read_text() == trained
    plain = np.concatenate([p["emb"] for p in est.predict(
        input_fn(query), hooks=[graphmod.GraphModifierHook()], yield_single_examples=False)])
    np.testing.assert_array_equal(helped, plain)


def test_a_plain_graph_trains_when_it_holds_an_optimizer_step():
    with tf.Graph().as_default() as graph:
        w = tf1.get_variable("w", [3])
        loss = tf.reduce_sum(w * w)
        assert graph_mode(graph, estimator=False) == "predict"
        assert graph_mode(graph, estimator=True) == "predict"
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        assert graph_mode(graph, estimator=False) == "train"
        # An Estimator's model_fn may build its optimizer in predict mode too.
        assert graph_mode(graph, estimator=True) == "predict"
        # An evaluation loop (Estimator.evaluate's too) counts its steps so:
        tf1.Variable(0, trainable=False, name="eval_step",
                     collections=[tf1.GraphKeys.LOCAL_VARIABLES, tf1.GraphKeys.EVAL_STEP])
        assert graph_mode(graph, estimator=False) == graph_mode(graph, estimator=True) == "eval"
