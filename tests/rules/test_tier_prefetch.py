"""tier_prefetch: a tiered table's keys are prefetched from the tf.data input, one element ahead."""
import numpy as np
import tensorflow as tf

from graphmod.rewrite_rules import table_counters, tier_prefetch
from graphmod.settings import TableSettings

from .helpers import READING_RULES, TRAINING_RULES, apply_rules, settings, tiny_model

tf1 = tf.compat.v1
BATCHES = np.random.default_rng(3).integers(0, 400, (40, 32)).astype(np.int32)


def _model(tmp_path, keys_of=lambda ids: tf.cast(ids, tf.int64) * 2 + 1, prefetch=True):
    """tiny_model over 1000 rows, its ids computed from a dataset iterator's
    elements by keys_of; the table keeps a quarter of its rows in memory."""
    iterator = tf1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(BATCHES))
    element = iterator.get_next()
    model = tiny_model(tf1.train.AdagradOptimizer(0.1), rows=1000, ids=keys_of(element))
    tables = {"emb": TableSettings(memory_budget=0.25, storage_path=str(tmp_path), num_shards=2,
                                   prefetch=prefetch)}
    return iterator, element, model, settings(tables=tables)


def test_the_dataset_prefetches_each_elements_keys_and_elements_pass_unchanged(tmp_path):
    with tf.Graph().as_default() as g:
        iterator, element, model, s = _model(tmp_path)
        make = iterator.initializer
        before = make.inputs[0]
        applied = apply_rules(g, *TRAINING_RULES, table_counters, tier_prefetch,
                              rewrite_settings=s)
        assert applied.reported("prefetch") == {"emb": ""}
        assert {"MapDataset", "PrefetchDataset"} <= set(applied.built_by("tier_prefetch"))
        assert make.inputs[0] is not before  # the iterator reads the prefetching dataset
        counters = applied.reported("counters")["emb"]
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), make])
            for batch in BATCHES:
                got, _ = sess.run([element, model.train])
                np.testing.assert_array_equal(got, batch)
            c = sess.run(counters)
        # Rows went to disk (spills spare the last 16 steps' rows) and came
        # back ahead of their steps: the steps themselves read (almost) nothing.
        assert c["disk_rows"] > 0 and c["prefetched"] > 0, c
        assert c["promoted"] < c["prefetched"], c


def test_keys_computed_with_state_are_not_prefetched_and_the_graph_is_left_alone(tmp_path):
    with tf.Graph().as_default() as g:
        noise = lambda ids: tf.cast(ids, tf.int64) + tf.random.uniform([], 0, 2, tf.int64)  # noqa: E731
        iterator, _, _, s = _model(tmp_path, keys_of=noise)
        before = iterator.initializer.inputs[0]
        applied = apply_rules(g, *TRAINING_RULES, tier_prefetch, rewrite_settings=s)
        why = applied.reported("prefetch")["emb"]
        assert "RandomUniformInt" in why and "input pipeline cannot run" in why, why
        assert iterator.initializer.inputs[0] is before
        assert applied.built_by("tier_prefetch") == []


def test_turned_off_or_not_training_nothing_is_built(tmp_path):
    with tf.Graph().as_default() as g:
        _, _, _, s = _model(tmp_path, prefetch=False)
        applied = apply_rules(g, *TRAINING_RULES, tier_prefetch, rewrite_settings=s)
        assert applied.reported("prefetch") == {"emb": "TableSettings(prefetch=False)"}
        assert applied.built_by("tier_prefetch") == []
    with tf.Graph().as_default() as g:
        _, _, _, s = _model(tmp_path)
        applied = apply_rules(g, *READING_RULES, tier_prefetch, rewrite_settings=s,
                              training=False)
        assert applied.reported("prefetch") == {}
        assert applied.built_by("tier_prefetch") == []
