"""Feature admission and eviction (graphmod.embeddings.features, graphmod.EvictHook):
exact admission on the threshold-th sighting, no gradient before it, eviction
by timestamp feature, global step and wall clock, LRU/LFU capacity bounds,
counts and timestamps through checkpoints, and settings refused up front."""
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.embeddings import features

tf1 = tf.compat.v1


def sgd_graph(specs, access_key="item", max_rows=None, when_full="lru"):
    """ids/ts placeholders -> a table trained by SGD(1) on sum(rows)."""
    ids = tf1.placeholder(tf.int64, [None], name="ids")
    ts = tf1.placeholder(tf.int64, [None], name="ts")
    step = tf1.train.get_or_create_global_step()
    looked_up = graphmod.use_feature_specs({access_key: ids, "ts": ts}, specs)
    opt = graphmod.optimizers.SGD(1.0)
    table = graphmod.create_table("item", 2, optimizer=opt, initializer=0.5,
                                  max_rows=max_rows, when_full=when_full)
    rows = graphmod.sparse_lookup(table, looked_up[access_key])
    with tf.control_dependencies([opt.minimize(tf.reduce_sum(rows))]):
        train = step.assign_add(1)  # after the lookups read the step
    return table, ids, ts, rows, train


def keys_of(sess, table):
    return set(sess.run(table.export())["keys"].tolist())


def test_a_key_gets_its_row_on_exactly_its_threshold_th_sighting():
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph([graphmod.FeatureSpec("item", access_threshold=3)])
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for sighting in (1, 2):
                got, _ = sess.run([rows, train], {ids: [7], ts: [0]})
                np.testing.assert_allclose(got, 0.5)  # the initial row, no gradient applied
                assert keys_of(sess, table) == set()
            got, _ = sess.run([rows, train], {ids: [7], ts: [0]})
            np.testing.assert_allclose(got, 0.5)  # admitted: its row starts from the initializer
            exported = sess.run(table.export())
            assert exported["keys"].tolist() == [7] and exported["counts"].tolist() == [3]
            np.testing.assert_allclose(exported["values"], -0.5)  # one SGD step, not three
            # Within one batch: positions 1 and 2 of key 9 are rejected, 3 and 4 get the row.
            sess.run(train, {ids: [9, 9, 9, 9], ts: [0] * 4})
            exported = sess.run(table.export())
            row9 = exported["values"][exported["keys"].tolist().index(9)]
            np.testing.assert_allclose(row9, 0.5 - 2.0)  # two gradients summed, not four
            info = sess.run(table.info())
            assert (info["admitted"], info["rejected"], info["pending"]) == (2, 2 + 2, 0)
            # Three lookups of [7], one of [9, 9, 9, 9]: every id, and the distinct ones per call.
            assert (info["ids_looked_up"], info["lookups"]) == (3 + 4, 3 + 1)


def test_eviction_by_timestamp_feature_removes_exactly_the_keys_older_than_the_threshold():
    with tf.Graph().as_default():
        specs = [graphmod.FeatureSpec("item", eviction_threshold=150),
                 graphmod.FeatureSpec("ts", is_timestamp=True)]
        table, ids, ts, rows, train = sgd_graph(specs)
        hook = graphmod.EvictHook(evict_step_interval=1)
        hook.begin()
        assert [t.name for t in hook.tables] == ["item"]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            # The batch's newest timestamp stamps all its keys.
            for keys, stamp in (([1, 2], [90, 100]), ([3], [149]), ([4], [150]), ([5], [300])):
                sess.run(train, {ids: keys, ts: stamp})
            assert hook.evict(sess) == {"item": 3}  # last seen before 300 - 150: 1, 2 and 3
            assert keys_of(sess, table) == {4, 5}
            stamps = sess.run(table.export())["last_seen"]
            assert sorted(stamps.tolist()) == [150, 300]


def test_eviction_by_global_steps():
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph(
            [graphmod.FeatureSpec("item", eviction_threshold=2, eviction_unit="steps")])
        hook = graphmod.EvictHook(evict_time_interval=None, evict_step_interval=1)
        hook.begin()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(5):  # key k is last seen at global step k
                sess.run(train, {ids: [step], ts: [0]})
            hook.evict(sess)
            assert keys_of(sess, table) == {2, 3, 4}  # seen at or after step 4 - 2


