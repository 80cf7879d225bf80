"""Portable export of three real models: what a process with only stock
TensorFlow serves (tf.saved_model.load, the TF1 loader and saved_model_cli
run) is what graphmod's own predict answers, to 1e-6, for seen, unseen and
missing ids, integer and string, and every op of the exported graph is in
stock TensorFlow's op registry.

  wide_deep  tf.estimator.DNNLinearCombinedClassifier (canned): an identity
             column past the hook's min_rows, a hashed string column and a
             hashed integer column, each read by the linear and the DNN part;
  deepfm     DeepCTR 0.9.4's DeepFMEstimator on the same features;
  horovod    a model_fn trained on 2 Horovod ranks (Gloo over loopback), its
             tables sharded by key into one model_dir, exported and predicted
             in one process without Horovod: by export_saved_model(portable=True)
             and from the model_dir's parts (`graphmod export --portable
             --model-dir`, graphmod.checkpoint.serving_versions.export_state).

Each model trains once (module-scoped fixture). The stock-TensorFlow client
is tests/test_portable.py's (STOCK: graphmod cannot be imported; CLI).
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.checkpoint import portable as portable_module
from graphmod.settings import MIN_ROWS
from test_portable import CLI, STOCK, _run  # tests/ is on sys.path under pytest

tf1 = tf.compat.v1
fc = tf.feature_column
pytestmark = pytest.mark.slow

USERS = 20_000  # identity ids: converted only past MIN_ROWS
BUCKETS = {"item": 5_000, "city": 2_000}  # hashed: converted at any size
DIM, N, STEPS, BATCH = 4, 512, 10, 64  # every training row is read (STEPS * BATCH > N)
assert USERS >= MIN_ROWS and STEPS * BATCH >= N


def training_data():
    """N rows: users in [0, 300), items 'i0'..'i199', cities in [0, 50)."""
    rng = np.random.default_rng(0)
    feats = {"user": rng.integers(0, 300, (N, 1)).astype(np.int64),
             "item": np.array([f"i{k}".encode() for k in rng.integers(0, 200, N)],
                              dtype=object).astype(bytes).reshape(N, 1),
             "city": rng.integers(0, 50, (N, 1)).astype(np.int64),
             "x": rng.normal(size=(N, 1)).astype(np.float32)}
    labels = ((feats["user"] + (feats["city"] % 3 == 0)) % 2).astype(np.float32)
    return feats, labels


FEATS, LABELS = training_data()
_U, _I, _C = FEATS["user"][:, 0], FEATS["item"][:, 0], FEATS["city"][:, 0]
# Rows 0-3 seen; 4/5 differ only by an unseen user, 6/7 only by an unseen
# item, 8 an unseen city, 9 all unseen, 10 all missing (-1 and '' are pruned
# by feature columns).
QUERY = {
    "user": np.array([_U[0], _U[1], _U[2], _U[3], 15_000, 15_001, _U[0], _U[0], _U[1],
                      USERS - 1, -1], np.int64).reshape(-1, 1),
    "item": np.array([_I[0], _I[1], _I[2], _I[3], _I[0], _I[0], b"never-a", b"never-b",
                      _I[1], b"never-c", b""]).reshape(-1, 1),
    "city": np.array([_C[0], _C[1], _C[2], _C[3], _C[0], _C[0], _C[0], _C[0], 987_654_321,
                      5_000_000_000, -1], np.int64).reshape(-1, 1),
    "x": np.array([0.1, -0.2, 0.3, 1.0, 0.5, 0.5, 0.5, 0.5, -0.7, 0.0, 0.2],
                  np.float32).reshape(-1, 1),
}
SEEN = slice(0, 4)
UNSEEN_PAIRS = {"user": (4, 5), "item": (6, 7)}  # rows equal but for this unseen feature
UNSEEN = {"user": [15_000, 15_001, USERS - 1], "item": [b"never-a", b"never-b", b"never-c"],
          "city": [987_654_321, 5_000_000_000]}
TRAINED = {"user": set(_U.tolist()), "item": set(_I.tolist()), "city": set(_C.tolist())}


def categorical_columns():
    return [fc.categorical_column_with_identity("user", USERS),
            fc.categorical_column_with_hash_bucket("item", BUCKETS["item"]),
            fc.categorical_column_with_hash_bucket("city", BUCKETS["city"], dtype=tf.int64)]


def raw_receiver():
    features = {"user": tf1.placeholder(tf.int64, [None, 1], name="user"),
                "item": tf1.placeholder(tf.string, [None, 1], name="item"),
                "city": tf1.placeholder(tf.int64, [None, 1], name="city"),
                "x": tf1.placeholder(tf.float32, [None, 1], name="x")}
    return tf.estimator.export.ServingInputReceiver(features, features)


def train_input_fn():
    return tf.data.Dataset.from_tensor_slices((FEATS, LABELS)).repeat().batch(BATCH)


def graphmod_predict(estimator, outputs, input_fn=None):
    """Estimator.predict with GraphModifierHook (on QUERY unless input_fn
    says otherwise): {output: [rows]}."""
    rows = list(estimator.predict(
        input_fn or (lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(len(QUERY["x"]))),
        predict_keys=outputs, hooks=[graphmod.GraphModifierHook()]))
    return {k: np.array([r[k] for r in rows]) for k in outputs}


def portable_export(estimator, base, receiver=raw_receiver):
    """graphmod.export_saved_model(portable=True); returns (path, the
    conversion's report), the report recorded from portable_saved_model."""
    reports = []
    convert = portable_module.portable_saved_model

    def recording(*args, **kwargs):
        reports.append(convert(*args, **kwargs))
        return reports[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(portable_module, "portable_saved_model", recording)
        path = graphmod.export_saved_model(estimator, receiver, str(base),
                                           portable=True).decode()
    assert len(reports) == 1 and reports[0]["out"] == path
    assert os.listdir(base) == [os.path.basename(path)]  # nothing aside left
    return path, reports[0]


def model_info(path, report, expected, signature, tables, squeezed_keys_kept, logits="logits",
               query=None):
    """What the tests check of one exported model. expected: graphmod's
    predict, {signature output: rows}; tables: {table name: its feature};
    squeezed_keys_kept: the training report's (hash ops whose buckets the
    tables kept as keys); logits: the output whose last column the unseen
    rows are compared by; query: {signature input: value}, QUERY's own
    unless given."""
    kept = {f for f in TRAINED for k in squeezed_keys_kept
            if f"/{f}/" in k["op"] or f"/{f}_embedding" in k["op"]}
    return dict(path=path, report=report, expected=expected, signature=signature,
                tables=tables, kept_buckets=kept, logits=logits, query=query or QUERY)


# --- (a) the canned wide & deep model ----------------------------------------

def train_wide_deep(root):
    cats = categorical_columns()
    estimator = tf.estimator.DNNLinearCombinedClassifier(
        model_dir=str(root / "model"), linear_feature_columns=cats + [fc.numeric_column("x")],
        dnn_feature_columns=[fc.embedding_column(c, DIM) for c in cats] +
        [fc.numeric_column("x")],
        dnn_hidden_units=[8], config=tf.estimator.RunConfig(tf_random_seed=1))
    hook = graphmod.GraphModifierHook()
    estimator.train(train_input_fn, steps=STEPS, hooks=[hook])
    tables = {f"linear/linear_model/{f}/weights": f for f in TRAINED}
    tables.update({f"dnn/input_from_feature_columns/input_layer/{f}_embedding/"
                   "embedding_weights": f for f in TRAINED})
    assert {t["variable"] for t in hook.report.tables} == set(tables), hook.report.tables
    assert hook.report.squeezed_keys_kept == []  # collision-free: full ids
    return estimator, tables, hook.report.squeezed_keys_kept


def build_wide_deep(root, trained):
    """Raw inputs: the classification signatures (one serialized string
    input) are left out; "predict" serves every output."""
    estimator, tables, kept = trained
    outputs = ["logits", "logistic", "probabilities", "class_ids"]
    expected = graphmod_predict(estimator, outputs)
    path, report = portable_export(estimator, root / "serving")
    return model_info(path, report, expected, "predict", tables, kept)


def serialized_query():
    """QUERY as tf.Examples; a missing id (-1, '') is a feature left out."""
    examples = []
    for i in range(len(QUERY["x"])):
        feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=QUERY["x"][i]))}
        for name in ("user", "city"):
            if QUERY[name][i, 0] != -1:
                feature[name] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=QUERY[name][i]))
        if QUERY["item"][i, 0]:
            feature["item"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=QUERY["item"][i]))
        examples.append(tf.train.Example(features=tf.train.Features(feature=feature))
                        .SerializeToString())
    return np.array(examples, dtype=object)


