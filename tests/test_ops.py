"""Tests of the native table ops through their Python API.

Run against the pip-built library and, with GRAPHMOD_OPS_LIBRARY pointing at
bazel-bin/native/_graphmod_ops.so, against the Bazel-built one (make test).
"""
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import graphmod
import graphmod.checkpoint.saver
from graphmod._ops import library_path, ops

tf1 = tf.compat.v1

I64_MIN, I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
DIM = 3


def test_library_under_test_is_the_requested_one():
    want = os.environ.get("GRAPHMOD_OPS_LIBRARY")
    if want:
        assert os.path.samefile(library_path, want)
    else:
        assert library_path.endswith(os.path.join("graphmod", "_graphmod_ops.so"))


# ------------------------------------------------------------------ model-based


class Harness:
    """One graph with placeholders for every table op, run in one session."""

    def __init__(self, num_shards: int, layout: str):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.opt = graphmod.optimizers.Adagrad(0.5, initial_accumulator_value=0.25)
            self.table = graphmod.create_table(
                "model", DIM, optimizer=self.opt, num_shards=num_shards, layout=layout,
                initializer=tf1.random_uniform_initializer(-1.0, 1.0))
            # A never-mutated twin with the same seed gives the expected initial rows.
            self.twin = graphmod.create_table(
                "twin", DIM, num_shards=1, seed=self.table_seed(),
                initializer=tf1.random_uniform_initializer(-1.0, 1.0))
            self.keys = tf1.placeholder(tf.int64, [None])
            self.grads = tf1.placeholder(tf.float32, [None, DIM])
            self.values = tf1.placeholder(tf.float32, [None, DIM])
            self.slots = tf1.placeholder(tf.float32, [None, 1, DIM])
            self.counts = tf1.placeholder(tf.int64, [None])
            self.lookup = graphmod.sparse_lookup(self.table, self.keys, is_training=True)
            self.find = graphmod.sparse_lookup(self.table, self.keys, is_training=False)
            self.initial = graphmod.sparse_lookup(self.twin, self.keys, is_training=False)
            self.apply = self.opt.apply(self.table, self.keys, self.grads)
            self.remove = self.table.remove(self.keys)
            self.imp = self.table.import_rows(self.keys, self.values, self.slots, self.counts)
            self.export = self.table.export()
            self.clear = self.table.clear()
        self.sess = tf1.Session(graph=self.graph)

    def table_seed(self):
        import zlib
        return zlib.crc32(b"model")


_HARNESSES = {}


def harness(num_shards, layout):
    if (num_shards, layout) not in _HARNESSES:
        _HARNESSES[num_shards, layout] = Harness(num_shards, layout)
    return _HARNESSES[num_shards, layout]


keys_st = st.lists(st.one_of(st.integers(-6, 6), st.sampled_from([I64_MIN, I64_MAX])),
                   min_size=0, max_size=12)
op_st = st.one_of(
    st.tuples(st.just("lookup"), keys_st),
    st.tuples(st.just("find"), keys_st),
    st.tuples(st.just("apply"), keys_st),
    st.tuples(st.just("remove"), keys_st),
    st.tuples(st.just("import"), keys_st),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op_st, max_size=12), num_shards=st.sampled_from([1, 4]),
       seed=st.integers(0, 2**16))
