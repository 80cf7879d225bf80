"""A table's initial row of (key, seed) has one formula in Python
(graphmod.embeddings.initializers.initial_rows), run on numpy and as stock TF
ops (a portable SavedModel's unseen keys): both equal the native op's rows
(native/initializer.cc) bit for bit, for every distribution, many keys and
seeds."""
import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.embeddings.initializers import NUMPY_OPS, initial_rows

tf1 = tf.compat.v1
RNG = np.random.default_rng(3)
KEYS = np.concatenate([RNG.integers(-2**63, 2**63 - 1, 3000, dtype=np.int64),
                       np.arange(-50, 50), [-2**63, 2**63 - 1]]).astype(np.int64)
SEEDS = [0, 1, 987654321, -7, 2**63 - 1, -2**63]


@pytest.mark.parametrize("kind,a,b", [("uniform", -0.3, 0.7), ("normal", 0.25, 0.125),
                                      ("truncated_normal", 0.1, 1.0), ("constant", 0.5, 0.0),
                                      ("zeros", 0.0, 0.0)])
@pytest.mark.parametrize("dim", [1, 33])
def test_native_numpy_and_stock_ops_rows_are_equal_bit_for_bit(kind, a, b, dim):
    a32, b32 = np.float32(a), np.float32(b)
    ab = np.array([a32, b32, b32 - a32])
    with tf.Graph().as_default():
        native, stock = [], []
        for seed in SEEDS:
            table = graphmod.create_table(f"t{len(native)}", dim, seed=seed,
                                          initializer=graphmod.TableInitializer(kind, a, b))
            native.append(graphmod.sparse_lookup(table, tf.constant(KEYS), is_training=False))
            # (a, b, b - a) read from a variable, as the portable export does,
            # so Grappler cannot fold or reorder the float arithmetic.
            variable = tf1.Variable(ab, use_resource=True)
            stock.append(initial_rows(tf.constant(KEYS), kind, seed, dim, variable.read_value()))
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.tables_initializer()])
            native, stock = sess.run([native, stock])
    for seed, theirs, ours in zip(SEEDS, native, stock):
        python = initial_rows(KEYS, kind, seed, dim, ab, NUMPY_OPS)
        assert theirs.shape == ours.shape == python.shape == (len(KEYS), dim)
        assert np.array_equal(theirs.view(np.int32), ours.view(np.int32)), seed
        assert np.array_equal(theirs.view(np.int32), python.view(np.int32)), seed
    if kind not in ("zeros", "constant"):  # the seed and the key change the row
        assert not np.array_equal(native[0], native[1])
        assert len({row.tobytes() for row in native[0]}) == (len(KEYS) if dim > 1 else
                                                              pytest.approx(len(KEYS), abs=5))


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown initializer kind 'gamma'"):
        initial_rows(KEYS, "gamma", 0, 4, np.zeros(3, np.float32), NUMPY_OPS)
