"""The collisionless_keys rule: hash-bucket and modulo ids feed tables unsqueezed."""
import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1


def train_once(build, feed_values, hook):
    """Builds a graph with build() -> (placeholder, loss), lets the hook rewrite
    it (as a session would, before initializing), runs one training step and
    returns the table's export."""
    with tf.Graph().as_default():
        step = tf1.train.get_or_create_global_step()
        ph, loss = build()
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss, step)
        hook.begin()
        (table,) = graphmod.tables()
        export = table.export()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ph: feed_values})
            return sess.run(export)


def test_hash_bucket_ids_become_full_fingerprints():
    words = np.array([f"w{i}".encode() for i in range(300)])

    def build():
        ph = tf1.placeholder(tf.string, [None])
        emb = tf1.get_variable("emb", [100, 4], initializer=tf1.constant_initializer(0.1))
        rows = tf.nn.embedding_lookup(emb, tf.strings.to_hash_bucket_fast(ph, 100))
        return ph, tf.reduce_sum(rows * rows)

    hook = graphmod.GraphModifierHook(tables={"emb": {}})
    exported = train_once(build, words, hook)
    assert len(exported["keys"]) == 300  # 300 words, 100 buckets: no sharing
    want = tf.bitcast(tf.fingerprint(words), tf.int64).numpy() & (2**63 - 1)
    assert sorted(exported["keys"].tolist()) == sorted(want.tolist())
    assert hook.report.unsqueezed_keys and not hook.report.squeezed_keys_kept


def test_modulo_ids_become_raw_ids():
    ids = np.arange(0, 5_000_000, 10_007, dtype=np.int64)  # ~500 ids, colliding mod 1000

    def build():
        ph = tf1.placeholder(tf.int64, [None])
        emb = tf1.get_variable("emb", [1000, 4], initializer=tf1.constant_initializer(0.1))
        return ph, tf.reduce_sum(tf.nn.embedding_lookup(emb, ph % 1000))

    hook = graphmod.GraphModifierHook()  # hashed ids: converted at any size
    exported = train_once(build, ids, hook)
    assert sorted(exported["keys"].tolist()) == ids.tolist()
    assert "full ids" in hook.report.approximations[0]["what"]


def test_modulo_ids_of_a_dense_feature_column_become_raw_ids():
    """An identity column over `ids % N` of a dense feature: the column
    picks the sparse values out of the ids with GatherNd, which carries them.
    Ids that do not collide mod N (k * 1001) train each full-id row as the
    unmodified model trains the id's bucket row."""
    ids = (np.arange(500, dtype=np.int64) * 1001).reshape(-1, 2)

    def build():
        ph = tf1.placeholder(tf.int64, [None, 2])
        column = tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_identity("ids", 1000), 4,
            initializer=tf1.constant_initializer(0.1))
        rows = tf1.feature_column.input_layer({"ids": tf.math.floormod(ph, 1000)}, [column])
        # Each example weighs differently: each id's row gets a gradient of its own.
        weights = tf.cast(tf.range(tf.shape(rows)[0]) + 1, tf.float32)[:, None]
        return ph, tf.reduce_sum(rows * weights)

    hook = graphmod.GraphModifierHook()
    exported = train_once(build, ids, hook)
    assert sorted(exported["keys"].tolist()) == sorted(ids.ravel().tolist())
    assert hook.report.unsqueezed_keys and not hook.report.squeezed_keys_kept
    assert "full ids" in hook.report.approximations[0]["what"]
    with tf.Graph().as_default():  # the model unmodified, one step
        step = tf1.train.get_or_create_global_step()
        ph, loss = build()
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss, step)
        (variable,) = tf1.trainable_variables()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train, {ph: ids})
            buckets = sess.run(variable)
    rows = exported["values"][np.argsort(exported["keys"])]
    # To rounding: the table's Adagrad and TensorFlow's kernel round apart,
    # and rows near 0 (0.1 less a step of nearly 0.1) keep only the rounding.
    np.testing.assert_allclose(rows, buckets[np.sort(ids.ravel()) % 1000], rtol=1e-5,
                               atol=2e-8)
    assert not np.allclose(rows, 0.1)  # the step moved them


