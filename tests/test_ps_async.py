"""Two asynchronous workers (the chief and a worker) and two ps tasks, each
its own process on 127.0.0.1, `train_and_evaluate` under TF_CONFIG with
GraphModifierHook: both workers train the same tables on the ps tasks, and
no update is lost or doubled: every id's count in the final checkpoint sums
to the sightings of the steps the workers ran (one global step each)."""
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from test_ps import MODEL, _env, _ports

pytestmark = pytest.mark.slow
STEPS, BATCH, IDS_PER_ROW = 60, 32, 3

JOB = MODEL + textwrap.dedent(f"""
    import json, os, sys, time
    import graphmod

    class Steps(tf1.train.SessionRunHook):  # this task's own steps, for the test
        steps = 0
        def after_run(self, run_context, run_values):  # a worker's end() may not run
            # Slow steps: train_and_evaluate starts worker 0 five seconds late.
            time.sleep(0.2)
            self.steps += 1
            task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
            with open(os.path.join(sys.argv[1], f"steps-{{task}}"), "w") as f:
                f.write(str(self.steps))

    config = tf.estimator.RunConfig(model_dir=sys.argv[1], tf_random_seed=1,
                                    save_checkpoints_steps=20)
    est = tf.estimator.Estimator(model_fn, config=config)
    hook = graphmod.GraphModifierHook(incremental_every_steps=5)
    tf.estimator.train_and_evaluate(
        est, tf.estimator.TrainSpec(input_fn, max_steps={STEPS}, hooks=[hook, Steps()]),
        tf.estimator.EvalSpec(input_fn, steps=1))
""")


def test_two_async_workers_lose_no_update(tmp_path):
    chief, worker, ps0, ps1 = _ports(4)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "worker": [f"127.0.0.1:{worker}"],
               "ps": [f"127.0.0.1:{ps0}", f"127.0.0.1:{ps1}"]}
    model_dir = str(tmp_path / "model")
    procs, logs = {}, {}
    for kind, index in (("ps", 0), ("ps", 1), ("worker", 0), ("chief", 0)):
        name = f"{kind}{index}"
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", JOB, model_dir],
                env=_env({"cluster": cluster, "task": {"type": kind, "index": index}}),
                stdout=log, stderr=subprocess.STDOUT)
    try:
        for name in ("chief0", "worker0"):
            assert procs[name].wait(timeout=300) == 0, logs[name].read_text()[-3000:]
    finally:
        for p in procs.values():  # the ps tasks serve until stopped
            if p.poll() is None:
                p.kill()
            p.wait()
    held = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    steps = int(held.get_tensor("global_step"))
    assert steps >= STEPS
    ran = [int((tmp_path / "model" / f"steps-{kind}").read_text()) for kind in ("chief", "worker")]
    assert min(ran) > 0 and sum(ran) == steps, ran  # both trained
    # Each global step is one worker's step of BATCH rows of IDS_PER_ROW ids,
    # each id sighted once by emb and once by one of part's two parts.
    assert held.get_tensor("emb-counts").sum() == steps * BATCH * IDS_PER_ROW
    assert held.get_tensor("part/part_0-counts").sum() + \
        held.get_tensor("part/part_1-counts").sum() == steps * BATCH * IDS_PER_ROW
    assert sorted(held.get_tensor("emb-keys")) == list(range(50))
