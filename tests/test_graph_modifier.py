"""GraphModifierHook: unchanged TF1 graphs and Estimators get table embeddings.

Each test builds its own graph (or Estimator). The numerical tests train the
same small model twice, once as written and once rewritten by the hook, and
compare every step's loss and the final rows; the others check what the hook
converts, what it leaves dense (and says why), what reaches the checkpoint,
and that a failed rewrite leaves the graph as it was.
"""
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_estimator as tf_estimator

import graphmod
from graphmod.rewrite import validate
from graphmod.embeddings.table import _TableSaveable

pytestmark = pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")

tf1 = tf.compat.v1
Estimator = tf.estimator.Estimator  # EstimatorV2; see test_v1_estimator_is_recognised
ModeKeys = tf_estimator.estimator.ModeKeys

FIELDS = ("keys", "values", "slots", "counts", "last_seen", "versions")
VOCAB = 64      # rows of the small models' embedding variable
MIN_ROWS = 32   # the hook's threshold in the small models (VOCAB rows qualify)
DIM = 4
STEPS = 5
BATCH = 8
INIT = 0.1      # tf.constant_initializer(INIT): table rows start as the variable's rows
# Fixed dense head, identical in both graphs of a comparison.
HEAD_W = np.linspace(-0.5, 0.7, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1)
HEAD_B = np.array([0.05], np.float32)


# --------------------------------------------------------------------------
# The small model, its batches, and sessions.