@pytest.mark.parametrize("layout", ["arena", "buckets"])
def test_table_matches_reference_model(layout, ops, num_shards, seed):
    h = harness(num_shards, layout)
    rng = np.random.default_rng(seed)
    run = h.sess.run
    run(h.clear)
    ref = {}  # key -> [row, accumulator, count]

    def initial(keys):
        return run(h.initial, {h.keys: keys})

    for kind, keys in ops:
        keys = np.array(keys, np.int64)
        if kind == "lookup":
            got = run(h.lookup, {h.keys: keys})
            init = initial(keys)
            for i, k in enumerate(keys):
                if k not in ref:
                    ref[k] = [init[i].copy(), np.full(DIM, 0.25, np.float32), 0]
                ref[k][2] += 1
                np.testing.assert_allclose(got[i], ref[k][0], rtol=1e-5, atol=1e-6)
        elif kind == "find":
            got = run(h.find, {h.keys: keys})
            init = initial(keys)
            for i, k in enumerate(keys):
                np.testing.assert_allclose(got[i], ref[k][0] if k in ref else init[i], rtol=1e-5, atol=1e-6)
        elif kind == "apply":
            grads = rng.normal(size=(len(keys), DIM)).astype(np.float32)
            run(h.apply, {h.keys: keys, h.grads: grads})
            total = {}
            for k, g in zip(keys, grads):
                total[k] = total.get(k, 0) + g.astype(np.float64)
            for k, g in total.items():
                if k in ref:  # gradients of keys without a row are dropped
                    row, acc, _ = ref[k]
                    acc += (g * g).astype(np.float32)
                    row -= (0.5 * g / np.sqrt(acc)).astype(np.float32)
        elif kind == "remove":
            removed = run(h.remove, {h.keys: keys})
            assert removed == len({k for k in keys if k in ref})
            for k in set(keys.tolist()):
                ref.pop(k, None)
        elif kind == "import":
            keys = np.unique(keys)
            values = rng.normal(size=(len(keys), DIM)).astype(np.float32)
            slots = rng.uniform(0.1, 1, size=(len(keys), 1, DIM)).astype(np.float32)
            counts = rng.integers(0, 100, len(keys))
            run(h.imp, {h.keys: keys, h.values: values, h.slots: slots, h.counts: counts})
            for k, v, s, c in zip(keys, values, slots, counts):
                ref[k] = [v.copy(), s[0].copy(), int(c)]
        # After every operation the export equals the reference, row for row.
        exp = run(h.export)
        assert sorted(exp["keys"].tolist()) == sorted(ref)
        for i, k in enumerate(exp["keys"]):
            row, acc, count = ref[k]
            np.testing.assert_allclose(exp["values"][i], row, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(exp["slots"][i, 0], acc, rtol=1e-5, atol=1e-6)
            assert exp["counts"][i] == count


# ------------------------------------------------------------------ concurrency


@pytest.mark.parametrize("layout", ["arena", "buckets"])
def test_concurrent_lookups_and_applies_lose_no_row(layout):
    with tf.Graph().as_default() as g:
        opt = graphmod.optimizers.Adagrad(0.01)
        table = graphmod.create_table("stress", 8, optimizer=opt, layout=layout)
        keys = tf1.placeholder(tf.int64, [None])
        rows = graphmod.sparse_lookup(table, keys, is_training=True)
        step = opt.minimize(tf.reduce_sum(rows * rows))
        size = table.size()
    config = tf1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=2)
    errors = []
    with tf1.Session(graph=g, config=config) as sess:
        def worker(w):
            rng = np.random.default_rng(w)
            try:
                for _ in range(60):
                    sess.run(step, {keys: rng.integers(w * 5000, w * 5000 + 20000, 2048)})
            except Exception as e:  # surfaced below
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        expected = set()
        for w in range(4):
            rng = np.random.default_rng(w)
            for _ in range(60):
                expected.update(rng.integers(w * 5000, w * 5000 + 20000, 2048).tolist())
        exported = sess.run(table.export())
        assert sess.run(size) == len(expected)
        assert set(exported["keys"].tolist()) == expected
        assert np.all(np.isfinite(exported["values"]))


# ------------------------------------------------------------------ checkpoints


def test_saver_round_trip_keeps_rows_slots_and_metadata():
    ckpt = os.path.join(tempfile.mkdtemp(), "model")
    with tf.Graph().as_default():
        opt = graphmod.optimizers.Ftrl(0.1, l1=0.01)
        table = graphmod.create_table("user", 4, optimizer=opt)
        ids = tf.constant([5, I64_MIN, I64_MAX, -7, 5], tf.int64)
        rows = graphmod.sparse_lookup(table, ids, is_training=True)
        train = opt.minimize(tf.reduce_sum(tf.sin(rows)))
        export = table.export()
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            for _ in range(3):
                sess.run(train)
            before = sess.run(export)
            saver.save(sess, ckpt)
    names = dict(tf.train.list_variables(ckpt))
    assert names["user-keys"] == [4] and names["user-slots"] == [4, 2, 4]
    with tf.Graph().as_default():
        table = graphmod.create_table("user", 4, optimizer=graphmod.optimizers.Ftrl(0.1, l1=0.01))
        export = table.export()
        with tf1.Session() as sess:
            tf1.train.Saver().restore(sess, ckpt)
            after = sess.run(export)
    order_b, order_a = np.argsort(before["keys"]), np.argsort(after["keys"])
    for field in before:
        np.testing.assert_array_equal(before[field][order_b], after[field][order_a], err_msg=field)
    assert before["counts"][order_b].tolist() == [3, 3, 6, 3]  # (min, -7, 5, max)


def test_restore_into_wrong_dim_names_the_table_and_fails():
    ckpt = os.path.join(tempfile.mkdtemp(), "model")
    with tf.Graph().as_default():
        table = graphmod.create_table("item", 4)
        rows = graphmod.sparse_lookup(table, tf.constant([1, 2], tf.int64))
        with tf1.Session() as sess:
            sess.run(rows)
            tf1.train.Saver().save(sess, ckpt)
    with tf.Graph().as_default():
        graphmod.create_table("item", 6)
        with tf1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="item"):
                tf1.train.Saver().restore(sess, ckpt)


def test_a_checkpoint_format_this_version_cannot_read_is_refused_naming_the_table():
    """Every table saves its format number; a newer one fails the restore with
    a message naming the table and both numbers, and leaves the table as it was."""
    ckpt = os.path.join(tempfile.mkdtemp(), "model")
    with tf.Graph().as_default():
        table = graphmod.create_table("item", 4)
        rows = graphmod.sparse_lookup(table, tf.constant([1, 2], tf.int64), is_training=True)
        with tf1.Session() as sess:
            sess.run(rows)
            tf1.train.Saver().save(sess, ckpt)
    reader = tf.train.load_checkpoint(ckpt)
    assert reader.get_tensor("item-format") == graphmod.embeddings.table.CHECKPOINT_FORMAT == 1
    newer = os.path.join(tempfile.mkdtemp(), "newer")
    names = sorted(reader.get_variable_to_shape_map())
    values = [np.int64(2) if n == "item-format" else reader.get_tensor(n) for n in names]
    with tf.Graph().as_default(), tf1.Session() as sess:
        sess.run(tf.raw_ops.SaveV2(prefix=newer, tensor_names=names,
                                   shape_and_slices=[""] * len(names), tensors=values))
    with tf.Graph().as_default():
        table = graphmod.create_table("item", 4)
        rows = graphmod.sparse_lookup(table, tf.constant([7], tf.int64), is_training=True)
        size = table.size()
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(rows)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"(?s)table .{1,2}item.{1,2} is saved in checkpoint format.*2.*"
                                     r"reads format 1"):
                saver.restore(sess, newer)
            assert sess.run(size) == 1  # the row of key 7, not the checkpoint's
            saver.restore(sess, ckpt)
            assert sess.run(size) == 2


