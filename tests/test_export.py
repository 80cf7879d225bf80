"""export_saved_model: the SavedModel of a hooked Estimator serves, in a fresh
process that imports graphmod, what estimator.predict returns."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow
VOCAB = 20_000


def model_fn(features, labels, mode):
    emb = tf1.get_variable("emb", [VOCAB, 4], initializer=tf1.truncated_normal_initializer(0.1))
    e = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), 1)
    logits = tf.squeeze(tf1.layers.dense(e, 1, kernel_initializer=tf1.ones_initializer()), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


SERVE = textwrap.dedent("""
    import json, sys, numpy as np, tensorflow as tf
    import graphmod  # loads the table ops
    tf1 = tf.compat.v1
    ids = np.array(json.loads(sys.argv[2]), np.int64)
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.load(sess, ["serve"], sys.argv[1])
        sig = meta.signature_def["serving_default"]
        out = sess.run(sig.outputs["p"].name, {sig.inputs["ids"].name: ids})
    print(json.dumps(out.tolist()))
""")


def test_exported_model_serves_the_estimators_predictions(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(512, 3))
    labels = (ids[:, 0] % 2).astype(np.float32)
    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    est.train(lambda: tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(64),
              steps=30, hooks=[graphmod.GraphModifierHook()])
    query = np.concatenate([ids[:6], [[VOCAB + 5, -3, 7]]])  # and ids no variable could hold
    expected = [p["p"] for p in est.predict(
        lambda: tf.data.Dataset.from_tensor_slices({"ids": query}).batch(7),
        hooks=[graphmod.GraphModifierHook()])]

    def receiver():
        ph = tf1.placeholder(tf.int64, [None, 3], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ph}, {"ids": ph})

    path = graphmod.export_saved_model(est, receiver, str(tmp_path / "export")).decode()
    served = subprocess.run([sys.executable, "-c", SERVE, path, json.dumps(query.tolist())],
                            capture_output=True, text=True, timeout=120)
    assert served.returncode == 0, served.stderr[-3000:]
    np.testing.assert_allclose(json.loads(served.stdout.strip().splitlines()[-1]), expected,
                               rtol=1e-6)
    variables = {n for n, _ in tf.train.list_variables(os.path.join(path, "variables", "variables"))}
    assert "emb-keys" in variables and "emb" not in variables
