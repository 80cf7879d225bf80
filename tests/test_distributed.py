"""Tables sharded across real Horovod ranks (Gloo over loopback).

A new row depends only on (key, seed), so training an unchanged model on N
ranks, each on its part of a global batch, must equal training it on one
rank on the whole batch: the same losses, dense weights and table rows
(values, optimizer slots, access counts, last seen, versions, and the ids
pending admission), every key kept by exactly its owner. The model has two
tables of different dims read in one fused lookup, keys that repeat within
and across ranks, admission by count on one table and eviction by steps on
the other.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    steps, out = int(sys.argv[1]), sys.argv[2]
    hvd.init()
    graphmod.horovod.enable()
    size, rank = hvd.size(), hvd.rank()
    B = 24
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 40, size=(B, 3)).astype(np.int64),
                rng.integers(0, 2, size=B).astype(np.float32)) for _ in range(steps)]
    # The last step reads one user only: the other owners' tables see no
    # lookup then, but must evict as the one table of one rank does.
    batches[-1][0][:, 0] = 7
    # Placeholders, not constants: TF would run collectives with constant
    # inputs while building the graph (docs/notes/horovod_0.28.1_facts.md).
    ids = tf1.placeholder(tf.int64, [None, 3])
    labels = tf1.placeholder(tf.float32, [None])
    step = tf1.train.get_or_create_global_step()
    # As an Estimator does: the step is read before the step's ops and
    # incremented after them (lookups stamp rows with it; eviction cuts by it).
    from tensorflow.python.training import training_util
    step_read = training_util._get_or_create_global_step_read()  # what EvictHook fetches
    graphmod.use_feature_specs({"item": ids[:, 1:], "user": ids[:, 0]}, [
        graphmod.FeatureSpec("item", access_threshold=2),
        graphmod.FeatureSpec("user", eviction_threshold=1, eviction_unit="steps")])
    opt = graphmod.optimizers.Adagrad(0.2)
    user = graphmod.create_table("user", 4, optimizer=opt, seed=1)
    item = graphmod.create_table("item", 8, optimizer=opt, seed=2)
    u, i = graphmod.fused_lookup([user, item], [ids[:, 0], ids[:, 1:]], combiners=[None, "sum"])
    w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 12, dtype=np.float32)
                         .reshape(12, 1))
    logits = tf.squeeze(tf.matmul(tf.concat([u, i], 1), w), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense = tf1.train.GradientDescentOptimizer(0.1)
    if size > 1:
        dense = hvd.DistributedOptimizer(dense)  # averages, as the tables' gradients are
    with tf.control_dependencies([opt.minimize(loss), dense.minimize(loss, var_list=[w]),
                                  step_read]):
        train = step.assign_add(1)
    global_loss = hvd.allreduce(loss, op=hvd.Average) if size > 1 else loss
    tables = {t.name: dict(t.export(), **{"pending_" + k: v for k, v in
                                           t.export_pending().items() if k != "sketch"})
              for t in (user, item)}
    owners = {t: graphmod.horovod.owner_of(x["keys"], size) for t, x in tables.items()}
    # Read-only lookups (evaluation): each rank's own ids, seen and unseen.
    probe = tf1.placeholder(tf.int64, [None])
    read = graphmod.sparse_lookup(item, probe, is_training=False)
    losses = []
    saver = tf1.train.Saver()  # builds: only running a save of a sharded table fails
    # A monitored session builds its Scaffold's Saver too.
    # Each owner evicts its users unseen for more than a step, every step.
    evict = graphmod.EvictHook(evict_time_interval=None, evict_step_interval=1)
    with tf1.train.SingularMonitoredSession(scaffold=tf1.train.Scaffold(saver=saver),
                                            hooks=[evict]) as sess:
        for x, y in batches:
            part = slice(rank * B // size, (rank + 1) * B // size)
            loss_value, _ = sess.run([global_loss, train], {ids: x[part], labels: y[part]})
            losses.append(loss_value)
        got, own, w_value = sess.run([tables, owners, w])
        # Some with rows, some without; one rank reads them all.
        probe_ids = np.arange(30, 50) + 3 * rank if size > 1 else np.arange(30, 56)
        read_value = sess.run(read, {probe: probe_ids})
        refused = ""
        try:
            saver.save(sess.raw_session(), out + f"/model{rank}")
        except tf.errors.InvalidArgumentError as e:
            refused = e.message
    np.savez(f"{out}/rank{rank}.npz", losses=np.array(losses), w=w_value,
             probe_ids=probe_ids, read=read_value,
             refused=np.array(refused), evictions=evict.evictions,
             users_seen=len(np.unique([x[:, 0] for x, _ in batches])),
             **{f"{t}/{f}": v for t, d in got.items() for f, v in d.items()},
             **{f"{t}/owner": v for t, v in own.items()})
""")

FIELDS = ("values", "slots", "counts", "last_seen", "versions")


def launch(ranks, *args):
    """Runs python with args on `ranks` Horovod ranks (plainly for one);
    returns the finished process, checked to have succeeded."""
    command = [sys.executable, *map(str, args)]
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"] + command
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def run_script(tmp_path, text, name, ranks, *args):
    """Runs a script writing rank{r}.npz into a fresh folder; their contents."""
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    launch(ranks, script, *args, out)
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(ranks)]


def run(tmp_path, ranks, steps=4):
    return run_script(tmp_path, SCRIPT, f"ranks{ranks}", ranks, steps)