def test_eviction_by_wall_clock():
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph([graphmod.FeatureSpec("item",
                                                                      eviction_threshold=1)])
        hook = graphmod.EvictHook(evict_time_interval=3600)
        hook.begin()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ids: [1, 2], ts: [0, 0]})
            time.sleep(2.1)
            sess.run(train, {ids: [3], ts: [0]})
            hook.evict(sess)
            assert keys_of(sess, table) == {3}
            assert abs(sess.run(table.export())["last_seen"][0] - time.time()) < 5


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_capacity_bound_holds_under_a_stream_of_new_keys(policy):
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph(
            [graphmod.FeatureSpec("item", eviction_unit="steps")], max_rows=1000,
            when_full=policy)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            hot = np.arange(10**6, 10**6 + 20)
            sess.run(train, {ids: np.repeat(hot, 8), ts: [0] * 160})
            for step in range(1, 40):
                fresh = np.arange(step * 100, step * 100 + 100)
                batch = np.concatenate([fresh, hot]) if step % 5 == 0 else fresh
                sess.run(train, {ids: batch, ts: [0] * len(batch)})
                assert sess.run(table.size()) <= 1000
            kept = keys_of(sess, table)
            info = sess.run(table.info())
            # Every new key got a row (none refused); each beyond the bound evicted one.
            assert info["rejected"] == 0 and info["evicted"] == info["admitted"] - 1000
            if policy == "lfu":
                assert set(hot.tolist()) <= kept  # often seen: never the victim
            else:  # mostly the last 10 steps' keys
                assert len(kept & set(range(30 * 100, 40 * 100))) >= 800


def test_counts_pending_ids_and_timestamps_round_trip_through_a_checkpoint(tmp_path):
    specs = [graphmod.FeatureSpec("item", access_threshold=3, eviction_threshold=10**6),
             graphmod.FeatureSpec("ts", is_timestamp=True)]
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph(specs)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ids: [1, 1, 1, 2, 2, 3], ts: [500] * 6})
            before = sess.run(table.export())
            saver.save(sess, str(tmp_path / "model"))
    with tf.Graph().as_default():
        table, ids, ts, rows, train = sgd_graph(specs)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            saver.restore(sess, str(tmp_path / "model"))
            after = sess.run(table.export())
            for f in ("keys", "counts", "last_seen", "values"):
                np.testing.assert_array_equal(after[f], before[f], err_msg=f)
            assert sess.run(table.info())["pending"] == 2
            # Key 2 was seen twice before the save: its third sighting admits it,
            # key 3 (seen once) still waits.
            sess.run(train, {ids: [2, 3], ts: [600, 600]})
            assert keys_of(sess, table) == {1, 2}


def test_gradients_of_unadmitted_keys_are_dropped_with_every_optimizer():
    for make in (lambda: graphmod.optimizers.Adagrad(0.1),
                 lambda: graphmod.optimizers.Adam(0.1),
                 lambda: graphmod.optimizers.Ftrl(0.1)):
        with tf.Graph().as_default():
            ids = tf1.placeholder(tf.int64, [None])
            opt = make()
            graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec(
                "item", access_threshold=2)])
            table = graphmod.create_table("item", 2, optimizer=opt, initializer=0.5)
            train = opt.minimize(tf.reduce_sum(graphmod.sparse_lookup(table, ids)))
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                sess.run(train, {ids: [4, 5, 5]})
                exported = sess.run(table.export())
                assert exported["keys"].tolist() == [5]
                assert sess.run(table.info())["pending"] == 1


@pytest.mark.parametrize("make, message", [
    (lambda: graphmod.FeatureSpec("item", table="items", access_threshold=-2),
     "'items'.*access_threshold"),
    (lambda: graphmod.FeatureSpec("item", eviction_threshold=-5), "'item'.*eviction_threshold"),
    (lambda: graphmod.FeatureSpec("item", eviction_unit="days"), "'item'.*eviction_unit"),
    (lambda: graphmod.FeatureSpec("ts", is_timestamp=True, access_threshold=3), "'ts'"),
    (lambda: graphmod.EvictHook(evict_time_interval=0), "evict_time_interval"),
    (lambda: graphmod.EvictHook(evict_time_interval=None, evict_step_interval=-1),
     "evict_step_interval"),
    (lambda: graphmod.EvictHook(evict_time_interval=None), "evict_step_interval or both"),
    (lambda: graphmod.GraphModifierHook(tables={"*emb*": dict(access_threshold=-3)}),
     r"\*emb\*.*access_threshold"),
    (lambda: graphmod.GraphModifierHook(tables={"*emb*": dict(eviction_threshold=5)},
                                        evict_time_interval=-1), "evict_time_interval"),
])
def test_invalid_settings_fail_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_feature_specs_must_match_the_batch_and_come_before_lookups():
    with tf.Graph().as_default():
        ids = tf1.placeholder(tf.int64, [None])
        with pytest.raises(ValueError, match="'ts'.*no feature 'ts'"):
            graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec("ts",
                                                                            is_timestamp=True)])
        table = graphmod.create_table("item", 2)
        graphmod.sparse_lookup(table, ids)
        with pytest.raises(ValueError, match="'item'.*before its first lookup"):
            graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec("item",
                                                                            access_threshold=2)])
        with pytest.raises(ValueError, match="EvictHook: graphmod table 'item' has no eviction"):
            graphmod.EvictHook(table_names=["item"]).begin()