def test_a_failed_table_save_leaves_no_files(tmp_path):
    """A table save that fails midway (here at a disk tier whose segment
    files were damaged, after another table's rows went out) removes the
    bundle it was writing (its temporary file) and leaves the bundle an
    earlier save wrote at the same prefix as it was."""
    with tf.Graph().as_default():
        opt = graphmod.optimizers.SGD(0.1)
        good = graphmod.create_table("good", 4, optimizer=opt)
        cold = graphmod.create_table("cold", 4, optimizer=opt, memory_budget=0.25,
                                     storage_path=str(tmp_path / "tier"))
        ids = tf1.placeholder(tf.int64, [None])
        # (Rows move to disk once 16 steps have not used them.)
        lookups = opt.minimize(tf.add_n([tf.reduce_sum(graphmod.sparse_lookup(t, ids))
                                         for t in (good, cold)]))
        prefix = str(tmp_path / "save" / "part")
        save = ops.graphmod_table_save([good.handle, cold.handle], prefix, [0, 0],
                                       checkpoint_format=1, with_removed=False)
        with tf1.Session() as sess:
            for step in range(24):
                sess.run(lookups, {ids: np.arange(step * 1000, (step + 1) * 1000)})
            assert sess.run(cold.tier_info())["disk_rows"] > 1000
            sess.run(save)  # a good bundle at the prefix first
            written = {f.name: f.read_bytes() for f in (tmp_path / "save").iterdir()}
            assert sorted(written) == ["part.data-00000-of-00001", "part.index"]
            segments = list((tmp_path / "tier").rglob("*.log"))
            assert segments
            for segment in segments:
                os.truncate(segment, 16)
            with pytest.raises(tf.errors.InternalError, match="table 'cold': disk tier"):
                sess.run(save)
    # The failed save removed its temporary file and left the earlier bundle.
    assert {f.name: f.read_bytes() for f in (tmp_path / "save").iterdir()} == written
    assert tf.train.load_checkpoint(prefix).get_tensor("good-keys").size == 24000


def test_a_save_of_a_copy_every_rank_holds_writes_the_keys_its_rank_owns(tmp_path,
                                                                        monkeypatch):
    """owned_only (a table replicated on every Horovod rank): the rows,
    pending ids and removed keys of keys that owner_rank of owner_size owns,
    in chunks gathered whole; the other tables' entries are written whole."""
    monkeypatch.setenv("GRAPHMOD_TEST_SAVE_CHUNK_ROWS", "7")
    with tf.Graph().as_default():
        ids = tf1.placeholder(tf.int64, [None])
        opt = graphmod.optimizers.Adagrad(0.1)
        graphmod.use_feature_specs({"copy": ids}, [graphmod.FeatureSpec(
            "copy", access_threshold=2)])
        copy = graphmod.create_table("copy", 3, optimizer=opt, num_shards=4)
        whole = graphmod.create_table("whole", 2, optimizer=opt)
        empty = graphmod.create_table("empty", 2)  # no rows, no slots
        train = opt.minimize(tf.reduce_sum(tf.sin(graphmod.sparse_lookup(copy, ids))) +
                             tf.reduce_sum(graphmod.sparse_lookup(whole, ids)))
        track = ops.graphmod_table_track_removals(copy.handle)
        removed = tf1.placeholder(tf.int64, [None])
        remove = copy.remove(removed)
        prefix = tf1.placeholder(tf.string, [])
        full, delta = (ops.graphmod_table_save([copy.handle, whole.handle, empty.handle],
                                               prefix, [0, 0, 0], checkpoint_format=1,
                                               with_removed=d, owned_only=[True, False, True],
                                               owner_rank=1, owner_size=3)
                       for d in (False, True))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            twice = np.arange(-40, 60, dtype=np.int64)  # admitted: rows
            sess.run(train, {ids: np.concatenate([twice, twice, [1000, 1001, 1002, 1003]])})
            exported, pending = sess.run([copy.export(), copy.export_pending()])
            sess.run(track)
            sess.run(remove, {removed: np.arange(-40, -20)})
            sess.run(full, {prefix: str(tmp_path / "full")})
            sess.run(delta, {prefix: str(tmp_path / "delta")})
    mine = lambda keys: np.asarray(keys)[graphmod.embeddings.partition.owner_of_numpy(keys, 3)
                                         == 1]
    saved = tf.train.load_checkpoint(str(tmp_path / "full"))
    keys = saved.get_tensor("copy-keys")
    kept = np.isin(exported["keys"], np.arange(-20, 60))
    assert 10 < len(keys) < 70 and sorted(keys) == sorted(mine(exported["keys"][kept]))
    order = {k: i for i, k in enumerate(exported["keys"])}
    np.testing.assert_array_equal(saved.get_tensor("copy-values"),
                                  exported["values"][[order[k] for k in keys]])
    for field in ("slots", "counts", "last_seen", "versions"):
        np.testing.assert_array_equal(saved.get_tensor(f"copy-{field}"),
                                      exported[field][[order[k] for k in keys]], err_msg=field)
    assert sorted(saved.get_tensor("copy-pending_keys")) == sorted(mine(pending["keys"]))
    assert len(saved.get_tensor("whole-keys")) == 104  # written whole
    assert saved.get_tensor("empty-keys").shape == (0,)
    assert saved.get_tensor("empty-slots").shape == (0, 0, 2)
    gone = tf.train.load_checkpoint(str(tmp_path / "delta")).get_tensor("copy-removed_keys")
    assert len(gone) and sorted(gone) == sorted(mine(np.arange(-40, -20)))


