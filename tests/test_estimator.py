"""graphmod tables inside a tf.estimator.Estimator: checkpoints, resume, eval/predict.

The model_fn below uses the explicit table API (create_table + sparse_lookup +
a graphmod sparse optimizer grouped with a dense tf.compat.v1 optimizer), as a
user's model would. Expected values come from the numpy data (examples/synthetic.py)
and from the checkpoint itself, read with tf.train.load_checkpoint.
"""
import os
import sys
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_estimator as tf_estimator

import graphmod
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import synthetic as data  # noqa: E402 (examples/synthetic.py: the demos' data)

pytestmark = pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")

tf1 = tf.compat.v1
Estimator = tf_estimator.estimator.Estimator
ModeKeys = tf_estimator.estimator.ModeKeys

FIELDS = ("keys", "values", "slots", "counts", "last_seen", "versions")
ENTRIES = FIELDS + ("pending_keys", "pending_counts", "pending_last_seen",  # in checkpoints
                    "pending_sketch", "format")
DIM = 5  # no dense layer below has a dimension of 5, so a [rows, 5] variable would stand out
# Small initial rows: ids first seen at eval time then add little noise.
INIT = graphmod.TableInitializer("truncated_normal", 0.0, 0.05)
SPARSE_LR = 0.5

# Six categorical features of very different cardinalities, two dense ones.
# Bayes AUC on held-out rows is ~0.65, so a trained model clearly beats 0.5.
CFG = data.SyntheticCriteo(n_dense=2, n_categorical=6,
                           vocab_sizes=(10, 50, 200, 1000, 5000, 100_000), seed=11)
BATCH = 256


def model_fn(features, labels, mode, params):
    """A linear head on one DIM-wide table per categorical feature."""
    is_training = mode == ModeKeys.TRAIN
    sparse_opt = graphmod.optimizers.Adagrad(SPARSE_LR)
    tables, embs = [], []
    for name in params["categorical"]:
        table = graphmod.create_table(name, dim=DIM, optimizer=sparse_opt, initializer=INIT,
                                      default_value=params.get("default_value"))
        tables.append(table)
        embs.append(graphmod.sparse_lookup(table, features[name], is_training=is_training,
                                           combiner="sum"))
    inputs = embs + [features[n] for n in params["dense"]]
    # tf1's initializer is seeded by the graph (tf_random_seed): repeatable runs.
    logits = tf1.layers.dense(tf.concat(inputs, axis=1), 1, name="out",
                              kernel_initializer=tf1.glorot_uniform_initializer())
    probs = tf.sigmoid(logits)

    if mode == ModeKeys.PREDICT:
        predictions = {"probability": probs[:, 0]}
        batch = tf.shape(logits)[:1]
        for table, emb in zip(tables, embs):
            predictions[f"emb_{table.name}"] = emb
            # The table's row count *after* this batch's lookup (per example).
            with tf.control_dependencies([emb]):
                predictions[f"rows_{table.name}"] = tf.fill(batch, table.size())
        return tf_estimator.estimator.EstimatorSpec(mode, predictions=predictions)

    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.EVAL:
        return tf_estimator.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops={"auc": tf1.metrics.auc(labels, probs)})

    global_step = tf1.train.get_or_create_global_step()
    dense_train = tf1.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)
    train_op = tf.group(dense_train, sparse_opt.minimize(loss))
    return tf_estimator.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def make_estimator(model_dir, categorical=None, dense=None, default_value=None):
    params = {"categorical": categorical or CFG.categorical_names,
              "dense": CFG.dense_names if dense is None else dense,
              "default_value": default_value}
    # Checkpoints only at the start and the end of each train call.
    config = tf_estimator.estimator.RunConfig(
        model_dir=str(model_dir), tf_random_seed=1, save_checkpoints_steps=1_000_000,
        save_checkpoints_secs=None, save_summary_steps=10_000, log_step_count_steps=10_000)
    return Estimator(model_fn, config=config, params=params)


def train_rows(est, steps, start=0):
    """Trains on rows start .. start + steps * BATCH of CFG's stream (one pass)."""
    est.train(data.input_fn(CFG, BATCH, num_examples=steps * BATCH, start=start), steps=steps)
    return data.generate(CFG, steps * BATCH, start)


