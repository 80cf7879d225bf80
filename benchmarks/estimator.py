"""Estimator benchmark: a DeepFM-shaped model_fn unmodified, with graphmod's
hook, and written against TFRA, trained alternately in one process.

The workload is the project's reference (shared/bench/estimator_peers.py): FM +
128-64 DNN + linear term, 8 categorical features of 120k ids, dim 16, 4 dense,
Adagrad, batch 1024. Prints median examples/s of each (and the ratios), and
the time GraphModifierHook.begin() takes on a model with 200 embedding columns.

Usage: python benchmarks/estimator.py [--steps 150] [--json out.json]
"""
import argparse
import json
import os
import platform
import tempfile
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
N_CAT, N_DENSE, VOCAB, B, D = 8, 4, 120_000, 1024, 16


def make_data(n, seed):
    """A small CTR task whose label comes from per-id weights."""
    w = np.random.default_rng(1234).normal(0, 1.0, size=(N_CAT, VOCAB)).astype(np.float32)
    r = np.random.default_rng(seed)
    ids = np.minimum(r.zipf(1.2, size=(n, N_CAT)), VOCAB) - 1
    dense = r.normal(0, 1, size=(n, N_DENSE)).astype(np.float32)
    logit = w[np.arange(N_CAT)[None, :], ids].sum(1) * 0.6
    y = (r.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32).reshape(-1, 1)
    feats = {f"C{f}": ids[:, f:f + 1].astype(np.int64) for f in range(N_CAT)}
    feats.update({f"I{d}": dense[:, d:d + 1] for d in range(N_DENSE)})
    return feats, y


def make_model_fn(kind):
    def model_fn(features, labels, mode):
        ids = tf.concat([features[f"C{f}"] for f in range(N_CAT)], 1)  # [B, F]
        if kind == "tfra":
            import tensorflow_recommenders_addons as tfra
            de = tfra.dynamic_embedding
            emb = de.get_variable("emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=D,
                                  initializer=tf1.random_normal_initializer(stddev=0.01))
            w1 = de.get_variable("w1", key_dtype=tf.int64, value_dtype=tf.float32, dim=1,
                                 initializer=tf1.zeros_initializer())
            keys = ids * N_CAT + tf.range(N_CAT, dtype=tf.int64)
            e = de.embedding_lookup(emb, keys)
            lin = tf.reduce_sum(de.embedding_lookup(w1, keys), [1, 2])
            opt = de.DynamicEmbeddingOptimizer(tf1.train.AdagradOptimizer(0.05))
        else:  # the plain model: "hook" trains this same graph with GraphModifierHook
            emb = tf1.get_variable("emb", [N_CAT * VOCAB, D],
                                   initializer=tf1.random_normal_initializer(stddev=0.01))
            w1 = tf1.get_variable("w1", [N_CAT * VOCAB, 1], initializer=tf1.zeros_initializer())
            off = tf.constant(np.arange(N_CAT, dtype=np.int64) * VOCAB)
            e = tf.nn.embedding_lookup(emb, ids + off)
            lin = tf.reduce_sum(tf.nn.embedding_lookup(w1, ids + off), [1, 2])
            opt = tf1.train.AdagradOptimizer(0.05)
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(e, 1)) - tf.reduce_sum(tf.square(e), 1), 1)
        dense = tf.concat([features[f"I{d}"] for d in range(N_DENSE)], 1)
        h = tf1.layers.dense(tf.concat([tf.reshape(e, [-1, N_CAT * D]), dense], 1), 128, tf.nn.relu)
        h = tf1.layers.dense(h, 64, tf.nn.relu)
        logits = tf.squeeze(tf1.layers.dense(h, 1), 1) + fm + lin
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.squeeze(labels, 1), logits=logits))
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()))
    return model_fn


class Timer(tf1.train.SessionRunHook):
    def __init__(self):
        self.t = []

    def before_run(self, ctx):
        self.t0 = time.perf_counter()

    def after_run(self, ctx, values):
        self.t.append(time.perf_counter() - self.t0)


def begin_time_with_columns(n_columns=200):
    """Seconds GraphModifierHook.begin() takes on a model with n embedding columns."""
    import graphmod
    with tf.Graph().as_default():
        step = tf1.train.get_or_create_global_step()
        ids = tf1.placeholder(tf.int64, [None, n_columns])
        parts = []
        for c in range(n_columns):
            v = tf1.get_variable(f"emb_{c}", [20_000, 8])
            parts.append(tf.nn.embedding_lookup(v, ids[:, c]))
        loss = tf.reduce_sum(tf1.layers.dense(tf.concat(parts, 1), 1))
        tf1.train.AdagradOptimizer(0.05).minimize(loss, step)
        hook = graphmod.GraphModifierHook()
        t = time.perf_counter()
        hook.begin()
        elapsed = time.perf_counter() - t
        assert len(hook.report.tables) == n_columns, hook.report.skipped[:3]
        return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--json")
    args = ap.parse_args()
    import graphmod
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    feats, y = make_data(200_000, seed=1)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((feats, y)).batch(B).repeat().prefetch(2)

    res = {}
    for kind in ["static", "hook", "tfra", "static", "hook", "tfra"]:
        est = tf.estimator.Estimator(
            make_model_fn("tfra" if kind == "tfra" else "static"), model_dir=tempfile.mkdtemp(),
            config=tf.estimator.RunConfig(save_checkpoints_steps=10**9, log_step_count_steps=10**9))
        timer = Timer()
        hooks = [timer] + ([graphmod.GraphModifierHook()] if kind == "hook" else [])
        est.train(input_fn, steps=args.steps, hooks=hooks)
        res.setdefault(kind, []).append(B / np.median(timer.t[30:]))
        print(f"  {kind:7s} {res[kind][-1]:9.0f} examples/s", flush=True)
    med = {k: float(np.median(v)) for k, v in res.items()}
    begin_s = begin_time_with_columns()
    print(f"DeepFM-shaped Estimator, median examples/s (2 runs each, {args.steps} steps):")
    for k in ("static", "hook", "tfra"):
        print(f"  {k:7s} {med[k]:9.0f}   runs {[round(x) for x in res[k]]}")
    print(f"hook / unmodified {med['hook'] / med['static']:.2f}x, hook / TFRA "
          f"{med['hook'] / med['tfra']:.2f}x; begin() on 200 embedding columns: {begin_s:.2f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(examples_per_s=med, runs=res, begin_seconds_200_columns=begin_s,
                           machine=f"{platform.machine()} {os.cpu_count()} cpus",
                           date=time.strftime("%Y-%m-%d")), f, indent=1)


if __name__ == "__main__":
    main()
