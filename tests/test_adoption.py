"""Adopting graphmod on a model_dir trained with dense variables.

A model trains without the hook; the hook is then added to the same
model_dir. Its predictions right after adoption must equal the dense model's,
and training on must move every row exactly as the dense model's training on
(rows and optimizer slots adopted, not re-initialized): both continue from
copies of one checkpoint on the same batches and are compared number for
number, then again after a restart from the table checkpoint the adopted
model wrote.
"""
import os
import sys
import shutil

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.checkpoint.saver import Adoption, TableSaver

tf1 = tf.compat.v1
VOCAB, DIM, BATCH = 300, 4, 32


def data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(n, 2)).astype(np.int64)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    return ids, labels


def input_fn(hashed=False):
    ids, labels = data()
    feats = {"ids": ids.astype(str) if hashed else ids}
    return tf.data.Dataset.from_tensor_slices((feats, labels)).batch(BATCH)


def model_fn(features, labels, mode, params):
    ids = features["ids"]
    if params.get("hashed"):
        ids = tf.strings.to_hash_bucket_fast(ids, VOCAB)
    emb = tf1.get_variable("emb", [VOCAB, DIM],
                           initializer=tf1.random_normal_initializer(stddev=0.3))
    w = tf1.get_variable("w", initializer=np.linspace(-0.6, 0.8, 2 * DIM, dtype=np.float32)
                         .reshape(2 * DIM, 1))
    logits = tf.squeeze(tf.matmul(tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 2 * DIM]),
                                  w), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    tf1.add_to_collection("test_loss", loss)
    train_op = tf1.train.AdagradOptimizer(0.3).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class Losses(tf1.train.SessionRunHook):
    def __init__(self):
        self.values = []

    def before_run(self, ctx):
        return tf1.train.SessionRunArgs(tf1.get_collection("test_loss")[0])

    def after_run(self, ctx, values):
        self.values.append(values.results)


def estimator(model_dir, hashed=False):
    return tf.estimator.Estimator(model_fn, model_dir=str(model_dir),
                                  params={"hashed": hashed},
                                  config=tf.estimator.RunConfig(tf_random_seed=3))


def train(est, steps, hooks=(), hashed=False):
    losses = Losses()
    est.train(lambda: input_fn(hashed), steps=steps, hooks=[losses, *hooks])
    return np.array(losses.values)


def table_rows(model_dir, table="emb"):
    reader = tf.train.load_checkpoint(str(model_dir))
    keys = reader.get_tensor(f"{table}-keys")
    order = np.argsort(keys)
    return (keys[order], reader.get_tensor(f"{table}-values")[order],
            reader.get_tensor(f"{table}-slots")[order])