@pytest.mark.parametrize("kind", ["exact_admission", "sketch_admission", "empty"])
def test_the_table_saver_writes_shard_by_shard_what_a_plain_saver_writes(tmp_path, kind,
                                                                        monkeypatch):
    """graphmod's TableSaver writes each table with GraphmodTableSave in
    chunks (here of 7 rows, so a table takes many), as
    a part of the checkpoint: the entries (names, types, shapes, contents)
    are those a plain Saver's SaveV2 writes, and restore (GraphmodTableRestore,
    a stored slice at a time)."""
    monkeypatch.setenv("GRAPHMOD_TEST_SAVE_CHUNK_ROWS", "7")
    def build():
        ids = tf1.placeholder(tf.int64, [None])
        opt = graphmod.optimizers.Adagrad(0.1)
        sketch = dict(admission_sketch_width=4096) if kind == "sketch_admission" else {}
        if kind != "empty":
            graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec(
                "item", access_threshold=2)])
        table = graphmod.create_table("item", 3, optimizer=opt, num_shards=4, **sketch)
        rows = graphmod.sparse_lookup(table, ids)
        train = opt.minimize(tf.reduce_sum(tf.sin(rows)))
        tf1.get_variable("dense", [2], initializer=tf1.ones_initializer())
        saver = graphmod.checkpoint.saver.TableSaver(sharded=True)
        saver.build()
        return table, ids, train, saver

    with tf.Graph().as_default():
        table, ids, train, saver = build()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if kind != "empty":
                sess.run(train, {ids: np.arange(200) % 150})  # 50 admitted, 100 pending
            before = sess.run(table.export())
            parts = saver.save(sess, str(tmp_path / "parts"))
            plain = tf1.train.Saver().save(sess, str(tmp_path / "plain"))
    assert len(list(tmp_path.glob("parts.data-*"))) == 2  # the table's part and the dense one
    a, b = tf.train.load_checkpoint(plain), tf.train.load_checkpoint(parts)
    assert a.get_variable_to_shape_map() == b.get_variable_to_shape_map()
    assert a.get_variable_to_dtype_map() == b.get_variable_to_dtype_map()
    rows = 0 if kind == "empty" else 50
    assert b.get_variable_to_shape_map()["item-values"] == [rows, 3]
    for prefix in ("item-", "item-pending_"):
        order_a, order_b = (np.argsort(r.get_tensor(prefix + "keys")) for r in (a, b))
        for name in a.get_variable_to_shape_map():
            field = name[len(prefix):]
            if not name.startswith(prefix) or field not in ("keys", "values", "slots", "counts",
                                                            "last_seen", "versions"):
                continue
            np.testing.assert_array_equal(a.get_tensor(name)[order_a],
                                          b.get_tensor(name)[order_b], err_msg=name)
    for name in ("item-pending_sketch", "item-format", "dense"):
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name), err_msg=name)
    # The stored slices a warm start reads one at a time: chunks of 7 rows
    # in the parts, one whole entry in the plain checkpoint.
    with tf.Graph().as_default(), tf1.Session() as sess:
        def slices(prefix, entry):
            return sess.run(ops.graphmod_checkpoint_row_slices(prefix, entry))
        starts, lengths = slices(parts, "item-values")
        assert lengths.sum() == rows and (lengths <= 7).all() and len(starts) >= rows // 7
        np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(lengths)[:-1]])
                                      if rows else [])
        assert [s.tolist() for s in slices(plain, "item-values")] == (
            [[0], [rows]] if rows else [[], []])
        with pytest.raises(tf.errors.NotFoundError, match="cannot read the stored slices of "
                                                          "'item-nothing' in '.*parts'"):
            slices(parts, "item-nothing")
        with pytest.raises(tf.errors.InvalidArgumentError, match="item-format.* is a scalar"):
            slices(parts, "item-format")
    if kind == "exact_admission":
        assert b.get_tensor("item-pending_keys").size == 100
    if kind == "sketch_admission":
        assert b.get_tensor("item-pending_sketch").size == 4 * 4096
        assert b.get_tensor("item-pending_sketch").sum() > 0

    with tf.Graph().as_default():
        table, ids, train, saver = build()
        with tf1.Session() as sess:
            saver.restore(sess, parts)
            after = sess.run(table.export())
            if kind == "exact_admission":  # the restored counts admit on the next sighting
                sess.run(train, {ids: [120]})
                assert sess.run(table.size()) == rows + 1
    order_b, order_a = np.argsort(before["keys"]), np.argsort(after["keys"])
    for field in before:
        np.testing.assert_array_equal(before[field][order_b], after[field][order_a],
                                      err_msg=field)


