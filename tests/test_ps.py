"""An unchanged Estimator on a parameter-server cluster, as users launch it:
the same script in a chief, two ps and an evaluator process on 127.0.0.1
ports, `tf.estimator.train_and_evaluate` under TF_CONFIG, GraphModifierHook
in both specs. Its tables live on the ps tasks (none on the chief), it trains
exactly as the same script in one process, its eval graph is rewritten on
the evaluator, and its checkpoint restores on one machine with no cluster."""
import glob
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from google.protobuf import text_format

import graphmod

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20

MODEL = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    WORDS = [f"w{i}" for i in range(97)]

    def model_fn(features, labels, mode):
        init = tf1.truncated_normal_initializer(0.1)
        emb = tf1.get_variable("emb", [20000, 4], initializer=init)
        # Partitioned, as PS users partition embeddings: a part on each ps task.
        part = tf1.get_variable("part", [20000, 4], initializer=init,
                                partitioner=tf1.fixed_size_partitioner(2))
        words = tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_hash_bucket("s", 20000), 4)
        net = tf.concat([
            tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), 1),
            tf.reduce_sum(tf.nn.embedding_lookup(part, features["ids"] * 7 % 20000), 1),
            tf1.feature_column.input_layer(features, [words])], 1)
        # A constant kernel: a distributed graph holds other ops than a local one,
        # which moves random initializers' op-level seeds (hook or not).
        logits = tf.squeeze(tf1.layers.dense(
            net, 1, kernel_initializer=tf1.constant_initializer(0.1)), 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def input_fn():
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 50, size=(256, 3))
        s = np.array(WORDS)[rng.integers(0, len(WORDS), 256)].astype(bytes)
        labels = ((ids[:, 0] + (s == b"w5")) % 2).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({"ids": ids, "s": s}, labels)) \
            .repeat().batch(32)
""")
exec(MODEL)  # model_fn and input_fn here too  # pylint: disable=exec-used

JOB = MODEL + textwrap.dedent(f"""
    import sys
    import graphmod
    config = tf.estimator.RunConfig(model_dir=sys.argv[1], tf_random_seed=1,
                                    save_checkpoints_steps=10)
    est = tf.estimator.Estimator(model_fn, config=config)
    hook = graphmod.GraphModifierHook(dump_graph=True, incremental_every_steps=5)
    tf.estimator.train_and_evaluate(
        est, tf.estimator.TrainSpec(input_fn, max_steps={STEPS}, hooks=[hook]),
        tf.estimator.EvalSpec(input_fn, steps=2, hooks=[hook], throttle_secs=1,
                              start_delay_secs=0))
""")
QUERY = {"ids": np.array([[1, 2, 3], [4, 5, 6], [70000, 8, 9]], np.int64),
         "s": np.array([b"w1", b"w2", b"unseen"])}


def _ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _env(tf_config=None):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the cluster's model_dir, the one-process model_dir)."""
    root = tmp_path_factory.mktemp("ps")
    chief, ps0, ps1, evaluator = _ports(4)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps0}", f"127.0.0.1:{ps1}"]}
    model_dir, single = str(root / "cluster"), str(root / "single")
    logs = {}

    def start(kind, index):
        log = open(root / f"{kind}{index}.log", "w")
        logs[f"{kind}{index}"] = root / f"{kind}{index}.log"
        config = {"cluster": cluster, "task": {"type": kind, "index": index}}
        return subprocess.Popen([sys.executable, "-c", JOB, model_dir], env=_env(config),
                                stdout=log, stderr=subprocess.STDOUT)
    del evaluator  # the evaluator is not a member of the cluster spec
    servers = [start("ps", 0), start("ps", 1)]
    tasks = [start("chief", 0), start("evaluator", 0)]
    try:
        for task in tasks:
            task.wait(timeout=300)
        for task, name in zip(tasks, ("chief0", "evaluator0")):
            assert task.returncode == 0, logs[name].read_text()[-3000:]
        # The same script in one process.
        done = subprocess.run([sys.executable, "-c", JOB, single], env=_env(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        for p in servers + tasks:  # ps tasks serve until stopped
            if p.poll() is None:
                p.kill()
            p.wait()
    return model_dir, single


def _graph(model_dir, mode):
    graph = graph_pb2.GraphDef()
    with open(os.path.join(model_dir, "graphmod", f"graph_after_{mode}.pbtxt")) as f:
        text_format.Parse(f.read(), graph)
    return graph


def test_tables_live_on_the_ps_tasks(trained):
    model_dir, _ = trained
    graph = _graph(model_dir, "train")
    tables = {n.name: n.device for n in graph.node if n.op == "GraphmodTable"}
    variables = {n.name: n.device for n in graph.node if n.op == "VarHandleOp"}
    assert sorted(tables) == sorted(
        f"graphmod/{v}/table" for v in ("emb", "part/part_0", "part/part_1",
                                         "input_layer/s_embedding/embedding_weights"))
    # Each table where replica_device_setter put the variable it replaces:
    # the partitioned variable's parts on both ps tasks, nothing on the chief.
    for name, device in tables.items():
        assert device == variables[name[len("graphmod/"):-len("/table")]], (name, device)
    assert {tables["graphmod/part/part_0/table"], tables["graphmod/part/part_1/table"]} == {
        "/job:ps/task:0", "/job:ps/task:1"}
    # The dense variables stay where the device setter put them.
    assert all(d.startswith("/job:ps/task:") for d in variables.values()), variables
    # Deltas were written between the full checkpoints, a part per device.
    assert glob.glob(os.path.join(model_dir, "graphmod", "deltas", "model.ckpt-10", "delta-*"))


def test_the_cluster_trains_as_one_process_and_restores_without_it(trained):
    """Predictions of both model_dirs, each read by one process with no
    cluster (the cluster's checkpoint restored on one machine), and their
    tables' rows, are equal."""
    model_dir, single = trained
    answers, rows = [], []
    for d in (model_dir, single):
        est = tf.estimator.Estimator(model_fn, model_dir=d)
        answers.append(np.array([p["p"] for p in est.predict(
            lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(3),
            hooks=[graphmod.GraphModifierHook()])]))
        held = tf.train.load_checkpoint(os.path.join(d, f"model.ckpt-{STEPS}"))
        for table in ("emb", "part/part_0", "part/part_1"):
            order = np.argsort(held.get_tensor(f"{table}-keys"))
            rows.append([held.get_tensor(f"{table}-{e}")[order]
                         for e in ("keys", "values", "slots", "counts")])
    np.testing.assert_array_equal(answers[0], answers[1])
    for a, b in zip(rows[:3], rows[3:]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert len(rows[0][0]) == 50  # every trained id has its row
    assert len(rows[1][0]) + len(rows[2][0]) == 50  # split between the parts


def test_the_evaluator_evaluates_with_the_rewritten_graph(trained):
    model_dir, _ = trained
    graph = _graph(model_dir, "eval")
    assert any(n.op == "GraphmodTable" for n in graph.node)
    assert glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))