def predict(est, features, batch=64):
    """All predictions for a dict of [n, 1] feature arrays, as arrays of n rows."""
    def input_fn():
        return tf.data.Dataset.from_tensor_slices(features).batch(batch)
    outs = list(est.predict(input_fn, yield_single_examples=False))
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


def read_tables(model_dir, names):
    """{name: {field: array}} of every table in the latest checkpoint."""
    reader = tf.train.load_checkpoint(str(model_dir))
    return {n: {f: reader.get_tensor(f"{n}-{f}") for f in FIELDS} for n in names}


def rows_of(table, keys):
    """table[field] rows of keys, in the order of keys (all must be present)."""
    pos = {int(k): i for i, k in enumerate(table["keys"])}
    idx = np.array([pos[int(k)] for k in keys], dtype=np.int64)
    return {f: v[idx] for f, v in table.items()}


def restored_find(model_dir, names, keys_by_name, default_value=None):
    """In a fresh graph and session: restore the tables from the checkpoint, then
    run read-only (eval-mode) lookups of keys_by_name[name].

    Returns (rows before the lookups, {name: looked-up rows}, rows after)."""
    with tf.Graph().as_default():
        opt = graphmod.optimizers.Adagrad(SPARSE_LR)
        tables = {n: graphmod.create_table(n, dim=DIM, optimizer=opt, initializer=INIT,
                                           default_value=default_value)
                  for n in names}
        saver = tf1.train.Saver()  # only the tables: the graph has no variables
        finds = {n: graphmod.sparse_lookup(tables[n], tf.constant(keys_by_name[n], tf.int64),
                                           is_training=False)
                 for n in names}
        sizes = {n: t.size() for n, t in tables.items()}
        with tf1.Session() as sess:
            saver.restore(sess, tf.train.latest_checkpoint(str(model_dir)))
            before = sess.run(sizes)
            found = sess.run(finds)
            after = sess.run(sizes)
    return before, found, after


def initial_rows(name, keys):
    """The rows a fresh table named `name` gives keys when it first inserts them."""
    with tf.Graph().as_default():
        table = graphmod.create_table(name, dim=DIM, optimizer=graphmod.optimizers.Adagrad(0.1),
                                      initializer=INIT)
        rows = graphmod.sparse_lookup(table, tf.constant(keys, tf.int64), is_training=True)
        with tf1.Session() as sess:
            return sess.run(rows)


@pytest.mark.slow
def test_train_checkpoint_then_evaluate_and_predict_restore_it(tmp_path):
    steps = 300
    est = make_estimator(tmp_path)
    feats, _ = train_rows(est, steps)

    # --- the checkpoint holds the entries of every table, and the tables
    # hold exactly the ids the training rows contained.
    shapes = dict(tf.train.list_variables(str(tmp_path)))
    tables = read_tables(tmp_path, CFG.categorical_names)
    for name in CFG.categorical_names:
        for field in ENTRIES:
            assert f"{name}-{field}" in shapes, f"{name}-{field} missing from checkpoint"
        t = tables[name]
        seen, occurrences = np.unique(feats[name], return_counts=True)
        n = len(seen)
        assert t["keys"].shape == (n,)
        np.testing.assert_array_equal(np.sort(t["keys"]), seen)
        assert t["values"].shape == (n, DIM) and t["values"].dtype == np.float32
        assert t["slots"].shape == (n, 1, DIM)      # Adagrad: one accumulator row per key
        assert (t["slots"] >= 0.1).all()  # Adagrad accumulators start at 0.1 and only grow
        # The sparse optimizer updated every row: none is still its initial row.
        moved = (t["values"] != initial_rows(name, t["keys"])).any(axis=1)
        assert moved.all(), f"{name}: {np.sum(~moved)} rows never updated"
        np.testing.assert_array_equal(rows_of(t, seen)["counts"], occurrences)
        assert t["last_seen"].min() > data.START_TIME  # wall-clock seconds of the lookup
        # One sparse update per step; every row was updated by some step.
        assert 1 <= t["versions"].min() and t["versions"].max() == steps
    # The large-vocabulary table really is sparse: far fewer rows than ids exist.
    assert 0 < tables["C6"]["keys"].shape[0] < CFG.vocab[5] // 4

    # --- no dense variable stands in for an embedding: the only variables are
    # the linear head, its Adagrad slots and the global step.
    table_entries = {f"{n}-{f}" for n in CFG.categorical_names for f in ENTRIES}
    others = {k: v for k, v in shapes.items() if k not in table_entries}
    head_in = len(CFG.categorical_names) * DIM + CFG.n_dense
    assert others == {"global_step": [], "out/kernel": [head_in, 1], "out/bias": [1],
                      "out/kernel/Adagrad": [head_in, 1], "out/bias/Adagrad": [1]}

    # --- evaluate restores the checkpoint and the model learned something.
    held_out = 2_000_000
    metrics = est.evaluate(data.input_fn(CFG, 1024, num_examples=20_000, start=held_out))
    assert metrics["global_step"] == steps
    bayes = data.bayes_auc(CFG, 20_000, start=held_out)
    assert metrics["auc"] > 0.59, (metrics, bayes)  # reaches ~0.62

    # --- predict restores the same checkpoint: a trained id's embedding is
    # exactly its checkpoint row, and predicting again gives the same output.
    pf, _ = data.generate(CFG, 200, start=0)  # training rows: every id has a row
    first = predict(est, pf)
    second = predict(est, pf)
    for k in first:
        np.testing.assert_array_equal(first[k], second[k], err_msg=k)
    for name in CFG.categorical_names:
        expected = rows_of(tables[name], pf[name][:, 0])["values"]
        np.testing.assert_array_equal(first[f"emb_{name}"], expected, err_msg=name)
        assert (first[f"rows_{name}"] == len(tables[name]["keys"])).all()
    assert np.isfinite(first["probability"]).all() and first["probability"].std() > 0.01


