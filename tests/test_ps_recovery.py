"""A ps task that dies mid-training and is restarted (as a cluster manager
restarts it) comes back from the last checkpoint, as TensorFlow's own PS
recovery does: the chief's session is recreated, every table shard (those of
the task that lived on too) is restored from the checkpoint's parts, exactly,
and training runs on to the end. Real processes on loopback
(examples/ps_cluster.py), all stopped by the test."""
import json
import os
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402
from checkpoint_parts import table_rows  # noqa: E402

pytestmark = pytest.mark.slow
STEPS, KILL_AT = 30, 13  # ps_train saves a checkpoint every 10 steps, a delta every 5

JOB = textwrap.dedent(f"""
    import json, os, signal, subprocess, sys
    import numpy as np
    config = json.loads(os.environ["TF_CONFIG"])
    task, model_dir = config["task"], sys.argv[1]
    if task["type"] == "ps":
        # A supervisor, as a cluster manager: the ps server is started again
        # once when it dies.
        server = ("import json, os, graphmod, tensorflow as tf; "
                  "c = json.loads(os.environ['TF_CONFIG']); "
                  "tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), job_name='ps', "
                  "task_index=c['task']['index']).join()")
        os.makedirs(model_dir, exist_ok=True)
        for life in range(2):
            child = subprocess.Popen([sys.executable, "-c", server])
            with open(os.path.join(model_dir, f"ps{{task['index']}}.pid"), "w") as f:
                f.write(str(child.pid))
            child.wait()
        sys.exit(0)

    sys.path.insert(0, {os.path.join(HERE, "..", "examples")!r})
    import tensorflow as tf
    import graphmod, ps_train
    from graphmod.embeddings import features
    tf1 = tf.compat.v1

    class Recovery(tf1.train.SessionRunHook):
        '''Kills ps task 1's server after step {KILL_AT}; writes what the
        tables hold when the session after it starts.'''
        def begin(self):
            graph = tf1.get_default_graph()
            self.step = tf1.train.get_global_step()
            self.export = {{t.name: [s.export() for s in features.parts(t)]
                           for t in graphmod.state.tables(graph)}}
            self.sessions, self.killed = 0, False

        def after_create_session(self, session, coord):
            self.sessions += 1
            if self.sessions == 2:
                step, tables = session.run([self.step, self.export])
                out = {{"step": step}}
                for name, shards in tables.items():
                    for i, e in enumerate(shards):
                        for k in ("keys", "values", "slots", "counts"):
                            out[f"{{name}}|{{i}}|{{k}}"] = e[k]
                np.savez(os.path.join(model_dir, "recovered.npz"), **out)

        def after_run(self, run_context, run_values):
            if not self.killed and run_context.session.run(self.step) >= {KILL_AT}:
                self.killed = True
                with open(os.path.join(model_dir, "ps1.pid")) as f:
                    os.kill(int(f.read()), signal.SIGKILL)

        def end(self, session):
            with open(os.path.join(model_dir, "sessions"), "w") as f:
                f.write(str(self.sessions))

    ps_train.train(model_dir, {STEPS}, hooks=[Recovery()])
""")


def test_a_restarted_ps_task_comes_back_from_the_last_checkpoint(tmp_path):
    model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
    status = run_cluster([sys.executable, "-c", JOB, model_dir], ps=2, evaluator=False,
                         log_dir=logs, timeout=300)
    log = open(os.path.join(logs, "chief0.log")).read()
    assert status == {"chief0": 0}, log[-3000:]
    # The session was made again, and training ran on to the end.
    assert open(os.path.join(model_dir, "sessions")).read() == "2"
    assert tf.train.latest_checkpoint(model_dir).endswith(f"-{STEPS}")
    # The tables after the restart hold exactly the checkpoint it restored
    # (the last full one: no delta was written after it before the kill).
    recovered = np.load(os.path.join(model_dir, "recovered.npz"))
    step = int(recovered["step"])
    assert step == 10, step
    names = {k.split("|")[0] for k in recovered.files if "|" in k}
    assert names == {"emb", "part/part_0", "part/part_1",
                     "input_layer/s_embedding/embedding_weights"}
    entries = ("keys", "values", "slots", "counts")
    for name in names:
        shards = sorted({int(k.split("|")[1]) for k in recovered.files if k.startswith(name + "|")})
        assert shards == [0, 1]
        got = [np.concatenate([recovered[f"{name}|{i}|{e}"] for i in shards]) for e in entries]
        order = np.argsort(got[0])
        want = table_rows(os.path.join(model_dir, f"model.ckpt-{step}"), name, entries)
        assert len(want[0]) > 0
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x[order], y)
    with open(os.path.join(model_dir, f"model.ckpt-{STEPS}.tables.json")) as f:
        assert json.load(f)["ranks"] == 2
