"""graphmod.WarmStartSettings: a third model starts from two source models,
a dense one and a graphmod one, with renamed tables and a key filter; a
restart then resumes from its own checkpoint."""
import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
VOCAB, DIM = 400, 4


def input_fn():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(256, 2)).astype(np.int64)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(32)


def make_model_fn(user_name, item_name):
    def model_fn(features, labels, mode):
        user = tf1.get_variable(user_name, [VOCAB, DIM])
        item = tf1.get_variable(item_name, [VOCAB, DIM])
        head = tf1.get_variable("head", [2 * DIM, 1])
        e = tf.concat([tf.nn.embedding_lookup(user, features["ids"][:, 0]),
                       tf.nn.embedding_lookup(item, features["ids"][:, 1])], 1)
        logits = tf.squeeze(tf.matmul(e, head), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        train_op = tf1.train.AdagradOptimizer(0.2).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


class Started(tf1.train.SessionRunHook):
    """Tables and the head right after the session started (after the warm start)."""

    def begin(self):
        self.fetches = {t.name: t.export() for t in graphmod.tables()}
        self.fetches["head"] = [v for v in tf1.global_variables() if v.op.name == "head"][0]

    def after_create_session(self, session, coord):
        self.state = session.run(self.fetches)


def by_key(rows):
    order = np.argsort(rows["keys"])
    return rows["keys"][order], rows["values"][order]


def test_a_model_starts_from_two_sources_with_renamed_tables(tmp_path):
    dense_dir, table_dir, target_dir = tmp_path / "dense", tmp_path / "tables", tmp_path / "new"
    tf.estimator.Estimator(make_model_fn("user_emb", "side_emb"), str(dense_dir)).train(
        input_fn, steps=5)
    tf.estimator.Estimator(make_model_fn("other_emb", "item_emb"), str(table_dir)).train(
        input_fn, steps=5, hooks=[graphmod.GraphModifierHook(min_rows=10)])
    dense = tf.train.load_checkpoint(str(dense_dir))
    tables = tf.train.load_checkpoint(str(table_dir))
    assert tables.has_tensor("item_emb-keys") and not tables.has_tensor("item_emb")

    settings = graphmod.WarmStartSettings(
        sources=[str(dense_dir), str(table_dir)], mapping={"u": "user_emb", "i": "item_emb"},
        key_filter=lambda target, keys: keys % 2 == 0 if target == "u" else keys >= 0)
    target = tf.estimator.Estimator(make_model_fn("u", "i"), str(target_dir))
    hook, started = graphmod.GraphModifierHook(min_rows=10, warm_start=settings), Started()
    target.train(input_fn, steps=3, hooks=[hook, started])
    assert hook.report.warm_started == ["i", "u", "head"]
    keys, values = by_key(started.state["u"])  # the dense source's rows, even keys only
    np.testing.assert_array_equal(keys, np.arange(0, VOCAB, 2))
    np.testing.assert_array_equal(values, dense.get_tensor("user_emb")[::2])
    keys, values = by_key(started.state["i"])  # the graphmod source's table
    want_keys, want_values = by_key({"keys": tables.get_tensor("item_emb-keys"),
                                     "values": tables.get_tensor("item_emb-values")})
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(started.state["head"], dense.get_tensor("head"))
    # The Estimator's first checkpoint (step 0) already holds the warm start,
    # so a crash before the next save restarts from it.
    first = tf.train.load_checkpoint(str(target_dir / "model.ckpt-0"))
    np.testing.assert_array_equal(np.sort(first.get_tensor("u-keys")), np.arange(0, VOCAB, 2))
    np.testing.assert_array_equal(first.get_tensor("head"), dense.get_tensor("head"))

    # A restart resumes from the model's own checkpoint: nothing warm-starts.
    hook, restarted = graphmod.GraphModifierHook(min_rows=10, warm_start=settings), Started()
    target.train(input_fn, steps=1, hooks=[hook, restarted])
    assert hook.report.warm_started == []
    own = tf.train.load_checkpoint(str(target_dir))
    assert not np.array_equal(restarted.state["head"], dense.get_tensor("head"))
    assert own.get_tensor("global_step") == 4


def test_mapping_errors_name_what_is_wrong(tmp_path):
    source = tmp_path / "source"
    tf.estimator.Estimator(make_model_fn("user_emb", "item_emb"), str(source)).train(
        input_fn, steps=1)
    for mapping, message in (({"u": "nowhere"}, "no source holds 'nowhere'"),
                             ({"missing": "user_emb"}, "mapping names missing")):
        hook = graphmod.GraphModifierHook(min_rows=10, warm_start=graphmod.WarmStartSettings(
            sources=[str(source)], mapping=mapping))
        with pytest.raises(RuntimeError, match=message):  # the rewrite failed, undone
            tf.estimator.Estimator(make_model_fn("u", "i"), str(tmp_path / message[:8])).train(
                input_fn, steps=1, hooks=[hook])
    with pytest.raises(ValueError, match="sources must be"):
        graphmod.WarmStartSettings(sources=str(source))