def build_wide_deep_examples(root, trained):
    """The canned model as TF Serving clients call it: serving_default (and
    classify) read serialized tf.Examples, answering scores."""
    estimator, tables, kept = trained
    spec = fc.make_parse_example_spec(categorical_columns() + [fc.numeric_column("x")])
    examples = serialized_query()
    expected = graphmod_predict(estimator, ["probabilities"], lambda: tf.data.Dataset
                                .from_tensor_slices(examples.astype(bytes)).batch(len(examples))
                                .map(lambda s: tf.io.parse_example(s, spec)))
    path, report = portable_export(
        estimator, root / "serving_examples",
        tf.estimator.export.build_parsing_serving_input_receiver_fn(spec))
    return model_info(path, report, {"scores": expected["probabilities"]}, "serving_default",
                      tables, kept, logits="scores", query={"inputs": examples})


# --- (b) DeepCTR's DeepFM ----------------------------------------------------

def build_deepfm(root):
    deepctr_estimator = pytest.importorskip("deepctr.estimator")
    cats = categorical_columns()
    estimator = deepctr_estimator.DeepFMEstimator(
        cats + [fc.numeric_column("x")],
        [fc.embedding_column(c, DIM) for c in cats] + [fc.numeric_column("x")],
        dnn_hidden_units=(8,), model_dir=str(root / "model"), seed=1,
        dnn_optimizer=tf1.train.AdagradOptimizer(0.1),
        config=tf.estimator.RunConfig(tf_random_seed=1))
    hook = graphmod.GraphModifierHook()
    estimator.train(train_input_fn, steps=STEPS, hooks=[hook])
    tables = {}
    for t in hook.report.tables:
        parts = t["variable"].split("/")
        tables[t["table"]] = next(f for f in TRAINED if f in parts or f"{f}_embedding" in parts)
    # Each feature's linear weight and its embedding (DeepCTR's variable names).
    assert sorted(tables.values()) == sorted(list(TRAINED) * 2), hook.report.tables
    assert hook.report.squeezed_keys_kept == []  # collision-free: full ids
    expected = graphmod_predict(estimator, ["pred", "logits"])
    path, report = portable_export(estimator, root / "serving")
    # DeepCTR exports one PredictOutput, which also becomes serving_default.
    return model_info(path, report, expected, "serving_default", tables,
                      hook.report.squeezed_keys_kept)


