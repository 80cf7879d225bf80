"""Estimator benchmark: models unmodified, with graphmod's hook, and written
against TFRA, trained in interleaved rounds in one process.

Workloads:
  reference  the project's reference (shared/bench/estimator_peers.py): FM +
             128-64 DNN + linear term, 8 categorical features of 120k ids in
             one embedding variable, dim 16, 4 dense, Adagrad, batch 1024
  criteo26   Criteo-shaped DeepFM as DeepCTR builds it: 26 categorical
             features, each with its own embedding variable (dim 16) and its
             own linear weight (dim 1), Criteo's cardinalities capped at 200k,
             13 dense features, 256-128 DNN, Ftrl for the linear part and
             Adagrad for the rest (DeepCTR's defaults), batch 1024
  deepctr26  the same data through DeepCTR's own DeepFMEstimator, as its
             users build it: feature columns (identity columns of Criteo's
             capped cardinalities, embedding_column dim 16, numeric columns),
             DeepCTR's defaults (DNN 256-128-64, l2_reg_linear and
             l2_reg_embedding 1e-5, Ftrl linear, Adagrad DNN). Unmodified and
             hook only: a TFRA model is a different model_fn, not DeepCTR's.
Each round trains every (workload, variant) once, in turn; figures are the
median examples/s of a run's steps after warm-up and the process CPU-seconds
per million examples over those steps, reported as median (min-max) over the
rounds, with ratios taken within each round (see benchmarks/rounds.py). Also
prints the time GraphModifierHook.begin() takes on 200 embedding columns.

Usage: python benchmarks/estimator.py [--steps 150] [--rounds 3]
                                      [--workloads reference,criteo26] [--json out.json]
"""
import argparse
import os
import tempfile
import time

import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, ratio_per_round, spread, write_json  # noqa: E402

tf1 = tf.compat.v1
N_CAT, N_DENSE, VOCAB, B, D = 8, 4, 120_000, 1024, 16
# Criteo (Kaggle display advertising) cardinalities of C1..C26, capped at 200k.
CRITEO_CARD = [min(c, 200_000) for c in (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)]
N_CRITEO_DENSE = 13


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


def make_criteo_data(n, seed):
    """Criteo-shaped features C1..C26 (Zipf ids below each cardinality) and
    I1..I13, with a label from per-id weights of every feature."""
    r = np.random.default_rng(seed)
    weights = [np.random.default_rng(100 + f).normal(0, 0.5, c).astype(np.float32)
               for f, c in enumerate(CRITEO_CARD)]
    feats, logit = {}, np.zeros(n, np.float32)
    for f, c in enumerate(CRITEO_CARD):
        ids = np.minimum(r.zipf(1.2, size=n), c) - 1
        feats[f"C{f + 1}"] = ids[:, None].astype(np.int64)
        logit += weights[f][ids]
    for d in range(N_CRITEO_DENSE):
        feats[f"I{d + 1}"] = r.normal(0, 1, size=(n, 1)).astype(np.float32)
    y = (r.random(n) < 1 / (1 + np.exp(-0.4 * logit))).astype(np.float32).reshape(-1, 1)
    return feats, y


