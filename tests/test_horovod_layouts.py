"""An unchanged Horovod Estimator laid out as Horovod's examples lay it out.

Horovod's examples give rank 0 alone the model_dir (`model_dir = dir if
hvd.rank() == 0 else None`: the Estimator makes a temporary one on the other
ranks) or every rank its own, and keep the RunConfig default (a save every
600 seconds, by each rank's clock). With GraphModifierHook the tables are
sharded across the ranks, and a save is a collective: rank 0 decides when
(graphmod.horovod.save_schedule) and every rank writes its part into
rank 0's model_dir at that step. Each case trains on 2 real ranks (Gloo over
loopback) against the same model with the hook on 1 rank on the same global
batches: equal losses, evaluation and predictions (on every rank); one case
saves by time every second while steps take 0.25 s, with deltas every
0.4 s. Rank 0's checkpoints then resume training on 1 and on 3 ranks (ranks
> 0 without a model_dir, or each its own), again as on 1 rank.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    phase, layout, secs, base, out = sys.argv[1:6]
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    B, FIRST, MORE = 24, 8, 3
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=(FIRST + MORE, B, 2)).astype(np.int64)
    labels = rng.integers(0, 2, size=(FIRST + MORE, B)).astype(np.float32)
    part = slice(rank * B // size, (rank + 1) * B // size)

    def input_fn(skip):
        return lambda: tf.data.Dataset.from_tensor_slices(
            ({"ids": ids[:, part]}, labels[:, part])).skip(skip)

    class Recorder(tf1.train.SessionRunHook):
        losses = []
        def __init__(self, loss, pause):
            self.loss, self.pause = loss, pause
        def before_run(self, run_context):
            return tf1.train.SessionRunArgs(self.loss)
        def after_run(self, run_context, run_values):
            Recorder.losses.append(float(run_values.results))
            time.sleep(self.pause)  # a slow step: saves by time come mid-training

    def model_fn(features, labels, mode):
        emb = tf1.get_variable("emb", [20000, 4], initializer=tf1.constant_initializer(0.1))
        w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 8, dtype=np.float32)
                             .reshape(8, 1))
        logits = tf.squeeze(tf.matmul(tf.reshape(tf.nn.embedding_lookup(emb, features["ids"]),
                                                 [-1, 8]), w), 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        global_loss = hvd.allreduce(loss, op=hvd.Average, name="global_loss")
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "global_loss": tf1.metrics.mean(global_loss)})
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3))
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train, training_hooks=[
            Recorder(global_loss, 0.25 if secs != "default" else 0.0)])

    # As Horovod's examples write it.
    if layout == "rank0":
        model_dir = base if rank == 0 else None
    else:
        model_dir = f"{base}_rank{rank}" if rank else base
    config = (tf.estimator.RunConfig(model_dir=model_dir) if secs == "default" else
              tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_secs=float(secs)))
    estimator = tf.estimator.Estimator(model_fn, config=config)
    deltas = dict(incremental_every_secs=0.4) if secs != "default" else {}
    hook = lambda: graphmod.GraphModifierHook(**deltas)
    result = {}

    def train_and_read(skip, steps, name):
        estimator.train(input_fn(skip), steps=steps,
                        hooks=[hvd.BroadcastGlobalVariablesHook(0), hook()])
        result[name] = dict(
            losses=list(Recorder.losses),
            eval=float(estimator.evaluate(input_fn(0), steps=3, hooks=[hook()])["global_loss"]),
            # Every rank predicts (on the whole first batch): ranks > 0 read rank 0's checkpoint.
            logits=[float(p["logits"]) for p in estimator.predict(
                lambda: tf.data.Dataset.from_tensor_slices({"ids": ids[0]}).batch(B),
                hooks=[hook()])])
        Recorder.losses.clear()

    if phase == "unshared":  # rank 1 sees another file system at rank 0's model_dir
        try:
            train_and_read(0, FIRST, "first")
        except ValueError as e:
            result["refused"] = str(e)
    if phase == "train_and_evaluate":  # each rank's evaluation would run by its own clock
        try:
            tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(
                input_fn(0), max_steps=FIRST, hooks=[hvd.BroadcastGlobalVariablesHook(0), hook()]),
                tf.estimator.EvalSpec(input_fn(0), steps=2, hooks=[hook()]))
        except ValueError as e:
            result["refused"] = str(e)
    if phase in ("first", "both"):
        train_and_read(0, FIRST, "first")
    if phase == "resume":  # a new process: ranks > 0 have no checkpoint of their own
        result["restored_eval"] = float(estimator.evaluate(
            input_fn(0), steps=3, hooks=[hook()])["global_loss"])
    if phase in ("resume", "both"):
        train_and_read(FIRST, MORE, "resume")
    result["model_dir"] = estimator.model_dir
    json.dump(result, open(f"{out}/rank{rank}.json", "w"))
""")