@pytest.mark.slow
def test_resume_restores_rows_exactly_and_keeps_growing(tmp_path):
    names = CFG.categorical_names
    train_rows(make_estimator(tmp_path), 60)
    ckpt1 = read_tables(tmp_path, names)

    # A fresh graph restored from the checkpoint reads back exactly its rows,
    # and read-only lookups of them leave the table as it was.
    keys = {n: ckpt1[n]["keys"] for n in names}
    before, found, after = restored_find(tmp_path, names, keys)
    for n in names:
        assert before[n] == after[n] == len(keys[n])
        np.testing.assert_array_equal(found[n], ckpt1[n]["values"], err_msg=n)

    # Resume: a new Estimator object and train call on later rows of the stream.
    est = make_estimator(tmp_path)
    feats2, _ = train_rows(est, 60, start=60 * BATCH)
    assert est.get_variable_value("global_step") == 120
    ckpt2 = read_tables(tmp_path, names)

    for n in names:
        t1, t2 = ckpt1[n], ckpt2[n]
        phase2_keys, phase2_counts = np.unique(feats2[n], return_counts=True)
        # The table kept its old rows and added the new ids.
        expected_keys = np.union1d(t1["keys"], phase2_keys)
        np.testing.assert_array_equal(np.sort(t2["keys"]), expected_keys, err_msg=n)
        # Access counts continue from the restored ones (a table that had
        # restarted empty would hold the phase-2 counts only).
        counts1 = dict(zip(t1["keys"].tolist(), t1["counts"].tolist()))
        counts2 = dict(zip(phase2_keys.tolist(), phase2_counts.tolist()))
        got = rows_of(t2, expected_keys)["counts"]
        want = [counts1.get(k, 0) + counts2.get(k, 0) for k in expected_keys.tolist()]
        np.testing.assert_array_equal(got, want, err_msg=n)
        # Rows phase 2 never touched are bit-for-bit the restored ones.
        untouched = np.setdiff1d(t1["keys"], phase2_keys)
        if len(untouched):
            old, new = rows_of(t1, untouched), rows_of(t2, untouched)
            for f in FIELDS:
                np.testing.assert_array_equal(new[f], old[f], err_msg=f"{n}-{f}")
        # Rows phase 2 trained carry versions after the restored ones.
        touched = rows_of(t2, phase2_keys)["versions"]
        assert touched.min() > t1["versions"].max() and touched.max() == 120, n
    # The big tables grew.
    assert len(ckpt2["C6"]["keys"]) > len(ckpt1["C6"]["keys"])
    assert len(ckpt2["C5"]["keys"]) > len(ckpt1["C5"]["keys"])


