"""Real client models, unchanged, trained with GraphModifierHook: DeepCTR 0.9.4's
Estimators and a tf-slim model_fn. Each trains, evaluates, predicts and resumes;
its checkpoint holds tables instead of the converted variables."""
import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod import data

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow

CFG = data.SyntheticCriteo(n_dense=2, n_categorical=3, vocab_sizes=(30_000, 20_000, 50),
                           seed=3, contiguous_ids=True)
TRAIN = data.input_fn(CFG, batch_size=256, num_examples=20_000, repeat=None)
EVAL = data.input_fn(CFG, batch_size=1024, num_examples=4096, start=20_000)


def check_estimator(est, tables_expected):
    hook = graphmod.GraphModifierHook()
    est.train(TRAIN, steps=120, hooks=[hook])
    names = {n for n, _ in tf.train.list_variables(est.model_dir)}
    for variable in tables_expected:
        assert f"{variable}-keys" in names and variable not in names, variable
    metrics = est.evaluate(EVAL, hooks=[graphmod.GraphModifierHook()])
    first = [p for p in est.predict(EVAL, hooks=[graphmod.GraphModifierHook()])][:64]
    again = [p for p in est.predict(EVAL, hooks=[graphmod.GraphModifierHook()])][:64]
    key = next(iter(first[0]))
    np.testing.assert_array_equal([p[key] for p in first], [p[key] for p in again])
    est.train(TRAIN, steps=20, hooks=[graphmod.GraphModifierHook()])  # resumes
    return hook.report, metrics


def deepctr_columns():
    fc = tf1.feature_column
    sparse = [fc.categorical_column_with_identity(c, n)
              for c, n in zip(CFG.categorical_names, CFG.vocab)]
    dense = [fc.numeric_column(c) for c in CFG.dense_names]
    linear = sparse + dense
    dnn = [fc.embedding_column(c, 8) for c in sparse] + dense
    return linear, dnn


@pytest.mark.parametrize("name", ["WDLEstimator", "DeepFMEstimator"])
def test_deepctr_estimator(tmp_path, name):
    deepctr_estimator = pytest.importorskip("deepctr.estimator")
    linear, dnn = deepctr_columns()
    est = getattr(deepctr_estimator, name)(linear, dnn, dnn_hidden_units=(32,),
                                           model_dir=str(tmp_path), l2_reg_linear=0.0)
    report, metrics = check_estimator(est, [])
    converted = {t["variable"] for t in report.tables}
    # The two big embedding columns become tables (the 50-id one is under min_rows).
    assert sum("C1" in v for v in converted) >= 1 and sum("C2" in v for v in converted) >= 1
    # DeepCTR's loss sums over the batch (1024): below log(2) per example means
    # it learned something.
    assert metrics["loss"] / 1024 < 0.69


def slim_model_fn(features, labels, mode):
    import tf_slim as slim
    ids = tf.concat([features[c] for c in CFG.categorical_names[:2]], 1)
    emb = slim.model_variable("slim_emb", shape=[30_000, 8],
                              initializer=tf1.truncated_normal_initializer(stddev=0.05))
    e = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 16])
    net = slim.fully_connected(e, 16)
    logits = tf.squeeze(slim.fully_connected(net, 1, activation_fn=None), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
    loss = tf1.losses.sigmoid_cross_entropy(tf.squeeze(labels, 1), logits)
    train_op = slim.learning.create_train_op(loss, tf1.train.AdagradOptimizer(0.1))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metric_ops={"auc": tf1.metrics.auc(tf.squeeze(labels, 1), tf.sigmoid(logits))})


def test_tf_slim_model(tmp_path):
    est = tf.estimator.Estimator(slim_model_fn, model_dir=str(tmp_path),
                                 config=tf.estimator.RunConfig(tf_random_seed=1))
    report, metrics = check_estimator(est, ["slim_emb"])
    assert [t["optimizer"] for t in report.tables] == ["adagrad"]
    assert metrics["auc"] > 0.53  # 120 steps on two features: a weak but real signal
