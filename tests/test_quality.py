"""Model quality with the hook: where hash buckets collide, collision-free
tables learn what the bucketed variable cannot; where nothing collides, the
hook matches the unmodified model."""
import os
import sys
import numpy as np
import pytest
import tensorflow as tf

import graphmod
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import synthetic as data  # noqa: E402 (examples/synthetic.py: the demos' data)

tf1 = tf.compat.v1
pytestmark = pytest.mark.slow

RNG = np.random.default_rng(11)
WORDS = np.array([f"item{i}".encode() for i in range(6000)])
WEIGHT = RNG.normal(0, 2.0, len(WORDS))  # each item's own effect on the click


def make(n, seed):
    r = np.random.default_rng(seed)
    idx = np.minimum(r.zipf(1.1, n), len(WORDS)) - 1
    p = 1 / (1 + np.exp(-WEIGHT[idx]))
    return {"item": WORDS[idx].reshape(-1, 1)}, (r.random(n) < p).astype(np.int64).reshape(-1, 1)


TRAIN, EVAL = make(60_000, 1), make(20_000, 2)


def auc_of(buckets, with_hook, tmp_path):
    column = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket("item", buckets), 8)
    est = tf.estimator.DNNClassifier(
        [16], [column], model_dir=str(tmp_path / f"{buckets}_{with_hook}"),
        optimizer=lambda: tf.keras.optimizers.legacy.Adagrad(0.3),
        config=tf.estimator.RunConfig(tf_random_seed=3))
    hooks = lambda: [graphmod.GraphModifierHook(min_rows=100)] if with_hook else []  # noqa: E731
    est.train(lambda: tf.data.Dataset.from_tensor_slices(TRAIN).shuffle(60_000, seed=0)
              .repeat(3).batch(256), hooks=hooks())
    return est.evaluate(lambda: tf.data.Dataset.from_tensor_slices(EVAL).batch(4096),
                        hooks=hooks())["auc"]


def test_collision_free_tables_beat_colliding_buckets(tmp_path):
    plain, hooked = auc_of(100, False, tmp_path), auc_of(100, True, tmp_path)
    bayes = data.auc(EVAL[1][:, 0], WEIGHT[[int(w[4:]) for w in EVAL[0]["item"][:, 0]]])
    print(f"100 buckets for 6000 items: plain AUC {plain:.4f}, hook {hooked:.4f}, best {bayes:.4f}")
    assert hooked > plain + 0.01


def test_without_collisions_the_hook_matches_the_unmodified_model(tmp_path):
    plain, hooked = auc_of(1_000_000, False, tmp_path), auc_of(1_000_000, True, tmp_path)
    print(f"1M buckets: plain AUC {plain:.4f}, hook {hooked:.4f}")
    assert abs(hooked - plain) < 0.01
