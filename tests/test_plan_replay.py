"""One plan per model: what training converted, evaluate, predict, export and
resumes read the same way (graphmod/rewrite/plan_file.py).

Each Estimator here is trained and evaluated twice, unmodified and with the
hook, and the numbers compared; the plan's own checks fail begin() with the
variable's name when a later graph cannot follow it.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.rewrite import plan_file

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow
ITEMS, DIM = 300, 8


def softmax_model_fn(features, labels, mode):
    """Trained with sampled softmax (a gather of the output embedding), evaluated
    with the full softmax (a dense read of it)."""
    emb = tf1.get_variable("item_emb", [ITEMS, DIM], initializer=tf1.constant_initializer(0.05))
    out_w = tf1.get_variable("softmax_w", [ITEMS, DIM],
                             initializer=tf1.constant_initializer(0.01))
    out_b = tf1.get_variable("softmax_b", [ITEMS], initializer=tf1.zeros_initializer())
    x = tf.reduce_mean(tf.nn.embedding_lookup(emb, features["hist"]), 1)
    if mode == tf.estimator.ModeKeys.TRAIN:
        loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
            out_w, out_b, labels[:, None], x, num_sampled=16, num_classes=ITEMS))
        train = tf1.train.AdagradOptimizer(1.0).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)
    logits = tf.matmul(x, out_w, transpose_b=True) + out_b
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    return tf.estimator.EstimatorSpec(mode, loss=loss)


def softmax_data(n=512):
    rng = np.random.default_rng(0)
    hist = rng.integers(0, ITEMS, size=(n, 3))
    labels = (hist[:, 0] * 7 + 3) % ITEMS
    return hist, labels


def softmax_input(hist, labels, repeat=True):
    def fn():
        ds = tf.data.Dataset.from_tensor_slices(({"hist": hist}, labels))
        return (ds.repeat() if repeat else ds).batch(64)
    return fn


def test_sampled_softmax_in_training_full_softmax_in_eval(tmp_path):
    hist, labels = softmax_data()
    config = tf.estimator.RunConfig(tf_random_seed=7)
    results = []
    # Without min_rows, the 300-row variables convert by pattern.
    for hooks in ([], [graphmod.GraphModifierHook(tables={"item_emb": {}, "softmax_w": {}})]):
        est = tf.estimator.Estimator(softmax_model_fn, str(tmp_path / f"m{len(hooks)}"),
                                     config=config)
        est.train(softmax_input(hist, labels), steps=60, hooks=hooks)
        eval_hooks = [graphmod.GraphModifierHook()] if hooks else []
        results.append(est.evaluate(softmax_input(hist, labels, repeat=False),
                                    hooks=eval_hooks))
        if hooks:
            assert sorted(t["variable"] for t in hooks[0].report.tables) == \
                ["item_emb", "softmax_w"]
            report = eval_hooks[0].report
            assert report.replayed_plan
            (w,) = [t for t in report.tables if t["variable"] == "softmax_w"]
            assert w["dense_reads"] == 1 and w["lookups"] == 0
    plain, hooked = results
    np.testing.assert_allclose(hooked["loss"], plain["loss"], rtol=1e-5)
    assert plain["loss"] < np.log(ITEMS) - 0.1, plain  # training moved the full-softmax loss


def hashed_model_fn(features, labels, mode, params):
    bucket = tf.strings.to_hash_bucket_fast(features["word"], 50)
    emb = tf1.get_variable("word_emb", [50, 4], initializer=tf1.constant_initializer(0.1))
    if mode == tf.estimator.ModeKeys.EVAL and params.get("narrow_eval_ids"):
        bucket = tf.cast(bucket, tf.int32)  # 63-bit keys cannot pass
    if params.get("sparse"):  # unique ids, their rows, combined per example by idx
        n = tf.shape(bucket, out_type=tf.int64)[0]
        sp = tf.SparseTensor(tf.stack([tf.range(n), tf.zeros([n], tf.int64)], 1), bucket,
                             tf.stack([n, 1]))
        rows = tf.nn.embedding_lookup_sparse(emb, sp, None, combiner="sum")
    else:
        rows = tf.nn.embedding_lookup(emb, bucket)
    logits = tf.reduce_sum(rows, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        # eval also reads the bucket numbers' values, which training did not
        metric = tf1.metrics.mean(tf.cast(tf.reduce_max(bucket), tf.float32))
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"m": metric})
    train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def _words_input():
    words = np.array([f"w{i}".encode() for i in range(200)])
    labels = (np.arange(200) % 2).astype(np.float32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"word": words}, labels)).batch(50)
    return words, labels, input_fn


@pytest.mark.parametrize("sparse", [False, True], ids=["gather", "unique_then_gather"])
def test_an_eval_graph_reading_bucket_ids_follows_the_plan(tmp_path, sparse):
    """Training fed the table the full keys; evaluation also reads the bucket
    ids as values (a metric): the table still gets the full keys, the metric
    the bucket ids, and the loss is predict's. embedding_lookup_sparse looks
    up unique ids and combines their rows by Unique's positions, which must
    be the full keys' positions too (words share buckets within a batch)."""
    words, labels, input_fn = _words_input()
    est = tf.estimator.Estimator(hashed_model_fn, str(tmp_path), params={"sparse": sparse})
    est.train(input_fn, steps=4, hooks=[graphmod.GraphModifierHook()])
    with open(os.path.join(str(tmp_path), "graphmod", "plan.json")) as f:
        saved = json.load(f)
    assert saved["format"] == plan_file.FORMAT
    (entry,) = saved["variables"]
    assert entry["variable"] == "word_emb" and entry["unsqueezed"]
    evaluating = graphmod.GraphModifierHook()
    metrics = est.evaluate(input_fn, hooks=[evaluating])
    (table,) = evaluating.report.tables
    assert table["unsqueezed"] == entry["unsqueezed"]
    buckets = tf.strings.to_hash_bucket_fast(words, 50).numpy()
    assert metrics["m"] == pytest.approx(buckets.reshape(4, 50).max(1).mean())
    logits = np.array([p["logits"] for p in est.predict(
        lambda: tf.data.Dataset.from_tensor_slices({"word": words}).batch(50),
        hooks=[graphmod.GraphModifierHook()])])
    losses = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    assert metrics["loss"] == pytest.approx(losses.mean(), rel=1e-5)
    # Keyed by full ids, each word's row moved by its own label only (two
    # values); rows of 50 buckets, shared by words of both labels, would not.
    assert len(set(logits.round(5))) == 2


