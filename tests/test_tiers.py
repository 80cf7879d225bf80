"""A disk tier under an unchanged Estimator: the hooked model with its table's
memory budget at a quarter of its rows trains as the same hooked model all in
memory (losses, and every row, slot, count and version of its checkpoints and
deltas, bit for bit), and as the unmodified model (losses and rows, to float
rounding). Evaluation restores the checkpoint into a tiered table and reads
cold rows where they are; a resume from the checkpoint and its deltas goes on
as the all-in-memory resume does. Rows really go to disk: the tier's segment
files grow while training, and the files are gone when training ends. The
model is examples/tier_train.py. Its saves and restores stream the table in
chunks."""
import json
import os
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod_cli import main

tf1 = tf.compat.v1
pytestmark = pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from tier_train import TABLE, estimator, hook, input_fn  # noqa: E402


class LossLog(tf1.train.SessionRunHook):
    """Each step's loss, in order."""

    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(tf1.get_collection(tf1.GraphKeys.LOSSES)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(run_values.results)


class SegmentBytes(tf1.train.SessionRunHook):
    """The largest total size of the tier's segment files seen after a step."""

    def __init__(self, path):
        self.path, self.most = path, 0

    def after_run(self, run_context, run_values):
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(self.path)
                    for f in files if f.startswith("seg-"))
        self.most = max(self.most, total)


def train(model_dir, steps, start, hooks):
    losses = LossLog()
    estimator(model_dir).train(input_fn(start), steps=steps, hooks=hooks + [losses])
    return np.array(losses.losses)


def checkpoint_state(model_dir, state=None):
    """Every table entry and variable of the latest checkpoint (or `state`)
    with its deltas merged in, rows sorted by key."""
    from graphmod.checkpoint import merged
    path = merged.write(state or merged.latest(model_dir),
                        os.path.join(tempfile.mkdtemp(dir=os.path.dirname(model_dir)),
                                     "model.ckpt"))[0]
    reader = tf.train.load_checkpoint(path)
    out = {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(path)}
    order = np.argsort(out[f"{TABLE}-keys"])
    for field in ("keys", "values", "slots", "counts", "last_seen", "versions"):
        out[f"{TABLE}-{field}"] = out[f"{TABLE}-{field}"][order]
    return out


