"""Saves while other workers insert: a chief and two asynchronous workers on
two ps tasks (real processes on 127.0.0.1, examples/ps_cluster.py), each
worker with its own stream of hot ids plus fresh ids on every step, while
the chief saves a checkpoint on every step. A save then copies table shards
that the other workers' lookups are growing at that moment. Every task must
finish (no save may fail because the table moved), and every checkpoint left
in the model_dir must be one consistent snapshot: unique keys, each with the
values, Adagrad accumulator and count of one moment (each fresh id is
trained once, by a gradient of 1: its saved row is exactly the row before
that update or after it), and it must restore and train on in one process.

Before a save locked every shard from its count to its copy, this failed in
most runs with "its row count changed while it was being saved"."""
import glob
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from graphmod.checkpoint import merged

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402

pytestmark = pytest.mark.slow
STEPS, BATCH, ROWS = 90, 4096, 1 << 22
HOT = 64  # each task's hot ids: [offset, offset + HOT)
TASKS = 3  # the chief and two workers

# The job every task runs: argv = model_dir steps. A task's ids are offset by
# its index (chief 0, worker i: i + 1; one process alone: TASKS), so each
# inserts keys no other does.
JOB = textwrap.dedent(f"""
    import json, os, sys, time
    import tensorflow as tf
    import graphmod
    tf1 = tf.compat.v1

    # Rows start at 0 and the loss is their sum: every occurrence of an id
    # brings a gradient of 1 to each of its values.
    def model_fn(features, labels, mode):
        emb = tf1.get_variable("emb", [{ROWS}, 4], initializer=tf1.zeros_initializer())
        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]))
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def task_index():  # one process on its own (no cluster): ids of its own too
        if not os.environ.get("TF_CONFIG"):
            return {TASKS}
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        return 0 if task["type"] == "chief" else task["index"] + 1

    def input_fn():
        base = task_index() * ({ROWS} // 4)
        def batch(step):  # row r of step s: a hot id, and a fresh one
            r = tf.range({BATCH}, dtype=tf.int64)
            fresh = base + {HOT} + (step * {BATCH} + r) % ({ROWS} // 4 - {HOT})
            ids = tf.stack([base + (r * 7 + step) % {HOT}, fresh], 1)
            return {{"ids": ids}}, tf.cast(r % 2, tf.float32)
        return tf.data.Dataset.range(10 ** 9).map(batch)

    # Every task trains only once all have started (train_and_evaluate starts
    # worker i 5 * (i + 1) seconds after the chief), so the chief's saves meet
    # the workers' steps.
    class Together(tf1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            open(os.path.join(sys.argv[1], f"started-{{task_index()}}"), "w").close()
            for _ in range(1200):
                if all(os.path.exists(os.path.join(sys.argv[1], f"started-{{i}}"))
                       for i in range({TASKS})):
                    return
                time.sleep(0.1)
            raise RuntimeError("the workers did not start")

    config = tf.estimator.RunConfig(model_dir=sys.argv[1], save_checkpoints_steps=1,
                                    keep_checkpoint_max=3, log_step_count_steps=10)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    hook = graphmod.GraphModifierHook(min_rows=1000)
    if os.environ.get("TF_CONFIG"):
        tf.estimator.train_and_evaluate(
            estimator, tf.estimator.TrainSpec(input_fn, max_steps=int(sys.argv[2]),
                                              hooks=[hook, Together()]),
            tf.estimator.EvalSpec(input_fn, steps=1))
    else:
        estimator.train(input_fn, max_steps=int(sys.argv[2]), hooks=[hook])
""")


def _consistent(checkpoint):
    """The table in `checkpoint` (one plain checkpoint) is one snapshot; its
    rows."""
    held = tf.train.load_checkpoint(checkpoint)
    keys, values = held.get_tensor("emb-keys"), held.get_tensor("emb-values")
    counts, accum = held.get_tensor("emb-counts"), held.get_tensor("emb-slots")[:, 0, :]
    assert len(keys) > 0 and len(np.unique(keys)) == len(keys), f"{checkpoint}: repeated keys"
    assert (counts >= 1).all(), f"{checkpoint}: a saved row nobody looked up"
    # A fresh id is looked up once, then its gradient (1) applied once: saved
    # whole, its row is (value 0, accumulator 0.1, count 1) before the apply
    # and (-0.1 / sqrt(1.1), 1.1, 1) after it. Values of one moment with the
    # accumulator of another would show a mix.
    fresh = (keys % (ROWS // 4)) >= HOT
    assert fresh.sum() > BATCH, checkpoint
    before = np.isclose(values, 0) & np.isclose(accum, 0.1)
    after = np.isclose(values, -0.1 / np.sqrt(1.1)) & np.isclose(accum, 1.1)
    whole = (before | after).all(axis=1) & (counts == 1)
    assert whole[fresh].all(), (checkpoint, keys[fresh][~whole[fresh]][:5])
    assert after[fresh].any(), checkpoint
    # (A task's first step may be in a save in part: each ps task saves its
    # part of the table at its own moment, so no check that all of a step's
    # new keys are in or out.)
    return len(keys)


def test_saves_while_async_workers_insert(tmp_path):
    model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
    job = str(tmp_path / "job.py")
    with open(job, "w") as f:
        f.write(JOB)
    status = run_cluster([sys.executable, job, model_dir, str(STEPS)], ps=2, workers=TASKS - 1,
                         evaluator=False, log_dir=logs, timeout=400)
    for name, code in status.items():
        assert code == 0, open(os.path.join(logs, f"{name}.log")).read()[-3000:]
    chief_log = open(os.path.join(logs, "chief0.log")).read()
    assert "changed while it was being saved" not in chief_log
    # No save left a part behind.
    assert not glob.glob(os.path.join(model_dir, "*_temp*")), os.listdir(model_dir)
    assert not glob.glob(os.path.join(model_dir, "**", "*tempstate*"), recursive=True)
    # The checkpoints kept after the first (step 0, before any training): the
    # chief saves after each of its steps, which the workers outnumber.
    kept = [p for p in tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths
            if not p.endswith("-0")]
    assert len(kept) >= 2, kept
    rows = []
    for i, path in enumerate(kept):
        step = int(path.rsplit("-", 1)[1])
        out = str(tmp_path / f"merged{i}" / "ckpt")
        merged_at, _ = merged.write(merged.State(path, [], step), out)
        rows.append(_consistent(merged_at))
    assert rows == sorted(rows) and rows[-1] > BATCH, rows  # the table grew between saves
    # The latest checkpoint restores on one machine and trains on.
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    step = int(kept[-1].rsplit("-", 1)[1])
    done = subprocess.run([sys.executable, job, model_dir, str(step + 3)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = tf.train.latest_checkpoint(model_dir)
    assert int(after.rsplit("-", 1)[1]) == step + 3
    final, _ = merged.write(merged.latest(model_dir), str(tmp_path / "final" / "ckpt"))
    assert _consistent(final) >= rows[-1]