def merged(ranks, table, prefix=""):
    """A table's rows (or pending ids) over all ranks, ordered by key."""
    keys = np.concatenate([r[f"{table}/{prefix}keys"] for r in ranks])
    order = np.argsort(keys)
    fields = ("counts", "last_seen") if prefix else FIELDS
    return keys[order], {f: np.concatenate([r[f"{table}/{prefix}{f}"] for r in ranks])[order]
                         for f in fields}


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_train_as_one_rank_on_the_same_global_batch(tmp_path, ranks):
    (one,) = run(tmp_path, 1)
    many = run(tmp_path, ranks)
    for r in many:
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=1e-6)
    np.testing.assert_allclose(many[0]["w"], one["w"], rtol=1e-5, atol=1e-7)
    for table in ("user", "item"):
        for rank, r in enumerate(many):  # each key kept by exactly its owner
            assert (r[f"{table}/owner"] == rank).all(), (table, rank)
        for prefix in ("", "pending_"):
            keys, fields = merged(many, table, prefix)
            want_keys, want = merged([one], table, prefix)
            np.testing.assert_array_equal(keys, want_keys, err_msg=f"{table} {prefix}keys")
            for f in fields:
                np.testing.assert_allclose(fields[f], want[f], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{table} {prefix}{f}")
        assert len(merged(many, table)[0]) > 20  # rows on every rank, not a trivial table
    assert len(merged(many, "item", "pending_")[0]) > 0  # admission had ids waiting
    # Eviction ran on every rank and removed users, as it did on one rank.
    assert all(int(r["evictions"]) > 0 for r in many)
    assert len(merged([one], "user")[0]) < int(one["users_seen"])
    # Read-only lookups on each rank read what one rank reads: the rows of
    # ids with one, the missing value (here the initial row) of the others.
    one_read = dict(zip(one["probe_ids"].tolist(), one["read"]))
    rows = set(one["item/keys"].tolist())
    for r in many:
        probes = r["probe_ids"].tolist()
        assert any(k in rows for k in probes) and any(k not in rows for k in probes)
        np.testing.assert_allclose(r["read"], [one_read[k] for k in probes], rtol=1e-5,
                                   atol=1e-6)
    for r in many:  # a save would write one rank's keys as if they were all: refused
        assert "sharded across Horovod ranks" in str(r["refused"])
    assert str(one["refused"]) == ""  # one rank saves as usual


def test_the_example_runs_on_two_ranks():
    """docs/horovod.md's command: 26 sharded tables in one exchange per step."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = launch(2, os.path.join(here, "examples", "horovod_sharded.py"), "--steps", "20")
    ends = [line for line in done.stdout.splitlines() if "all owned by this rank" in line]
    assert len(ends) == 2 and all(line.endswith("True") for line in ends), done.stdout[-2000:]
    losses = {line.split("global loss ")[1] for line in done.stdout.splitlines()
              if "step 19: global loss" in line}
    assert len(losses) == 1, done.stdout[-2000:]  # both ranks report the same global loss


CHECKPOINT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod, graphmod.checkpoint.saver
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    mode, folder, out = sys.argv[1:4]  # out last, as run_script passes it
    hvd.init()
    graphmod.horovod.enable()
    size, rank = hvd.size(), hvd.rank()
    ids = tf1.placeholder(tf.int64, [None, 2])
    step = tf1.train.get_or_create_global_step()
    graphmod.use_feature_specs({"item": ids[:, 1]}, [graphmod.FeatureSpec(
        "item", access_threshold=2)])
    opt = graphmod.optimizers.Adagrad(0.2)
    user = graphmod.create_table("user", 4, optimizer=opt, seed=1)
    item = graphmod.create_table("item", 3, optimizer=opt, seed=2)
    u, i = graphmod.fused_lookup([user, item], [ids[:, 0], ids[:, 1]])
    w = tf1.get_variable("w", [7, 1], initializer=tf1.ones_initializer())
    loss = tf.reduce_mean(tf.matmul(tf.concat([u, i], 1), w) ** 2)
    dense = tf1.train.GradientDescentOptimizer(0.1)
    if size > 1:
        dense = hvd.DistributedOptimizer(dense)
    train = tf.group(opt.minimize(loss), dense.minimize(loss, var_list=[w]), step.assign_add(1))
    saver = graphmod.checkpoint.saver.TableSaver(sharded=True, max_to_keep=2)
    saver.build()
    tables = {t.name: dict(t.export(), **{"pending_" + k: v for k, v in
                                           t.export_pending().items() if k != "sketch"})
              for t in (user, item)}
    owners = {t: graphmod.horovod.owner_of(x["keys"], size) for t, x in tables.items()}
    rng = np.random.default_rng(rank)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        if mode == "train":
            for s in range(6):
                sess.run(train, {ids: rng.integers(0, 300, size=(16, 2))})
                if s % 2 == 1:
                    path = saver.save(sess, folder + "/model.ckpt", global_step=step)
        else:
            saver.restore(sess, tf.train.latest_checkpoint(folder))
        got, own, w_value = sess.run([tables, owners, w])
    np.savez(f"{out}/rank{rank}.npz", w=w_value,
             **{f"{t}/{f}": v for t, d in got.items() for f, v in d.items()},
             **{f"{t}/owner": v for t, v in own.items()})
""")


def run_checkpoint_script(tmp_path, mode, ranks, folder):
    return run_script(tmp_path, CHECKPOINT_SCRIPT, f"{mode}{ranks}", ranks, mode, folder)


def test_a_checkpoint_of_two_ranks_restores_on_one_two_and_three(tmp_path):
    """Every rank saves the keys it owns as a part of the checkpoint, rank 0
    commits the manifest and the rest; restored on 1, 2 or 3 ranks, every
    rank holds exactly the keys it owns, with the saved rows, slots, counts
    and pending ids, and the dense weights."""
    folder = tmp_path / "model"
    saved = run_checkpoint_script(tmp_path, "train", 2, folder)
    files = sorted(os.listdir(folder))
    assert "model.ckpt-6.tables.json" in files and "model.ckpt-6.tables-00001-of-00002.index" in files
    assert not any(f.startswith("model.ckpt-2.") for f in files)  # max_to_keep took its parts
    for ranks in (1, 2, 3):
        restored = run_checkpoint_script(tmp_path, "restore", ranks, folder)
        np.testing.assert_array_equal(restored[0]["w"], saved[0]["w"])
        for table in ("user", "item"):
            for rank, r in enumerate(restored):
                assert (r[f"{table}/owner"] == rank).all(), (ranks, table, rank)
            for prefix in ("", "pending_"):
                keys, fields = merged(restored, table, prefix)
                want_keys, want = merged(saved, table, prefix)
                np.testing.assert_array_equal(keys, want_keys, err_msg=f"{ranks} {table}")
                for f in fields:
                    np.testing.assert_array_equal(fields[f], want[f],
                                                  err_msg=f"{ranks} ranks {table} {prefix}{f}")
            assert len(merged(saved, table)[0]) > 20
        assert len(merged(saved, "item", "pending_")[0]) > 0


