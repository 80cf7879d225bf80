"""Which rank owns a key.

A key's owner is its hash's range: the 64-bit hash space is cut into `size`
equal ranges and rank r owns the r-th. Ranges, not `hash % size`, so that a
checkpoint written by N ranks can be read on M by each new rank reading only
the old ranks whose ranges overlap its own. The hash (a multiply-xorshift
mix) spreads sequential ids and ids sharing low bits alike, and differs from
the one the table uses inside a rank to pick its shard.
"""
import tensorflow as tf

_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd


def owner_of(keys: tf.Tensor, size: int) -> tf.Tensor:
    """The owner rank (int32, in [0, size)) of each int64 key."""
    if size < 1:
        raise ValueError(f"graphmod: a key's owner needs size >= 1 ranks, got {size}")
    if size == 1:
        return tf.zeros_like(keys, tf.int32)
    h = tf.bitcast(tf.convert_to_tensor(keys, tf.int64), tf.uint64)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(31, tf.uint64)))
    h = h * tf.constant(_MIX, tf.uint64)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(29, tf.uint64)))
    # The top 32 bits times size, over 2^32: the range h falls in.
    top = tf.bitwise.right_shift(h, tf.constant(32, tf.uint64))
    return tf.cast(tf.bitwise.right_shift(top * tf.constant(size, tf.uint64),
                                          tf.constant(32, tf.uint64)), tf.int32)


def owned_by(keys: tf.Tensor, rank: int, size: int) -> tf.Tensor:
    """Whether rank `rank` of `size` owns each key (bool, keys' shape)."""
    return tf.equal(owner_of(keys, size), rank)


def owner_of_numpy(keys, size: int):
    """owner_of in numpy (int32 owners of int64 keys), for host code."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    h = np.asarray(keys, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(31))
        h = h * np.uint64(_MIX)
        h = h ^ (h >> np.uint64(29))
        return (((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32)).astype(np.int32)
