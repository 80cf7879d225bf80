"""An unchanged Estimator on a parameter-server cluster, as users launch it:
the same script in a chief, two ps and an evaluator process on 127.0.0.1
ports, `tf.estimator.train_and_evaluate` under TF_CONFIG, GraphModifierHook
in both specs. Each table is sharded by key over the ps tasks (none on the
chief; one lookup and one apply per ps task and step), it trains exactly as
the same script in one process, hooked or not, its eval graph is rewritten on
the evaluator, its checkpoint restores on one machine with no cluster, and
training resumes from it on 3 ps tasks as it does in one process."""
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from google.protobuf import text_format

import graphmod
from graphmod.checkpoint import merged
from graphmod.embeddings.partition import owner_of_numpy

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, MORE = 20, 30

sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402
from ps_train import model_fn  # noqa: E402
from checkpoint_parts import table_rows  # noqa: E402

TRAIN = os.path.join(HERE, "..", "examples", "ps_train.py")
QUERY = {"ids": np.array([[1, 2, 3], [4, 5, 6], [70000, 8, 9]], np.int64),
         "s": np.array([b"w1", b"w2", b"unseen"])}


def _one_process(model_dir, steps, *flags):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, TRAIN, model_dir, "--steps", str(steps), *flags],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _losses(path):
    with open(path) as f:
        return [float(line.split()[1]) for line in f]


