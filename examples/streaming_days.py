"""Streaming training over simulated days with feature admission and eviction.

An unchanged Estimator model_fn (tf.Variable embeddings, ids folded by
`ids % vocab`) trains day after day on a drifting synthetic stream whose rows
carry a `timestamp` feature: popular ids change from day to day, so yesterday's
ids go stale. GraphModifierHook turns the embeddings into tables and, with

    tables={"*": dict(access_threshold=2, eviction_threshold=2 * 86400)},
    timestamp_feature="timestamp", evict_step_interval=...

gives an id a row on its 2nd sighting and drops rows not seen for two
simulated days (by the data's timestamps). The same model also trains with the
hook alone (no admission, no eviction). After each day both are evaluated on
the next day; the table rows each checkpoint holds are printed side by side.

    python examples/streaming_days.py [--days 6] [--rows_per_day 60000]
"""
import argparse
import tempfile

import tensorflow as tf
from absl import logging

import graphmod
import synthetic as data

tf1 = tf.compat.v1
DAY = 86400
VOCAB, DIM, BATCH = 20_000, 8, 512


def config(days: int, rows_per_day: int) -> data.SyntheticCriteo:
    return data.SyntheticCriteo(n_dense=4, n_categorical=4, seed=5, with_timestamp=True,
                                days=days + 1, rows_per_day=rows_per_day, drift=0.1,
                                vocab_sizes=(400_000, 200_000, 50_000, 5_000))


def make_model_fn(cfg: data.SyntheticCriteo):
    def model_fn(features, labels, mode):
        """Plain TF1: nothing here knows about graphmod, days or timestamps."""
        embs = []
        for name in cfg.categorical_names:
            var = tf1.get_variable(f"{name}_embedding", [VOCAB, DIM],
                                   initializer=tf1.truncated_normal_initializer(stddev=0.05))
            embs.append(tf.nn.embedding_lookup(var, features[name][:, 0] % VOCAB))
        dense = tf.concat([features[n] for n in cfg.dense_names], 1)
        h = tf1.layers.dense(tf.concat(embs + [dense], 1), 32, tf.nn.relu)
        logits = tf.squeeze(tf1.layers.dense(h, 1), 1)
        probability = tf.sigmoid(logits)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"probability": probability})
        y = tf.squeeze(labels, 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
        train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                          eval_metric_ops={"auc": tf1.metrics.auc(y, probability)})
    return model_fn


def table_rows(model_dir: str) -> int:
    """Rows of all tables in the latest checkpoint."""
    return sum(shape[0] for name, shape in tf.train.list_variables(model_dir)
               if name.endswith("-keys"))


def run(admission_eviction: bool, days: int = 6, rows_per_day: int = 60_000) -> dict:
    """Trains day by day; returns {"history": [{day, rows, auc}] (auc on the
    next day), "model_dir": ...}."""
    cfg = config(days, rows_per_day)
    est = tf.estimator.Estimator(make_model_fn(cfg), model_dir=tempfile.mkdtemp(
        prefix="graphmod_streaming_"))
    settings = dict(tables={"*": dict(access_threshold=2, eviction_threshold=2 * DAY)},
                    timestamp_feature="timestamp",
                    evict_time_interval=None, evict_step_interval=rows_per_day // BATCH // 4)
    hook = lambda: graphmod.GraphModifierHook(  # noqa: E731
        min_rows=1000, **(settings if admission_eviction else {}))
    history = []
    for day in range(days):
        est.train(data.input_fn(cfg, BATCH, rows_per_day, start=day * rows_per_day),
                  hooks=[hook()])
        metrics = est.evaluate(data.input_fn(cfg, 4096, rows_per_day // 4,
                                             start=(day + 1) * rows_per_day), hooks=[hook()])
        history.append(dict(day=day + 1, rows=table_rows(est.model_dir), auc=metrics["auc"]))
        logging.info("day %d: %s", day + 1, history[-1])
    return dict(history=history, model_dir=est.model_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=6)
    ap.add_argument("--rows_per_day", type=int, default=60_000)
    args = ap.parse_args()
    logging.set_verbosity(logging.INFO)
    tf1.logging.set_verbosity(tf1.logging.WARN)
    plain = run(False, args.days, args.rows_per_day)["history"]
    bounded = run(True, args.days, args.rows_per_day)["history"]
    print("=" * 72)
    print(f"{'day':>4} | {'hook only: rows':>16} {'next-day AUC':>13} | "
          f"{'+ admission & eviction: rows':>29} {'AUC':>7}")
    for p, b in zip(plain, bounded):
        print(f"{p['day']:>4} | {p['rows']:>16,} {p['auc']:>13.4f} | {b['rows']:>29,} "
              f"{b['auc']:>7.4f}")
    print("=" * 72)


if __name__ == "__main__":
    main()