def build_model(make_optimizer, use_resource=True, ids_dtype=tf.int64, vocab=VOCAB,
                name="emb", l2=0.0, keras=False, combiner=None):
    """An embedding variable gathered by tf.nn.embedding_lookup (or, with a
    combiner, read by embedding_lookup_sparse's fused fast path), a dense head.

    Returns a dict of the graph's tensors; must be called inside a graph."""
    ids = tf1.placeholder(ids_dtype, [None, 2], name="ids")
    labels = tf1.placeholder(tf.float32, [None], name="labels")
    emb = tf1.get_variable(name, [vocab, DIM], initializer=tf1.constant_initializer(INIT),
                           use_resource=use_resource)
    if combiner is None:
        e = tf.nn.embedding_lookup(emb, ids)  # [B, 2, DIM]
    else:  # both ids of an example combined, twice: [B, 2, DIM] again
        batch = tf.shape(ids, out_type=tf.int64)[0]
        sparse = tf.SparseTensor(tf.reshape(tf.stack(tf.meshgrid(
            tf.range(batch), tf.range(2, dtype=tf.int64), indexing="ij"), 2), [-1, 2]),
            tf.cast(tf.reshape(ids, [-1]), tf.int64), [batch, 2])
        combined = tf1.nn.embedding_lookup_sparse(emb, sparse, None, combiner=combiner)
        e = tf.stack([combined, combined], 1)
    w = tf1.get_variable("head/w", initializer=HEAD_W, use_resource=use_resource)
    b = tf1.get_variable("head/b", initializer=HEAD_B, use_resource=use_resource)
    logits = tf.squeeze(tf.matmul(tf.reshape(e, [-1, 2 * DIM]), w) + b, 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if l2:
        loss = loss + l2 * tf.nn.l2_loss(emb)  # a dense read of the whole variable
    global_step = tf1.train.get_or_create_global_step()
    opt = make_optimizer()
    if keras:
        variables = [emb, w, b]
        grads = tf1.gradients(loss, variables)
        update = opt.apply_gradients(zip(grads, variables))
        train_op = tf.group(update, global_step.assign_add(1))
    else:
        train_op = opt.minimize(loss, global_step=global_step)
    return dict(ids=ids, labels=labels, emb=emb, w=w, b=b, loss=loss, train_op=train_op,
                lookup=e)


def batches(seed, all_ids=None):
    """STEPS (ids [BATCH, 2], labels [BATCH]) batches with repeated ids.

    With all_ids, every batch contains each of them (and only them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        if all_ids is None:
            ids = rng.integers(0, VOCAB, size=(BATCH, 2))
            ids[1] = ids[0]          # a repeated pair
            ids[2, 1] = ids[3, 0]    # an id in both columns
        else:
            flat = np.concatenate([all_ids, rng.choice(all_ids, 2 * BATCH - len(all_ids))])
            ids = rng.permutation(flat).reshape(BATCH, 2)
        labels = rng.integers(0, 2, size=BATCH).astype(np.float32)
        out.append((ids.astype(np.int64), labels))
    return out


class ExportTables(tf1.train.SessionRunHook):
    """Builds each table's export op in begin(), after the graph modifier's
    begin() (hooks begin in order) and before the session finalizes the graph."""

    def begin(self):
        self.exports = {t.name: t.export() for t in graphmod.tables()}


def run_steps(model, hooks, data):
    """Trains on data in a MonitoredSession; returns (losses, dense head, export rows,
    embedding variable value or None when it was converted)."""
    export = ExportTables()
    losses = []
    with tf1.train.MonitoredSession(hooks=list(hooks) + [export]) as sess:
        for ids, labels in data:
            _, loss = sess.run([model["train_op"], model["loss"]],
                               {model["ids"]: ids, model["labels"]: labels})
            losses.append(loss)
        head = sess.run([model["w"], model["b"]])
        tables = sess.run(export.exports)
        converted = model["emb"] not in tf1.global_variables()
        emb = None if converted else sess.run(model["emb"])
    return np.array(losses), head, tables, emb


def sorted_rows(exported):
    order = np.argsort(exported["keys"])
    return {f: v[order] for f, v in exported.items()}


# --------------------------------------------------------------------------
# 1. Numerical equivalence with the tf.compat.v1 optimizers.

OPTIMIZERS = {
    "sgd": lambda: tf1.train.GradientDescentOptimizer(0.5),
    "adagrad": lambda: tf1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2),
    "momentum": lambda: tf1.train.MomentumOptimizer(0.2, momentum=0.9),
    "nesterov": lambda: tf1.train.MomentumOptimizer(0.2, momentum=0.9, use_nesterov=True),
    "adam": lambda: tf1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
    "ftrl": lambda: tf1.train.FtrlOptimizer(0.3, l1_regularization_strength=0.01,
                                            l2_regularization_strength=0.02),
    "ftrl_shrinkage": lambda: tf1.train.FtrlOptimizer(
        0.3, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.05),
    "rmsprop": lambda: tf1.train.RMSPropOptimizer(0.05, decay=0.8, momentum=0.5),
}
KIND = {"sgd": "sgd", "adagrad": "adagrad", "momentum": "momentum", "nesterov": "momentum",
        "adam": "adam", "ftrl": "ftrl", "ftrl_shrinkage": "ftrl", "rmsprop": "rmsprop"}
ADAM_IDS = np.array([3, 17, 40, 63, 5, 22], np.int64)


def train_twice(opt_name, use_resource=True, ids_dtype=tf.int64, combiner=None):
    """(plain run, rewritten run, hook, data) of the same model and batches."""
    data = batches(seed=7, all_ids=ADAM_IDS if opt_name == "adam" else None)
    runs = []
    hook = graphmod.GraphModifierHook(min_rows=MIN_ROWS)
    for hooks in ([], [hook]):
        with tf.Graph().as_default():
            model = build_model(OPTIMIZERS[opt_name], use_resource, ids_dtype,
                                combiner=combiner)
            runs.append(run_steps(model, hooks, data))
            if hooks:
                # The hook removed the variable and its slots from the graph's collections.
                assert model["emb"] not in tf1.global_variables()
                assert not [v for v in tf1.global_variables() if v.op.name.startswith("emb/")]
    return runs[0], runs[1], hook, data


def assert_same_training(plain, converted, data, deduplicated=False):
    """deduplicated: the model gathers each id once per batch (Unique first)."""
    p_losses, p_head, p_tables, p_emb = plain
    c_losses, c_head, c_tables, c_emb = converted
    assert p_tables == {} and p_emb is not None
    assert c_emb is None and list(c_tables) == ["emb"]
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-5, atol=1e-6)
    # The loss moved: the optimizer trained something.
    assert abs(p_losses[-1] - p_losses[0]) > 1e-4, p_losses
    rows = sorted_rows(c_tables["emb"])
    touched = np.unique(np.concatenate([ids.ravel() for ids, _ in data]))
    # The raw ids are the keys; exactly the ids looked up have rows.
    np.testing.assert_array_equal(rows["keys"], touched)
    np.testing.assert_allclose(rows["values"], p_emb[touched], rtol=1e-5, atol=1e-6)
    assert (np.abs(p_emb[touched] - INIT) > 1e-6).any()  # the rows were trained
    for c, p in zip(c_head, p_head):
        np.testing.assert_allclose(c, p, rtol=1e-5, atol=1e-6)
    # counts: every occurrence of the id in a lookup; versions: the last step
    # that updated the row (one table apply per step).
    occurrences = np.array([sum(int((ids == k).sum()) if not deduplicated else int(k in ids)
                                for ids, _ in data) for k in touched])
    np.testing.assert_array_equal(rows["counts"], occurrences)
    last_step = np.array([max(i + 1 for i, (ids, _) in enumerate(data) if k in ids)
                          for k in touched])
    np.testing.assert_array_equal(rows["versions"], last_step)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_matches_tf1_optimizer(opt_name):
    plain, converted, hook, data = train_twice(opt_name)
    assert_same_training(plain, converted, data)
    report = hook.report
    assert report.graph == "train" and report.skipped == []
    (table,) = report.tables
    assert table["variable"] == "emb" and table["rows"] == VOCAB and table["dim"] == DIM
    assert table["optimizer"] == KIND[opt_name]
    assert table["lookups"] == 1
    assert report.dense_bytes_freed >= VOCAB * DIM * 4 * (1 + table["slots"])


@pytest.mark.parametrize("opt_name", ["sgd", "adagrad", "adam"])
def test_matches_tf1_optimizer_reference_variable_int32_ids(opt_name):
    plain, converted, hook, data = train_twice(opt_name, use_resource=False,
                                               ids_dtype=tf.int32)
    assert_same_training(plain, converted, data)
    assert [t["variable"] for t in hook.report.tables] == ["emb"]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("use_resource", [False, True])
def test_embedding_lookup_sparse_converts(combiner, use_resource):
    """For a reference variable, embedding_lookup_sparse reads the variable
    with one fused SparseSegmentSum/Mean/SqrtN (sparse gradient); for a
    resource variable it gathers, then combines."""
    plain, converted, hook, data = train_twice("adagrad", use_resource=use_resource,
                                               combiner=combiner)
    # The resource path gathers unique ids, so the table counts one sighting
    # per batch.
    assert_same_training(plain, converted, data, deduplicated=use_resource)
    assert [t["variable"] for t in hook.report.tables] == ["emb"]


# --------------------------------------------------------------------------
# 3. What stays dense, and why.

def train_with_checkpoint(tmp_path, hook, **model_kwargs):
    """Trains STEPS steps in a MonitoredTrainingSession saving to tmp_path.

    Returns (losses, embedding variable value, checkpoint variable names)."""
    data = batches(seed=3)
    with tf.Graph().as_default():
        model = build_model(**model_kwargs)
        losses = []
        with tf1.train.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), hooks=[hook], save_summaries_steps=None,
                save_summaries_secs=None, log_step_count_steps=None) as sess:
            for ids, labels in data:
                _, loss = sess.run([model["train_op"], model["loss"]],
                                   {model["ids"]: ids, model["labels"]: labels})
                losses.append(loss)
            emb = sess.run(model["emb"])
    names = {n for n, _ in tf.train.list_variables(str(tmp_path))}
    return np.array(losses), emb, names


def assert_stays_dense(tmp_path, hook, variable="emb", reason=None, **model_kwargs):
    losses, emb, names = train_with_checkpoint(tmp_path, hook, **model_kwargs)
    assert np.isfinite(losses).all() and losses[0] != losses[-1], losses
    assert (np.abs(emb - INIT) > 1e-6).any()  # the dense variable was trained
    assert variable in names
    assert not [n for n in names if n.startswith(variable + "-")]  # no table entries
    assert hook.report.tables == []
    # The dense head is reported too when min_rows is below its 8 rows.
    skipped = {s["variable"]: s["reason"] for s in hook.report.skipped
               if not s["variable"].startswith("head/")}
    if reason is None:
        assert skipped == {}
    else:
        assert list(skipped) == [variable], skipped
        assert reason in skipped[variable], skipped[variable]
    return skipped


def test_l2_penalised_variable_stays_dense_when_exact(tmp_path):
    # (without exact=True the penalty covers the rows read: tests/test_faithful.py)
    reason = assert_stays_dense(
        tmp_path, graphmod.GraphModifierHook(min_rows=MIN_ROWS, exact=True),
        reason="L2 penalty over the whole variable",
        make_optimizer=OPTIMIZERS["adagrad"], l2=1e-3)["emb"]
    assert "exact=True" in reason, reason


def test_variable_below_min_rows_stays_dense_silently(tmp_path):
    assert_stays_dense(tmp_path, graphmod.GraphModifierHook(min_rows=VOCAB + 1),
                       make_optimizer=OPTIMIZERS["adagrad"])


def test_default_min_rows_leaves_small_variable_dense(tmp_path):
    assert_stays_dense(tmp_path, graphmod.GraphModifierHook(),
                       make_optimizer=OPTIMIZERS["adagrad"])


def test_pattern_with_convert_false_stays_dense(tmp_path):
    assert_stays_dense(
        tmp_path, graphmod.GraphModifierHook(min_rows=0, tables={"emb*": {"convert": False}}),
        reason="convert=False", make_optimizer=OPTIMIZERS["adagrad"])


def test_keras_momentum_update_stays_dense(tmp_path):
    assert_stays_dense(
        tmp_path, graphmod.GraphModifierHook(min_rows=MIN_ROWS), reason="Keras momentum",
        make_optimizer=lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), keras=True)


def test_centered_rmsprop_update_stays_dense(tmp_path):
    assert_stays_dense(
        tmp_path, graphmod.GraphModifierHook(min_rows=MIN_ROWS), reason="centered RMSProp",
        make_optimizer=lambda: tf1.train.RMSPropOptimizer(0.05, momentum=0.5, centered=True))


# --------------------------------------------------------------------------
# 4. Per-table settings.

def test_table_pattern_converts_variable_below_min_rows(tmp_path):
    hook = graphmod.GraphModifierHook(tables={"small_emb": {}})  # default min_rows: 10,000
    data = batches(seed=11)
    with tf.Graph().as_default():
        model = build_model(OPTIMIZERS["adagrad"], name="small_emb")
        losses, _, tables, emb = run_steps(model, [hook], data)
    assert emb is None and list(tables) == ["small_emb"]
    assert [(t["variable"], t["table"], t["rows"]) for t in hook.report.tables] == \
        [("small_emb", "small_emb", VOCAB)]
    touched = np.unique(np.concatenate([ids.ravel() for ids, _ in data]))
    np.testing.assert_array_equal(np.sort(tables["small_emb"]["keys"]), touched)
    assert np.isfinite(losses).all()


def read_only_lookup(hook, ids):
    """Rows a graph without an optimizer reads for ids after the hook (read-only find)."""
    with tf.Graph().as_default():
        ids_t = tf1.placeholder(tf.int64, [None])
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(INIT))
        rows = tf.nn.embedding_lookup(emb, ids_t) * 1.0
        export = ExportTables()
        with tf1.train.MonitoredSession(hooks=[hook, export]) as sess:
            out = sess.run(rows, {ids_t: ids})
            exported = sess.run(export.exports)
    return out, exported


def test_default_value_setting_for_unseen_ids():
    ids = np.array([1, 5, 5, 60], np.int64)
    hook = graphmod.GraphModifierHook(tables={"emb": {"default_value": 0.0}})
    rows, exported = read_only_lookup(hook, ids)
    assert [t["variable"] for t in hook.report.tables] == ["emb"]
    assert hook.report.tables[0]["optimizer"] is None  # nothing trains it: read-only
    np.testing.assert_array_equal(rows, np.zeros((4, DIM), np.float32))
    assert len(exported["emb"]["keys"]) == 0  # reads insert nothing
    # Without default_value an unseen id reads the row it would be initialized with.
    hook = graphmod.GraphModifierHook(tables={"emb": {}})
    rows, _ = read_only_lookup(hook, ids)
    np.testing.assert_allclose(rows, np.full((4, DIM), INIT, np.float32))


# --------------------------------------------------------------------------
# 5. A failed rewrite is undone.

def graph_snapshot(graph):
    """Every op's data and control inputs, and every collection's items (by identity)."""
    ops = {op.name: ([t.name for t in op.inputs], sorted(c.name for c in op.control_inputs))
           for op in graph.get_operations()}
    collections = {k: [id(x) for x in graph.get_collection(k)]
                   for k in graph.get_all_collection_keys()}
    return ops, collections


def test_failed_rewrite_is_undone(monkeypatch):
    def fail(*args, **kwargs):
        raise validate.InvalidRewrite("injected failure")

    monkeypatch.setattr(validate, "check", fail)
    data = batches(seed=5)
    with tf.Graph().as_default() as graph:
        model = build_model(OPTIMIZERS["momentum"])
        gather = model["lookup"].op
        while gather.type != "ResourceGather":
            gather = gather.inputs[0].op
        consumers = [(op, [t.name for t in op.inputs]) for op in gather.outputs[0].consumers()]
        assert consumers
        ops_before, collections_before = graph_snapshot(graph)
        hook = graphmod.GraphModifierHook(min_rows=MIN_ROWS)
        with pytest.raises(RuntimeError, match="undone") as info:
            hook.begin()
        assert "injected failure" in str(info.value)
        # The rules did run (they built the table and its ops) before the failure.
        assert any(op.type == "GraphmodTableFindOrInsert" for op in graph.get_operations())
        assert any(op.type == "GraphmodTableApply" for op in graph.get_operations())

        # Every pre-existing op reads and waits for what it did before;
        # the collections hold the same items.
        ops_after, collections_after = graph_snapshot(graph)
        assert {k: ops_after[k] for k in ops_before} == ops_before
        assert [op for op in gather.outputs[0].consumers()] == [op for op, _ in consumers]
        for op, inputs in consumers:
            assert [t.name for t in op.inputs] == inputs
        assert {k: v for k, v in collections_after.items() if v} == \
            {k: v for k, v in collections_before.items() if v}
        assert model["emb"] in tf1.global_variables()
        assert model["emb"] in tf1.trainable_variables()
        assert not [s for s in tf1.get_collection(tf1.GraphKeys.SAVEABLE_OBJECTS)
                    if isinstance(s, _TableSaveable)]
        assert hook.report is None

        # The graph still trains densely, like an untouched one.
        losses, _, tables, emb = run_steps(model, [], data)
    with tf.Graph().as_default():
        plain = run_steps(build_model(OPTIMIZERS["momentum"]), [], data)
    # The table the rules built stays in graphmod's registry, unused: no rows.
    assert all(len(t["keys"]) == 0 for t in tables.values())
    np.testing.assert_array_equal(losses, plain[0])
    np.testing.assert_array_equal(emb, plain[3])


# --------------------------------------------------------------------------
# 6. Bad configuration.

@pytest.mark.parametrize("kwargs, words", [
    (dict(min_rows=-1), ["min_rows", "-1"]),
    (dict(min_rows=2.5), ["min_rows"]),
    (dict(tables={"x": {"bogus": 1}}), ["'x'", "bogus"]),
])
def test_bad_configuration_raises(kwargs, words):
    with pytest.raises(ValueError) as info:
        graphmod.GraphModifierHook(**kwargs)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_bad_settings_type_raises():
    with pytest.raises(TypeError, match="'x'"):
        graphmod.GraphModifierHook(tables={"x": 3})


# --------------------------------------------------------------------------
# 2. An unchanged Estimator, end to end.

E_ROWS = 10_000          # the hook's default min_rows: converted without configuration
E_BATCH = 64
E_RNG = np.random.default_rng(0)
E_TRUE = E_RNG.normal(size=E_ROWS)


def e_data(n, low, high, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(low, high, size=(n, 2))
    labels = (E_TRUE[ids].sum(1) > 0).astype(np.float32)
    return ids, labels


def e_model_fn(features, labels, mode):
    """A model written without graphmod: a dense embedding variable and a linear head."""
    emb = tf1.get_variable("emb", [E_ROWS, DIM],
                           initializer=tf1.truncated_normal_initializer(stddev=0.1))
    e = tf.nn.embedding_lookup(emb, features["ids"])
    logits = tf.squeeze(tf1.layers.dense(tf.reshape(e, [-1, 2 * DIM]), 1, name="out"), 1)
    if mode == ModeKeys.PREDICT:
        return tf_estimator.estimator.EstimatorSpec(
            mode, predictions={"p": tf.sigmoid(logits), "emb": e})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.AdagradOptimizer(1.0).minimize(loss, tf1.train.get_global_step())
    return tf_estimator.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metric_ops={"auc": tf1.metrics.auc(labels, tf.sigmoid(logits))})


def e_input_fn(ids, labels=None, epochs=None):
    def input_fn():
        feats = {"ids": ids}
        ds = tf.data.Dataset.from_tensor_slices((feats, labels) if labels is not None else feats)
        return ds.repeat(epochs).batch(E_BATCH)
    return input_fn


def e_table(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return sorted_rows({f: reader.get_tensor(f"emb-{f}") for f in FIELDS})


def e_predict(est, ids, hook):
    out = list(est.predict(e_input_fn(ids, epochs=1), hooks=[hook],
                           yield_single_examples=False))
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}


@pytest.mark.slow
def test_estimator_end_to_end(tmp_path):
    config = tf_estimator.estimator.RunConfig(
        model_dir=str(tmp_path), tf_random_seed=1, save_checkpoints_steps=1_000_000,
        save_checkpoints_secs=None, save_summary_steps=1_000_000, log_step_count_steps=1_000_000)
    est = Estimator(e_model_fn, config=config)
    ids1, labels1 = e_data(4096, 0, 600, seed=1)
    hook = graphmod.GraphModifierHook(dump_graph=True)
    est.train(e_input_fn(ids1, labels1), steps=60, hooks=[hook])

    # --- the checkpoint holds the table, not the variable nor its Adagrad slot.
    names = dict(tf.train.list_variables(str(tmp_path)))
    for f in FIELDS:
        assert f"emb-{f}" in names
    assert "emb" not in names and not [n for n in names if n.startswith("emb/")], names
    assert {"global_step", "out/kernel", "out/bias"} <= set(names)
    t1 = e_table(tmp_path)
    seen1 = np.unique(ids1[:60 * E_BATCH])
    np.testing.assert_array_equal(t1["keys"], seen1)
    assert t1["slots"].shape == (len(seen1), 1, DIM)
    assert t1["versions"].max() == 60

    # --- the report and the graph dumps.
    out = tmp_path / "graphmod"
    with open(out / "rewrite_report_train.json") as f:
        report = json.load(f)
    assert report["graph"] == "train"
    assert [(t["variable"], t["table"], t["rows"], t["dim"], t["optimizer"])
            for t in report["tables"]] == [("emb", "emb", E_ROWS, DIM, "adagrad")]
    assert report["tables"][0]["initializer"]["kind"] == "truncated_normal"
    before = (out / "graph_before_train.pbtxt").read_text()
    after = (out / "graph_after_train.pbtxt").read_text()
    assert "GraphmodTable" not in before and '"ResourceSparseApplyAdagrad"' in before
    assert '"GraphmodTableFindOrInsert"' in after and '"GraphmodTableApply"' in after

    # --- evaluate with the hook restores the table.
    eval_hook = graphmod.GraphModifierHook()
    metrics = est.evaluate(e_input_fn(ids1[:1024], labels1[:1024], epochs=1), hooks=[eval_hook])
    assert metrics["global_step"] == 60 and np.isfinite(metrics["loss"])
    assert metrics["auc"] > 0.8, metrics  # trained rows, not fresh ones
    assert eval_hook.report.graph == "eval"
    assert [t["variable"] for t in eval_hook.report.tables] == ["emb"]
    assert (out / "rewrite_report_eval.json").exists()

    # --- predict: trained ids read their checkpoint rows; twice, the same output.
    pids = ids1[:100]
    first = e_predict(est, pids, graphmod.GraphModifierHook())
    second = e_predict(est, pids, graphmod.GraphModifierHook())
    for k in first:
        np.testing.assert_array_equal(first[k], second[k], err_msg=k)
    pos = {int(k): i for i, k in enumerate(t1["keys"])}
    expected = t1["values"][np.vectorize(pos.get)(pids)]
    np.testing.assert_array_equal(first["emb"], expected)
    with open(out / "rewrite_report_predict.json") as f:
        assert json.load(f)["graph"] == "predict"

    # --- unseen ids: the initializer's row by default, zeros with default_value=0.0.
    unseen = np.array([[E_ROWS - 1, E_ROWS - 2], [5000, 7777]])
    assert not np.isin(unseen, seen1).any()
    zero = e_predict(est, unseen, graphmod.GraphModifierHook(
        tables={"emb": {"default_value": 0.0}}))
    np.testing.assert_array_equal(zero["emb"], np.zeros((2, 2, DIM), np.float32))
    init = e_predict(est, unseen, graphmod.GraphModifierHook())
    assert (np.abs(init["emb"]).sum(-1) > 0).all()
    assert (np.abs(init["emb"]) <= 0.2 + 1e-6).all()  # truncated normal, stddev 0.1
    assert len(e_table(tmp_path)["keys"]) == len(seen1)  # predict inserted nothing

    # --- resume on ids 0..299 only: the other rows stay bit for bit.
    ids2, labels2 = e_data(2048, 0, 300, seed=2)
    est2 = Estimator(e_model_fn, config=config)
    est2.train(e_input_fn(ids2, labels2), steps=20, hooks=[graphmod.GraphModifierHook()])
    assert est2.get_variable_value("global_step") == 80
    t2 = e_table(tmp_path)
    seen2 = np.unique(ids2[:20 * E_BATCH])
    np.testing.assert_array_equal(t2["keys"], np.union1d(seen1, seen2))
    untouched = np.setdiff1d(seen1, seen2)
    assert len(untouched) > 200
    i1, i2 = np.searchsorted(t1["keys"], untouched), np.searchsorted(t2["keys"], untouched)
    for f in FIELDS:
        np.testing.assert_array_equal(t2[f][i2], t1[f][i1], err_msg=f)
    # Rows trained again continue from their restored state (counts add up).
    both = np.intersect1d(seen1, seen2)
    j1, j2 = np.searchsorted(t1["keys"], both), np.searchsorted(t2["keys"], both)
    assert (t2["counts"][j2] > t1["counts"][j1]).all()
    assert t2["versions"][j2].min() > 60


@pytest.mark.slow
def test_v1_estimator_is_recognised(tmp_path):
    """tf.compat.v1.estimator.Estimator (tensorflow_estimator.estimator.Estimator, as in
    test_estimator.py) is the base class of tf.estimator.Estimator, not a subclass:
    the hook must still find its model_dir and tell its predict graph."""
    est = tf1.estimator.Estimator(e_model_fn, model_dir=str(tmp_path))
    ids, labels = e_data(256, 0, 100, seed=3)
    est.train(e_input_fn(ids, labels), steps=4, hooks=[graphmod.GraphModifierHook()])
    assert "emb-keys" in dict(tf.train.list_variables(str(tmp_path)))
    hook = graphmod.GraphModifierHook()
    e_predict(est, ids[:8], hook)
    assert hook.report.graph == "predict"
    out = tmp_path / "graphmod"
    assert (out / "rewrite_report_train.json").exists()
    assert (out / "rewrite_report_predict.json").exists()


@pytest.mark.parametrize("kind", ["partitioned_div", "partitioned_mod", "keras_embedding"])
def test_partitioned_variables_and_keras_embedding_layers(kind):
    """Each part of a PartitionedVariable becomes its own table (keyed by the
    id within the part), and a Keras Embedding layer's variable converts too;
    training matches the dense model step for step."""
    def losses(with_hook):
        with tf.Graph().as_default():
            step = tf1.train.get_or_create_global_step()
            ids = tf1.placeholder(tf.int64, [None])
            init = tf1.constant_initializer(0.1)
            if kind.startswith("partitioned"):
                emb = tf1.get_variable("emb", [3000, 4], initializer=init,
                                       partitioner=tf1.fixed_size_partitioner(3))
                e = tf1.nn.embedding_lookup(emb, ids, partition_strategy=kind.split("_")[1])
            else:
                e = tf.keras.layers.Embedding(3000, 4, embeddings_initializer=init, name="kemb")(ids)
            w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.5))
            loss = tf.reduce_sum(tf.square(tf.matmul(e, w) - 1.0))
            train = tf1.train.AdagradOptimizer(0.1).minimize(loss, step)
            hook = graphmod.GraphModifierHook(min_rows=100)
            out = []
            with tf1.train.MonitoredSession(hooks=[hook] if with_hook else []) as sess:
                for batch in ([1, 1500, 2999, 1], [2, 1500, 7], [1, 2999]):
                    out.append(sess.run([loss, train], {ids: batch})[0])
            return out, hook.report

    dense, _ = losses(False)
    hooked, report = losses(True)
    np.testing.assert_allclose(hooked, dense, rtol=1e-5)
    expected = 3 if kind.startswith("partitioned") else 1
    assert len(report.tables) == expected and not report.skipped


@pytest.mark.parametrize("make, kind, a, b", [
    (lambda: None, "uniform", -(6 / 20_008) ** 0.5, (6 / 20_008) ** 0.5),  # get_variable's glorot
    (lambda: tf1.random_uniform_initializer(-0.05, 0.05), "uniform", -0.05, 0.05),
    (lambda: tf1.random_normal_initializer(0.5, 0.2), "normal", 0.5, 0.2),
    (lambda: tf1.truncated_normal_initializer(stddev=0.1), "truncated_normal", 0.0, 0.1),
    (lambda: tf1.constant_initializer(0.25), "constant", 0.25, 0.0),
])
def test_tables_inherit_the_variables_initializer(make, kind, a, b):
    from graphmod.embeddings.initializers import from_variable
    with tf.Graph().as_default():
        v = tf1.get_variable("emb", [20_000, 8], initializer=make())
        init = from_variable(v)
    assert init.kind == kind
    np.testing.assert_allclose([init.a, init.b], [a, b], rtol=1e-6)


def test_large_variable_read_only_densely_is_reported():
    with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, [None, 20_000])
        w = tf1.get_variable("wide", [20_000, 4])
        loss = tf.reduce_sum(tf.matmul(x, w))
        tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_or_create_global_step())
        hook = graphmod.GraphModifierHook()
        hook.begin()
    ((variable, reason),) = [(s["variable"], s["reason"]) for s in hook.report.skipped]
    assert variable == "wide" and "never read by a gather" in reason and "MatMul" in reason