def launch(ranks, *args, hide=None):
    """Runs python with args on `ranks` Horovod ranks (plainly for one),
    checked to have succeeded; horovodrun stops every rank when it returns.
    hide: a folder that ranks > 0 see empty (a tmpfs mounted over it in a
    mount namespace of their own), as on a file system the ranks do not share."""
    command = [sys.executable, *map(str, args)]
    if hide is not None:
        line = " ".join(shlex.quote(str(a)) for a in command)
        command = ["sh", "-c", f'if [ "$HOROVOD_RANK" != 0 ]; then exec unshare -m sh -c '
                   f'{shlex.quote(f"mount -t tmpfs none {shlex.quote(str(hide))} && exec {line}")}; '
                   f'else exec {line}; fi']
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"] + command
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def run(tmp_path, name, ranks, phase, layout, secs, base, hide=None):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "layouts.py"
    script.write_text(SCRIPT)
    launch(ranks, script, phase, layout, secs, base, out, hide=hide)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def assert_as_one_rank(ranks, one, name):
    for rank, r in enumerate(ranks):
        got, want = r[name], one[name]
        assert len(got["losses"]) == len(want["losses"]) > 0
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} rank {rank}")
        np.testing.assert_allclose(got["eval"], want["eval"], rtol=1e-6, err_msg=f"{name} rank {rank}")
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} rank {rank}")


def checkpoints(model_dir):
    """{step: whether both ranks' parts and the manifest are there} of the
    checkpoints in model_dir."""
    names = os.listdir(model_dir)
    steps = sorted({int(n.split("-")[1].split(".")[0]) for n in names
                    if n.startswith("model.ckpt-") and n.endswith(".index") and ".tables" not in n})
    return {s: all(f"model.ckpt-{s}.{x}" in names for x in (
        "tables.json", "tables-00000-of-00002.index", "tables-00001-of-00002.index"))
            for s in steps}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The hooked model on 1 rank: 8 steps, then 3 more after a restore."""
    tmp = tmp_path_factory.mktemp("one")
    return run(tmp, "one", 1, "both", "rank0", "default", tmp / "model")[0]


@pytest.mark.parametrize("layout", ["rank0", "each"])
def test_default_run_config_trains_and_resumes_on_1_and_3_ranks(tmp_path, one_rank, layout):
    """Saves every 600 s (never mid-training here): the checkpoints of the
    start and the end, written by both ranks into rank 0's model_dir."""
    base = tmp_path / "model"
    ranks = run(tmp_path, "two", 2, "first", layout, "default", base)
    assert_as_one_rank(ranks, one_rank, "first")
    assert checkpoints(base) == {0: True, 8: True}
    assert ranks[0]["model_dir"] == str(base)
    other = ranks[1]["model_dir"]  # a temporary or its own dir: no checkpoint of its own
    assert other != str(base) and not any(n.startswith("model.ckpt") for n in os.listdir(other))
    # Rank 0's checkpoints resume on 1 and on 3 ranks (laid out alike).
    for count in (1, 3):
        copy = tmp_path / f"model_copy{count}"
        shutil.copytree(base, copy)
        resumed = run(tmp_path, f"resume{count}", count, "resume", layout, "default", copy)
        assert_as_one_rank(resumed, one_rank, "resume")
        # Evaluated before training there: every rank restored rank 0's checkpoint.
        for r in resumed:
            np.testing.assert_allclose(r["restored_eval"], one_rank["first"]["eval"], rtol=1e-6)