def test_admission_counted_in_a_sketch_survives_a_checkpoint(tmp_path):
    def build():
        ids = tf1.placeholder(tf.int64, [None])
        graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec("item",
                                                                        access_threshold=3)])
        opt = graphmod.optimizers.SGD(1.0)
        table = graphmod.create_table("item", 2, optimizer=opt, admission_sketch_width=4096)
        return table, ids, opt.minimize(tf.reduce_sum(graphmod.sparse_lookup(table, ids)))

    with tf.Graph().as_default():
        table, ids, train = build()
        with tf1.Session() as sess:
            sess.run(train, {ids: [1, 1, 1, 2, 2, 3]})
            info = sess.run(table.info())
            assert keys_of(sess, table) == {1} and info["pending"] == 0  # no per-id entries
            assert info["memory_bytes"] >= 4 * 4096 * 4
            tf1.train.Saver().save(sess, str(tmp_path / "model"))
    assert tf.train.load_checkpoint(str(tmp_path)).get_tensor("item-pending_sketch").size == \
        4 * 4096
    with tf.Graph().as_default():
        table, ids, train = build()
        with tf1.Session() as sess:
            tf1.train.Saver().restore(sess, str(tmp_path / "model"))
            sess.run(train, {ids: [2, 3]})
            assert keys_of(sess, table) == {1, 2}


def stream_estimator(model_dir):
    """An unchanged model_fn over an id stream that moves on every step."""
    def input_fn():
        ds = tf.data.Dataset.range(10**6).map(lambda i: (
            {"item": tf.reshape(i // 4 % 100_000, [1]), "ts": tf.reshape(i, [1])},
            tf.reshape(tf.cast(i % 2, tf.float32), [1])))
        return ds.batch(64)

    def model_fn(features, labels, mode):
        emb = tf1.get_variable("item_emb", [100_000, 4])
        logits = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["item"][:, 0]), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels[:, 0],
                                                                      logits=logits))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf1.train.AdagradOptimizer(
            0.1).minimize(loss, tf1.train.get_global_step()))

    return tf.estimator.Estimator(model_fn, model_dir=str(model_dir)), input_fn


def test_the_hook_drives_eviction_by_steps_in_an_estimator(tmp_path):
    est, input_fn = stream_estimator(tmp_path)
    hook = graphmod.GraphModifierHook(
        tables={"item_emb": dict(eviction_threshold=5, eviction_unit="steps")},
        evict_time_interval=None, evict_step_interval=10)
    est.train(input_fn, steps=60, hooks=[hook])
    assert hook.evict_hook.evictions == 5  # after steps 10, 20, ..., 50
    reader = tf.train.load_checkpoint(str(tmp_path))
    seen = reader.get_tensor("item_emb-last_seen")
    # Each step brings 16 new ids; the last eviction (after step 50) kept steps 45+.
    assert seen.min() >= 45 and len(seen) == 16 * (60 - 45)


def test_the_hook_finds_the_timestamp_feature_by_name_or_says_what_the_batch_has(tmp_path):
    est, input_fn = stream_estimator(tmp_path / "a")
    hook = graphmod.GraphModifierHook(tables={"item_emb": dict(eviction_threshold=100)},
                                      timestamp_feature="ts", evict_step_interval=10)
    est.train(input_fn, steps=30, hooks=[hook])
    seen = tf.train.load_checkpoint(str(tmp_path / "a")).get_tensor("item_emb-last_seen")
    assert seen.max() == 30 * 64 - 1 and seen.min() >= 30 * 64 - 1 - 100 - 64 * 10
    est, input_fn = stream_estimator(tmp_path / "b")
    with pytest.raises(RuntimeError, match=r"'timestamp'.*not in the input batch.*'item', 'ts'"):
        est.train(input_fn, steps=1, hooks=[graphmod.GraphModifierHook(
            tables={"item_emb": dict(eviction_threshold=100)}, timestamp_feature="timestamp")])


def test_evict_hook_never_evicts_in_a_graph_that_only_reads():
    with tf.Graph().as_default():
        ids = tf1.placeholder(tf.int64, [None])
        graphmod.use_feature_specs({"item": ids}, [graphmod.FeatureSpec(
            "item", eviction_threshold=0)])
        table = graphmod.create_table("item", 2)
        graphmod.sparse_lookup(table, ids, is_training=False)
        hook = graphmod.EvictHook(evict_step_interval=1)
        hook.begin()
        assert [t.name for t in hook.tables] == ["item"] and not hook.enabled