def test_adopted_model_predicts_and_trains_as_the_dense_model(tmp_path):
    dense_dir, hooked_dir = tmp_path / "dense", tmp_path / "hooked"
    dense = estimator(dense_dir)
    train(dense, 6)
    shutil.copytree(dense_dir, hooked_dir)
    hooked = estimator(hooked_dir)

    # Right after adoption: the same predictions.
    hook = graphmod.GraphModifierHook(min_rows=10)
    want = np.array([p["logits"] for p in dense.predict(input_fn)])
    got = np.array([p["logits"] for p in hooked.predict(input_fn, hooks=[hook])])
    assert hook.report.adopted == ["emb"], (hook.report.adopted, hook.report.skipped)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    # Training on: the same losses, rows and Adagrad accumulators.
    hook = graphmod.GraphModifierHook(min_rows=10)
    dense_losses = train(dense, 5)
    hooked_losses = train(hooked, 5, [hook])
    assert hook.report.adopted == ["emb"]
    assert [t["variable"] for t in hook.report.tables] == ["emb"]
    np.testing.assert_allclose(hooked_losses, dense_losses, rtol=1e-5, atol=1e-7)
    keys, values, slots = table_rows(hooked_dir)
    reader = tf.train.load_checkpoint(str(dense_dir))
    np.testing.assert_array_equal(keys, np.arange(VOCAB))  # every trained row adopted
    np.testing.assert_allclose(values, reader.get_tensor("emb"), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(slots[:, 0], reader.get_tensor("emb/Adagrad"), rtol=1e-5,
                               atol=1e-7)
    assert not tf.train.load_checkpoint(str(hooked_dir)).has_tensor("emb")
    # The first save wrote model.ckpt-6 again, as tables; the dense one is kept.
    kept = tf.train.load_checkpoint(str(hooked_dir / "graphmod" / "dense_before_adoption" /
                                        "model.ckpt-6"))
    np.testing.assert_array_equal(kept.get_tensor("emb"),
                                  tf.train.load_checkpoint(str(tmp_path / "dense" /
                                                               "model.ckpt-6")).get_tensor("emb"))

    # A restart reads the table checkpoint the adopted model wrote.
    hook = graphmod.GraphModifierHook(min_rows=10)
    np.testing.assert_allclose(train(hooked, 3, [hook]), train(dense, 3), rtol=1e-5, atol=1e-7)
    assert hook.report.adopted == [] and [t["variable"] for t in hook.report.tables] == ["emb"]
    np.testing.assert_allclose(table_rows(hooked_dir)[1],
                               tf.train.load_checkpoint(str(dense_dir)).get_tensor("emb"),
                               rtol=1e-5, atol=1e-7)


def test_evaluate_adopts_and_matches_the_dense_loss(tmp_path):
    dense = estimator(tmp_path)
    train(dense, 4)
    want = dense.evaluate(input_fn)["loss"]
    hook = graphmod.GraphModifierHook(min_rows=10)
    got = dense.evaluate(input_fn, hooks=[hook])["loss"]
    assert hook.report.adopted == ["emb"]
    assert got == pytest.approx(want, rel=1e-6)


def test_hashed_ids_are_adopted_keyed_by_bucket_and_stay_so(tmp_path):
    """With the default collision-free keys too: an adopted variable's hash
    buckets are kept (its trained rows are the buckets'), so it trains on as
    the dense model, and a restart (replaying the plan) keeps them."""
    dense_dir, hooked_dir = tmp_path / "dense", tmp_path / "hooked"
    dense = estimator(dense_dir, hashed=True)
    train(dense, 3, hashed=True)
    shutil.copytree(dense_dir, hooked_dir)
    hooked = estimator(hooked_dir, hashed=True)
    hook = graphmod.GraphModifierHook(min_rows=10)
    np.testing.assert_allclose(train(hooked, 3, [hook], hashed=True),
                               train(dense, 3, hashed=True), rtol=1e-5, atol=1e-7)
    assert hook.report.adopted == ["emb"]
    (kept,) = hook.report.squeezed_keys_kept
    assert "adopted" in kept["reason"] and "keyed by bucket" in kept["reason"], kept
    assert not any("full ids" in a["what"] for a in hook.report.approximations)

    hook = graphmod.GraphModifierHook(min_rows=10)
    np.testing.assert_allclose(train(hooked, 2, [hook], hashed=True),
                               train(dense, 2, hashed=True), rtol=1e-5, atol=1e-7)
    assert hook.report.adopted == [] and [t["variable"] for t in hook.report.tables] == ["emb"]
    keys, values, _ = table_rows(hooked_dir)
    np.testing.assert_array_equal(keys, np.arange(VOCAB))  # buckets, no full ids
    np.testing.assert_allclose(values, tf.train.load_checkpoint(str(dense_dir)).get_tensor("emb"),
                               rtol=1e-5, atol=1e-7)


def test_hashed_ids_keyed_by_bucket_are_adopted(tmp_path):
    dense_dir, hooked_dir = tmp_path / "dense", tmp_path / "hooked"
    dense = estimator(dense_dir, hashed=True)
    train(dense, 3, hashed=True)
    shutil.copytree(dense_dir, hooked_dir)
    hook = graphmod.GraphModifierHook(min_rows=10, collision_free=False)
    hooked_losses = train(estimator(hooked_dir, hashed=True), 3, [hook], hashed=True)
    assert hook.report.adopted == ["emb"]
    np.testing.assert_allclose(hooked_losses, train(dense, 3, hashed=True), rtol=1e-5,
                               atol=1e-7)


def test_adopted_rows_count_as_seen_at_adoption(tmp_path):
    """With eviction by steps, rows the first steps do not read survive the
    first eviction after adoption (they were seen at the adopted step, not
    at step 0)."""
    est = estimator(tmp_path)
    train(est, 6)
    hook = graphmod.GraphModifierHook(
        min_rows=10, tables={"emb": dict(eviction_threshold=3, eviction_unit="steps")},
        evict_time_interval=None, evict_step_interval=1)
    train(est, 2, [hook])
    assert hook.report.adopted == ["emb"] and hook.evict_hook.evictions >= 1
    keys = tf.train.load_checkpoint(str(tmp_path)).get_tensor("emb-keys")
    assert len(keys) == VOCAB  # two steps of 32 batches read few of the 300 ids


def test_a_model_with_its_own_saver_keeps_the_variable_dense(tmp_path):
    """The Estimator then uses the Scaffold's Saver, which cannot adopt: the
    variable stays dense, as the checkpoint holds it, and training resumes."""
    def own_saver_model_fn(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        return spec._replace(scaffold=tf1.train.Scaffold(
            saver=tf1.train.Saver(defer_build=True, sharded=True)))

    est = tf.estimator.Estimator(own_saver_model_fn, model_dir=str(tmp_path), params={})
    train(est, 3)
    hook = graphmod.GraphModifierHook(min_rows=10)
    assert np.isfinite(train(est, 2, [hook])).all()
    assert hook.report.adopted == [] and not hook.report.tables
    (skipped,) = [s for s in hook.report.skipped if s["variable"] == "emb"]
    assert "Scaffold brings its own Saver" in skipped["reason"], skipped


def test_the_table_saver_refuses_a_checkpoint_holding_neither(tmp_path):
    """A checkpoint without the variable (or its slots) is named in the error."""
    with tf.Graph().as_default():
        v = tf1.get_variable("other", [2])
        with tf1.Session() as sess:
            sess.run(v.initializer)
            path = tf1.train.Saver([v]).save(sess, str(tmp_path / "ckpt"))
        table = graphmod.create_table("t", 4)
        saver = TableSaver([Adoption(table, "emb", [], 10)], sharded=True)
        with pytest.raises(ValueError, match="neither table 't'.*missing: emb"):
            saver.holds_tables_densely(path)


@pytest.mark.slow
def test_deepfm_with_hash_bucket_columns_is_adopted_at_the_dense_models_auc(tmp_path):
    """DeepCTR's DeepFMEstimator over hash-bucket columns, trained densely,
    then evaluated and trained on with GraphModifierHook() (default
    settings) in the same model_dir: every embedding and linear weight is
    adopted, its eval AUC right after adoption is the dense model's, and
    after both train on it is the dense model's still."""
    deepctr_estimator = pytest.importorskip("deepctr.estimator")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import synthetic as data  # examples/synthetic.py: the demos' data
    cfg = data.SyntheticCriteo(n_dense=2, n_categorical=3, vocab_sizes=(30_000, 20_000, 50),
                               seed=3)
    fc = tf1.feature_column
    sparse = [fc.categorical_column_with_hash_bucket(c, n, dtype=tf.int64)
              for c, n in zip(cfg.categorical_names, (20_000, 10_000, 100))]
    numeric = [fc.numeric_column(c) for c in cfg.dense_names]
    dnn = [fc.embedding_column(c, 8) for c in sparse] + numeric

    def make(model_dir):
        return deepctr_estimator.DeepFMEstimator(
            sparse + numeric, dnn, dnn_hidden_units=(32,), model_dir=str(model_dir), seed=1,
            dnn_optimizer=tf1.train.AdagradOptimizer(0.1),
            config=tf.estimator.RunConfig(tf_random_seed=1))

    train_fn = data.input_fn(cfg, batch_size=256, num_examples=100_000, repeat=None)
    eval_fn = data.input_fn(cfg, batch_size=1024, num_examples=20_000, start=200_000)
    dense = make(tmp_path / "dense")
    dense.train(train_fn, steps=300)
    shutil.copytree(tmp_path / "dense", tmp_path / "hooked")
    hooked = make(tmp_path / "hooked")

    auc_dense = dense.evaluate(eval_fn)["AUC"]
    hook = graphmod.GraphModifierHook()
    auc_adopted = hooked.evaluate(eval_fn, hooks=[hook])["AUC"]
    assert len(hook.report.adopted) == 6, hook.report.adopted  # 3 embeddings, 3 linear weights
    assert sorted(hook.report.adopted) == sorted(t["variable"] for t in hook.report.tables)
    print(f"eval AUC dense {auc_dense:.4f}, right after adoption {auc_adopted:.4f}")
    assert abs(auc_adopted - auc_dense) <= 0.002

    dense.train(train_fn, steps=200)
    hook = graphmod.GraphModifierHook()
    hooked.train(train_fn, steps=200, hooks=[hook])
    assert len(hook.report.adopted) == 6
    auc_dense = dense.evaluate(eval_fn)["AUC"]
    auc_hooked = hooked.evaluate(eval_fn, hooks=[graphmod.GraphModifierHook()])["AUC"]
    print(f"after 200 more steps: dense {auc_dense:.4f}, adopted {auc_hooked:.4f}")
    assert auc_hooked >= auc_dense - 0.002