def make_criteo_model_fn(kind):
    """DeepFM as DeepCTR writes it: per feature an embedding variable and a
    linear weight; Ftrl trains the linear part, Adagrad the rest."""
    def model_fn(features, labels, mode):
        embs, linear, linear_vars = [], [], []
        for f, card in enumerate(CRITEO_CARD):
            ids = features[f"C{f + 1}"]  # [B, 1]
            if kind == "tfra":
                import tensorflow_recommenders_addons as tfra
                de = tfra.dynamic_embedding
                e_var = de.get_variable(f"sparse_emb_C{f + 1}", key_dtype=tf.int64,
                                        value_dtype=tf.float32, dim=D,
                                        initializer=tf1.random_normal_initializer(stddev=1e-4))
                w_var = de.get_variable(f"linear_emb_C{f + 1}", key_dtype=tf.int64,
                                        value_dtype=tf.float32, dim=1,
                                        initializer=tf1.zeros_initializer())
                e = de.embedding_lookup(e_var, ids, name=f"sparse_emb_lookup_C{f + 1}")
                w = de.embedding_lookup(w_var, ids, name=f"linear_emb_lookup_C{f + 1}")
            else:
                e_var = tf1.get_variable(f"sparse_emb_C{f + 1}", [card, D],
                                         initializer=tf1.random_normal_initializer(stddev=1e-4))
                w_var = tf1.get_variable(f"linear_emb_C{f + 1}", [card, 1],
                                         initializer=tf1.zeros_initializer())
                e = tf.nn.embedding_lookup(e_var, ids)
                w = tf.nn.embedding_lookup(w_var, ids)
            embs.append(e)        # [B, 1, D]
            linear.append(w)      # [B, 1, 1]
        e = tf.concat(embs, 1)    # [B, 26, D]
        lin = tf.reduce_sum(tf.concat(linear, 1), [1, 2])
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(e, 1)) - tf.reduce_sum(tf.square(e), 1), 1)
        dense = tf.concat([features[f"I{d + 1}"] for d in range(N_CRITEO_DENSE)], 1)
        h = tf.concat([tf.reshape(e, [-1, len(CRITEO_CARD) * D]), dense], 1)
        for units in (256, 128):
            h = tf1.layers.dense(h, units, tf.nn.relu)
        logits = tf.squeeze(tf1.layers.dense(h, 1), 1) + fm + lin
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.squeeze(labels, 1), logits=logits))
        trainable = tf1.trainable_variables()
        linear_vars = [v for v in trainable if "linear_emb" in v.name]
        other_vars = [v for v in trainable if "linear_emb" not in v.name]
        ftrl, adagrad = tf1.train.FtrlOptimizer(0.05), tf1.train.AdagradOptimizer(0.05)
        if kind == "tfra":
            de = tfra.dynamic_embedding
            ftrl = de.DynamicEmbeddingOptimizer(ftrl)
            adagrad = de.DynamicEmbeddingOptimizer(adagrad)
        train_op = tf.group(ftrl.minimize(loss, var_list=linear_vars),
                            adagrad.minimize(loss, tf1.train.get_global_step(),
                                             var_list=other_vars))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


def make_deepctr_estimator(kind, model_dir, config):
    """DeepCTR's DeepFMEstimator over Criteo-shaped feature columns."""
    from deepctr.estimator import DeepFMEstimator
    assert kind == "static", "deepctr26 has no TFRA variant"
    fc = tf1.feature_column
    sparse = [fc.categorical_column_with_identity(f"C{f + 1}", card)
              for f, card in enumerate(CRITEO_CARD)]
    dense = [fc.numeric_column(f"I{d + 1}") for d in range(N_CRITEO_DENSE)]
    return DeepFMEstimator(sparse + dense, [fc.embedding_column(c, D) for c in sparse] + dense,
                           model_dir=model_dir, config=config)


def make_model_fn(kind, wrap_optimizer=None):
    """wrap_optimizer: applied to the optimizer (benchmarks/horovod.py passes
    hvd.DistributedOptimizer)."""
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
        tf1.add_to_collection("benchmark_keys", ids)
        if wrap_optimizer is not None:
            opt = wrap_optimizer(opt)
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()))
    return model_fn


class Timer(tf1.train.SessionRunHook):
    """Wall time of each step, and the process's CPU time from step `warm` on."""

    def __init__(self, warm):
        self.t, self.warm = [], warm

    def before_run(self, ctx):
        if len(self.t) == self.warm:
            self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()

    def after_run(self, ctx, values):
        self.t.append(time.perf_counter() - self.t0)
        self.cpu = time.process_time() - getattr(self, "cpu0", time.process_time())


def begin_time_with_columns(n_columns=200):
    """Seconds GraphModifierHook.begin() takes on a model with n embedding
    columns (the median of three graphs)."""
    return float(np.median([_begin_time(n_columns) for _ in range(3)]))


def _begin_time(n_columns):
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


