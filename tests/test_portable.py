"""graphmod export --portable: a graphmod SavedModel becomes one that a process
with only stock TensorFlow serves (tf.saved_model.load, saved_model_cli run),
answering what graphmod's predict answers for seen and unseen, int and string
ids; bad input is one line, exit status 2, nothing written."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import graphmod
from graphmod.checkpoint.portable import portable_saved_model
from graphmod_cli import main

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow
VOCAB, BUCKETS = 20_000, 20_000
WORDS = [f"w{i}" for i in range(97)]


def model_fn(features, labels, mode):
    emb = tf1.get_variable("emb", [VOCAB, 4], initializer=tf1.truncated_normal_initializer(0.1))
    e = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), 1)
    words = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket("s", BUCKETS), 4)
    # A small vocabulary stays a variable; its lookup table is the model's
    # own, filled by the SavedModel's main op.
    kind = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_vocabulary_list("c", ["a", "b", "c"]), 2)
    s = tf1.feature_column.input_layer(features, [words, kind])
    logits = tf.squeeze(tf1.layers.dense(tf.concat([e, s], 1), 1,
                                         kernel_initializer=tf1.ones_initializer()), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def receiver():
    ids = tf1.placeholder(tf.int64, [None, 3], name="ids")
    s = tf1.placeholder(tf.string, [None], name="s")
    c = tf1.placeholder(tf.string, [None], name="c")
    features = {"ids": ids, "s": s, "c": c}
    return tf.estimator.export.ServingInputReceiver(features, features)


# Seen rows first, then ids and strings no table holds (the initial rows).
QUERY_IDS = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12],
                      [VOCAB + 5, -3, 7], [2**62, -2**63, 2**63 - 1], [123_457, 0, 1]], np.int64)
QUERY_S = np.array([b"w0", b"w5", b"w96", b"w40", b"unseen-a", b"", b"w1"])
QUERY_C = np.array([b"a", b"b", b"c", b"zz", b"a", b"b", b"c"])
QUERY = {"ids": QUERY_IDS, "s": QUERY_S, "c": QUERY_C}

# A client with stock TensorFlow only: graphmod cannot be imported (the
# editable install would find it otherwise) and its op library is never loaded.
STOCK = textwrap.dedent("""
    import importlib.abc, sys
    class NoGraphmod(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "graphmod":
                raise ImportError("graphmod is not available in this process")
    sys.meta_path.insert(0, NoGraphmod())
""")
LOAD = STOCK + textwrap.dedent("""
    import json, numpy as np, tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry
    tf1 = tf.compat.v1
    query = {k: np.load(f"{sys.argv[2]}/{k}.npy") for k in ("ids", "s", "c")}
    out = {}
    f = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    out["v2"] = f(**{k: tf.constant(v) for k, v in query.items()})["p"].numpy().tolist()
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.load(sess, ["serve"], sys.argv[1])
        sig = meta.signature_def["serving_default"]
        out["v1"] = sess.run(sig.outputs["p"].name,
                             {sig.inputs[k].name: v for k, v in query.items()}).tolist()
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(open(sys.argv[1] + "/saved_model.pb", "rb").read())
    types = {n.op for m in saved.meta_graphs for n in m.graph_def.node}
    types |= {n.op for m in saved.meta_graphs for f in m.graph_def.library.function
              for n in f.node_def}
    out["not_stock"] = sorted(t for t in types if op_def_registry.get(t) is None)
    out["op_types"] = len(types)
    assert "graphmod" not in sys.modules and op_def_registry.get("GraphmodTable") is None
    print(json.dumps(out))
""")
CLI = STOCK + textwrap.dedent("""
    from tensorflow.python.tools import saved_model_cli
    sys.argv = ["saved_model_cli"] + sys.argv[1:]
    saved_model_cli.main()
    assert "graphmod" not in sys.modules
""")


def _stock_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GRAPHMOD_OPS_LIBRARY")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run(args, cwd):
    done = subprocess.run([sys.executable, "-I", *args], capture_output=True, text=True,
                          timeout=180, env=_stock_env(), cwd=cwd)  # run() waits: none left
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(graphmod's SavedModel, the portable one of export_saved_model(portable=True),
    graphmod's predict on the query)."""
    root = tmp_path_factory.mktemp("portable")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(512, 3))
    ids[:4] = QUERY_IDS[:4]
    s = np.array(WORDS)[rng.integers(0, len(WORDS), 512)].astype(bytes)
    c = np.array([b"a", b"b", b"c"])[rng.integers(0, 3, 512)]
    labels = ((ids[:, 0] + (s == b"w5") + (c == b"b")) % 2).astype(np.float32)
    est = tf.estimator.Estimator(model_fn, model_dir=str(root / "model"))
    est.train(lambda: tf.data.Dataset.from_tensor_slices(
        ({"ids": ids, "s": s, "c": c}, labels)).repeat().batch(64),
        steps=20, hooks=[graphmod.GraphModifierHook()])
    expected = np.array([p["p"] for p in est.predict(
        lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(len(QUERY_S)),
        hooks=[graphmod.GraphModifierHook()])])
    source = graphmod.export_saved_model(est, receiver, str(root / "graphmod")).decode()
    portable = graphmod.export_saved_model(est, receiver, str(root / "serving"),
                                           portable=True).decode()
    return source, portable, expected