# --- (c) 2 Horovod ranks, tables sharded by key ------------------------------

# The model, both in the ranks' script and here (predict touches no Horovod).
HOROVOD_MODEL = textwrap.dedent("""
    def horovod_model_fn(features, labels, mode):
        fc = tf.feature_column
        cats = [fc.categorical_column_with_identity("user", 20_000),
                fc.categorical_column_with_hash_bucket("item", 5_000),
                fc.categorical_column_with_hash_bucket("city", 2_000, dtype=tf.int64)]
        net = tf.compat.v1.feature_column.input_layer(
            features, [fc.embedding_column(c, 4) for c in cats] + [fc.numeric_column("x")])
        net = tf.compat.v1.layers.dense(net, 8, tf.nn.relu)
        logits = tf.squeeze(tf.compat.v1.layers.dense(net, 1), 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={
                "logits": logits, "p": tf.sigmoid(logits)})
        import horovod.tensorflow as hvd
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.squeeze(labels, 1), logits=logits))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step()))
""")
exec(HOROVOD_MODEL)  # defines horovod_model_fn  # pylint: disable=exec-used

HOROVOD_RANK = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    model_dir, data, out = sys.argv[1:4]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data = np.load(data)
    feats = {k: data[k][rank::size] for k in ("user", "item", "city", "x")}  # this rank's
    labels = data["labels"][rank::size]
    # MODEL
    estimator = tf.estimator.Estimator(horovod_model_fn, config=tf.estimator.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=STEPS, tf_random_seed=1))
    modifier = graphmod.GraphModifierHook()
    estimator.train(lambda: tf.data.Dataset.from_tensor_slices((feats, labels)).repeat()
                    .batch(BATCH), steps=STEPS,
                    hooks=[hvd.BroadcastGlobalVariablesHook(0), modifier])
    json.dump(dict(ranks=modifier.report.sharded_ranks,
                   tables=[t["table"] for t in modifier.report.tables],
                   squeezed_keys_kept=modifier.report.squeezed_keys_kept),
              open(f"{out}/rank{rank}.json", "w"))