MISMATCH_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod, graphmod.checkpoint.saver
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    hvd.init()
    graphmod.horovod.enable()
    ids = tf1.placeholder(tf.int64, [None])
    table = graphmod.create_table("user", 4)
    rows = graphmod.sparse_lookup(table, ids)
    saver = graphmod.checkpoint.saver.TableSaver(sharded=True)
    saver.build()
    with tf1.Session() as sess:
        sess.run(rows, {ids: [1, 2, 3]})
        try:  # each rank its own folder, as Horovod's examples set model_dir
            saver.save(sess, f"{sys.argv[1]}/rank{hvd.rank()}/model.ckpt")
        except ValueError as e:
            print("refused:", e, flush=True)
""")


def test_ranks_saving_to_different_checkpoints_are_refused(tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH_SCRIPT)
    done = launch(2, script, tmp_path)
    refusals = [line for line in done.stdout.splitlines() if "refused:" in line]
    assert len(refusals) == 2 and all("same model_dir" in line for line in refusals), \
        done.stdout[-2000:]
    assert not list(tmp_path.rglob("*.tables-*"))  # nothing written


# The model of the hook-mode Estimator scripts below: one embedding variable
# read by a gather (rows start from a constant: a table's random rows cannot
# equal the variable's, only follow its distribution), a dense layer.
LOGITS_OF = textwrap.dedent("""
    def logits_of(features):
        emb = tf1.get_variable("emb", [20000, 4], initializer=tf1.constant_initializer(0.1))
        w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 8, dtype=np.float32)
                             .reshape(8, 1))
        return tf.squeeze(tf.matmul(tf.reshape(tf.nn.embedding_lookup(emb, features["ids"]),
                                               [-1, 8]), w), 1)
""")


# emb beside an 8-row variable read by the same ids, which the planner
# (auto) replicates whatever emb's placement: its allreduce sends less than
# an exchange of the rows of a batch's 24 ids would.
TWO_TABLES = textwrap.dedent("""
    def logits_of(features):
        emb = tf1.get_variable("emb", [20000, 4], initializer=tf1.constant_initializer(0.1))
        small = tf1.get_variable("small", [8, 4], initializer=tf1.constant_initializer(0.2))
        w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 8, dtype=np.float32)
                             .reshape(8, 1))
        ids = features["ids"]
        x = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 8]) * \\
            tf.reshape(tf.nn.embedding_lookup(small, ids % 8), [-1, 8])
        return tf.squeeze(tf.matmul(x, w), 1)
""")


def with_model(script: str, logits: str = LOGITS_OF) -> str:
    return script.replace("# LOGITS_OF\n", logits)


# Hook mode: an unchanged Horovod Estimator (DistributedOptimizer and
# BroadcastGlobalVariablesHook) with GraphModifierHook, against the same
# model trained densely on one rank on the same global batches. The rows
# start from a constant (a table's random rows cannot equal the variable's,
# only follow its distribution), so every difference is the training's.
ESTIMATOR_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    mode, order, combine, model_dir, out = sys.argv[1:6]
    warm_from = sys.argv[6] if sys.argv[6] != "-" else None  # a checkpoint emb starts from
    # "graphmod:DIR": the model starts from DIR by GraphModifierHook(warm_start=...)
    graphmod_warm = warm_from[len("graphmod:"):] if warm_from and \
        warm_from.startswith("graphmod:") else None
    placements = sys.argv[7].split(",")  # emb's, in the first training and the rest
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    B, STEPS, FIRST = 24, 8, 5
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=(STEPS, B, 2)).astype(np.int64)
    labels = rng.integers(0, 2, size=(STEPS, B)).astype(np.float32)
    part = slice(rank * B // size, (rank + 1) * B // size)

    def input_fn(skip):
        return lambda: tf.data.Dataset.from_tensor_slices(
            ({"ids": ids[:, part]}, labels[:, part])).skip(skip)

    class Recorder(tf1.train.SessionRunHook):
        def __init__(self, loss):
            self.loss, self.losses = loss, []
        def before_run(self, run_context):
            return tf1.train.SessionRunArgs(self.loss)
        def after_run(self, run_context, run_values):
            self.losses.append(float(run_values.results))

    recorders = []
    # LOGITS_OF

    def model_fn(features, labels, mode):
        logits = logits_of(features)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        global_loss = hvd.allreduce(loss, op=hvd.Average, name="global_loss")
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
                "global_loss": tf1.metrics.mean(global_loss)})
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3),
                                       op=hvd.Average if combine == "average" else hvd.Sum)
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        recorders.append(Recorder(global_loss))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                          training_hooks=[recorders[-1]])

    # "adopt": a dense Horovod model laid out as Horovod's examples do (rank
    # 0 alone has the model_dir) trains its first steps, then goes on with
    # the hook, which adopts its checkpoint into tables split across the ranks.
    estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
        model_dir=model_dir if mode != "adopt" or rank == 0 else None,
        save_checkpoints_steps=3, tf_random_seed=1),
        warm_start_from=tf.estimator.WarmStartSettings(warm_from, vars_to_warm_start="emb")
        if warm_from and not graphmod_warm else None)

    def hooks(dense=mode == "dense", placement=placements[-1]):
        broadcast = [hvd.BroadcastGlobalVariablesHook(0)]
        if dense:
            return broadcast
        modifier = graphmod.GraphModifierHook(
            model_dir=None, min_rows=8, tables={"emb": {"placement": placement}},
            warm_start=graphmod.WarmStartSettings([graphmod_warm]) if graphmod_warm else None)
        return broadcast + [modifier] if order == "after" else [modifier] + broadcast

    class Rows(tf1.train.SessionRunHook):
        def begin(self):
            tables = {t.name: t for t in graphmod.tables()}
            named = {v.op.name: v for v in tf1.global_variables()}
            self.fetch = tables["emb"].export() if tables else {
                "emb": named["emb"].read_value(), "accum": named["emb/Adagrad"].read_value()}
        def end(self, session):
            self.rows = session.run(self.fetch)

    first = hooks(dense=mode != "hooked", placement=placements[0])
    estimator.train(input_fn(0), steps=FIRST, hooks=first)
    rows = Rows()  # the second call restores the checkpoint of step 5, trains to the input's end
    second = hooks()
    estimator.train(input_fn(FIRST), hooks=second + [rows])
    # Which tables' ids the hooked training exchanged a step ahead; adopted.
    reports = [h.report for h in first + second if isinstance(h, graphmod.GraphModifierHook)]
    modifier = [h for h in hooks() if isinstance(h, graphmod.GraphModifierHook)]
    evaluation = estimator.evaluate(input_fn(0), steps=3, hooks=modifier)
    # Prediction holds every key (it reads every rank's part): any rank, any ids.
    logits = [p["logits"] for p in estimator.predict(
        lambda: tf.data.Dataset.from_tensor_slices({"ids": ids[0]}).batch(B),
        hooks=modifier)]
    if "keys" in rows.rows:
        got = {int(k): (v.tolist(), s.reshape(-1).tolist(), int(c)) for k, v, s, c in zip(
            rows.rows["keys"], rows.rows["values"], rows.rows["slots"], rows.rows["counts"])}
    else:
        used = np.unique(ids)
        got = {int(k): (rows.rows["emb"][k].tolist(), rows.rows["accum"][k].tolist()) for k in used}
    json.dump(dict(losses=[l for r in recorders for l in r.losses], rows=got,
                   logits=np.array(logits).tolist(),
                   eval=float(evaluation["global_loss"]),
                   w=estimator.get_variable_value("w").tolist(),
                   ids_ahead=reports[0].ids_ahead if reports else None,
                   placed=[{t["variable"]: t.get("placement") for t in r.tables}
                           for r in reports],
                   adopted=reports[0].adopted if reports else None),
              open(f"{out}/rank{rank}.json", "w"))
""")


