"""Warm-start a new model from two trained ones, with renamed tables.

A user model is trained as plain TensorFlow (dense embedding variable
`user_emb`), an item model with GraphModifierHook and incremental deltas (its
`item_emb` is a graphmod table). A third model, whose embeddings are named
`u` and `i`, starts from both: graphmod.WarmStartSettings maps u <- user_emb
and i <- item_emb, and keeps only the users with an even id. It prints what
was warm-started, the first loss of the new model against that of the same
model started cold, and the rows its tables hold.

Run:  python examples/warm_start_two_sources.py [--model_dir DIR]
"""
import argparse
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
USERS, ITEMS, DIM = 5_000, 20_000, 8


def input_fn(seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, USERS, 50_000)
    item = rng.integers(0, ITEMS, 50_000)
    label = ((user % 7) + (item % 5) > 5).astype(np.float32)  # learnable from either id
    return tf.data.Dataset.from_tensor_slices(
        ({"user": user, "item": item}, label)).repeat().batch(256)


def make_model_fn(user_name, item_name):
    def model_fn(features, labels, mode):
        u = tf1.get_variable(user_name, [USERS, DIM], initializer=tf1.random_normal_initializer(0, 0.05))
        i = tf1.get_variable(item_name, [ITEMS, DIM], initializer=tf1.random_normal_initializer(0, 0.05))
        e = tf.concat([tf.nn.embedding_lookup(u, features["user"]),
                       tf.nn.embedding_lookup(i, features["item"])], 1)
        logits = tf.squeeze(tf1.layers.dense(tf1.layers.dense(e, 16, tf.nn.relu, name="h"), 1,
                                             name="out"), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        tf1.add_to_collection("example_loss", loss)
        train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


class FirstLoss(tf1.train.SessionRunHook):
    """The loss of the first step (before any update)."""

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(tf1.get_collection("example_loss")[0])

    def after_run(self, run_context, run_values):
        self.loss = getattr(self, "loss", float(run_values.results))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_dir", default=os.path.join(tempfile.gettempdir(),
                                                        "graphmod_warm_start"))
    args = ap.parse_args()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    shutil.rmtree(args.model_dir, ignore_errors=True)
    users, items = (os.path.join(args.model_dir, d) for d in ("users", "items"))
    tf.estimator.Estimator(make_model_fn("user_emb", "side_emb"), users).train(
        input_fn, steps=300)
    tf.estimator.Estimator(make_model_fn("other_emb", "item_emb"), items).train(
        input_fn, steps=300, hooks=[graphmod.GraphModifierHook(incremental_every_steps=100)])

    settings = graphmod.WarmStartSettings(
        sources=[users, items], mapping={"u": "user_emb", "i": "item_emb"},
        key_filter=lambda target, keys: keys % 2 == 0 if target == "u" else keys >= 0)
    losses = {}
    for name, warm in (("warm", settings), ("cold", None)):
        hook, first = graphmod.GraphModifierHook(warm_start=warm), FirstLoss()
        est = tf.estimator.Estimator(make_model_fn("u", "i"),
                                     os.path.join(args.model_dir, f"new_{name}"))
        est.train(lambda: input_fn(seed=1), steps=1, hooks=[hook, first])
        losses[name] = first.loss
        if warm is not None:
            print("warm-started:", ", ".join(hook.report.warm_started))
            reader = tf.train.load_checkpoint(est.model_dir)
            for table in ("u", "i"):
                print(f"  table {table}: {len(reader.get_tensor(f'{table}-keys')):,} rows")
    print(f"first loss of the new model: warm-started {losses['warm']:.4f}, "
          f"cold {losses['cold']:.4f}")


if __name__ == "__main__":
    main()
