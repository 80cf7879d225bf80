"""Verify the hook on a model before switching its production training to it.

    python examples/verify_model.py [--steps 20] [--html verify.html]
    graphmod verify --steps 20 --html verify.html examples/verify_model.py:model

`model()` returns what graphmod.verify needs: the Estimator as you build it
for training, a seeded input_fn (both runs must see the same batches) and the
GraphModifierHook with the settings you will train with. The model is
ordinary TF1 code: two embeddings, a dense layer, Adagrad. verify trains it
unmodified and hooked from the same initial rows and compares the loss, and
every converted variable's rows and slots, after each step; the exit status is
0 when they agree (or a difference is one the hook's report states), 1 if not.
"""
import argparse
import sys

import numpy as np
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
USERS, ITEMS, DIM = 5_000, 2_000, 8


def input_fn():
    rng = np.random.default_rng(11)  # seeded: both runs get the same batches
    users = rng.zipf(1.3, 20_000) % USERS
    items = rng.zipf(1.2, 20_000) % ITEMS
    labels = ((users + items) % 4 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        ({"user": users.astype(np.int64), "item": items.astype(np.int64)}, labels)
    ).repeat().batch(256)


def model_fn(features, labels, mode):
    user = tf1.get_variable("user_embedding", [USERS, DIM],
                            initializer=tf1.truncated_normal_initializer(stddev=0.05))
    item = tf1.get_variable("item_embedding", [ITEMS, DIM],
                            initializer=tf1.random_uniform_initializer(-0.05, 0.05))
    e = tf.concat([tf.nn.embedding_lookup(user, features["user"]),
                   tf.nn.embedding_lookup(item, features["item"])], 1)
    logits = tf.squeeze(tf1.layers.dense(tf1.layers.dense(e, 16, tf.nn.relu), 1), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def model():
    """(estimator, input_fn, hook): what `graphmod verify` calls for."""
    estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(tf_random_seed=3))
    return estimator, input_fn, graphmod.GraphModifierHook(min_rows=1_000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--html", help="write the loss curves and differences by step here")
    args = ap.parse_args()
    estimator, fn, hook = model()
    result = graphmod.verify(estimator, fn, steps=args.steps, hook=hook)
    print(result.summary())
    if args.html:
        with open(args.html, "w") as f:
            f.write(result.html())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