def _cluster(model_dir, steps, ps, *flags, evaluator=True):
    logs = model_dir + ".logs"
    status = run_cluster([sys.executable, TRAIN, model_dir, "--steps", str(steps), *flags],
                         ps=ps, evaluator=evaluator, log_dir=logs, timeout=300)
    for name, code in status.items():
        assert code == 0, open(os.path.join(logs, f"{name}.log")).read()[-3000:]
    assert sorted(status) == ["chief0", "evaluator0"] if evaluator else ["chief0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the cluster's model_dir, the one-process model_dir); each wrote its
    losses to <model_dir>.losses."""
    root = tmp_path_factory.mktemp("ps")
    model_dir, single = str(root / "cluster"), str(root / "single")
    _cluster(model_dir, STEPS, 2, "--losses", model_dir + ".losses")
    _one_process(single, STEPS, "--losses", single + ".losses")  # the same script
    return model_dir, single


@pytest.fixture(scope="module")
def resumed(trained, tmp_path_factory):
    """Both model_dirs trained on to MORE steps: the cluster's on 3 ps tasks
    (its checkpoint written by 2), the one-process one in one process."""
    del tmp_path_factory
    model_dir, single = trained
    _cluster(model_dir, MORE, 3, evaluator=False)
    _one_process(single, MORE)
    return model_dir, single


def _graph(model_dir, mode):
    graph = graph_pb2.GraphDef()
    with open(os.path.join(model_dir, "graphmod", f"graph_after_{mode}.pbtxt")) as f:
        text_format.Parse(f.read(), graph)
    return graph


def test_tables_are_sharded_over_the_ps_tasks(trained):
    model_dir = trained[0]
    graph = _graph(model_dir, "train")
    tables = collections.defaultdict(set)
    for n in graph.node:
        if n.op == "GraphmodTable":
            tables[n.attr["table_name"].s.decode()].add(n.device)
    # Every table has a shard on each ps task, the partitioned variable's
    # parts included; none is on the chief.
    assert dict(tables) == {name: {"/job:ps/task:0", "/job:ps/task:1"} for name in (
        "emb", "part/part_0", "part/part_1", "input_layer/s_embedding/embedding_weights")}
    # A step runs one lookup and one apply per ps task, over every table.
    used = {i.split(":")[0].lstrip("^") for n in graph.node for i in n.input}
    fused = collections.Counter((n.op, n.device) for n in graph.node
                                if n.op.startswith("Graphmod") and n.name in used
                                and n.op not in ("GraphmodTable", "GraphmodTableInfo",
                                                 "GraphmodTableTrackRemovals"))
    for op in ("GraphmodFusedFindOrInsert", "GraphmodFusedApply"):
        for task in (0, 1):
            assert fused.pop((op, f"/job:ps/task:{task}")) == 1, fused
    assert not [k for k in fused if "Find" in k[0] or "Apply" in k[0]], fused
    # The dense variables stay where the device setter put them.
    variables = [n.device for n in graph.node if n.op == "VarHandleOp"]
    assert variables and all(d.startswith("/job:ps/task:") for d in variables), variables
    # Each ps task wrote its part of the checkpoints and of the deltas between them.
    with open(os.path.join(model_dir, f"model.ckpt-{STEPS}.tables.json")) as f:
        assert json.load(f)["ranks"] == 2
    assert glob.glob(os.path.join(model_dir, "graphmod", "deltas", "model.ckpt-10",
                                  "delta-*.tables-00001-of-00002.index"))


def test_the_cluster_trains_as_one_process_and_restores_without_it(trained):
    """The cluster's losses equal those of the same script in one process;
    predictions of both model_dirs, each read by one process with no cluster
    (the cluster's checkpoint restored on one machine), and their tables'
    rows, slots and counts are equal."""
    model_dir, single = trained
    losses = [_losses(d + ".losses") for d in (model_dir, single)]
    assert len(losses[0]) == STEPS
    assert losses[0] == losses[1]
    answers, rows = [], []
    for d in (model_dir, single):
        est = tf.estimator.Estimator(model_fn, model_dir=d)
        answers.append(np.array([p["p"] for p in est.predict(
            lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(3),
            hooks=[graphmod.GraphModifierHook()])]))
        rows.append([table_rows(os.path.join(d, f"model.ckpt-{STEPS}"), table)
                     for table in ("emb", "part/part_0", "part/part_1")])
    np.testing.assert_array_equal(answers[0], answers[1])
    for a, b in zip(rows[0], rows[1]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert len(rows[0][0][0]) == 50  # every trained id has its row
    assert len(rows[0][1][0]) + len(rows[0][2][0]) == 50  # split between the parts


def test_the_cluster_trains_as_the_unmodified_model(tmp_path):
    """With embeddings starting at a constant (graphmod's initial rows are
    drawn from the variable's distribution, not its values), the cluster's
    losses equal the unmodified model's in one process."""
    model_dir, dense = str(tmp_path / "cluster"), str(tmp_path / "dense")
    _cluster(model_dir, STEPS, 2, "--constant-init", "--losses", model_dir + ".losses",
             evaluator=False)
    _one_process(dense, STEPS, "--constant-init", "--dense", "--losses", dense + ".losses")
    losses = [_losses(d + ".losses") for d in (model_dir, dense)]
    assert len(losses[0]) == STEPS and len(set(losses[0])) > 1
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_admission_and_eviction_as_in_one_process(tmp_path):
    """Admission counts and evictions per key owner (the EvictHook on the
    chief, cutting at the newest lookup over every shard) leave the hashed
    words' table exactly as one process leaves it."""
    model_dir, single = str(tmp_path / "cluster"), str(tmp_path / "single")
    _cluster(model_dir, STEPS, 2, "--policies", "--losses", model_dir + ".losses",
             evaluator=False)
    _one_process(single, STEPS, "--policies", "--losses", single + ".losses")
    assert _losses(model_dir + ".losses") == _losses(single + ".losses")
    rows = []
    for d in (model_dir, single):
        at, _ = merged.write(merged.latest(d), str(tmp_path / "merged" / os.path.basename(d)))
        held = tf.train.load_checkpoint(at)
        name = "input_layer/s_embedding/embedding_weights"
        order = np.argsort(held.get_tensor(f"{name}-keys"))
        rows.append([held.get_tensor(f"{name}-{e}")[order]
                     for e in ("keys", "values", "counts", "last_seen")])
        pending = held.get_tensor(f"{name}-pending_keys")
        order = np.argsort(pending)
        rows[-1] += [pending[order], held.get_tensor(f"{name}-pending_counts")[order]]
    for x, y in zip(*rows):
        np.testing.assert_array_equal(x, y)
    # Evictions ran: of the 97 words every run sees, the rows left are those
    # seen in the last steps; admission kept some ids pending.
    assert 0 < len(rows[0][0]) < 90, len(rows[0][0])


def test_a_dense_checkpoint_is_adopted_as_on_one_machine(tmp_path):
    """A model_dir trained without graphmod, trained on with the hook: each
    ps task adopts the rows it owns. The cluster trains on exactly as one
    process adopting the same checkpoint, and as the unmodified model."""
    dense = str(tmp_path / "dense")
    _one_process(dense, STEPS, "--dense")
    cluster, single = str(tmp_path / "cluster"), str(tmp_path / "single")
    shutil.copytree(dense, cluster)
    shutil.copytree(dense, single)
    _cluster(cluster, MORE, 2, "--losses", cluster + ".losses", evaluator=False)
    _one_process(single, MORE, "--losses", single + ".losses")
    _one_process(dense, MORE, "--dense", "--losses", dense + ".losses")
    losses = [_losses(d + ".losses") for d in (cluster, single, dense)]
    assert len(losses[0]) == MORE - STEPS
    assert losses[0] == losses[1]
    np.testing.assert_allclose(losses[0], losses[2], rtol=1e-6)
    with open(os.path.join(cluster, "graphmod", "rewrite_report_train.json")) as f:
        report = json.load(f)
    assert {t["table"] for t in report["tables"]} >= {
        "emb", "input_layer/s_embedding/embedding_weights"}
    assert os.path.exists(os.path.join(cluster, f"model.ckpt-{MORE}.tables.json"))


def test_a_warm_start_fills_each_ps_tasks_shard_as_one_process(tmp_path):
    """WarmStartSettings start emb from a dense model's checkpoint: on 2 ps
    tasks each task's shard imports the keys it owns, and the cluster trains
    exactly as one process warm-started alike, and as the unmodified model;
    every one of the variable's 20,000 rows is imported, each key on its
    owner's part."""
    dense = str(tmp_path / "dense")
    _one_process(dense, STEPS, "--dense")
    runs = {name: str(tmp_path / name) for name in ("cluster", "single", "plain")}
    flags = ("--warm-from", dense, "--constant-init")
    _cluster(runs["cluster"], STEPS, 2, *flags, "--losses", runs["cluster"] + ".losses",
             evaluator=False)
    _one_process(runs["single"], STEPS, *flags, "--losses", runs["single"] + ".losses")
    _one_process(runs["plain"], STEPS, *flags, "--dense", "--losses", runs["plain"] + ".losses")
    losses = {name: _losses(d + ".losses") for name, d in runs.items()}
    assert len(losses["cluster"]) == STEPS
    assert losses["cluster"] == losses["single"]
    np.testing.assert_allclose(losses["cluster"], losses["plain"], rtol=1e-6)
    with open(os.path.join(runs["cluster"], "graphmod", "rewrite_report_train.json")) as f:
        emb = next(t for t in json.load(f)["tables"] if t["table"] == "emb")
    assert emb["ps_shards"] == 2
    # Each part holds the keys its task owns; together, every row: the 50
    # trained ids as in one process, the others as the dense checkpoint's.
    checkpoint = os.path.join(runs["cluster"], f"model.ckpt-{STEPS}")
    with open(checkpoint + ".tables.json") as f:
        indexes = sorted(n for n in json.load(f)["files"] if n.endswith(".index"))
    assert len(indexes) == 2, indexes
    for task, index in enumerate(indexes):
        keys = tf.train.load_checkpoint(
            os.path.join(runs["cluster"], index[:-len(".index")])).get_tensor("emb-keys")
        assert len(keys) and (owner_of_numpy(keys, 2) == task).all(), index
    keys, values = table_rows(checkpoint, "emb", ("keys", "values"))
    assert keys.tolist() == list(range(20000))
    _, single = table_rows(os.path.join(runs["single"], f"model.ckpt-{STEPS}"), "emb",
                           ("keys", "values"))
    np.testing.assert_array_equal(values, single)
    np.testing.assert_array_equal(values[50:], tf.train.load_checkpoint(dense).get_tensor("emb")[50:])


# ps tasks running a stock tf.distribute.Server (no graphmod); the chief the example.
STOCK_PS = textwrap.dedent(f"""
    import json, os, sys
    config = json.loads(os.environ["TF_CONFIG"])
    if config["task"]["type"] == "ps":
        import tensorflow as tf
        tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name="ps",
                             task_index=config["task"]["index"]).join()
    sys.path.insert(0, {os.path.join(HERE, "..", "examples")!r})
    import ps_train
    ps_train.train(sys.argv[1], {STEPS})
""")


def test_a_ps_task_without_the_op_library_fails_at_once_naming_it(tmp_path):
    logs = str(tmp_path / "logs")
    status = run_cluster([sys.executable, "-c", STOCK_PS, str(tmp_path / "m")], ps=2,
                         evaluator=False, log_dir=logs, timeout=120)
    assert status["chief0"] != 0
    log = open(os.path.join(logs, "chief0.log")).read()
    assert ("RuntimeError: graphmod: ps task 0 runs without graphmod's op library, so it cannot "
            "hold the tables sharded onto it: start every ps task with a program that imports "
            "graphmod (train_and_evaluate's script does, in every task)\n") in log
    assert not glob.glob(str(tmp_path / "m" / "model.ckpt-*"))  # before the session


def test_the_evaluator_evaluates_with_the_rewritten_graph(trained):
    model_dir = trained[0]
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
