"""Incremental checkpoints: deltas between full checkpoints, restored as a chain.

A streaming model trains with admission (threshold 2), eviction (every 3
steps, rows idle for 5) and a delta every 4 steps after a single full
checkpoint. A hook copies the model_dir right after each delta and records
the live state then (every table row with its slots and metadata, the ids
pending admission, the dense variables). Restoring a copy must give exactly
that state: rows updated since, rows evicted since (tombstones), admission
counts, dense variables. A torn delta stops the restore at the one before,
and training then continues the chain from there; deltas go with the full
checkpoint max_to_keep deletes; a training process killed (SIGKILL) at
random moments restores to exactly its last committed delta.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

import graphmod
from graphmod.checkpoint import deltas, merged

tf1 = tf.compat.v1
HERE = os.path.dirname(os.path.abspath(__file__))
TABLES = {"item_emb": dict(access_threshold=2, eviction_threshold=5, eviction_unit="steps")}
CONFIG = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)


def input_fn():
    """Per step 64 ids: 24 from a hot set of 40, 40 fresh ones each seen
    twice over two consecutive steps (pending after the first sighting)."""
    def batch(i):
        j = tf.range(64, dtype=tf.int64)
        hot = (i * 7 + j) % 40
        fresh = 1000 + (i * 40 + (j - 24)) // 2 + 10 * (j % 2)
        return {"item": tf.reshape(tf.where(j < 24, hot, fresh), [64, 1])}, \
            tf.cast(tf.equal(j % 3, 0), tf.float32)
    return tf.data.Dataset.range(10**6).map(batch)


def model_fn(features, labels, mode):
    emb = tf1.get_variable("item_emb", [100_000, 4],
                           initializer=tf1.random_normal_initializer(stddev=0.1))
    bias = tf1.get_variable("bias", [1], initializer=tf1.zeros_initializer())
    logits = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["item"][:, 0]), 1) + bias
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.AdagradOptimizer(0.2).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def estimator(model_dir, save_steps=10**6, keep=5):
    return tf.estimator.Estimator(model_fn, model_dir=str(model_dir), config=tf.estimator.RunConfig(
        save_checkpoints_steps=save_steps, keep_checkpoint_max=keep, session_config=CONFIG,
        log_step_count_steps=10**6))


def hook(incremental_every_steps=None):
    return graphmod.GraphModifierHook(tables=TABLES, evict_time_interval=None,
                                      evict_step_interval=3,
                                      incremental_every_steps=incremental_every_steps)


class StateHook(tf1.train.SessionRunHook):
    """Reads every row, pending id and dense variable of the graph."""

    def begin(self):
        (table,) = graphmod.tables()
        self.fetches = dict(rows=table.export(), pending=table.export_pending(),
                            dense={v.op.name: v.value() for v in tf1.global_variables()
                                   if v.op.name in ("bias", "bias/Adagrad", "global_step")})

    def state(self, session):
        got = session.run(self.fetches)
        rows, pending = got["rows"], got["pending"]
        order, p_order = np.argsort(rows["keys"]), np.argsort(pending["keys"])
        state = {f"rows/{k}": v[order] for k, v in rows.items()}
        state.update({f"pending/{k}": pending[k][p_order] for k in ("keys", "counts",
                                                                     "last_seen")})
        state.update(got["dense"])
        return state


def assert_same_state(got, want, what):
    assert sorted(got) == sorted(want), what
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")


class Snapshots(StateHook):
    """Right after each delta: a copy of model_dir and the live state."""

    def __init__(self, model_dir, out_dir, incremental):
        self.model_dir, self.out_dir, self.incremental = model_dir, out_dir, incremental
        self.states = {}

    def after_run(self, run_context, run_values):
        written = self.incremental.deltas_written
        if written and written not in self.states:
            session = run_context.session
            shutil.copytree(self.model_dir, os.path.join(self.out_dir, f"after_delta_{written}"))
            self.states[written] = self.state(session)


class Restored(StateHook):
    """The live state right after the session restored its checkpoint."""

    def after_create_session(self, session, coord):
        self.restored = self.state(session)


def restored_state(model_dir):
    capture = Restored()
    estimator(model_dir).train(input_fn, steps=1, hooks=[hook(), capture])
    return capture.restored


def train_with_snapshots(tmp_path, steps=17):
    model_dir = tmp_path / "model"
    h = hook(incremental_every_steps=4)
    snaps = Snapshots(str(model_dir), str(tmp_path / "snaps"), h.incremental_hook)
    estimator(model_dir).train(input_fn, steps=steps, hooks=[h, snaps])
    return snaps


def test_full_checkpoint_plus_deltas_restore_the_state_at_the_last_delta(tmp_path,
                                                                         monkeypatch):
    snaps = train_with_snapshots(tmp_path)
    assert sorted(snaps.states) == [1, 2, 3, 4]  # deltas at steps 4, 8, 12, 16
    state = snaps.states[4]
    assert state["global_step"] == 16
    # Admission, eviction and updates all happened between the deltas.
    assert len(state["pending/keys"]) > 0
    assert state["rows/last_seen"].min() >= 16 - 3 - 5
    snap = tmp_path / "snaps" / "after_delta_4"
    assert tf.train.latest_checkpoint(str(snap)).endswith("model.ckpt-0")
    assert_same_state(restored_state(snap), state, "full checkpoint + 4 deltas")

    # Each delta holds what changed, not the table: fewer rows than the
    # table has, and the keys evicted since the delta before.
    folder = snap / "graphmod" / "deltas" / "model.ckpt-0"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [d["step"] for d in manifest["deltas"]] == [4, 8, 12, 16]
    delta = tf.train.load_checkpoint(str(folder / "delta-000004"))
    assert 0 < len(delta.get_tensor("item_emb-keys")) < len(state["rows/keys"])
    gone = set(snaps.states[3]["rows/keys"]) - set(state["rows/keys"])
    assert gone and gone <= set(delta.get_tensor("item_emb-removed_keys"))
    assert delta.get_tensor("global_step") == 16  # dense variables whole

    # A delta committed while a reader reads the chain: what it lists and
    # what it verifies are one reading (listing 3 and verifying 4 pointed
    # past the list: the export watcher's IndexError).
    raced = tmp_path / "raced"
    shutil.copytree(snap, raced)
    tf1.train.update_checkpoint_state(str(raced), str(raced / "model.ckpt-0"))
    earlier = deltas.read_manifest(str(tmp_path / "snaps" / "after_delta_3" / "model.ckpt-0"))
    readings, real_read = iter([earlier]), deltas.read_manifest
    # The first reading is the one from before the 4th delta's commit.
    monkeypatch.setattr(deltas, "read_manifest",
                        lambda base: next(readings, None) or real_read(base))
    raced_state = merged.latest(str(raced))
    assert (len(raced_state.deltas), raced_state.step) == (3, 12)


def test_export_restores_the_deltas_too(tmp_path):
    """A SavedModel exported from full checkpoint + deltas serves the rows of
    the last delta (its graph has the table without optimizer slots)."""
    snaps = train_with_snapshots(tmp_path)
    state = snaps.states[4]

    def receiver():
        ph = tf1.placeholder(tf.int64, [None, 1], name="item")
        return tf.estimator.export.ServingInputReceiver({"item": ph}, {"item": ph})

    path = graphmod.export_saved_model(estimator(tmp_path / "snaps" / "after_delta_4"),
                                       receiver, str(tmp_path / "export")).decode()
    with tf.Graph().as_default(), tf1.Session() as sess:
        tf1.saved_model.load(sess, ["serve"], path)
        (table,) = graphmod.tables()
        rows = sess.run(table.export())
    order = np.argsort(rows["keys"])
    np.testing.assert_array_equal(rows["keys"][order], state["rows/keys"])
    np.testing.assert_array_equal(rows["values"][order], state["rows/values"])


def test_a_torn_delta_stops_the_restore_and_training_continues_the_chain(tmp_path):
    snaps = train_with_snapshots(tmp_path)
    snap = tmp_path / "snaps" / "after_delta_4"
    folder = snap / "graphmod" / "deltas" / "model.ckpt-0"
    # A torn write of the table's part (the largest of the delta's files).
    data = max(folder.glob("delta-000004.data-*"), key=lambda f: f.stat().st_size)
    data.write_bytes(data.read_bytes()[:-7])
    (folder / ".tmp-delta-000005-deadbeef.index").write_bytes(b"uncommitted")
    model_dir = tmp_path / "resumed"
    shutil.copytree(snap, model_dir)
    assert_same_state(restored_state(snap), snaps.states[3], "delta 4 torn: up to delta 3")

    # Training from there drops the torn delta and the stray file, and
    # continues from the restored state.
    h = hook(incremental_every_steps=2)
    resumed = Snapshots(str(model_dir), str(tmp_path / "resumed_snaps"), h.incremental_hook)
    estimator(model_dir).train(input_fn, steps=2, hooks=[h, resumed])
    # Its session saved a full checkpoint at the restored step 12 first.
    folder = model_dir / "graphmod" / "deltas" / "model.ckpt-12"
    assert json.loads((folder / "manifest.json").read_text())["deltas"][0]["step"] == 14
    old = model_dir / "graphmod" / "deltas" / "model.ckpt-0"
    kept = sorted(os.listdir(old))
    assert kept[-1] == "manifest.json" and kept[:-1], kept
    assert {f.split(".")[0] for f in kept[:-1]} == {"delta-000001", "delta-000002",
                                                     "delta-000003"}, kept
    assert_same_state(restored_state(tmp_path / "resumed_snaps" / "after_delta_1"),
                      resumed.states[1], "resumed chain")


def test_deltas_go_with_the_full_checkpoints_max_to_keep_deletes(tmp_path):
    h = hook(incremental_every_steps=2)
    estimator(tmp_path, save_steps=5, keep=2).train(input_fn, steps=23, hooks=[h])
    kept = {os.path.basename(p) for p in
            tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths}
    chains = set(os.listdir(tmp_path / "graphmod" / "deltas"))
    assert kept == {"model.ckpt-20", "model.ckpt-23"}
    assert chains <= kept and "model.ckpt-20" in chains
    assert h.incremental_hook.deltas_written == 11


def test_a_resumed_run_saves_its_step_again_and_drops_that_checkpoints_old_deltas(tmp_path):
    """Full saves every 4 steps and deltas every 2 meet at step 4: the resumed
    run restores ckpt-4 and its delta, saves ckpt-4 again at start, and its
    deltas start a new chain (the old one would follow a checkpoint that now
    holds it)."""
    est = estimator(tmp_path, save_steps=4)
    est.train(input_fn, steps=4, hooks=[hook(incremental_every_steps=2)])
    folder = tmp_path / "graphmod" / "deltas" / "model.ckpt-4"
    assert [d["step"] for d in json.loads((folder / "manifest.json").read_text())["deltas"]] == [4]
    h = hook(incremental_every_steps=2)
    snaps = Snapshots(str(tmp_path), str(tmp_path / "snaps"), h.incremental_hook)
    est.train(input_fn, steps=2, hooks=[h, snaps])
    assert [d["step"] for d in json.loads((folder / "manifest.json").read_text())["deltas"]] == [6]
    assert_same_state(restored_state(tmp_path / "snaps" / "after_delta_1"), snaps.states[1],
                      "resumed chain after ckpt-4")


def test_a_new_session_of_the_same_graph_tracks_removals_again(tmp_path):
    """MonitoredSession makes a new session after an Aborted error: its tables
    are new, and the TableSaver must make them track again (else deltas lose
    their tombstones and evicted keys come back)."""
    from graphmod.checkpoint.saver import TableSaver
    with tf.Graph().as_default():
        table = graphmod.create_table("t", 2)
        ids = tf1.placeholder(tf.int64, [None])
        rows = graphmod.sparse_lookup(table, ids, is_training=True)
        remove = table.remove(ids)
        size = table.size()
        saver = TableSaver(sharded=True)
        saver.build()
        base = None
        for session_number in range(2):
            with tf1.Session() as sess:
                if base is None:
                    sess.run(rows, {ids: np.arange(10)})
                    base = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=0)
                else:
                    saver.restore(sess, base)
                saver.start_tracking(sess)
                sess.run(remove, {ids: [session_number]})
                delta = saver.save_delta(sess, session_number + 1)
                removed = tf.train.load_checkpoint(delta).get_tensor("t-removed_keys")
                assert removed.tolist() == [session_number], session_number
        with tf1.Session() as sess:
            saver.restore(sess, base)
            assert sess.run(size) == 8  # keys 0 and 1 stay gone


def test_rows_imported_while_training_are_in_the_next_delta(tmp_path):
    """A table-API import_rows without versions after tracking began carries
    the coming step's version, so the next delta holds the rows."""
    from graphmod.checkpoint.saver import TableSaver
    with tf.Graph().as_default():
        table = graphmod.create_table("t", 2)
        keys = tf1.placeholder(tf.int64, [None])
        imported = table.import_rows(keys, tf.ones([tf.size(keys), 2]))
        saver = TableSaver(sharded=True)
        saver.build()
        with tf1.Session() as sess:
            saver.save(sess, str(tmp_path / "model.ckpt"), global_step=0)
            saver.start_tracking(sess)
            sess.run(imported, {keys: [3, 4]})
            delta = saver.save_delta(sess, 1)
    assert sorted(tf.train.load_checkpoint(delta).get_tensor("t-keys").tolist()) == [3, 4]