def test_a_small_modulo_is_meaning_not_hashing():
    """`ts % 7` (day of week) or `ids % num_partitions` keep their rows: a
    modulo below MIN_MODULO_BUCKETS is not unsqueezed."""
    ids = np.arange(0, 5_000, 37, dtype=np.int64)

    def build():
        ph = tf1.placeholder(tf.int64, [None])
        emb = tf1.get_variable("emb", [7, 4], initializer=tf1.constant_initializer(0.1))
        return ph, tf.reduce_sum(tf.nn.embedding_lookup(emb, ph % 7))

    hook = graphmod.GraphModifierHook(tables={"emb": {}})
    exported = train_once(build, ids, hook)
    assert sorted(exported["keys"].tolist()) == sorted(set((ids % 7).tolist()))
    assert not hook.report.unsqueezed_keys and not hook.report.approximations


def _lookup(variable, ids, fused):
    """tf.nn.embedding_lookup, or embedding_lookup_sparse, which for a
    reference variable reads rows with one fused SparseSegmentSum whose ids
    index the variable like a gather's."""
    if not fused:
        return tf.nn.embedding_lookup(variable, ids)
    n = tf.shape(ids, out_type=tf.int64)[0]
    sparse = tf.SparseTensor(tf.stack([tf.range(n), tf.zeros([n], tf.int64)], 1), ids, [n, 1])
    return tf1.nn.embedding_lookup_sparse(variable, sparse, None, combiner="sum")


@pytest.mark.parametrize("fused", [False, True])
def test_ids_that_also_index_a_dense_variable_stay_squeezed(fused):
    ids = np.arange(0, 5_000_000, 10_007, dtype=np.int64)

    def build():
        ph = tf1.placeholder(tf.int64, [None])
        bucket = ph % 1000
        emb = tf1.get_variable("emb", [1000, 4], initializer=tf1.constant_initializer(0.1),
                               use_resource=not fused)
        # kept dense by its pattern (hashed ids would convert it at any size)
        bias = tf1.get_variable("bias", [1000, 1], use_resource=not fused)
        loss = tf.reduce_sum(_lookup(emb, bucket, fused))
        return ph, loss + tf.reduce_sum(_lookup(bias, bucket, fused))

    hook = graphmod.GraphModifierHook(tables={"emb": {}, "bias": {"convert": False}})
    exported = train_once(build, ids, hook)
    assert set(exported["keys"].tolist()) == set((ids % 1000).tolist())
    (kept,) = hook.report.squeezed_keys_kept
    assert "bias" in kept["reason"]


def test_collision_free_can_be_switched_off():
    words = np.array([f"w{i}".encode() for i in range(300)])

    def build():
        ph = tf1.placeholder(tf.string, [None])
        emb = tf1.get_variable("emb", [100, 4], initializer=tf1.constant_initializer(0.1))
        return ph, tf.reduce_sum(tf.nn.embedding_lookup(emb, tf.strings.to_hash_bucket_fast(ph, 100)))

    exported = train_once(build, words,
                          graphmod.GraphModifierHook(tables={"emb": {}}, collision_free=False))
    assert len(exported["keys"]) <= 100


def test_eval_graph_with_an_optimizer_unsqueezes_like_training():
    """A model_fn may build its optimizer in every mode; keys must not differ
    between the training and the evaluation graph."""
    reports = {}
    for mode in ("train", "eval"):
        with tf.Graph().as_default():
            step = tf1.train.get_or_create_global_step()
            ph = tf1.placeholder(tf.int64, [None])
            emb = tf1.get_variable("emb", [1000, 4])
            loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, ph % 1000))
            tf1.train.AdagradOptimizer(0.1).minimize(loss, step)
            if mode == "eval":
                tf1.add_to_collection(tf1.GraphKeys.EVAL_STEP, tf1.Variable(0, name="eval_step"))
            hook = graphmod.GraphModifierHook(tables={"emb": {}})
            hook.begin()
            reports[mode] = hook.report
    assert reports["eval"].graph == "eval"
    assert reports["train"].unsqueezed_keys == reports["eval"].unsqueezed_keys == ["mod"]