""").replace("# MODEL\n", HOROVOD_MODEL)


def train_horovod(root):
    np.savez(root / "data.npz", labels=LABELS, **FEATS)
    script = root / "rank.py"
    script.write_text(HOROVOD_RANK.replace("STEPS", str(STEPS)).replace("BATCH", str(BATCH // 2)))
    model_dir = root / "model"
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    done = subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable, str(script), str(model_dir), str(root / "data.npz"),
                           str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    tables = {f"input_layer/{f}_embedding/embedding_weights": f for f in TRAINED}
    for r in ranks:
        assert r["ranks"] == 2 and sorted(r["tables"]) == sorted(tables), r
    # Every rank wrote its part of the last checkpoint.
    names = os.listdir(model_dir)
    for r in range(2):
        assert f"model.ckpt-{STEPS}.tables-0000{r}-of-00002.index" in names, names
    # One process, no Horovod: graphmod's predict and the export read both parts.
    estimator = tf.estimator.Estimator(horovod_model_fn, model_dir=str(model_dir))
    # The rank whose rewrite saved the plan first decided (and reported) which
    # hash buckets stay keys; the other replayed its plan, reporting none.
    return estimator, tables, ranks[0]["squeezed_keys_kept"] + ranks[1]["squeezed_keys_kept"]


def build_horovod(root, trained):
    estimator, tables, kept = trained
    expected = graphmod_predict(estimator, ["logits", "p"])
    path, report = portable_export(estimator, root / "serving")
    return model_info(path, report, expected, "serving_default", tables, kept)


def build_horovod_model_dir(root, trained):
    """`graphmod export --portable --model-dir`: the state read from the
    model_dir's parts (graphmod.checkpoint.merged), the graph from a
    SavedModel of graphmod's."""
    from graphmod.checkpoint.serving_versions import export_state
    estimator, tables, kept = trained
    expected = graphmod_predict(estimator, ["logits", "p"])
    template = graphmod.export_saved_model(estimator, raw_receiver, str(root / "graphmod"))
    path = str(root / "serving")
    report = export_state(template.decode(), estimator.model_dir, path)
    assert report["step"] == STEPS and report["deltas"] == 0
    return model_info(path, report, expected, "serving_default", tables, kept)


@pytest.fixture(scope="module")
def wide_deep(tmp_path_factory):
    return train_wide_deep(tmp_path_factory.mktemp("wide_deep"))


@pytest.fixture(scope="module")
def horovod(tmp_path_factory):
    return train_horovod(tmp_path_factory.mktemp("horovod"))


BUILDERS = {"wide_deep": (build_wide_deep, "wide_deep"),
            "wide_deep_examples": (build_wide_deep_examples, "wide_deep"),
            "deepfm": (build_deepfm, None), "horovod": (build_horovod, "horovod"),
            "horovod_model_dir": (build_horovod_model_dir, "horovod")}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request, tmp_path_factory):
    """One model's portable export (each model trains once)."""
    root = tmp_path_factory.mktemp(request.param)
    build, trained = BUILDERS[request.param]
    if trained is not None:
        return build(root, request.getfixturevalue(trained))
    return build(root)


# --- what a stock TensorFlow process serves ----------------------------------

# The SavedModel's signature on the query, through tf.saved_model.load and
# the TF1 loader, and the op types of its graph (and function library) that
# stock TensorFlow's op registry lacks.
LOAD = STOCK + textwrap.dedent("""
    import json, numpy as np, tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry
    tf1 = tf.compat.v1
    path, query_dir, signature = sys.argv[1:4]
    outputs = json.loads(sys.argv[4])
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(open(path + "/saved_model.pb", "rb").read())
    inputs = list(saved.meta_graphs[0].signature_def[signature].inputs)
    query = {k: np.load(f"{query_dir}/{k}.npy", allow_pickle=True) for k in inputs}
    f = tf.saved_model.load(path).signatures[signature]
    got = f(**{k: tf.constant(v) for k, v in query.items()})
    out = {"v2": {k: got[k].numpy().tolist() for k in outputs}}
    with tf.Graph().as_default(), tf1.Session() as sess:
        sig = tf1.saved_model.load(sess, ["serve"], path).signature_def[signature]
        values = sess.run([sig.outputs[k].name for k in outputs],
                          {sig.inputs[k].name: v for k, v in query.items()})
        out["v1"] = {k: v.tolist() for k, v in zip(outputs, values)}
    types = {n.op for m in saved.meta_graphs for n in m.graph_def.node}
    types |= {n.op for m in saved.meta_graphs for f in m.graph_def.library.function
              for n in f.node_def}
    out["not_stock"] = sorted(t for t in types if op_def_registry.get(t) is None)
    out["op_types"] = sorted(types)
    out["inputs"] = sorted(inputs)
    assert "graphmod" not in sys.modules and op_def_registry.get("GraphmodTable") is None
    print(json.dumps(out))
""")