def _unseen_ids(trained, n=16, seed=5):
    rng = np.random.default_rng(seed)
    ids = np.concatenate([rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64, endpoint=True),
                          np.array([-1, 0, 2**41 + 3], np.int64)])
    assert not np.isin(ids, trained).any()
    return ids


@pytest.mark.parametrize("default_value", [None, 0.0])
def test_unseen_ids_get_missing_value_and_do_not_grow_table(tmp_path, default_value):
    names = ["C5", "C6"]
    est = make_estimator(tmp_path, categorical=names, default_value=default_value)
    train_rows(est, 10)
    ckpt = read_tables(tmp_path, names)
    unseen = {n: _unseen_ids(ckpt[n]["keys"]) for n in names}
    m = len(unseen["C5"])
    pf = {n: unseen[n].reshape(m, 1) for n in names}
    pf.update({n: np.ones((m, 1), np.float32) for n in CFG.dense_names})

    first = predict(est, pf, batch=7)
    second = predict(est, pf, batch=m)
    for n in names:
        emb = first[f"emb_{n}"]
        np.testing.assert_array_equal(emb, second[f"emb_{n}"], err_msg=n)
        if default_value is None:
            # The row the id would be initialized with: deterministic, non-zero.
            np.testing.assert_array_equal(emb, initial_rows(n, unseen[n]), err_msg=n)
            assert (np.abs(emb).sum(axis=1) > 0).all()
            assert len(np.unique(emb, axis=0)) == m  # different ids, different rows
        else:
            np.testing.assert_array_equal(emb, np.zeros((m, DIM), np.float32), err_msg=n)
        # Predict-time lookups inserted nothing.
        assert (first[f"rows_{n}"] == len(ckpt[n]["keys"])).all(), n

    # Same in a fresh graph restored from the checkpoint; known ids still
    # return their own rows next to the unseen ones.
    known = {n: ckpt[n]["keys"][:5] for n in names}
    mixed = {n: np.concatenate([known[n], unseen[n]]) for n in names}
    before, found, after = restored_find(tmp_path, names, mixed, default_value)
    for n in names:
        assert before[n] == after[n] == len(ckpt[n]["keys"]), n
        np.testing.assert_array_equal(found[n][:5], ckpt[n]["values"][:5], err_msg=n)
        np.testing.assert_array_equal(found[n][5:], first[f"emb_{n}"], err_msg=n)
    assert read_tables(tmp_path, names)["C6"]["keys"].shape == ckpt["C6"]["keys"].shape


def test_negative_and_huge_ids_are_keys(tmp_path):
    negative = np.array([-1, -2, -12345, -2**40, -2**40 - 1, -2**62, -2**63 + 1, -2**63],
                        np.int64)
    positive = np.array([0, 1, 2**40, 2**40 + 1, 2**41 + 1, 2**53 + 1, 2**62, 2**63 - 1],
                        np.int64)
    ids = np.concatenate([negative, positive])
    # Learnable only if every id has its own row: label 1 exactly for negative ids.
    reps = 64
    feats = {"C1": np.tile(ids, reps).reshape(-1, 1)}
    labels = (feats["C1"] < 0).astype(np.float32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((feats, labels)).shuffle(
            len(labels), seed=3).repeat().batch(64)

    est = make_estimator(tmp_path, categorical=["C1"], dense=[], default_value=0.0)
    steps = 160  # 10 passes: each id is looked up 10 * reps times
    est.train(input_fn, steps=steps)

    t = read_tables(tmp_path, ["C1"])["C1"]
    np.testing.assert_array_equal(np.sort(t["keys"]), np.sort(ids))
    np.testing.assert_array_equal(rows_of(t, ids)["counts"], np.full(len(ids), 10 * reps))
    assert len(np.unique(t["values"], axis=0)) == len(ids)

    out = predict(est, {"C1": ids.reshape(-1, 1)})
    # default_value=0.0: a key not found would read zeros, not its trained row.
    np.testing.assert_array_equal(out["emb_C1"], rows_of(t, ids)["values"])
    p = out["probability"]
    assert p[:len(negative)].min() > 0.7 and p[len(negative):].max() < 0.3, p
