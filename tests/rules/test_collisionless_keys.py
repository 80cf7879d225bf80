"""collisionless_keys: ids squeezed by a hash bucket or modulo feed the table unsqueezed."""
import numpy as np
import tensorflow as tf

from graphmod.rewrite.plan import TableSettings
from graphmod.rewrite_rules import collisionless_keys, gather_to_lookup

from .helpers import (READING_RULES, TRAINING_RULES, apply_rules, exported, settings,
                      the_table, tiny_model)

tf1 = tf.compat.v1
BUCKETS = 1000  # a modulo this large is hashing, not meaning (graphmod.rewrite.ids)
IDS = [5, 5 + BUCKETS, 7 + 3 * BUCKETS]  # 5 and 1005 share bucket 5


def _modulo_model(optimizer=None):
    raw = tf1.placeholder(tf.int64, [None], name="raw")
    squeezed = tf.math.floormod(raw, BUCKETS, name="bucket")
    return raw, squeezed, tiny_model(optimizer, rows=BUCKETS, ids=squeezed)


def test_a_modulo_feeds_the_table_the_raw_ids():
    with tf.Graph().as_default() as g:
        raw, squeezed, m = _modulo_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *TRAINING_RULES)
        c = applied.only()
        keys = applied.context.built(collisionless_keys.Keys, c)
        assert (keys.names, keys.types) == (["bucket"], ["FloorMod"])
        assert applied.reported("unsqueezed_keys") == ["bucket"]
        assert applied.reported("squeezed_keys_kept") == []
        assert "full ids of bucket" in applied.context.approximations["emb"][0]
        # The lookup reads the raw ids, kept non-negative; nothing reads the modulo.
        lookup_keys = applied.context.built(gather_to_lookup.Lookups, c).reads[0][0]
        assert lookup_keys.op.type == "BitwiseAnd" and lookup_keys.op.inputs[0] is raw
        assert not squeezed.consumers()
        assert "BitwiseAnd" in applied.built_by("collisionless_keys")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(m.train, {raw: IDS})
            assert sorted(exported(sess, the_table(g))) == sorted(IDS)  # no shared row


def test_a_hash_bucket_feeds_the_table_the_full_fingerprints():
    words = [b"a", b"b", b"c", b"d"]
    with tf.Graph().as_default() as g:
        strings = tf1.placeholder(tf.string, [None])
        bucket = tf.strings.to_hash_bucket_fast(strings, 2, name="bucket")
        m = tiny_model(ids=bucket)  # 2 rows: 4 words must share
        applied = apply_rules(g, *READING_RULES, training=False)
        keys = applied.context.built(collisionless_keys.Keys, applied.only())
        assert (keys.names, keys.types) == (["bucket"], ["StringToHashBucketFast"])
        lookup_keys = applied.context.built(gather_to_lookup.Lookups, applied.only()).reads[0][0]
        with tf1.Session() as sess:
            got = sess.run(lookup_keys, {strings: words})
            buckets = sess.run(bucket, {strings: words})
        del m
    # TF's Fingerprint64 of each word (eagerly), its sign bit cleared
    want = tf.bitcast(tf.fingerprint(np.array(words)), tf.int64).numpy() & (2**63 - 1)
    assert got.tolist() == want.tolist()
    assert len(set(buckets.tolist())) <= 2 and len(set(got.tolist())) == 4


def test_a_sign_check_does_not_stop_it():
    """Feature columns prune negative ids (ids >= 0): unsqueezed keys are
    non-negative too, so the check answers as it did."""
    with tf.Graph().as_default() as g:
        raw = tf1.placeholder(tf.int64, [None])
        squeezed = tf.math.floormod(raw, BUCKETS, name="bucket")
        kept = tf.boolean_mask(squeezed, squeezed >= 0)
        tiny_model(rows=BUCKETS, ids=kept)
        applied = apply_rules(g, *READING_RULES, training=False)
        assert applied.reported("unsqueezed_keys") == ["bucket"]


def test_keeps_squeezed_ids_that_also_index_a_dense_variable():
    with tf.Graph().as_default() as g:
        raw = tf1.placeholder(tf.int64, [None])
        squeezed = tf.math.floormod(raw, BUCKETS, name="bucket")
        tiny_model(rows=BUCKETS, ids=squeezed)
        bias = tf1.get_variable("bias", [BUCKETS, 1], use_resource=True)
        tf.nn.embedding_lookup(bias, squeezed)
        # bias stays dense by its pattern (hashed ids convert any size)
        applied = apply_rules(g, *READING_RULES, training=False, rewrite_settings=settings(
            tables={"bias": TableSettings(convert=False)}))
        assert [c.name for c in applied.conversions] == ["emb"]
        assert applied.reported("squeezed_keys_kept") == [
            dict(op="bucket", reason="its ids also index 'bias', which stays dense")]
        assert applied.reported("unsqueezed_keys") == []
        keys = applied.context.built(collisionless_keys.Keys, applied.only())
        assert keys.names == [] and "emb" not in applied.context.approximations
        lookup_keys = applied.context.built(gather_to_lookup.Lookups, applied.only()).reads[0][0]
        assert lookup_keys is squeezed  # the table is keyed by bucket
        assert applied.built_by("collisionless_keys") == []


def test_keeps_squeezed_ids_that_reach_a_narrowing_cast():
    with tf.Graph().as_default() as g:
        raw = tf1.placeholder(tf.int64, [None])
        squeezed = tf.math.floormod(raw, BUCKETS, name="bucket")
        tiny_model(rows=BUCKETS, ids=squeezed)
        tf.cast(squeezed, tf.int32, name="narrow")
        applied = apply_rules(g, *READING_RULES, training=False)
        assert applied.reported("squeezed_keys_kept") == [dict(
            op="bucket", reason="its ids also reach a cast to int32 'narrow', which reads their "
            "values")]


def test_keeps_the_buckets_of_a_variable_adopted_from_a_dense_checkpoint():
    """The checkpoint's trained rows are the buckets': the table goes on keyed by bucket."""
    with tf.Graph().as_default() as g:
        _modulo_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *TRAINING_RULES, checkpoint_names=frozenset({"emb"}))
        (kept,) = applied.reported("squeezed_keys_kept")
        assert kept["op"] == "bucket" and "adopted from the dense checkpoint" in kept["reason"]
        assert applied.reported("unsqueezed_keys") == []


def test_collision_free_off_or_exact_leaves_the_ids_alone():
    for kw in (dict(collision_free=False), dict(exact=True)):
        with tf.Graph().as_default() as g:
            raw, squeezed, _ = _modulo_model()
            applied = apply_rules(g, *READING_RULES, training=False,
                                  rewrite_settings=settings(**kw))
            assert applied.reported("unsqueezed_keys") == []
            assert applied.reported("squeezed_keys_kept") == []
            assert applied.context.built(collisionless_keys.Keys, applied.only()) is None
            assert applied.built_by("collisionless_keys") == []
            assert squeezed.consumers()  # the lookup reads the buckets