def run_estimator(tmp_path, name, ranks, mode, order="after", combine="average",
                  warm_from=None, placements="auto,auto", logits=LOGITS_OF):
    out, model_dir = tmp_path / name, tmp_path / f"{name}_model"
    out.mkdir()
    script = tmp_path / f"{name}.py"
    script.write_text(with_model(ESTIMATOR_SCRIPT, logits))
    launch(ranks, script, mode, order, combine, model_dir, out, warm_from or "-", placements)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)], model_dir


def test_an_unchanged_horovod_estimator_trains_sharded_tables_as_its_dense_model(tmp_path):
    """Both hook orders around BroadcastGlobalVariablesHook, 2 ranks, against
    one dense rank: the same losses (5 steps, a restore from the sharded
    checkpoint of step 5, 3 more), evaluation (sharded), predictions (each
    rank holding every key), dense weights, and every row and Adagrad
    accumulator, each key kept by one rank only."""
    (dense,), dense_dir = run_estimator(tmp_path, "dense", 1, "dense")
    for order in ("after", "before"):
        ranks, model_dir = run_estimator(tmp_path, f"hooked_{order}", 2, "hooked", order)
        for r in ranks:
            assert r["ids_ahead"] == {"emb": ""}  # each step's ids went during the step before
            np.testing.assert_allclose(r["losses"], dense["losses"], rtol=1e-5)
            assert len(r["losses"]) == 8
            np.testing.assert_allclose(r["eval"], dense["eval"], rtol=1e-5)
            np.testing.assert_allclose(r["w"], dense["w"], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(r["logits"], dense["logits"], rtol=1e-5, atol=1e-6)
        owned = [set(r["rows"]) for r in ranks]
        assert owned[0] and owned[1] and not owned[0] & owned[1]  # sharded, not copied
        rows = {**ranks[0]["rows"], **ranks[1]["rows"]}
        assert set(rows) == set(dense["rows"])
        for key, (values, accum, *_) in dense["rows"].items():
            np.testing.assert_allclose(rows[key][0], values, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(rows[key][1], accum, rtol=1e-5, atol=1e-7)
        # Both ranks wrote their part of every checkpoint; rank 0 the manifest.
        names = os.listdir(model_dir)
        for step in (0, 3, 5, 8):
            assert f"model.ckpt-{step}.tables.json" in names, names
            for r in range(2):
                assert f"model.ckpt-{step}.tables-0000{r}-of-00002.index" in names
    assert_the_command_reads_both_parts(model_dir, dense_dir, len(rows), tmp_path)


def test_placements_train_as_the_dense_model_and_restore_into_each_other(tmp_path):
    """emb placed replicated (every row on both ranks) trains as one dense
    rank, and its checkpoint of step 5 restores into it sharded for 3 more
    steps; and the other way round: the same losses, evaluation,
    predictions, dense weights, rows and accumulators as the dense model,
    beside an 8-row table the planner replicates. A replicated table's two
    copies hold every key, equal, and count each key's reads as the sharded
    table's owner does. The command reads the checkpoints, and `graphmod
    inspect` shows the placement."""
    import contextlib
    import io
    from graphmod_cli import main
    (dense,), dense_dir = run_estimator(tmp_path, "dense", 1, "dense", logits=TWO_TABLES)
    counts = []
    for first, then in (("replicated", "sharded"), ("sharded", "replicated")):
        ranks, model_dir = run_estimator(tmp_path, f"{first}_{then}", 2, "hooked",
                                         placements=f"{first},{then}", logits=TWO_TABLES)
        for r in ranks:
            assert [p["emb"] for p in r["placed"]] == [first, then]
            assert all(p["small"] == "replicated" for p in r["placed"]), r["placed"]
            np.testing.assert_allclose(r["losses"], dense["losses"], rtol=1e-5)
            assert len(r["losses"]) == 8
            np.testing.assert_allclose(r["eval"], dense["eval"], rtol=1e-5)
            np.testing.assert_allclose(r["w"], dense["w"], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(r["logits"], dense["logits"], rtol=1e-5, atol=1e-6)
        if then == "replicated":
            copies = [r["rows"] for r in ranks]
            assert set(copies[0]) == set(copies[1]) == set(dense["rows"])
            assert copies[0] == copies[1]  # bit-equal copies, counts included
        else:
            assert not set(ranks[0]["rows"]) & set(ranks[1]["rows"])
        rows = {**ranks[0]["rows"], **ranks[1]["rows"]}
        assert set(rows) == set(dense["rows"])
        for key, (values, accum, *_) in dense["rows"].items():
            np.testing.assert_allclose(rows[key][0], values, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(rows[key][1], accum, rtol=1e-5, atol=1e-7)
        counts.append({k: r[2] for k, r in rows.items()})
        assert_the_command_reads_both_parts(model_dir, dense_dir, len(rows),
                                            tmp_path / f"{first}_{then}")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main(["graphmod", "inspect", str(model_dir)]) == 0
        assert f"placed {then} across Horovod ranks (TableSettings" in text.getvalue()
    # Each key's reads over the 8 steps (2 per id per step: both ranks' batches).
    assert counts[0] == counts[1] and sum(counts[0].values()) == 8 * 24 * 2


def test_a_dense_horovod_model_dir_is_adopted_into_tables_split_across_ranks(tmp_path):
    """A dense Horovod model (rank 0 alone with the model_dir) trains 5 steps
    on 2 ranks, then goes on with the hook: each rank adopts the keys it owns
    from rank 0's dense checkpoint, and the 2 ranks then train as one dense
    rank does: the same losses, evaluation, predictions and every row and
    Adagrad accumulator, each key on its owner."""
    (dense,), _ = run_estimator(tmp_path, "dense", 1, "dense")
    ranks, model_dir = run_estimator(tmp_path, "adopt", 2, "adopt")
    for r in ranks:
        assert r["adopted"] == ["emb"] and r["ids_ahead"] == {"emb": ""}
        np.testing.assert_allclose(r["losses"], dense["losses"], rtol=1e-5)
        assert len(r["losses"]) == 8
        np.testing.assert_allclose(r["eval"], dense["eval"], rtol=1e-5)
        np.testing.assert_allclose(r["logits"], dense["logits"], rtol=1e-5, atol=1e-6)
    owned = [set(r["rows"]) for r in ranks]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    rows = {**ranks[0]["rows"], **ranks[1]["rows"]}
    # Every adopted key (the dense variable's 20000 rows), each on one rank.
    assert set(rows) == {str(k) for k in range(20000)}
    for key, (values, accum, *_) in rows.items():
        want = dense["rows"].get(key, ([0.1] * 4, [0.1] * 4))  # never read: as initialized
        np.testing.assert_allclose(values, want[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(accum, want[1], rtol=1e-5, atol=1e-7)
    # The dense checkpoint of step 5 kept aside (once, by rank 0); then in parts.
    kept = os.listdir(model_dir / "graphmod" / "dense_before_adoption")
    assert "model.ckpt-5.index" in kept and not any(".tables" in n for n in kept)
    assert "model.ckpt-8.tables.json" in os.listdir(model_dir)


# graphmod.verify of a Horovod Estimator on every rank: the unmodified model
# on the ranks against the hooked one, tables split across the ranks.
VERIFY_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    from graphmod._ops import ops
    tf1 = tf.compat.v1
    fault, out, placement = sys.argv[1:4]
    hvd.init()
    rank = hvd.rank()
    if fault == "doubled":  # the table's update gets twice the gradient
        fused = ops.graphmod_fused_apply
        ops.graphmod_fused_apply = lambda h, k, g, *a, **kw: fused(h, k, [2 * x for x in g],
                                                                   *a, **kw)

    def input_fn():
        rng = np.random.default_rng(3 + rank)
        ids = rng.integers(0, 300, size=(512, 3)).astype(np.int64)
        labels = (ids[:, 0] % 3 == 0).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(32)

    def model_fn(features, labels, mode):
        emb = tf1.get_variable("emb", [300, 4],
                               initializer=tf1.truncated_normal_initializer(stddev=0.5))
        head = tf1.get_variable("head", [12, 1])
        e = tf.reshape(tf.nn.embedding_lookup(emb, features["ids"]), [-1, 12])
        logits = tf.squeeze(tf.matmul(e, head), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3))
        train = opt.minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    estimator = tf.estimator.Estimator(model_fn,
                                       config=tf.estimator.RunConfig(tf_random_seed=7))
    result = graphmod.verify(estimator, input_fn, steps=4,
                             hook=graphmod.GraphModifierHook(
                                 min_rows=100, tables={"emb": {"placement": placement}}))
    finding = result.findings.get("emb")
    json.dump(dict(ok=result.ok, summary=result.summary(), other_ranks=result.other_ranks,
                   first_step=finding.first_step if finding else None,
                   compared=finding.compared if finding else None),
              open(f"{out}/rank{rank}.json", "w"))
""")


def test_verify_on_two_ranks_passes_a_faithful_rewrite_and_catches_a_doubled_gradient(tmp_path):
    """graphmod.verify under Horovod: each rank compares the keys its part of
    the table owns (adopted from the unmodified run's first checkpoint)
    against the unmodified model on the same ranks; a doubled gradient in
    the tables' update fails it on every rank, at step 1. Replicated, each
    rank compares every key of its copy."""
    script = tmp_path / "verify.py"
    script.write_text(VERIFY_SCRIPT)
    out = tmp_path / "replicated"
    out.mkdir()
    launch(2, script, "none", out, "replicated")
    for r in range(2):
        got = json.loads((out / f"rank{r}.json").read_text())
        assert got["ok"], got["summary"]
        assert got["compared"].startswith("300 rows and 1 slot(s) at 4 steps") and \
            "on this rank" not in got["compared"], got["compared"]
    for fault in ("none", "doubled"):
        out = tmp_path / fault
        out.mkdir()
        launch(2, script, fault, out, "sharded")
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        for r in ranks:
            assert r["compared"].startswith("300 rows and 1 slot(s) at 4 steps (") and \
                "of them on this rank" in r["compared"], r["compared"]
        owned = [int(re.search(r"\((\d+) of them on this rank\)", r["compared"]).group(1))
                 for r in ranks]
        assert sum(owned) == 300 and min(owned) > 0
        if fault == "none":
            assert all(r["ok"] for r in ranks), ranks[0]["summary"] + ranks[1]["summary"]
        else:
            assert not any(r["ok"] for r in ranks)
            assert all(r["first_step"] == 1 for r in ranks), [r["summary"] for r in ranks]
            assert "rank 1:" in ranks[0]["summary"] and "DIFFERS" in ranks[0]["summary"]


def test_a_warm_start_fills_each_ranks_part_with_the_keys_it_owns(tmp_path):
    """The Estimator's WarmStartSettings start `emb` from a trained dense
    checkpoint: on 2 hooked ranks each rank's part imports the keys it owns,
    and training goes on as the dense model's on one rank; graphmod's own
    warm start alike, sharded and replicated."""
    _, trained = run_estimator(tmp_path, "trained", 1, "dense")
    (dense,), _ = run_estimator(tmp_path, "dense_warm", 1, "dense", warm_from=trained)
    ranks, _ = run_estimator(tmp_path, "hooked_warm", 2, "hooked", warm_from=trained)
    for r in ranks:
        np.testing.assert_allclose(r["losses"], dense["losses"], rtol=1e-5)
        np.testing.assert_allclose(r["logits"], dense["logits"], rtol=1e-5, atol=1e-6)
    owned = [set(r["rows"]) for r in ranks]
    assert not owned[0] & owned[1]
    rows = {**ranks[0]["rows"], **ranks[1]["rows"]}
    assert len(rows) == 20000  # every warm-started row, each on one rank
    for key, (values, accum, *_) in dense["rows"].items():
        np.testing.assert_allclose(rows[key][0], values, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(rows[key][1], accum, rtol=1e-5, atol=1e-7)
    # graphmod's own warm start (GraphModifierHook(warm_start=...), here of
    # `emb` and `w`) into 2 ranks, sharded and replicated, trains as into one.
    (one,), _ = run_estimator(tmp_path, "one_graphmod", 1, "hooked",
                              warm_from=f"graphmod:{trained}")
    assert len(one["rows"]) == 20000
    for placement in ("sharded", "replicated"):
        ranks, _ = run_estimator(tmp_path, f"two_graphmod_{placement}", 2, "hooked",
                                 warm_from=f"graphmod:{trained}",
                                 placements=f"{placement},{placement}")
        for r in ranks:
            np.testing.assert_allclose(r["losses"], one["losses"], rtol=1e-5)
            np.testing.assert_allclose(r["logits"], one["logits"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(r["w"], one["w"], rtol=1e-5, atol=1e-7)
        if placement == "sharded":
            assert not set(ranks[0]["rows"]) & set(ranks[1]["rows"])
        else:
            assert ranks[0]["rows"] == ranks[1]["rows"]
        rows = {**ranks[0]["rows"], **ranks[1]["rows"]}
        assert set(rows) == set(one["rows"])
        for key, (values, accum, *_) in one["rows"].items():
            np.testing.assert_allclose(rows[key][0], values, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(rows[key][1], accum, rtol=1e-5, atol=1e-7)


# A run that reads the model's input without training, where the iterator
# would have handed it a batch: with the ids a step ahead, the run after it
# fails, saying so (never a silently shifted input).
READ_WITHOUT_TRAINING = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    hvd.init()
    ids = np.random.default_rng(hvd.rank()).integers(0, 60, size=(40, 8, 2))

    # LOGITS_OF

    def model_fn(features, labels, mode):
        logits = logits_of(features)
        loss = tf.reduce_mean(logits)
        tf1.add_to_collection("read_only", tf.reduce_sum(features["ids"]))
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3))
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_or_create_global_step()))

    class ReadsAlone(tf1.train.SessionRunHook):
        def after_run(self, run_context, run_values):  # a run of its own, no update
            run_context.session.run(tf1.get_collection("read_only"))

    estimator = tf.estimator.Estimator(model_fn, sys.argv[1])
    try:
        hook = graphmod.GraphModifierHook(ids_ahead=sys.argv[2] == "ahead")
        estimator.train(lambda: tf.data.Dataset.from_tensor_slices({"ids": ids}), steps=5,
                        hooks=[hook, ReadsAlone()])
        print("IDS_AHEAD:", hook.report.ids_ahead, flush=True)
    except tf.errors.InvalidArgumentError as e:
        print("REFUSED:", str(e), flush=True)
        sys.exit(3)
""")


def test_a_run_reading_the_input_without_training_fails_the_next_step(tmp_path):
    """... and trains, as without the hook, with GraphModifierHook(ids_ahead=False)."""
    script = tmp_path / "read_without_training.py"
    script.write_text(with_model(READ_WITHOUT_TRAINING))
    for ahead in ("ahead", "not_ahead"):
        command = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2",
                   "-H", "localhost:2", "--gloo", sys.executable, str(script),
                   str(tmp_path / ahead), ahead]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        out = done.stdout + done.stderr
        if ahead == "ahead":
            assert done.returncode != 0
            assert "a run read the input of the model without training" in out, out[-3000:]
        else:
            assert done.returncode == 0, out[-3000:]
            assert "IDS_AHEAD: {'emb': 'GraphModifierHook(ids_ahead=False)'}" in out, out[-3000:]


def test_hashed_ids_under_horovod_feed_sharded_tables_their_full_keys(tmp_path):
    """`(ids + OFFSET) % 20000` squeezes ids into the variable's rows. Its ids
    also reach Horovod's sparse allreduce (a cond that only feeds the update
    the table replaces), which no longer keeps the buckets: 2 hooked ranks
    key their tables by the full ids, and train as the dense model on one
    rank (whose buckets here never collide)."""
    offset = 10**9 + 7
    hashed = LOGITS_OF.replace('features["ids"]',
                               f'tf.math.floormod(features["ids"] + {offset}, 20000)')
    script = ESTIMATOR_SCRIPT.replace("# LOGITS_OF\n", hashed).replace(
        '["emb"][k]', f'["emb"][(k + {offset}) % 20000]').replace(
        '["accum"][k]', f'["accum"][(k + {offset}) % 20000]')
    results = {}
    for name, ranks, mode in (("dense", 1, "dense"), ("hooked", 2, "hooked")):
        out, model_dir = tmp_path / name, tmp_path / f"{name}_model"
        out.mkdir()
        (tmp_path / f"{name}.py").write_text(script)
        launch(ranks, tmp_path / f"{name}.py", mode, "after", "average", model_dir, out, "-",
               "auto,auto")
        results[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    (dense,), ranks = results["dense"], results["hooked"]
    for r in ranks:
        np.testing.assert_allclose(r["losses"], dense["losses"], rtol=1e-5)
        np.testing.assert_allclose(r["logits"], dense["logits"], rtol=1e-5, atol=1e-6)
    rows = {int(k): v for r in ranks for k, v in r["rows"].items()}
    assert min(rows) >= offset  # full ids, not buckets
    assert {k - offset for k in rows} == {int(k) for k in dense["rows"]}
    for key, (values, accum, *_) in dense["rows"].items():
        np.testing.assert_allclose(rows[int(key) + offset][0], values, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(rows[int(key) + offset][1], accum, rtol=1e-5, atol=1e-7)


def assert_the_command_reads_both_parts(model_dir, dense_dir, rows, tmp_path):
    """`graphmod inspect` counts both ranks' rows; `ckpt convert --to=dense`
    of the sharded checkpoint is the dense model's checkpoint (every row and
    accumulator: the rows start from a constant)."""
    import contextlib
    import io
    import tensorflow as tf
    from graphmod_cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["graphmod", "inspect", str(model_dir)]) == 0
    assert f"emb: dim 4, {rows} rows" in out.getvalue(), out.getvalue()
    converted = str(tmp_path / "converted")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["graphmod", "ckpt", "convert", "--to=dense", str(model_dir),
                     converted]) == 0
    got = tf.train.load_checkpoint(tf.train.latest_checkpoint(converted))
    want = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(dense_dir)))
    assert got.get_tensor("global_step") == want.get_tensor("global_step") == 8
    for name in ("emb", "emb/Adagrad", "w"):
        np.testing.assert_allclose(got.get_tensor(name), want.get_tensor(name), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


# A MonitoredTrainingSession model: Horovod's Sum over gradients made dense
# (sparse_as_dense), clipped by their global norm after the collective (a
# scalar the owners apply too), a
# variable each rank trains on its own (no DistributedOptimizer: it must
# stay dense), and an Estimator-less hook.
SESSION_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    mode, out = sys.argv[1:3]
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    B = 24
    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, 50, size=(B, 2)).astype(np.int64),
                rng.integers(0, 2, size=B).astype(np.float32)) for _ in range(5)]
    ids = tf1.placeholder(tf.int64, [None, 2])
    labels = tf1.placeholder(tf.float32, [None])
    step = tf1.train.get_or_create_global_step()
    emb = tf1.get_variable("emb", [20000, 4], initializer=tf1.constant_initializer(0.1))
    own = tf1.get_variable("own", [20000, 2], initializer=tf1.constant_initializer(0.2))
    w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 12, dtype=np.float32)
                         .reshape(12, 1))
    x = tf.concat([tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 8]),
                   tf.reshape(tf.nn.embedding_lookup(own, ids), [-1, 4])], 1)
    logits = tf.squeeze(tf.matmul(x, w), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3), op=hvd.Sum,
                                   sparse_as_dense=True)  # an allreduce of dense gradients
    grads, variables = zip(*opt.compute_gradients(loss, var_list=[emb, w]))
    grads, norm = tf.clip_by_global_norm(list(grads), 0.05)
    local = tf1.train.GradientDescentOptimizer(0.1)  # each rank its own copy of `own`
    train = tf.group(opt.apply_gradients(zip(grads, variables), global_step=step),
                     local.minimize(loss, var_list=[own]))
    global_loss = hvd.allreduce(loss, op=hvd.Average, name="global_loss")
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    modifier = graphmod.GraphModifierHook() if mode == "hooked" else None

    class Rows(tf1.train.SessionRunHook):
        def begin(self):
            tables = graphmod.tables()
            self.fetch = tables[0].export() if tables else {"emb": emb.read_value()}
    rows = Rows()
    hooks += [modifier, rows] if modifier else [rows]
    losses, norms = [], []
    with tf1.train.MonitoredTrainingSession(hooks=hooks) as sess:
        for xb, yb in batches:
            part = slice(rank * B // size, (rank + 1) * B // size)
            loss_value, norm_value, _ = sess.run([global_loss, norm, train],
                                                 {ids: xb[part], labels: yb[part]})
            losses.append(float(loss_value))
            norms.append(float(norm_value))
        got = sess.run(rows.fetch)
    if "keys" in got:
        got = {int(k): v.tolist() for k, v in zip(got["keys"], got["values"])}
    else:
        got = {int(k): got["emb"][k].tolist() for k in np.unique([b[0] for b in batches])}
    report = dict(skipped=modifier.report.skipped, tables=modifier.report.tables,
                  ranks=modifier.report.sharded_ranks) if modifier else {}
    json.dump(dict(losses=losses, norms=norms, rows=got, report=report),
              open(f"{out}/rank{rank}.json", "w"))
""")


def test_sum_clipping_and_a_variable_each_rank_trains_alone(tmp_path):
    """Horovod's Sum of dense gradients (an allreduce, not the allgathers of
    the Estimator test) and a global-norm clip after it train the table as
    the dense variable; a variable trained without Horovod (each
    rank its own copy) stays dense, and the report says why."""
    def run_mode(mode):
        out = tmp_path / mode
        out.mkdir()
        script = tmp_path / f"{mode}.py"
        script.write_text(SESSION_SCRIPT)
        launch(2, script, mode, out)
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    dense, hooked = run_mode("dense"), run_mode("hooked")
    assert min(dense[0]["norms"]) > 0.05  # the clip scales every step's gradients
    report = hooked[0]["report"]
    assert report["ranks"] == 2
    assert [(t["variable"], t["ranks_combine"]) for t in report["tables"]] == [("emb", "sum")]
    (skipped,) = [s for s in report["skipped"] if s["variable"] == "own"]
    assert "trains its own copy" in skipped["reason"]
    for r in hooked:
        np.testing.assert_allclose(r["losses"], dense[0]["losses"], rtol=1e-5)
    rows = {**hooked[0]["rows"], **hooked[1]["rows"]}
    assert not set(hooked[0]["rows"]) & set(hooked[1]["rows"])
    assert set(rows) == set(dense[0]["rows"])
    for key, values in dense[0]["rows"].items():
        np.testing.assert_allclose(rows[key], values, rtol=1e-5, atol=1e-7)


REFUSED_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    case, model_dir, out = sys.argv[1:4]
    hvd.init()

    def model_fn(features, labels, mode):
        emb = tf1.get_variable("emb", [20000, 4])
        loss = tf.reduce_mean(tf.nn.embedding_lookup(emb, features["ids"]) ** 2)
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf1.train.get_or_create_global_step()))

    mine = model_dir if hvd.rank() == 0 else None  # Horovod's examples: rank 0's alone
    data = lambda: tf.data.Dataset.from_tensor_slices({"ids": np.arange(8)[:, None]}).batch(2)
    # Deltas on rank 0 alone: rank 1 could not write its part of them.
    deltas = dict(incremental_every_steps=2) if case == "deltas" and hvd.rank() == 0 else {}
    hooks = [hvd.BroadcastGlobalVariablesHook(0), graphmod.GraphModifierHook(**deltas)]
    try:
        if case == "session":
            tf1.disable_eager_execution()
            ids = tf1.placeholder(tf.int64, [None, 1])
            spec = model_fn({"ids": ids}, None, "train")
            with tf1.train.MonitoredTrainingSession(checkpoint_dir=mine, hooks=hooks,
                                                    save_checkpoint_steps=2) as sess:
                sess.run(spec.train_op, {ids: [[1], [2]]})
        else:
            config = tf.estimator.RunConfig(model_dir=mine, save_checkpoints_steps=2)
            estimator = tf.estimator.Estimator(model_fn, config=config)
            estimator.train(lambda: data().map(lambda f: (f, 0.0)), steps=2, hooks=hooks)
        message = "trained"
    except Exception as e:  # pylint: disable=broad-except
        message = str(e)
    open(f"{out}/rank{hvd.rank()}.txt", "w").write(message)
""")