def test_a_graph_that_cannot_follow_the_plan_fails_naming_the_table(tmp_path):
    _, _, input_fn = _words_input()
    est = tf.estimator.Estimator(hashed_model_fn, str(tmp_path),
                                 params={"narrow_eval_ids": True})
    est.train(input_fn, steps=4, hooks=[graphmod.GraphModifierHook()])
    with pytest.raises(RuntimeError, match="'word_emb'.*unsqueezed ids.*Cast"):
        est.evaluate(input_fn, hooks=[graphmod.GraphModifierHook()])


def test_export_and_eval_use_the_training_settings(tmp_path):
    """Table settings given to training (here the initializer and shard count)
    hold in every later graph, whatever hook (or none) those graphs get."""
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 100, size=(256, 3))
    labels = (hist[:, 0] * 7 + 3) % ITEMS
    est = tf.estimator.Estimator(softmax_model_fn, str(tmp_path / "m"))
    train_hook = graphmod.GraphModifierHook(tables={
        "item_emb": dict(initializer=0.25, num_shards=4), "softmax_w": {}})
    est.train(softmax_input(hist, labels), steps=5, hooks=[train_hook])
    planned = plan_file.read(str(tmp_path / "m"))
    assert planned["item_emb"].initializer.kind == "constant"
    assert planned["item_emb"].settings.num_shards == 4
    # Prediction (a hook with other settings) and the export read the same
    # tables: the served logits equal predict's, and the served table has
    # training's initializer and shard count.
    unseen = np.full((1, 3), 299, np.int64)
    (pred,) = est.predict(lambda: tf.data.Dataset.from_tensor_slices(
        {"hist": unseen}).batch(1), hooks=[graphmod.GraphModifierHook(min_rows=10**9)])
    def receiver():
        ph = tf1.placeholder(tf.int64, [None, 3], name="hist")
        return tf.estimator.export.ServingInputReceiver({"hist": ph}, {"hist": ph})

    path = graphmod.export_saved_model(est, receiver, str(tmp_path / "export")).decode()
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.load(sess, ["serve"], path)
        sig = meta.signature_def["serving_default"]
        served = sess.run(sig.outputs["logits"].name, {sig.inputs["hist"].name: unseen})
        (table_op,) = [op for op in sess.graph.get_operations()
                       if op.type == "GraphmodTable" and op.get_attr("table_name") == b"item_emb"]
        assert table_op.get_attr("num_shards") == 4 and table_op.get_attr("init_a") == 0.25
    np.testing.assert_allclose(served[0], pred["logits"], rtol=1e-6)


