"""Portable SavedModels of a model_dir's state: `graphmod export --portable
--model-dir` (latest checkpoint plus its deltas), `--min-count`, and
`graphmod export --watch`, TF Serving's numbered versions written while a
training process writes deltas, each answering in a stock-TensorFlow process
what graphmod's predict answers at that version's state."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.checkpoint import deltas, merged, parts
from graphmod.checkpoint.serving_versions import versions
from graphmod_cli import main
from test_portable import LOAD, QUERY, QUERY_IDS, WORDS, _run, model_fn, receiver

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, FULL_EVERY, DELTA_EVERY = 60, 20, 5

TRAIN = textwrap.dedent(f"""
    import sys, time
    sys.path.insert(0, {HERE!r})
    import numpy as np, tensorflow as tf
    import graphmod
    from test_portable import model_fn, WORDS
    tf1 = tf.compat.v1

    class Slow(tf1.train.SessionRunHook):  # steps slow enough for the watcher to see most states
        def after_run(self, run_context, run_values):
            time.sleep(0.25)

    def input_fn():
        rng = np.random.default_rng(1)
        ids = rng.integers(0, 60, size=(4096, 3))
        s = np.array(WORDS)[rng.integers(0, len(WORDS), 4096)].astype(bytes)
        c = np.array([b"a", b"b", b"c"])[rng.integers(0, 3, 4096)]
        labels = ((ids[:, 0] + (s == b"w5")) % 2).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({{"ids": ids, "s": s, "c": c}}, labels)) \\
            .repeat().batch(32)

    config = tf.estimator.RunConfig(save_checkpoints_steps={FULL_EVERY}, keep_checkpoint_max=10)
    est = tf.estimator.Estimator(model_fn, model_dir=sys.argv[1], config=config)
    est.train(input_fn, steps={STEPS}, hooks=[
        graphmod.GraphModifierHook(incremental_every_steps={DELTA_EVERY}), Slow()])
""")


def _train_briefly(model_dir, steps, serving_export=None, **config):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    s = np.array(WORDS)[rng.integers(0, len(WORDS), 256)].astype(bytes)
    c = np.array([b"a", b"b", b"c"])[rng.integers(0, 3, 256)]
    labels = (ids[:, 0] % 2).astype(np.float32)
    est = tf.estimator.Estimator(model_fn, model_dir=model_dir, config=tf.estimator.RunConfig(
        **{"save_checkpoints_steps": 10, **config}))
    est.train(lambda: tf.data.Dataset.from_tensor_slices(
        ({"ids": ids, "s": s, "c": c}, labels)).repeat().batch(32), steps=steps,
        hooks=[graphmod.GraphModifierHook(incremental_every_steps=5,
                                          serving_export=serving_export)])
    return est


def _predict(model_dir):
    est = tf.estimator.Estimator(model_fn, model_dir=model_dir)
    return np.array([p["p"] for p in est.predict(
        lambda: tf.data.Dataset.from_tensor_slices(QUERY).batch(len(QUERY_IDS)),
        hooks=[graphmod.GraphModifierHook()])])


def _at_step(model_dir, step, copy):
    """A copy of model_dir whose latest state is the one at `step`: the full
    checkpoint at or before it and its deltas up to it."""
    shutil.copytree(model_dir, copy)
    fulls = sorted(int(p.rsplit("-", 1)[1]) for p in
                   tf.train.get_checkpoint_state(copy).all_model_checkpoint_paths)
    base = os.path.join(copy, f"model.ckpt-{max(f for f in fulls if f <= step)}")
    tf1.train.update_checkpoint_state(copy, base)
    deltas.truncate(base, sum(1 for d in deltas.read_manifest(base) if d["step"] <= step))
    return copy


def _served(path, tmp_path):
    for name, value in QUERY.items():
        np.save(tmp_path / f"{name}.npy", value)
    served = json.loads(_run(["-c", LOAD, path, str(tmp_path)], tmp_path).splitlines()[-1])
    assert served["not_stock"] == []
    np.testing.assert_allclose(served["v1"], served["v2"], rtol=1e-6, atol=1e-6)
    return np.array(served["v2"])


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A training process writing full checkpoints and deltas, watched by
    `graphmod export --watch` in another: (model_dir, template, base, the
    versions the watcher printed)."""
    root = tmp_path_factory.mktemp("watch")
    template_dir = str(root / "template_model")
    _train_briefly(template_dir, 2)
    template = graphmod.export_saved_model(tf.estimator.Estimator(model_fn, template_dir),
                                           receiver, str(root / "template")).decode()
    model_dir, base = str(root / "model"), str(root / "serving")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    trainer = subprocess.Popen([sys.executable, "-c", TRAIN, model_dir], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "graphmod", "export", "--watch", f"--template={template}",
         "--keep=4", "--poll-secs=0.2", f"--until-step={STEPS}", model_dir, base],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, train_err = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, train_err[-3000:]
        out, err = watcher.communicate(timeout=300)
        assert watcher.returncode == 0, err[-3000:]
    finally:
        for p in (trainer, watcher):
            if p.poll() is None:
                p.kill()
                p.wait()
    return model_dir, template, base, [json.loads(line) for line in out.splitlines()]