@pytest.mark.parametrize("case, expected", [
    ("deltas", "ranks [1] write deltas at other settings than rank 0 "
               "(rank 0: incremental_every_steps=2, incremental_every_secs=None)"),
    # MonitoredTrainingSession without a checkpoint_dir on rank 1 has no
    # saver hook there to write rank 1's part of rank 0's checkpoints.
    ("session", "ranks [1] save checkpoints where rank 0 does not, or the reverse")])
def test_save_settings_sharded_tables_cannot_use_are_refused_before_training(tmp_path, case, expected):
    """Ranks that cannot follow rank 0's saves (the model_dirs and save
    times of Horovod's examples can: tests/test_horovod_layouts.py)."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "refused.py"
    script.write_text(REFUSED_SCRIPT)
    launch(2, script, case, tmp_path / "model", out)
    for r in range(2):
        assert expected in (out / f"rank{r}.txt").read_text()
    assert not any(".tables" in n for n in os.listdir(tmp_path / "model"))  # nothing saved


# A rank dies in the middle of training: the other fails (Horovod sees the
# closed connection and shuts down) instead of waiting forever, and a
# restart from the last complete checkpoint trains on exactly as a run that
# never failed.
FAILURE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf1 = tf.compat.v1
    phase, every, model_dir, out, placement = sys.argv[1:6]
    every = int(every) or None  # steps between deltas
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    B, STEPS = 16, 8
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 80, size=(STEPS, B, 2)).astype(np.int64)
    labels = rng.integers(0, 2, size=(STEPS, B)).astype(np.float32)
    part = slice(rank * B // size, (rank + 1) * B // size)
    latest = tf.train.latest_checkpoint(model_dir)
    start = int(latest.rsplit("-", 1)[1]) if latest else 0
    chain = graphmod.checkpoint.deltas.read_manifest(latest) if latest else []
    start = chain[-1]["step"] if chain else start  # the restore applies the deltas too

    class Steps(tf1.train.SessionRunHook):
        losses = []
        def begin(self):
            self.loss = tf1.get_collection("global_loss")[0]
            self.step = tf1.train.get_global_step()
        def before_run(self, run_context):
            return tf1.train.SessionRunArgs([self.loss, self.step])
        def after_run(self, run_context, run_values):
            loss, step = run_values.results
            self.losses.append(float(loss))
            if phase == "crash" and rank == 1 and step + 1 == 5:
                os._exit(3)  # dies after step 5, between saves (every 2 steps)

    class Rows(tf1.train.SessionRunHook):
        def begin(self):
            self.fetch = graphmod.tables()[0].export()
        def end(self, session):
            got = session.run(self.fetch)
            self.rows = {int(k): v.tolist() for k, v in zip(got["keys"], got["values"])}
    # LOGITS_OF

    def model_fn(features, labels, mode):
        logits = logits_of(features)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        tf1.add_to_collection("global_loss", hvd.allreduce(loss, op=hvd.Average, name="loss"))
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.3))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf1.train.get_or_create_global_step()))

    estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=2))
    data = lambda: tf.data.Dataset.from_tensor_slices(({"ids": ids[:, part]},
                                                       labels[:, part])).skip(start)
    rows = Rows()
    estimator.train(data, max_steps=STEPS, hooks=[
        hvd.BroadcastGlobalVariablesHook(0),
        graphmod.GraphModifierHook(incremental_every_steps=every,
                                   tables={"emb": {"placement": placement}}), Steps(), rows])
    json.dump(dict(start=start, losses=Steps.losses, rows=rows.rows),
              open(f"{out}/rank{rank}.json", "w"))
""")