def test_saves_by_time_mid_training(tmp_path, one_rank):
    """save_checkpoints_secs=1, deltas every 0.4 s, steps of 0.25 s, rank 0
    alone with a model_dir: rank 0's clock decides and both ranks write
    their parts at the same steps, mid-training."""
    base = tmp_path / "model"
    ranks = run(tmp_path, "two", 2, "first", "rank0", "1", base)
    assert_as_one_rank(ranks, one_rank, "first")
    saved = checkpoints(base)
    assert all(saved.values()), saved  # every checkpoint has both parts and its manifest
    assert {0, 8} < set(saved), saved  # and some were saved by time, mid-training
    chains = [d for d in os.listdir(base / "graphmod" / "deltas")]
    manifests = [json.loads((base / "graphmod" / "deltas" / c / "manifest.json").read_text())
                 for c in chains]
    entries = [e for m in manifests for e in m["deltas"]]
    assert entries, chains  # deltas were written by time too
    for e in entries:  # each with both ranks' parts
        assert any("tables-00001-of-00002" in f for f in e["files"]), e
    copy = tmp_path / "model_copy3"
    shutil.copytree(base, copy)
    assert_as_one_rank(run(tmp_path, "resume3", 3, "resume", "rank0", "1", copy), one_rank,
                       "resume")


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs unshare and root to give ranks > 0 a file system of their own")
def test_ranks_that_do_not_share_rank_0_s_model_dir_send_it_their_parts(tmp_path, one_rank):
    """Ranks > 0 see an empty tmpfs where rank 0's model_dir is (a mount
    namespace of their own): they send their parts of checkpoints and deltas
    (saved by time) to rank 0, and restore (training, evaluation) from a
    copy of rank 0's checkpoint it sends them."""
    def temporaries():  # the ranks' staging folders and copies of rank 0's checkpoint
        return {n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(("graphmod_parts_", "graphmod_rank0_checkpoint_"))}
    before = temporaries()
    base = tmp_path / "model"
    base.mkdir()
    ranks = run(tmp_path, "two", 2, "first", "rank0", "1", base, hide=base)
    assert_as_one_rank(ranks[:1], one_rank, "first")  # rank 0 predicts
    np.testing.assert_allclose(ranks[1]["first"]["losses"], one_rank["first"]["losses"],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ranks[1]["first"]["eval"], one_rank["first"]["eval"], rtol=1e-6)
    saved = checkpoints(base)
    assert all(saved.values()) and {0, 8} < set(saved), saved
    assert not [n for n in os.listdir(base) if "stream-tmp" in n]
    deltas = base / "graphmod" / "deltas"
    entries = [e for c in os.listdir(deltas)
               for e in json.loads((deltas / c / "manifest.json").read_text())["deltas"]]
    assert entries and all(any("tables-00001-of-00002" in f for f in e["files"])
                           for e in entries)
    copy = tmp_path / "model_copy3"
    shutil.copytree(base, copy)
    resumed = run(tmp_path, "resume3", 3, "resume", "rank0", "1", copy, hide=copy)
    assert_as_one_rank(resumed[:1], one_rank, "resume")
    for r in resumed:
        np.testing.assert_allclose(r["restored_eval"], one_rank["first"]["eval"], rtol=1e-6)
        np.testing.assert_allclose(r["resume"]["losses"], one_rank["resume"]["losses"],
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(r["resume"]["eval"], one_rank["resume"]["eval"], rtol=1e-6)
    assert temporaries() <= before  # removed once used


def test_train_and_evaluate_on_one_machine_per_rank_is_refused_on_every_rank(tmp_path):
    """Its evaluation runs from each rank's saver hook, by each rank's clock
    and model_dir: some ranks would enter the evaluation's collectives and
    wait forever. Refused on every rank, before training."""
    ranks = run(tmp_path, "tae", 2, "train_and_evaluate", "rank0", "default",
                tmp_path / "model")
    for r in ranks:
        assert "evaluate from their saver hook (train_and_evaluate on one machine)" in \
            r.get("refused", ""), r
        assert "ranks [0, 1]" in r["refused"], r["refused"]