def test_watch_writes_versions_in_order_each_the_state_at_its_delta(watched, tmp_path):
    model_dir, _, base, printed = watched
    steps = [v["step"] for v in printed]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    # It saw the chain, not only the end: deltas between full checkpoints too.
    assert len(steps) >= 4 and any(v["deltas"] > 0 for v in printed), printed
    kept = sorted(int(n) for n in os.listdir(base) if n.isdigit())
    assert kept == steps[-4:]  # the newest 4 kept
    assert sorted(os.listdir(base)) == sorted(str(s) for s in kept)  # no temp dir left
    assert all(v["seconds_from_commit"] < 60 for v in printed)
    answers = []
    for step in kept[:-1] + [kept[-1]]:
        state = _at_step(model_dir, step, str(tmp_path / f"at{step}"))
        expected = _predict(state)
        answers.append(expected)
        np.testing.assert_allclose(_served(os.path.join(base, str(step)), tmp_path), expected,
                                   rtol=1e-6, atol=1e-6)
    # The versions differ (each is its own state, not the last one copied).
    assert not np.allclose(answers[0], answers[-1])


def test_export_from_model_dir_takes_the_latest_checkpoint_and_its_deltas(watched, tmp_path,
                                                                          capsys):
    model_dir, template, _, _ = watched
    chain = deltas.read_manifest(os.path.join(model_dir, f"model.ckpt-{STEPS - FULL_EVERY}"))
    with_deltas = chain[-1]["step"]
    state = _at_step(model_dir, with_deltas, str(tmp_path / "state"))
    out = str(tmp_path / "out")
    assert main(["graphmod", "export", "--portable", f"--model-dir={state}", template, out]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == with_deltas > STEPS - FULL_EVERY and report["deltas"] == len(chain)
    np.testing.assert_allclose(_served(out, tmp_path), _predict(state), rtol=1e-6, atol=1e-6)


def test_min_count_keeps_the_rows_seen_that_often(watched, tmp_path, capsys):
    model_dir, template, _, _ = watched
    out = str(tmp_path / "lean")
    # About half of emb's rows; none of the strings' (a table left empty).
    assert main(["graphmod", "export", "--portable", f"--model-dir={model_dir}",
                 "--min-count=96", template, out]) == 0
    report = json.loads(capsys.readouterr().out)
    held = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    lean = tf.train.load_checkpoint(os.path.join(out, "variables", "variables"))
    kept = {}
    for table in report["tables"]:
        name = table["table"]
        counts, keys = held.get_tensor(f"{name}-counts"), held.get_tensor(f"{name}-keys")
        # A table left with no rows has no keys to fill its hash table with.
        rows = lean.get_tensor(f"{name}-keys") if lean.has_tensor(f"{name}-keys") \
            else np.zeros(0, np.int64)
        values = lean.get_tensor(f"{name}-rows")
        assert sorted(rows) == sorted(keys[counts >= 96])
        order = {k: i for i, k in enumerate(keys)}
        np.testing.assert_array_equal(values, held.get_tensor(f"{name}-values")[
            [order[k] for k in rows]])  # each kept key keeps its own row
        assert table["rows_kept"] == len(rows) and table["rows"] == len(keys)
        assert table["bytes_saved"] == (len(keys) - len(rows)) * (8 + 4 * table["dim"])
        kept[name] = (len(rows), len(keys))
    assert 0 < kept["emb"][0] < kept["emb"][1]
    assert kept["input_layer/s_embedding/embedding_weights"][0] == 0
    # Still serves: a dropped key reads what an unseen one reads.
    full = _served(_export_full(template, model_dir, tmp_path), tmp_path)
    lean_answers = _served(out, tmp_path)
    assert lean_answers.shape == full.shape and not np.allclose(lean_answers, full)


def test_seen_since_keeps_the_rows_seen_since(watched, tmp_path, capsys):
    model_dir, template, _, _ = watched
    held = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    since = int(np.median(held.get_tensor("emb-last_seen")))
    out = str(tmp_path / "recent")
    assert main(["graphmod", "export", "--portable", f"--model-dir={model_dir}",
                 f"--seen-since={since}", template, out]) == 0
    report = json.loads(capsys.readouterr().out)
    recent = tf.train.load_checkpoint(os.path.join(out, "variables", "variables"))
    for table in report["tables"]:
        name = table["table"]
        keys, seen = held.get_tensor(f"{name}-keys"), held.get_tensor(f"{name}-last_seen")
        kept = recent.get_tensor(f"{name}-keys") if recent.has_tensor(f"{name}-keys") else []
        assert sorted(kept) == sorted(keys[seen >= since]) and table["rows_kept"] == len(kept)
    assert 0 < report["tables"][0]["rows_kept"] < report["tables"][0]["rows"] or \
        0 < report["tables"][1]["rows_kept"] < report["tables"][1]["rows"]


def _export_full(template, model_dir, tmp_path):
    from graphmod.checkpoint.serving_versions import export_state
    out = str(tmp_path / "full")
    export_state(template, model_dir, out)
    return out


def test_torn_delta_is_one_line_exit_2_and_nothing_written(watched, tmp_path, capsys):
    model_dir, template, _, _ = watched
    state = _at_step(model_dir, STEPS - FULL_EVERY + 2 * DELTA_EVERY, str(tmp_path / "torn"))
    base = tf.train.latest_checkpoint(state)
    last = deltas.read_manifest(base)[-1]
    data = [n for n in last["files"] if ".data-" in n][0]
    path = os.path.join(deltas.directory(base), data)
    os.truncate(path, os.path.getsize(path) // 2)
    for args in (["--portable", f"--model-dir={state}", template, str(tmp_path / "out")],
                 ["--watch", f"--template={template}", state, str(tmp_path / "out")]):
        assert main(["graphmod", "export", *args]) == 2
        err = capsys.readouterr().err
        assert "is torn" in err and last["name"] in err and err.count("\n") == 1, err
        assert sorted(os.listdir(tmp_path)) == ["torn"]  # nothing written
    assert main(["graphmod", "export", "--watch", state, str(tmp_path / "none")]) == 2
    assert "--template" in capsys.readouterr().err


def test_hook_option_writes_versions_while_training(tmp_path):
    base = str(tmp_path / "serving")
    export = graphmod.ServingExport(receiver, base, keep=2, poll_secs=0.2)
    _train_briefly(str(tmp_path / "model"), 30, serving_export=export)
    assert export.join(timeout=180) and export.error is None
    assert [r["step"] for r in export.reports][-1] == 30
    assert sorted(os.listdir(base)) == sorted([".template"] + [
        str(r["step"]) for r in export.reports[-2:]])
    np.testing.assert_allclose(_served(os.path.join(base, "30"), tmp_path),
                               _predict(str(tmp_path / "model")), rtol=1e-6, atol=1e-6)


def test_watch_reads_on_when_the_checkpoint_it_reads_is_deleted(watched, tmp_path,
                                                                monkeypatch):
    """The training's Saver deletes the full checkpoint (and its deltas) the
    watcher is exporting, and moves on to a newer one: the version of what
    was read is written, then the newer state's, instead of a failure."""
    from graphmod.checkpoint import merged, serving_versions
    model_dir, template, _, _ = watched
    at = STEPS - FULL_EVERY + 2 * DELTA_EVERY
    state = _at_step(model_dir, at, str(tmp_path / "m"))
    reading = tf.train.latest_checkpoint(state)
    real_write = merged.write

    def saver_moves_on(st, prefix, recover=None):
        written = real_write(st, prefix, recover)
        if st.checkpoint == reading:  # as max_to_keep does, while the export runs
            for name in os.listdir(state):
                if name.startswith(os.path.basename(reading) + "."):
                    os.remove(os.path.join(state, name))
            shutil.rmtree(deltas.directory(reading))
            tf1.train.update_checkpoint_state(state, os.path.join(state, f"model.ckpt-{STEPS}"))
        return written
    monkeypatch.setattr(merged, "write", saver_moves_on)
    base = str(tmp_path / "serving")
    for _ in range(2):
        assert serving_versions.watch(template, state, base, poll_secs=0.01,
                                      stop=lambda: True) == 1
    assert versions(base) == [at, STEPS]


def _as_rank_parts(checkpoint):
    """Rewrites a one-process checkpoint as one Horovod rank saves it: the
    tables in a part beside it (graphmod.checkpoint.parts), the checkpoint
    itself the dense variables only. Its manifest is left to be committed."""
    part = parts.part_prefix(checkpoint, 0, 1)
    for f in tf.io.gfile.glob(checkpoint + ".index") + tf.io.gfile.glob(checkpoint + ".data-*"):
        os.rename(f, part + f[len(checkpoint):])
    reader = tf.train.load_checkpoint(part)
    with tf.Graph().as_default():
        dense = [tf1.Variable(reader.get_tensor(name), name=name) for name in
                 merged.dense_entries(part, merged.table_entries(part))]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf1.train.Saver(dense).save(sess, checkpoint, write_meta_graph=False,
                                        write_state=False)


def test_watch_waits_while_the_latest_checkpoint_is_saved_again(watched, tmp_path):
    """A resumed Horovod run saves its restored step again under its name,
    its table parts written before their manifest commits them. A watcher
    that finds the checkpoint in between waits for the save to complete,
    instead of failing or exporting the checkpoint without its tables; then
    it exports what the parts hold."""
    from graphmod.checkpoint import serving_versions
    model_dir, template, _, _ = watched
    state = _at_step(model_dir, STEPS, str(tmp_path / "m"))
    latest = tf.train.latest_checkpoint(state)
    deltas.drop(latest)  # a save again under its name drops its deltas first (RankParts.save)
    whole = str(tmp_path / "whole")
    # Stray parts beside a one-process checkpoint (its save killed while
    # removing an earlier save's parts): it holds its tables, it is complete.
    stray = parts.part_prefix(latest, 1, 2) + ".index"
    shutil.copy(latest + ".index", stray)
    assert not merged.unfinished(latest)
    assert serving_versions.export_new_version(template, state, whole)["step"] == STEPS
    os.remove(stray)
    _as_rank_parts(latest)
    assert merged.unfinished(latest)
    with pytest.raises(merged.StateError, match="its save has not completed"):
        merged.table_entries(latest)
    base = str(tmp_path / "serving")
    polls = iter(range(3))
    assert serving_versions.watch(template, state, base, poll_secs=0.01,
                                  stop=lambda: next(polls, None) is None) == 0
    assert versions(base) == []
    parts.commit(latest, 1)  # every part written: the save completes
    assert serving_versions.watch(template, state, base, poll_secs=0.01,
                                  stop=lambda: True) == 1
    assert versions(base) == [STEPS]
    np.testing.assert_array_equal(_served(os.path.join(base, str(STEPS)), tmp_path),
                                  _served(os.path.join(whole, str(STEPS)), tmp_path))


def test_hook_option_survives_deleted_checkpoints_and_a_resume(tmp_path):
    """keep_checkpoint_max=1 deletes each full checkpoint (and its deltas)
    as the next is written, and a second train() writes a checkpoint again
    under a name the first used: the export reads on and ends at the last
    state, which serves what graphmod's predict answers."""
    base, model = str(tmp_path / "serving"), str(tmp_path / "model")
    export = graphmod.ServingExport(receiver, base, keep=3, poll_secs=0.05)
    for final in (20, 40):  # 20 steps each
        _train_briefly(model, 20, serving_export=export, save_checkpoints_steps=4,
                       keep_checkpoint_max=1)
        assert export.join(timeout=180) and export.error is None, export.error
        assert versions(base)[-1] == final
    assert len(versions(base)) <= 3 and len(export.reports) >= 2
    np.testing.assert_allclose(_served(os.path.join(base, "40"), tmp_path), _predict(model),
                               rtol=1e-6, atol=1e-6)


FAILING = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {HERE!r})
    import numpy as np, tensorflow as tf, graphmod
    from test_portable import model_fn, receiver, WORDS

    class Boom(tf.compat.v1.train.SessionRunHook):
        steps = 0
        def after_run(self, run_context, run_values):
            self.steps += 1
            if self.steps == 12:
                raise RuntimeError("boom")

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    s = np.array(WORDS)[rng.integers(0, len(WORDS), 256)].astype(bytes)
    c = np.array([b"a"] * 256)
    est = tf.estimator.Estimator(model_fn, model_dir=sys.argv[1],
                                 config=tf.estimator.RunConfig(save_checkpoints_steps=5))
    export = graphmod.ServingExport(receiver, sys.argv[2], poll_secs=0.2)
    est.train(lambda: tf.data.Dataset.from_tensor_slices(
        ({{"ids": ids, "s": s, "c": c}}, (ids[:, 0] % 2).astype(np.float32))).repeat().batch(32),
        steps=30, hooks=[graphmod.GraphModifierHook(serving_export=export), Boom()])
""")


def test_a_training_that_raises_exits_with_its_error_not_waiting_for_the_export(tmp_path):
    """The export's thread is not a daemon (the last version is written after
    train() returns); when training raises instead, the process still exits."""
    done = subprocess.run([sys.executable, "-c", FAILING, str(tmp_path / "model"),
                           str(tmp_path / "serving")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 1 and "RuntimeError: boom" in done.stderr, done.stderr[-2000:]