def _estimator_of(make_model_fn):
    def make(kind, model_dir, config):
        return tf.estimator.Estimator(make_model_fn(kind), model_dir=model_dir, config=config)
    return make


# workload -> (data, estimator factory, variants)
WORKLOADS = {"reference": (make_data, _estimator_of(make_model_fn), ("static", "hook", "tfra")),
             "criteo26": (make_criteo_data, _estimator_of(make_criteo_model_fn),
                          ("static", "hook", "tfra")),
             "deepctr26": (make_criteo_data, make_deepctr_estimator, ("static", "hook"))}


def run_once(workload, kind, data, steps, warm):
    """(median examples/s after warm-up, process CPU-seconds per M examples)."""
    import graphmod
    feats, y = data

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((feats, y)).batch(B).repeat().prefetch(2)

    timer = Timer(warm)
    hooks = [timer] + ([graphmod.GraphModifierHook()] if kind == "hook" else [])
    # Each run's checkpoints (about 1 GB for the reference model) go with it.
    with tempfile.TemporaryDirectory(prefix="graphmod_bench_") as model_dir:
        est = WORKLOADS[workload][1](
            "tfra" if kind == "tfra" else "static", model_dir,
            tf.estimator.RunConfig(save_checkpoints_steps=10**9, log_step_count_steps=10**9))
        est.train(input_fn, steps=steps, hooks=hooks)
    timed = steps - warm
    return B / np.median(timer.t[warm:]), timer.cpu / (timed * B / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="reference,criteo26,deepctr26")
    ap.add_argument("--json")
    args = ap.parse_args()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    workloads = args.workloads.split(",")
    made = {}  # criteo26 and deepctr26 share their data
    for w in workloads:
        make_data_fn = WORKLOADS[w][0]
        made.setdefault(make_data_fn, make_data_fn(200_000, seed=1))
    data = {w: made[WORKLOADS[w][0]] for w in workloads}
    warm = min(30, args.steps // 3)
    rate = {(w, k): [] for w in workloads for k in WORKLOADS[w][2]}
    cpu = {(w, k): [] for w in workloads for k in WORKLOADS[w][2]}
    for r in range(args.rounds):
        for w in workloads:
            for k in WORKLOADS[w][2]:
                x, c = run_once(w, k, data[w], args.steps, warm)
                rate[w, k].append(x)
                cpu[w, k].append(c)
                print(f"  round {r + 1} {w:9s} {k:6s} {x:9.0f} examples/s  "
                      f"{c:6.2f} CPU-s/M examples", flush=True)
    begin_s = begin_time_with_columns()
    print(f"\nmedian (min-max) over {args.rounds} interleaved rounds, {args.steps} steps each, "
          f"timed after {warm}:")
    out = {}
    for w in workloads:
        variants = WORKLOADS[w][2]
        print(f"{w}:")
        for k in variants:
            print(f"  {k:7s} {spread(rate[w, k], '{:.0f}'):>24s} examples/s   "
                  f"{spread(cpu[w, k], '{:.2f}')} CPU-s/M examples")
        hs = float(np.median(ratio_per_round(rate[w, "hook"], rate[w, "static"])))
        cs = float(np.median(ratio_per_round(cpu[w, "static"], cpu[w, "hook"])))
        ht = (float(np.median(ratio_per_round(rate[w, "hook"], rate[w, "tfra"])))
              if "tfra" in variants else None)
        print(f"  hook / unmodified {hs:.2f}x"
              + (f", hook / TFRA {ht:.2f}x" if ht is not None else "")
              + f" (examples/s); unmodified / hook CPU per example {cs:.2f}x")
        out[w] = dict(examples_per_s={k: rate[w, k] for k in variants},
                      cpu_s_per_m_examples={k: cpu[w, k] for k in variants},
                      hook_over_unmodified=hs, hook_over_tfra=ht, cpu_unmodified_over_hook=cs)
    print(f"begin() on 200 embedding columns: {begin_s:.2f} s")
    if args.json:
        write_json(args.json, dict(workloads=out, begin_seconds_200_columns=begin_s,
                                   machine=machine(), date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