def test_an_admission_sketch_restores_only_into_as_many_shards(tmp_path):
    """Each shard counts its own keys in its own part of the sketch, so a
    checkpoint keeps a row of counters per shard. A table of another shard
    count (here 8 instead of 4, with as many counters in all) refuses the
    sketch, naming the table and both counts, through graphmod's TableSaver
    and through a plain Saver, before any row changes; a table of the same
    count restores every counter; a checkpoint that stored the sketch as a
    vector (before the rows) still restores."""
    def build(num_shards):
        ids = tf1.placeholder(tf.int64, [None])
        opt = graphmod.optimizers.Adagrad(0.1)
        graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec(
            "item", access_threshold=3)])
        table = graphmod.create_table("item", 3, optimizer=opt, num_shards=num_shards,
                                      admission_sketch_width=4096)
        train = opt.minimize(tf.reduce_sum(graphmod.sparse_lookup(table, ids)))
        saver = graphmod.checkpoint.saver.TableSaver(sharded=True)
        saver.build()
        return table, ids, train, saver

    with tf.Graph().as_default():
        table, ids, train, saver = build(4)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ids: np.arange(300) % 200})  # every id pending (threshold 3)
            before = sess.run(table.export_pending())
            parts = saver.save(sess, str(tmp_path / "parts"))
            plain = tf1.train.Saver().save(sess, str(tmp_path / "plain"))
    saved = tf.train.load_checkpoint(parts).get_tensor("item-pending_sketch")
    assert saved.shape == (4, 4096) and saved.sum() > 0
    np.testing.assert_array_equal(saved, before["sketch"])
    np.testing.assert_array_equal(tf.train.load_checkpoint(plain).get_tensor("item-pending_sketch"),
                                  saved)

    # The same checkpoint with the sketch as a vector, as graphmod wrote it before.
    reader = tf.train.load_checkpoint(parts)
    names = sorted(reader.get_variable_to_shape_map())
    tensors = [reader.get_tensor(n).reshape(-1) if n == "item-pending_sketch"
               else reader.get_tensor(n) for n in names]
    vector = str(tmp_path / "vector")
    with tf.Graph().as_default(), tf1.Session() as sess:
        sess.run(tf.raw_ops.SaveV2(prefix=vector, tensor_names=names,
                                   shape_and_slices=[""] * len(names), tensors=tensors))

    for prefix in (parts, vector):
        with tf.Graph().as_default():
            table, ids, train, saver = build(4)
            with tf1.Session() as sess:
                saver.restore(sess, prefix)
                np.testing.assert_array_equal(sess.run(table.export_pending())["sketch"], saved)

    for restore in ("table_saver", "plain_saver"):
        with tf.Graph().as_default():
            table, ids, train, saver = build(8)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                sess.run(train, {ids: [7, 7]})
                kept = sess.run(table.export_pending())
                with pytest.raises(tf.errors.InvalidArgumentError,
                                   match=r"table \W*item\W.*saved by a table of\W+4\W+shards and "
                                         r"this one has 8.*num_shards=\W*4"):
                    if restore == "table_saver":
                        saver.restore(sess, parts)
                    else:
                        tf1.train.Saver().restore(sess, plain)
                after = sess.run(table.export_pending())
        for field in kept:  # nothing changed
            np.testing.assert_array_equal(kept[field], after[field], err_msg=field)