def assert_same_state(a, b):
    """Equal checkpoints, bit for bit; last_seen is each run's wall clock."""
    assert a.keys() == b.keys()
    for name in a:
        if not name.endswith("last_seen"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_table_four_times_its_budget_trains_as_all_in_memory(tmp_path, capsys, monkeypatch):
    # Saves stream a table in chunks and restores read it a stored slice at a
    # time; chunks of 50 rows make several per shard, across both tiers.
    monkeypatch.setenv("GRAPHMOD_TEST_SAVE_CHUNK_ROWS", "50")
    storage = str(tmp_path / "tier")
    memory_dir, disk_dir, dense_dir = (str(tmp_path / n) for n in ("memory", "disk", "dense"))
    segments = SegmentBytes(storage)
    memory = train(memory_dir, 40, 0, [hook()])
    disk = train(disk_dir, 40, 0, [hook(storage), segments])
    dense = train(dense_dir, 40, 0, [])
    assert len(disk) == 40 and len(set(disk.tolist())) > 1
    np.testing.assert_array_equal(disk, memory)
    np.testing.assert_allclose(disk, dense, rtol=1e-5)
    # Rows went to disk (a quarter of them fit in memory) and the files went afterwards.
    assert segments.most > 1000, segments.most
    assert not [f for _, _, files in os.walk(storage) for f in files]

    a, b = checkpoint_state(memory_dir), checkpoint_state(disk_dir)
    assert len(a[f"{TABLE}-keys"]) > 200
    assert_same_state(a, b)
    # Merging (`graphmod ckpt compact`, exports) streams a table larger than
    # its stand-in's budget through a disk tier: the same state, bit for bit.
    from graphmod.checkpoint import merged
    from graphmod.checkpoint.saver import TableSaver
    from graphmod.embeddings import table as table_module
    budget, create, save, stand_ins, on_disk = (merged.STAND_IN_BUDGET, table_module.create_table,
                                                TableSaver.save, [], [])

    def create_table(*args, **kwargs):
        stand_ins.append(create(*args, **kwargs))
        return stand_ins[-1]

    def saved(self, sess, *args, **kwargs):  # the stand-in's rows on disk as it saves
        on_disk.extend(sess.run([t.tier_info()["disk_rows"] for t in stand_ins]))
        return save(self, sess, *args, **kwargs)
    monkeypatch.setattr(table_module, "create_table", create_table)
    monkeypatch.setattr(TableSaver, "save", saved)
    monkeypatch.setattr(merged, "STAND_IN_BUDGET", 4096)  # a row or so a shard
    tiered = checkpoint_state(disk_dir)
    monkeypatch.setattr(merged, "STAND_IN_BUDGET", budget)
    monkeypatch.setattr(table_module, "create_table", create)
    monkeypatch.setattr(TableSaver, "save", save)
    assert [t.memory_budget for t in stand_ins] == [4096]
    assert on_disk[0] > 0.9 * len(b[f"{TABLE}-keys"]), on_disk
    assert not list(tmp_path.rglob(".graphmod-merge"))  # removed with its tables' files
    np.testing.assert_array_equal(tiered[f"{TABLE}-last_seen"], b[f"{TABLE}-last_seen"])
    assert_same_state(tiered, b)
    dense_rows = tf.train.load_checkpoint(dense_dir).get_tensor(TABLE)
    np.testing.assert_allclose(b[f"{TABLE}-values"], dense_rows[b[f"{TABLE}-keys"]],
                               rtol=1e-4, atol=1e-6)

    # The tiers' counters, as TensorBoard scalars, shown by `graphmod inspect`.
    assert main(["graphmod", "inspect", "--format", "json", disk_dir]) == 0
    c = json.loads(capsys.readouterr().out)["tables"][0]["counters"]
    rows = c["disk_rows"] + c["memory_rows"]  # as of the last summary, a step before the end
    assert c["step"] >= 39 and 0.9 * len(b[f"{TABLE}-keys"]) <= rows <= len(b[f"{TABLE}-keys"])
    # A quarter of the rows is the budget; rows of the last 16 steps stay in memory too.
    assert c["disk_rows"] >= 0.3 * rows, c
    # The input pipeline prefetched each step's cold rows while the step
    # before trained, so the steps themselves read (almost) nothing from disk.
    assert c["prefetched"] > 0 and c["promoted"] < c["prefetched"], c
    assert c["disk_reads"] >= c["promoted"] + c["prefetched"], c
    report = json.load(open(os.path.join(disk_dir, "graphmod", "rewrite_report_train.json")))
    assert report["prefetch"] == {TABLE: ""}
    assert c["disk_file_bytes"] > 0
    assert main(["graphmod", "inspect", disk_dir]) == 0
    assert "on disk" in capsys.readouterr().out

    # Evaluation restores into a tiered table; a resume goes on from the
    # checkpoint and its deltas as the all-in-memory one does.
    metrics = [estimator(d).evaluate(input_fn(99), steps=5, hooks=[h])
               for d, h in ((memory_dir, hook()), (disk_dir, hook(storage)))]
    assert metrics[0] == metrics[1]
    resumed = [train(memory_dir, 20, 7, [hook()]), train(disk_dir, 20, 7, [hook(storage)])]
    np.testing.assert_array_equal(resumed[0], resumed[1])
    assert_same_state(checkpoint_state(memory_dir), checkpoint_state(disk_dir))

    # A warm start from a checkpoint and its deltas streams too: a new
    # model's tiered table imports them a stored slice (50 rows) at a time,
    # spilling as it goes, and starts with the merged rows the filter keeps.
    from graphmod.checkpoint import deltas, merged
    source = next(p for p in reversed(tf.train.get_checkpoint_state(
        disk_dir).all_model_checkpoint_paths) if deltas.committed(p))
    want = checkpoint_state(disk_dir, merged.State(source, deltas.committed(source), 0))
    assert sum(tf.train.load_checkpoint(d).get_tensor(f"{TABLE}-keys").size
               for d in deltas.committed(source)) > 0  # rows the deltas change
    from graphmod._ops import ops
    with tf.Graph().as_default(), tf1.Session() as sess:  # several slices to read
        starts, _ = sess.run(ops.graphmod_checkpoint_row_slices(source, f"{TABLE}-values"))
    assert len(starts) > 2, starts
    started = Started()
    warm = graphmod.GraphModifierHook(
        min_rows=100, tables={TABLE: graphmod.TableSettings(memory_budget=0.25,
                                                            storage_path=storage)},
        warm_start=graphmod.WarmStartSettings([source],
                                              key_filter=lambda table, keys: keys % 3 != 0))
    estimator(str(tmp_path / "warm")).train(input_fn(5), steps=1, hooks=[warm, started])
    assert warm.report.warm_started[0] == TABLE
    keys, order = started.rows["keys"], np.argsort(started.rows["keys"])
    kept = want[f"{TABLE}-keys"] % 3 != 0
    np.testing.assert_array_equal(keys[order], want[f"{TABLE}-keys"][kept])
    np.testing.assert_array_equal(started.rows["values"][order], want[f"{TABLE}-values"][kept])
    np.testing.assert_array_equal(started.rows["counts"][order], want[f"{TABLE}-counts"][kept])
    assert started.tiers["disk_rows"] > 0, started.tiers


def test_a_bad_tier_setting_is_named():
    with pytest.raises(ValueError, match="memory_budget and storage_path go together"):
        graphmod.TableSettings(memory_budget=0.5)
    with pytest.raises(ValueError, match="memory_budget must be"):
        graphmod.TableSettings(memory_budget=1.5, storage_path="/tmp/x")
    with pytest.raises(ValueError, match="max_rows and a memory_budget"):
        graphmod.TableSettings(memory_budget=0.5, storage_path="/tmp/x", max_rows=1000)


def _item_model(embed):
    """examples/tier_train.py's model over the rows embed(features) reads."""
    def model_fn(features, labels, mode):
        emb = embed(features)
        logits = tf.squeeze(tf1.layers.dense(emb, 1), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        train_op = tf1.train.AdagradOptimizer(0.3).minimize(
            loss, global_step=tf1.train.get_or_create_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


@pytest.mark.parametrize("case", ["tensors", "vocabulary", "component", "off"])
def test_the_input_pipeline_prefetches_keys_it_can_compute_and_reports_the_rest(tmp_path, case):
    """No prefetch where the next keys cannot be computed from a tf.data
    element: input_fn returns tensors (no iterator), or the keys need a
    vocabulary table's lookup (state); the report says why. Keys that are an
    element's component itself (int64 ids gathered as they come) are
    prefetched, unless TableSettings(prefetch=False). Training runs in every
    case."""
    ids = np.arange(256) % 40
    labels = (ids % 3 == 0).astype(np.float32)
    table = TABLE
    if case == "tensors":
        def input_fn():
            return {"item": tf.constant(ids)}, tf.constant(labels)
        column = lambda: tf.feature_column.embedding_column(  # noqa: E731
            tf.feature_column.categorical_column_with_identity("item", 40), 4)
    else:
        def input_fn():
            items = ids.astype(str) if case == "vocabulary" else ids
            return tf.data.Dataset.from_tensor_slices(({"item": items}, labels)).repeat().batch(32)
        column = lambda: tf.feature_column.embedding_column(  # noqa: E731
            tf.feature_column.categorical_column_with_vocabulary_list(
                "item", [str(i) for i in range(40)]), 4)
    if case in ("component", "off"):
        table = "item_emb"
        model_fn = _item_model(lambda features: tf.nn.embedding_lookup(
            tf1.get_variable("item_emb", [40, 4]), features["item"]))
    else:
        model_fn = _item_model(lambda features: tf1.feature_column.input_layer(
            features, [column()]))
    model_dir = str(tmp_path / "model")
    settings = graphmod.TableSettings(memory_budget=0.25, storage_path=str(tmp_path / "tier"),
                                      prefetch=case != "off")
    tf.estimator.Estimator(model_fn, model_dir).train(
        input_fn, steps=3,
        hooks=[graphmod.GraphModifierHook(min_rows=10, tables={table: settings})])
    report = json.load(open(os.path.join(model_dir, "graphmod", "rewrite_report_train.json")))
    assert [t["table"] for t in report["tables"]] == [table]
    why_not = report["prefetch"][table]
    expected = dict(tensors="do not come from one tf.data iterator",
                    vocabulary="LookupTableFindV2", off="TableSettings(prefetch=False)")
    assert why_not == "" if case == "component" else expected[case] in why_not, why_not


class Started(tf1.train.SessionRunHook):
    """The table's rows and tier counters right after the session started."""

    def begin(self):
        table = graphmod.tables()[0]
        self.fetches = (table.export(), table.tier_info())

    def after_create_session(self, session, coord):
        self.rows, self.tiers = session.run(self.fetches)
