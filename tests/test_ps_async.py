"""Two asynchronous workers (the chief and a worker) and two ps tasks, each
its own process on 127.0.0.1 (examples/ps_cluster.py), examples/ps_train.py
under TF_CONFIG with GraphModifierHook: both workers train the same tables on
the ps tasks, and no lookup is lost or doubled: every table's counts in the
final checkpoint sum to the sightings of the steps the workers ran. (That
each row's update equals the gradient it received is tested with one worker,
in test_ps.py, against one process and the unmodified model.)"""
import os
import sys
import textwrap

import pytest
import tensorflow as tf

from graphmod.checkpoint import merged

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402

pytestmark = pytest.mark.slow
STEPS, BATCH, IDS_PER_ROW = 60, 32, 3

# ps_train.py's training, with a hook that slows each step (train_and_evaluate
# starts worker 0 five seconds after the chief) and records the task's steps.
JOB = textwrap.dedent(f"""
    import json, os, sys, time
    sys.path.insert(0, {os.path.join(HERE, "..", "examples")!r})
    import tensorflow as tf
    import ps_train

    class Steps(tf.compat.v1.train.SessionRunHook):
        steps = 0
        def after_run(self, run_context, run_values):  # a worker's end() may not run
            time.sleep(0.2)
            self.steps += 1
            task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
            with open(os.path.join(sys.argv[1], f"steps-{{task}}"), "w") as f:
                f.write(str(self.steps))

    ps_train.train(sys.argv[1], {STEPS}, hooks=[Steps()])
""")


def test_two_async_workers_lose_no_update(tmp_path):
    model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
    status = run_cluster([sys.executable, "-c", JOB, model_dir], ps=2, workers=1,
                         evaluator=False, log_dir=logs, timeout=300)
    for name, code in status.items():
        assert code == 0, open(os.path.join(logs, f"{name}.log")).read()[-3000:]
    # The tables' parts (one per ps task) and deltas, as one plain checkpoint.
    merged_at, _ = merged.write(merged.latest(model_dir), str(tmp_path / "merged" / "ckpt"))
    held = tf.train.load_checkpoint(merged_at)
    steps = int(held.get_tensor("global_step"))
    assert steps >= STEPS
    ran = [int(open(os.path.join(model_dir, f"steps-{kind}")).read())
           for kind in ("chief", "worker")]
    assert min(ran) > 0 and sum(ran) == steps, ran  # both trained, each step counted
    # Each global step is one worker's step of BATCH rows of IDS_PER_ROW ids,
    # each id sighted once by emb and once by one of part's two parts.
    sightings = steps * BATCH * IDS_PER_ROW
    assert held.get_tensor("emb-counts").sum() == sightings
    parts = [held.get_tensor(f"part/part_{i}-counts").sum() for i in (0, 1)]
    assert min(parts) > 0 and sum(parts) == sightings
    assert sorted(held.get_tensor("emb-keys")) == list(range(50))