def test_the_table_saver_restores_a_table_slice_by_slice_and_names_a_bad_checkpoint(tmp_path):
    """GraphmodTableRestore imports the stored slices of a table's entries,
    whoever wrote them, and refuses, naming the table and before any row
    changes, slices that leave rows out or overlap (of any entry), a newer
    format, a shape or a type the table cannot take, a negative count; a V1
    checkpoint (no bundle) is read too, each entry whole."""
    def build():
        ids = tf1.placeholder(tf.int64, [None])
        opt = graphmod.optimizers.Adagrad(0.1)
        table = graphmod.create_table("item", 3, optimizer=opt, num_shards=2)
        train = opt.minimize(tf.reduce_sum(tf.sin(graphmod.sparse_lookup(table, ids))))
        return table, ids, train, graphmod.checkpoint.saver.TableSaver()

    with tf.Graph().as_default():
        table, ids, train, saver = build()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ids: np.arange(50) * 7})
            before = sess.run(table.export())
            whole = tf1.train.Saver().save(sess, str(tmp_path / "whole"))
    reader = tf.train.load_checkpoint(whole)
    entries = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}

    def write(name, pieces, changes=None, values_pieces=None):
        """The checkpoint with every row entry of `item` as the given slices
        (its values as values_pieces, when given)."""
        names, specs, tensors = [], [], []
        for n, value in {**entries, **(changes or {})}.items():
            field = n[len("item-"):]
            if field not in ("keys", "values", "slots", "counts", "last_seen", "versions"):
                names.append(n), specs.append(""), tensors.append(value)
                continue
            for start, stop in (values_pieces if field == "values" and values_pieces
                                else pieces):
                full = " ".join(str(d) for d in value.shape)
                rest = ":-" * (value.ndim - 1)
                names.append(n)
                specs.append(f"{full} {start},{stop - start}{rest}")
                tensors.append(value[start:stop])
        prefix = str(tmp_path / name)
        with tf.Graph().as_default(), tf1.Session() as sess:
            sess.run(tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                                       shape_and_slices=specs, tensors=tensors))
        return prefix

    with tf.Graph().as_default():
        table, ids, train, saver = build()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ids: [10**9]})  # a row no checkpoint holds
            for prefix, error in [
                    (write("gap", [(0, 20), (30, 50)]), "do not cover its 50 rows once"),
                    (write("newer", [(0, 50)], {"item-format": np.int64(2)}),
                     "saves it in checkpoint format 2; this graphmod reads format 1"),
                    (write("narrow", [(0, 50)], {"item-values": entries["item-values"][:, :2]}),
                     r"item-values has shape \[50,2\]"),
                    (write("typed", [(0, 50)], {"item-counts": entries["item-counts"] * 1.0}),
                     "item-counts in .* holds double, not int64"),
                    (write("overlap", [(0, 30), (30, 50), (40, 50)]),
                     "do not cover its 50 rows once"),
                    (write("values_gap", [(0, 50)], values_pieces=[(0, 25), (30, 50)]),
                     "stored slices of item-values .* do not cover"),
                    (write("negative", [(0, 20), (20, 50)],
                           {"item-counts": np.where(np.arange(50) == 33, -1,
                                                    entries["item-counts"])}),
                     "item-counts in .* holds a negative count -1 at row 33")]:
                with pytest.raises(tf.errors.InvalidArgumentError,
                                   match=r"graphmod table 'item': .*" + error):
                    saver.restore(sess, prefix)
                assert sess.run(table.export())["keys"].tolist() == [10**9]  # unchanged
            saver.restore(sess, write("sliced", [(0, 13), (13, 40), (40, 50)]))
            after = sess.run(table.export())
            # A V1 checkpoint has no bundle: the kernel reads it as RestoreV2 does.
            sess.run(train, {ids: [10**9]})
            v1 = tf1.train.Saver(write_version=tf1.train.SaverDef.V1).save(
                sess, str(tmp_path / "v1"), write_meta_graph=False)
            assert not os.path.exists(v1 + ".index")
            saver.restore(sess, write("sliced_again", [(0, 50)]))
            assert sess.run(table.size()) == 50
            saver.restore(sess, v1)
            assert sess.run(table.size()) == 51
    order_b, order_a = np.argsort(before["keys"]), np.argsort(after["keys"])
    for field in before:
        np.testing.assert_array_equal(before[field][order_b], after[field][order_a],
                                      err_msg=field)


# ------------------------------------------------------------------ determinism


_ROWS_SCRIPT = """
import sys, numpy as np, tensorflow as tf, graphmod
tf.compat.v1.disable_eager_execution()
keys = [int(k) for k in sys.argv[1:]]
t = graphmod.create_table("emb", 5, initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.3))
rows = graphmod.sparse_lookup(t, tf.constant(keys, tf.int64), is_training=True)
with tf.compat.v1.Session() as s:
    np.save(sys.stdout.buffer, s.run(rows))
"""


def test_initial_rows_are_the_same_in_any_process_and_order():
    keys = [3, -9, 2**62, 17, 0]

    def rows(order):
        out = subprocess.run([sys.executable, "-c", _ROWS_SCRIPT] + [str(k) for k in order],
                             check=True, capture_output=True).stdout
        import io
        return dict(zip(order, np.load(io.BytesIO(out))))

    a, b = rows(keys), rows(keys[::-1])
    for k in keys:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a[3], a[17])
    assert np.all(np.abs(a[3]) <= 0.6 + 1e-6)


# ------------------------------------------------------------------ bad input


def test_bad_input_gives_clear_errors_naming_the_table():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="'zero'.*dim must be a positive integer"):
            graphmod.create_table("zero", 0)
        with pytest.raises(ValueError, match="'neg'.*dim"):
            graphmod.create_table("neg", -4)
        with pytest.raises(ValueError, match="num_shards"):
            graphmod.create_table("shards", 4, num_shards=3)
        with pytest.raises(ValueError, match="uniform"):
            graphmod.create_table("u", 4, initializer=graphmod.TableInitializer("uniform", 1, 0))
        table = graphmod.create_table("clicks", 4, optimizer=graphmod.optimizers.SGD(0.1))
        with pytest.raises(ValueError, match="'clicks' already exists"):
            graphmod.create_table("clicks", 4)
        with pytest.raises(TypeError, match="'clicks'.*float32"):
            graphmod.sparse_lookup(table, tf.constant([1.0, 2.0]))
        with pytest.raises(ValueError, match="'clicks'.*combiner"):
            graphmod.sparse_lookup(table, tf.constant([1]), combiner="max")
        with pytest.raises(TypeError, match="'clicks'.*is_training"):
            graphmod.sparse_lookup(table, tf.constant([1]), is_training=tf.constant(True))
        bad_grads = table.optimizer.apply(table, tf.constant([1, 2, 3], tf.int64), tf.ones([2, 4]))
        bad_import = table.import_rows(tf.constant([1, 2], tf.int64), tf.ones([2, 5]))
        # Rows in many shards, then one apply of their valid handles and one
        # handle from nowhere: the apply must fail before it moves any row.
        keys = tf.constant(np.arange(100, 164), tf.int64)
        graphmod.sparse_lookup(table, keys)
        lookup = graphmod.training_lookups()[-1]
        from_nowhere = tf.constant([(3 << 48) | 12345678], tf.int64)
        wrong_handle = table.optimizer.apply(
            table, tf.concat([lookup.handles, from_nowhere], 0), tf.ones([65, 4]),
            by_address=True)
        export = table.export()
        with tf1.Session() as sess:
            sess.run(lookup.rows)
            before = sess.run(export)
            assert len(before["keys"]) == 64
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="'clicks'.*gradients of shape \\[2,4\\]"):
                sess.run(bad_grads)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="'clicks'.*import values have shape \\[2,5\\]"):
                sess.run(bad_import)
            # (the handles are fed from the lookup's run: a new lookup gives the same rows)
            with pytest.raises(tf.errors.InvalidArgumentError, match="'clicks'.*row handle"):
                sess.run(wrong_handle)
            after = sess.run(export)
            np.testing.assert_array_equal(after["values"], before["values"])  # nothing half-applied
    # The op itself (past create_table's checks) names the table and the setting.
    with tf.Graph().as_default():
        raw = ops.graphmod_table(table_name="raw", shared_name="raw", dim=2, when_full="fifo")
        with tf1.Session() as sess, pytest.raises(tf.errors.InvalidArgumentError,
                                                  match="'raw'.*capacity policy 'fifo'"):
            sess.run(raw)