def optimizer_everywhere_model_fn(features, labels, mode):
    """Builds its optimizer in every mode (some model_fns do), creates a side
    embedding that prediction never reads, and reads the output embedding
    whole outside training."""
    emb = tf1.get_variable("item_emb", [ITEMS, DIM], initializer=tf1.constant_initializer(0.05))
    side = tf1.get_variable("side_emb", [ITEMS, DIM], initializer=tf1.constant_initializer(0.02))
    out_w = tf1.get_variable("softmax_w", [ITEMS, DIM], initializer=tf1.constant_initializer(0.01))
    x = tf.reduce_mean(tf.nn.embedding_lookup(emb, features["hist"]), 1)
    if mode != tf.estimator.ModeKeys.PREDICT:
        x = x + tf.reduce_mean(tf.nn.embedding_lookup(side, features["hist"]), 1)
    if mode == tf.estimator.ModeKeys.TRAIN:
        loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
            out_w, tf.zeros([ITEMS]), labels[:, None], x, num_sampled=16, num_classes=ITEMS))
    else:
        logits = tf.matmul(x, out_w, transpose_b=True)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                             logits=logits))
    train = tf1.train.AdagradOptimizer(1.0).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def test_eval_with_an_optimizer_and_predict_without_a_planned_read(tmp_path):
    hist, labels = softmax_data()
    config = tf.estimator.RunConfig(tf_random_seed=7)
    results = []
    for hooked in (False, True):
        hooks = [graphmod.GraphModifierHook(tables={"*_emb": {}, "softmax_w": {}})] \
            if hooked else []
        est = tf.estimator.Estimator(optimizer_everywhere_model_fn,
                                     str(tmp_path / f"m{hooked}"), config=config)
        est.train(softmax_input(hist, labels), steps=30, hooks=hooks)
        evaluating = [graphmod.GraphModifierHook()] if hooked else []
        predicting = [graphmod.GraphModifierHook()] if hooked else []
        metrics = est.evaluate(softmax_input(hist, labels, repeat=False), hooks=evaluating)
        (pred,) = est.predict(lambda: tf.data.Dataset.from_tensor_slices(
            {"hist": hist[:1]}).batch(1), hooks=predicting)
        results.append((metrics["loss"], pred["logits"]))
        if hooked:
            assert sorted(t["variable"] for t in hooks[0].report.tables) == \
                ["item_emb", "side_emb", "softmax_w"]
            for hook in evaluating + predicting:  # every planned table, in both graphs
                tables = {t["variable"]: t for t in hook.report.tables}
                assert sorted(tables) == ["item_emb", "side_emb", "softmax_w"]
                assert tables["softmax_w"]["dense_reads"] == 1
            assert {t["variable"]: t["lookups"] for t in predicting[0].report.tables
                    }["side_emb"] == 0  # built, never read: restored all the same
    (p_loss, p_logits), (c_loss, c_logits) = results
    np.testing.assert_allclose(c_loss, p_loss, rtol=1e-5)
    np.testing.assert_allclose(c_logits, p_logits, rtol=1e-5, atol=1e-7)


def test_resume_cannot_turn_a_planned_table_dense(tmp_path):
    hist, labels = softmax_data()
    est = tf.estimator.Estimator(softmax_model_fn, str(tmp_path))
    est.train(softmax_input(hist, labels), steps=2,
              hooks=[graphmod.GraphModifierHook(tables={"item_emb": {}})])
    with pytest.raises(RuntimeError, match="'item_emb'.*convert=False"):
        est.train(softmax_input(hist, labels), steps=2,
                  hooks=[graphmod.GraphModifierHook(tables={"item_emb": {"convert": False}})])