def test_portable_export_serves_graphmods_answers_on_stock_tensorflow(exported, tmp_path):
    source, portable, expected = exported
    assert os.listdir(os.path.dirname(portable)) == [os.path.basename(portable)]  # no temp left
    out = str(tmp_path / "cli_out")
    assert main(["graphmod", "export", "--portable", source, out]) == 0
    converted = str(tmp_path / "converted")
    report = portable_saved_model(source, converted)
    assert sorted(t["table"] for t in report["tables"]) == [
        "emb", "input_layer/s_embedding/embedding_weights"]
    assert "emb-slots" in report["dropped"] or "emb-counts" in report["dropped"]
    for name, value in QUERY.items():
        np.save(tmp_path / f"{name}.npy", value)
    for path in (portable, out, converted):
        served = json.loads(_run(["-c", LOAD, path, str(tmp_path)], tmp_path).splitlines()[-1])
        assert served["not_stock"] == [] and served["op_types"] > 10
        np.testing.assert_allclose(served["v2"], expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(served["v1"], expected, rtol=1e-6, atol=1e-6)
    results = tmp_path / "cli_results"
    _run(["-c", CLI, "run", "--dir", out, "--tag_set", "serve",
          "--signature_def", "serving_default", "--outdir", str(results),
          "--inputs", ";".join(f"{k}={tmp_path / k}.npy" for k in QUERY)], tmp_path)
    np.testing.assert_allclose(np.load(results / "p.npy"), expected, rtol=1e-6, atol=1e-6)
    # The unseen rows are not zeros (or the test could pass with any default).
    assert len(set(np.round(expected[4:], 5))) == 3


def test_portable_export_keeps_keys_and_rows_in_variables(exported):
    source, portable, _ = exported
    entries = dict(tf.train.list_variables(os.path.join(portable, "variables", "variables")))
    before = dict(tf.train.list_variables(os.path.join(source, "variables", "variables")))
    assert entries["emb-keys"] == before["emb-keys"]
    assert entries["emb-rows"] == before["emb-values"]
    assert not any(n.endswith(("-slots", "-counts", "-pending_keys")) for n in entries)
    assert os.path.getsize(os.path.join(portable, "saved_model.pb")) < 400_000
    metas = []
    for path in (source, portable):
        saved = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved.ParseFromString(f.read())
        metas.append(saved.meta_graphs[0])
    assert dict(metas[0].signature_def) == dict(metas[1].signature_def)  # unchanged
    assert list(metas[1].meta_info_def.tags) == ["serve"]


def test_bad_input_is_one_line_exit_2_and_nothing_written(exported, tmp_path, capsys):
    source, portable, _ = exported
    foreign = _edited(source, str(tmp_path / "foreign"), lambda node: node.op == "Squeeze" and
                      setattr(node, "op", "SomeLibrarysOp"))
    cases = [(portable, str(tmp_path / "a"), "holds no graphmod tables"),
             (foreign, str(tmp_path / "d"), "does not import here"),
             (_truncated(source, str(tmp_path / "torn")), str(tmp_path / "e"), "cannot be copied"),
             (str(tmp_path), str(tmp_path / "b"), "not a SavedModel"),
             (source, os.path.dirname(source), "not empty")]
    for src, out, says in cases:
        listing = sorted(os.listdir(os.path.dirname(out)))
        assert main(["graphmod", "export", "--portable", src, out]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
        assert sorted(os.listdir(os.path.dirname(out))) == listing  # nothing written
    assert main(["graphmod", "export", source, str(tmp_path / "c")]) == 2
    assert "--portable" in capsys.readouterr().err


def _serve(path, query):
    """The signature's output in this process (graphmod loaded: its ops too)."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        sig = tf1.saved_model.load(sess, ["serve"], path).signature_def["serving_default"]
        return sess.run(sig.outputs["p"].name,
                        {sig.inputs[k].name: v for k, v in query.items()})


def _truncated(source, copy):
    """A copy of the SavedModel source whose variables' data lost its second half."""
    shutil.copytree(source, copy)
    folder = os.path.join(copy, "variables")
    for name in os.listdir(folder):
        if ".data-" in name:
            path = os.path.join(folder, name)
            os.truncate(path, os.path.getsize(path) // 2)
    return copy


def _edited(source, copy, edit):
    """A copy of the SavedModel source with edit applied to each node."""
    shutil.copytree(source, copy)
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(copy, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    for node in saved.meta_graphs[0].graph_def.node:
        edit(node)
    with open(os.path.join(copy, "saved_model.pb"), "wb") as f:
        f.write(saved.SerializeToString())
    return copy


def test_default_value_tables_read_their_default(exported, tmp_path):
    """A table with default_value: graphmod's export of it (the table's
    attributes edited) and its portable form answer alike."""
    source, _, _ = exported

    def default_value(node):
        if node.op == "GraphmodTable":
            node.attr["missing_is_initializer"].b = False
            node.attr["default_value"].f = 0.25
    edited = _edited(source, str(tmp_path / "edited"), default_value)
    report = portable_saved_model(edited, str(tmp_path / "out"))
    assert {t["unseen"] for t in report["tables"]} == {"default_value 0.25"}
    expected = _serve(edited, QUERY)
    np.testing.assert_allclose(_serve(str(tmp_path / "out"), QUERY), expected,
                               rtol=1e-6, atol=1e-6)
    assert not np.allclose(expected[4:], _serve(source, QUERY)[4:])


# Keys at both ends of int64: stored, they are found; asked for, unseen,
# they read their initial rows.
LOWEST, HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max
EDGE_KEYS = np.array([LOWEST, LOWEST + 1, LOWEST + 2, HIGHEST, HIGHEST - 1, 0, -1, 5], np.int64)
EDGE_QUERY = np.concatenate([EDGE_KEYS, [LOWEST + 3, HIGHEST - 2, 7]])[:, None]


def edge_model_fn(features, labels, mode):
    opt = graphmod.optimizers.SGD(0.5)
    table = graphmod.create_table("edge", 4, optimizer=opt)
    e = graphmod.sparse_lookup(table, features["ids"], combiner="sum",
                               is_training=mode == tf.estimator.ModeKeys.TRAIN)
    logits = tf.reduce_sum(e * np.float32([1.0, -2.0, 3.0, 0.5]), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf.group(opt.minimize(loss), tf1.assign_add(tf1.train.get_global_step(), 1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def test_keys_at_the_ends_of_int64_are_served_as_graphmod_serves_them(tmp_path):
    est = tf.estimator.Estimator(edge_model_fn, model_dir=str(tmp_path / "model"))
    labels = np.arange(len(EDGE_KEYS), dtype=np.float32) % 2
    est.train(lambda: tf.data.Dataset.from_tensor_slices(
        ({"ids": EDGE_KEYS[:, None]}, labels)).repeat().batch(8), steps=3)

    def predict(query):
        return np.array([p["p"] for p in est.predict(
            lambda: tf.data.Dataset.from_tensor_slices({"ids": query}).batch(len(query)))])

    def receiver_fn():
        ids = tf1.placeholder(tf.int64, [None, 1], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})
    source = graphmod.export_saved_model(est, receiver_fn, str(tmp_path / "graphmod")).decode()
    report = portable_saved_model(source, str(tmp_path / "portable"))
    assert report["tables"][0]["rows_kept"] == len(EDGE_KEYS)
    expected = predict(EDGE_QUERY)
    served = _serve(str(tmp_path / "portable"), {"ids": EDGE_QUERY})
    np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)
    assert len(set(np.round(expected, 5))) == len(EDGE_QUERY)  # each key its own row
    # Saving the served model's variables again writes the keys in row order.
    os.makedirs(tmp_path / "resaved")
    prefix = str(tmp_path / "resaved" / "variables")
    with tf.Graph().as_default(), tf1.Session() as sess:
        tf1.saved_model.load(sess, ["serve"], str(tmp_path / "portable"))
        meta = saved_model_pb2.SavedModel()
        with open(os.path.join(tmp_path, "portable", "saved_model.pb"), "rb") as f:
            meta.ParseFromString(f.read())
        saver_def = meta.meta_graphs[0].saver_def
        sess.run(saver_def.save_tensor_name, {saver_def.filename_tensor_name: prefix})
    written = tf.train.load_checkpoint(os.path.join(tmp_path, "portable", "variables",
                                                    "variables"))
    resaved = tf.train.load_checkpoint(prefix)
    assert sorted(resaved.get_variable_to_shape_map()) == sorted(
        written.get_variable_to_shape_map())
    for name in written.get_variable_to_shape_map():
        np.testing.assert_array_equal(resaved.get_tensor(name), written.get_tensor(name), name)