def test_empty_batches_and_extreme_keys():
    with tf.Graph().as_default():
        opt = graphmod.optimizers.Adam(0.01)
        table = graphmod.create_table("edge", 2, optimizer=opt)
        empty = graphmod.sparse_lookup(table, tf.zeros([0], tf.int64))
        empty_2d = graphmod.sparse_lookup(table, tf.zeros([3, 0], tf.int64), combiner="mean")
        sp = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [2, 5])
        empty_sparse = graphmod.sparse_lookup(table, sp, combiner="sqrtn")
        extreme = graphmod.sparse_lookup(table, tf.constant([I64_MIN, I64_MAX, -1, 0], tf.int64))
        train = opt.minimize(tf.reduce_sum(extreme) + tf.reduce_sum(empty))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            e, e2, es, x = sess.run([empty, empty_2d, empty_sparse, extreme])
            assert e.shape == (0, 2) and es.shape == (2, 2) and not es.any()
            assert e2.shape == (3, 2) and not e2.any()
            assert len({tuple(r) for r in x}) == 4
            sess.run(train)
            assert sess.run(table.size()) == 4


def test_string_ids_use_a_64_bit_fingerprint():
    with tf.Graph().as_default():
        table = graphmod.create_table("query", 4)
        words = tf.constant([b"shoes", b"hat", b"shoes"])
        rows = graphmod.sparse_lookup(table, words)
        with tf1.Session() as sess:
            r = sess.run(rows)
            keys = sess.run(table.export())["keys"]
    np.testing.assert_array_equal(r[0], r[2])
    assert not np.array_equal(r[0], r[1])
    assert len(keys) == 2 and any(abs(int(k)) > 2**40 for k in keys)  # full-width keys


def test_max_rows_bounds_the_table_and_drops_gradients_of_refused_ids():
    with tf.Graph().as_default():
        opt = graphmod.optimizers.SGD(1.0)
        table = graphmod.create_table("bounded", 2, optimizer=opt, max_rows=5,
                                      when_full="refuse", initializer=0.5)
        ids = tf1.placeholder(tf.int64, [None])
        rows = graphmod.sparse_lookup(table, ids)
        train = opt.minimize(tf.reduce_sum(rows))
        with tf1.Session() as sess:
            sess.run(train, {ids: np.arange(12)})
            exported = sess.run(table.export())
            assert len(exported["keys"]) == 5
            np.testing.assert_allclose(exported["values"], -0.5)  # each kept row got its gradient
            got = sess.run(rows, {ids: np.arange(12)})
            assert (got == 0.5).all(axis=1).sum() == 7  # refused ids read their initial row
        with pytest.raises(ValueError, match="'bad'.*max_rows"):
            graphmod.create_table("bad", 2, max_rows=0)


def test_tables_survive_export_and_import_of_the_meta_graph(caplog):
    ckpt = os.path.join(tempfile.mkdtemp(), "model")
    with tf.Graph().as_default():
        table = graphmod.create_table("meta", 3, optimizer=graphmod.optimizers.Adagrad(0.1))
        rows = graphmod.sparse_lookup(table, tf.constant([4, 8], tf.int64))
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(rows)
            saver.save(sess, ckpt)
            before = sess.run(table.export())
        meta = tf1.train.export_meta_graph()
    assert len(meta.collection_def[tf1.GraphKeys.SAVEABLE_OBJECTS].bytes_list.value) == 1
    with tf.Graph().as_default():
        restorer = tf1.train.import_meta_graph(meta)
        (imported,) = graphmod.tables()
        assert (imported.name, imported.dim, imported.num_slots) == ("meta", 3, 1)
        with tf1.Session() as sess:
            restorer.restore(sess, ckpt)
            after = sess.run(imported.export())
    assert "Cannot identify data type" not in caplog.text
    np.testing.assert_array_equal(np.sort(before["keys"]), np.sort(after["keys"]))