def partitioned_model_fn(features, labels, mode):
    emb = tf1.get_variable("emb", [2 * ITEMS, DIM], initializer=tf1.constant_initializer(0.05),
                           partitioner=tf1.fixed_size_partitioner(2))
    logits = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["hist"]), [1, 2])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels % 2, tf.float32), logits=logits))
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def test_a_partitioned_variable_in_a_dense_checkpoint_stays_dense(tmp_path):
    """Its parts are saved as slices of one name: the hook must see that the
    checkpoint holds it densely (and not convert the parts, which restore
    would then look for in vain)."""
    hist, labels = softmax_data()
    est = tf.estimator.Estimator(partitioned_model_fn, str(tmp_path))
    est.train(softmax_input(hist, labels), steps=2)
    hook = graphmod.GraphModifierHook(tables={"emb*": {}})
    est.train(softmax_input(hist, labels), steps=2, hooks=[hook])
    assert not hook.report.tables
    assert sorted(s["variable"] for s in hook.report.skipped) == ["emb/part_0", "emb/part_1"]
    assert all("partitioned" in s["reason"] and "densely" in s["reason"]
               for s in hook.report.skipped)
    assert est.get_variable_value("global_step") == 4


def test_estimator_warm_start_then_resume(tmp_path):
    """WarmStartSettings: the table starts from the source checkpoint's rows on
    the first run only; a resume continues from the model's own checkpoint
    (the import does not run again). Equal to the unmodified model throughout."""
    hist, labels = softmax_data()
    source = np.random.default_rng(5).normal(size=(ITEMS, DIM)).astype(np.float32) * 0.1
    with tf.Graph().as_default():
        v = tf1.get_variable("item_emb", initializer=source)
        with tf1.Session() as sess:
            sess.run(v.initializer)
            ckpt = tf1.train.Saver([v]).save(sess, str(tmp_path / "source" / "ckpt"))
    warm = tf.estimator.WarmStartSettings(ckpt, vars_to_warm_start="item_emb")
    results = []
    for hooked in (False, True):
        est = tf.estimator.Estimator(softmax_model_fn, str(tmp_path / f"m{hooked}"),
                                     config=tf.estimator.RunConfig(tf_random_seed=7),
                                     warm_start_from=warm)
        made = []

        def hooks():
            if not hooked:
                return []
            made.append(graphmod.GraphModifierHook(tables={"item_emb": {}, "softmax_w": {}}))
            return made[-1:]
        est.train(softmax_input(hist, labels), steps=5, hooks=hooks())
        if hooked:
            (t,) = [t for t in made[0].report.tables if t["variable"] == "item_emb"]
            assert t["warm_started"]
        first = est.evaluate(softmax_input(hist, labels, repeat=False), hooks=hooks())
        est.train(softmax_input(hist, labels), steps=5, hooks=hooks())  # resumes
        second = est.evaluate(softmax_input(hist, labels, repeat=False), hooks=hooks())
        results.append((first["loss"], second["loss"]))
    (p1, p2), (c1, c2) = results
    np.testing.assert_allclose([c1, c2], [p1, p2], rtol=1e-5)
    assert abs(p2 - p1) > 1e-4  # the resume trained on (and did not start over)


def test_warm_start_added_to_a_model_with_table_checkpoints(tmp_path):
    """A model_dir whose checkpoint holds the table (trained without warm
    start) resumes from it when WarmStartSettings are added later: no import,
    no flag to restore."""
    hist, labels = softmax_data()
    source = np.zeros((ITEMS, DIM), np.float32)
    with tf.Graph().as_default():
        v = tf1.get_variable("item_emb", initializer=source)
        with tf1.Session() as sess:
            sess.run(v.initializer)
            ckpt = tf1.train.Saver([v]).save(sess, str(tmp_path / "source" / "ckpt"))
    hooks = lambda: [graphmod.GraphModifierHook(tables={"item_emb": {}, "softmax_w": {}})]
    est = tf.estimator.Estimator(softmax_model_fn, str(tmp_path / "m"))
    est.train(softmax_input(hist, labels), steps=3, hooks=hooks())
    before = est.evaluate(softmax_input(hist, labels, repeat=False), hooks=hooks())["loss"]
    warm = tf.estimator.Estimator(softmax_model_fn, str(tmp_path / "m"),
                                  warm_start_from=tf.estimator.WarmStartSettings(
                                      ckpt, vars_to_warm_start="item_emb"))
    same = warm.evaluate(softmax_input(hist, labels, repeat=False), hooks=hooks())["loss"]
    warm.train(softmax_input(hist, labels), steps=1, hooks=hooks())  # restores, no import
    np.testing.assert_allclose(same, before, rtol=1e-6)
    names = {n for n, _ in tf.train.list_variables(str(tmp_path / "m"))}
    assert "item_emb-keys" in names and not any("warm_started" in n for n in names)