_KILLED_TRAINING = """
import sys
sys.path.insert(0, {here!r})
import test_incremental as t
t.estimator(sys.argv[1], save_steps=7).train(
    t.input_fn, steps=10**6, hooks=[t.hook(incremental_every_steps=1)])
"""


def test_a_killed_training_restores_to_its_last_committed_delta(tmp_path):
    """SIGKILL at moments spread over the run (before the first delta, and
    at random points of later ones): the restore equals a reference run's
    state at the step of the last committed delta."""
    # State at each step before the hooks' after_run (what the Estimator's
    # full save of that step sees: its saver hook runs first) and after it
    # (eviction done: what that step's delta holds).
    before, after = {}, {}

    class After(StateHook):
        def after_create_session(self, session, coord):
            before[0] = after[0] = self.state(session)

        def after_run(self, run_context, run_values):
            state = self.state(run_context.session)
            after[int(state["global_step"])] = state

    class Before(tf1.train.SessionRunHook):
        """Listed first, it reads with After's fetches (built once the
        hook's rewrite made the table)."""

        def after_run(self, run_context, run_values):
            state = reads.state(run_context.session)
            before[int(state["global_step"])] = state

    reads = After()
    estimator(tmp_path / "reference", save_steps=7).train(
        input_fn, steps=400, hooks=[Before(), hook(incremental_every_steps=1), reads])
    compared = []
    rng = np.random.default_rng(0)
    script = _KILLED_TRAINING.format(here=HERE)
    for delay in (0.0, *rng.uniform(0.3, 2.5, size=3)):
        model_dir = tmp_path / f"killed_{delay:.2f}"
        proc = subprocess.Popen([sys.executable, "-c", script, str(model_dir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not (model_dir / "checkpoint").exists() and time.time() < deadline:
            time.sleep(0.05)  # counted from the first full checkpoint
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        base = tf.train.latest_checkpoint(str(model_dir))
        manifest = os.path.join(model_dir, "graphmod", "deltas", os.path.basename(base),
                                "manifest.json")
        steps = ([d["step"] for d in json.load(open(manifest))["deltas"]]
                 if os.path.exists(manifest) else [])
        step = steps[-1] if steps else int(base.rsplit("-", 1)[1])
        if step > max(after):
            continue  # ran past the reference run: nothing to compare with
        state = restored_state(model_dir)
        assert state["global_step"] == step
        want = after[step] if steps else before[step]
        assert_same_state(state, want, f"killed after {delay:.2f}s at step {step}")
        compared.append((step, len(steps)))
    print("killed at (step, committed deltas):", compared)
    assert len(compared) >= 2, compared