@pytest.mark.parametrize("layout", ["arena", "buckets"])
def test_a_stale_handle_never_updates_another_key(layout):
    """Look up key 1, remove it, look up other keys (one reuses key 1's row),
    apply key 1's handle: the gradient is dropped and counted, no row moves."""
    with tf.Graph().as_default():
        opt = graphmod.optimizers.SGD(1.0)
        table = graphmod.create_table("stale", 2, optimizer=opt, num_shards=1, layout=layout)
        one = graphmod.sparse_lookup(table, tf.constant([1], tf.int64))
        handles_of_one = graphmod.training_lookups()[-1].handles
        others = graphmod.sparse_lookup(table, tf.constant([2, 3], tf.int64))
        handle = tf1.placeholder(tf.int64, [1])
        apply = opt.apply(table, handle, tf.ones([1, 2]), by_address=True)
        remove = table.remove(tf.constant([1], tf.int64))
        export, info = table.export(), table.info()
        with tf1.Session() as sess:
            _, old = sess.run([one, handles_of_one])
            sess.run(remove)
            sess.run(others)  # key 2 takes the freed row
            before = sess.run(export)
            sess.run(apply, {handle: old})
            after = sess.run(export)
            np.testing.assert_array_equal(after["values"], before["values"])
            assert sess.run(info["stale"]) == 1


# ------------------------------------------------------------------ exchange plan


def test_the_exchange_plan_brings_each_id_its_own_keys_row_from_its_owner():
    """The exchange's index ops (graphmod/horovod/exchange.py) on 3 simulated
    ranks, the all-to-alls done in numpy: each rank's ids go to owner_of's
    owner, each owner looks every key up as often as all ranks read it, and
    each id reads back its own key's row and its key's refused count."""
    from graphmod.embeddings.partition import owner_of, owner_of_numpy
    size, dims = 3, [2, 1]
    widths = [d + 1 for d in dims]
    rng = np.random.default_rng(5)
    batches = [[np.concatenate([rng.integers(-20, 20, n), [I64_MIN, I64_MAX][:n % 3]])
                for n in rng.integers(0, 30, len(dims))] for _ in range(size)]
    with tf.Graph().as_default(), tf1.Session() as sess:
        routes = sess.run([ops.graphmod_exchange_route([tf.constant(b, tf.int64) for b in rank],
                                                       size=size, widths=widths)
                           for rank in batches])
        sent_keys = np.concatenate([r.sent[:, 0] for r in routes])
        owners = sess.run(owner_of(tf.constant(sent_keys, tf.int64), size))
        assert np.array_equal(owner_of_numpy(sent_keys, size), owners)
        assert np.array_equal(owners, np.concatenate(
            [np.repeat(np.arange(size), r.splits) for r in routes]))
        returned = [[] for _ in range(size)]
        looked_up = {}
        for owner in range(size):
            parts = [np.split(r.sent, np.cumsum(r.splits)[:-1])[owner] for r in routes]
            plan = sess.run(ops.graphmod_exchange_serve(
                np.concatenate(parts), np.array([len(p) for p in parts], np.int32),
                N=len(dims), widths=widths))
            back = np.full(sum(plan.back_splits), np.nan, np.float32)
            for t, d in enumerate(dims):
                for key in plan.lookups[t]:
                    looked_up[(t, key)] = looked_up.get((t, key), 0) + 1
                for e, key in enumerate(plan.keys[t]):
                    assert plan.lookups[t][plan.last[t][e]] == key
                    assert set(plan.lookups[t][plan.first[t][e]:][:plan.count[t][e]]) == {key}
                    # a row made from the key, and the entry's first lookup index
                    back[plan.out_at[t][e]:][:d] = [float(key % 97) + t + 0.5 * j for j in range(d)]
                    back[plan.out_at[t][e] + d] = plan.count[t][e]
            assert not np.isnan(back).any()
            for rank, part in enumerate(np.split(back, np.cumsum(plan.back_splits)[:-1])):
                returned[rank].append(part)
                assert len(part) == routes[rank].float_splits[owner]
        read = {}
        for rank, (route, batch) in enumerate(zip(routes, batches)):
            flat = np.concatenate(returned[rank])
            for t, (ids, d) in enumerate(zip(batch, dims)):
                for i, key in enumerate(ids):
                    at = route.at[t][i]
                    want = [float(key % 97) + t + 0.5 * j for j in range(d)]
                    assert list(flat[at:at + d]) == want
                    assert flat[at + d] == np.count_nonzero(ids == key)  # its count from this rank
                    assert route.occurrence[t][i] == np.count_nonzero(ids[:i] == key)
                    read[(t, key)] = read.get((t, key), 0) + 1
        assert read == looked_up and len(read) > 20

        with pytest.raises(tf.errors.InvalidArgumentError, match="names table 4 of 2"):
            sess.run(ops.graphmod_exchange_serve(tf.constant([[1, 1, 4]], tf.int64), [1], N=2,
                                                 widths=[1, 1]))
        with pytest.raises(tf.errors.InvalidArgumentError, match="splits count 2 entries, but 1"):
            sess.run(ops.graphmod_exchange_serve(tf.constant([[1, 1, 0]], tf.int64), [1, 1], N=1,
                                                 widths=[1]))