def test_stock_tensorflow_serves_graphmods_predictions(model, tmp_path):
    """tf.saved_model.load, the TF1 loader and saved_model_cli run answer
    graphmod's predict; no op of the graph is missing from stock TF."""
    for name, value in model["query"].items():
        np.save(tmp_path / f"{name}.npy", value)
    expected, path = model["expected"], model["path"]
    served = json.loads(_run(["-c", LOAD, path, str(tmp_path), model["signature"],
                              json.dumps(sorted(expected))], tmp_path).splitlines()[-1])
    assert served["inputs"] == sorted(model["query"])
    assert served["not_stock"] == [], served["not_stock"]
    assert len(served["op_types"]) > 10 and not any("Graphmod" in t for t in served["op_types"])
    results = tmp_path / "cli"
    _run(["-c", CLI, "run", "--dir", path, "--tag_set", "serve",
          "--signature_def", model["signature"], "--outdir", str(results),
          "--inputs", ";".join(f"{k}={tmp_path / k}.npy" for k in model["query"])],
         tmp_path)
    for key, want in expected.items():
        for how in ("v2", "v1"):
            np.testing.assert_allclose(np.array(served[how][key]).reshape(want.shape), want,
                                       rtol=1e-6, atol=1e-6, err_msg=f"{how} {key}")
        np.testing.assert_allclose(np.load(results / f"{key}.npy").reshape(want.shape), want,
                                   rtol=1e-6, atol=1e-6, err_msg=f"saved_model_cli {key}")


def keys_of(feature, values, kind):
    """The table keys of a feature's values: identity ids themselves; hashed
    ones (the feature column hashes an integer's decimal string) either the
    full 63-bit fingerprint (collision_free, graphmod's default) or the
    hash bucket (where the rewrite kept the buckets, reported)."""
    values = np.asarray(list(values))
    if feature == "user":
        return set(values.tolist())
    strings = tf.constant(values) if feature == "item" else tf.strings.as_string(values)
    if kind == "buckets":
        keys = tf.strings.to_hash_bucket_fast(strings, BUCKETS[feature])
    else:  # as rewrite_rules/collisionless_keys.py feeds the table
        keys = tf.bitwise.bitwise_and(tf.bitcast(tf.fingerprint(strings), tf.int64),
                                      tf.int64.max)
    return set(keys.numpy().tolist())


def test_tables_are_converted_with_every_trained_key(model):
    """The conversion's report lists each table with its rows; the portable
    variables hold them as keys and rows: exactly the keys of the trained
    ids of its feature (sharded: both ranks' parts), full ids unless the
    training's report says the hash buckets were kept. The query's unseen
    ids have no key there, its seen ones have."""
    report, tables = model["report"], model["tables"]
    converted = {t["table"]: t for t in report["tables"]}
    assert set(converted) == set(tables), sorted(converted)
    reader = tf.train.load_checkpoint(os.path.join(model["path"], "variables", "variables"))
    shapes = reader.get_variable_to_shape_map()
    for table, feature in tables.items():
        rows = converted[table]["rows"]
        keys = set(reader.get_tensor(f"{table}-keys").tolist())
        assert rows == len(keys) > 0 and shapes[f"{table}-keys"] == [rows], table
        assert shapes[f"{table}-rows"] == [rows, converted[table]["dim"]], table
        assert not any(n.startswith(table + "-") and n.endswith(("-slots", "-values"))
                       for n in shapes), table
        kind = "buckets" if feature in model["kept_buckets"] else "full"
        assert keys == keys_of(feature, TRAINED[feature], kind), (table, kind)
        assert not keys & keys_of(feature, UNSEEN[feature], kind), table
        assert keys_of(feature, QUERY[feature][SEEN, 0], kind) <= keys, table


def test_unseen_ids_are_unseen_and_read_their_initial_rows(model):
    """The query's unseen ids were never trained (the tables hold exactly
    the trained ids, above), its seen ones were; two rows that differ only
    by an unseen id answer differently (unseen ids read their own initial
    rows, not one default)."""
    for feature, values in UNSEEN.items():
        assert not TRAINED[feature] & set(values)
        assert set(QUERY[feature][:, 0].tolist()) & set(values)
    for feature in TRAINED:
        assert set(QUERY[feature][SEEN, 0].tolist()) <= TRAINED[feature]
    logits = model["expected"][model["logits"]].reshape(len(QUERY["x"]), -1)[:, -1]
    for feature, (a, b) in UNSEEN_PAIRS.items():
        assert all((QUERY[k][a] == QUERY[k][b]) == (k != feature) for k in QUERY)
        assert {QUERY[feature][a, 0], QUERY[feature][b, 0]} <= set(UNSEEN[feature])
        assert abs(logits[a] - logits[b]) > 1e-4, (feature, logits)
