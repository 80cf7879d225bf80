"""An unchanged Estimator on a parameter-server cluster, as users launch it:
the same script in a chief, two ps and an evaluator process on 127.0.0.1
ports, `tf.estimator.train_and_evaluate` under TF_CONFIG, GraphModifierHook
in both specs. Its tables live on the ps tasks (none on the chief), it trains
exactly as the same script in one process, its eval graph is rewritten on
the evaluator, its checkpoint restores on one machine with no cluster, and
training resumes from it on 3 ps tasks as it does in one process."""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from google.protobuf import text_format

import graphmod

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, MORE = 20, 30

sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402
from ps_train import model_fn  # noqa: E402

TRAIN = os.path.join(HERE, "..", "examples", "ps_train.py")
QUERY = {"ids": np.array([[1, 2, 3], [4, 5, 6], [70000, 8, 9]], np.int64),
         "s": np.array([b"w1", b"w2", b"unseen"])}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the cluster's model_dir, the one-process model_dir)."""
    root = tmp_path_factory.mktemp("ps")
    model_dir, single = str(root / "cluster"), str(root / "single")
    logs = str(root / "logs")
    status = run_cluster([sys.executable, TRAIN, model_dir, "--steps", str(STEPS)], ps=2,
                         log_dir=logs, timeout=300)
    for name, code in status.items():
        assert code == 0, open(os.path.join(logs, f"{name}.log")).read()[-3000:]
    assert sorted(status) == ["chief0", "evaluator0"]
    # The same script in one process.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, TRAIN, single, "--steps", str(STEPS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir, single


@pytest.fixture(scope="module")
def resumed(trained, tmp_path_factory):
    """Both model_dirs trained on to MORE steps: the cluster's on 3 ps tasks
    (its checkpoint written by 2), the one-process one in one process."""
    model_dir, single = trained
    logs = str(tmp_path_factory.mktemp("ps3_logs"))
    status = run_cluster([sys.executable, TRAIN, model_dir, "--steps", str(MORE)], ps=3,
                         evaluator=False, log_dir=logs, timeout=300)
    assert status == {"chief0": 0}, open(os.path.join(logs, "chief0.log")).read()[-3000:]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, TRAIN, single, "--steps", str(MORE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
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


def test_a_checkpoint_of_2_ps_tasks_resumes_on_3(resumed):
    """Tables are saved by name, not by task: training resumes on another
    number of ps tasks exactly as in one process."""
    model_dir, single = resumed
    answers = []
    for d in (model_dir, single):
        assert tf.train.latest_checkpoint(d).endswith(f"-{MORE}")
        est = tf.estimator.Estimator(model_fn, model_dir=d)
        answers.append(np.array([p["p"] for p in est.predict(
            lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(3),
            hooks=[graphmod.GraphModifierHook()])]))
    np.testing.assert_array_equal(answers[0], answers[1])
    # The resumed graph's tables spread over the 3 tasks.
    devices = {n.device for n in _graph(model_dir, "train").node if n.op == "GraphmodTable"}
    assert devices == {"/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:2"}, devices