@pytest.mark.parametrize("every, resume_ranks, placement", [
    (0, 2, "sharded"), (1, 1, "sharded"), (1, 2, "replicated")])
def test_a_dead_rank_fails_the_others_and_a_restart_loses_nothing(tmp_path, every,
                                                                   resume_ranks, placement):
    """Full checkpoints every 2 steps; rank 1 dies after step 5. Without
    deltas the restart on 2 ranks resumes at the full checkpoint of step 4;
    with a delta every step (each rank writing its keys' changes) it resumes
    at step 5, on 1 rank (the parts of 2 ranks read by one), and, the table
    replicated (each rank writing the keys it owns of its copy), on 2 ranks
    that each read every part."""
    script = tmp_path / "failure.py"
    script.write_text(with_model(FAILURE_SCRIPT))
    runs = {}
    for name in ("whole", "crash", "resume"):
        model = tmp_path / ("whole" if name == "whole" else "model")
        (tmp_path / name).mkdir()
        if name == "crash":
            horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
            done = subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
                                   sys.executable, str(script), name, str(every), model,
                                   tmp_path / name, placement],
                                  capture_output=True, text=True, timeout=300)
            # Fails, within the timeout, naming the rank that died.
            assert done.returncode != 0
            assert "Process 1 exit with status code 3" in done.stdout + done.stderr
            continue
        ranks = resume_ranks if name == "resume" else 2
        launch(ranks, script, name, every, model, tmp_path / name, placement)
        runs[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text())
                      for r in range(ranks)]
    whole, resume = runs["whole"], runs["resume"]
    start = 5 if every else 4  # what the last complete save before the death holds
    assert all(r["start"] == start for r in resume)
    for r in resume:
        np.testing.assert_allclose(r["losses"], whole[0]["losses"][start:], rtol=1e-5)
    rows = {k: v for r in resume for k, v in r["rows"].items()}
    expected = {k: v for w in whole for k, v in w["rows"].items()}
    if placement == "replicated":  # each rank's copy holds every key, the same
        assert all(r["rows"] == resume[0]["rows"] for r in resume + whole)
    assert set(rows) == set(expected)
    for key, values in expected.items():
        np.testing.assert_allclose(rows[key], values, rtol=1e-5, atol=1e-7)
