"""Freshness benchmark: from a delta's commit to its servable TF Serving version.

A training process (an Estimator, one hashed string feature whose table
grows by --keys-per-step new keys a step, dim 16, Adagrad) writes a full
checkpoint every --full-every steps and a delta every --delta-every steps.
This process watches its model_dir as `graphmod export --watch` does
(graphmod.checkpoint.serving_versions.export_new_version, polling every
--poll-secs) and writes a portable version after each new state. Per version:
the seconds from the state's commit (the delta manifest's or the checkpoint
index's mtime) to the version renamed into place, the export's wall and
process CPU seconds (merge of checkpoint + deltas, then conversion), the
table's rows, the version's bytes. Figures are medians (min-max) over the
versions; the training shares the 2 cores with the watcher, as a sidecar
watcher would. No peer publishes this figure: Monolith syncs sparse
parameters to serving "every few minutes", DeepRec's Processor loads
incremental checkpoints at its own polling interval.

Usage: python benchmarks/serving_freshness.py [--keys-per-step 25000] [--steps 80]
                                              [--json benchmarks/results/serving_freshness.json]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import Meter, machine, spread, write_json  # noqa: E402

MODEL = textwrap.dedent("""
    import tensorflow as tf
    tf1 = tf.compat.v1

    def model_fn(features, labels, mode):
        column = tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_hash_bucket("s", 1000), 16)
        net = tf1.feature_column.input_layer(features, [column])
        logits = tf.squeeze(tf1.layers.dense(net, 1), 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        train = tf1.train.AdagradOptimizer(0.05).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def input_fn(keys_per_step):
        def batch(i):
            ids = i * keys_per_step + tf.range(keys_per_step, dtype=tf.int64)
            s = tf.strings.as_string(ids)  # every step's keys are new
            return {"s": s}, tf.cast(ids % 2, tf.float32)
        return tf.data.Dataset.range(1 << 30).map(batch)

    def receiver():
        s = tf1.placeholder(tf.string, [None], name="s")
        return tf.estimator.export.ServingInputReceiver({"s": s}, {"s": s})
""")

TRAIN = MODEL + textwrap.dedent("""
    import sys
    import graphmod
    model_dir, steps, keys, full_every, delta_every = sys.argv[1], *map(int, sys.argv[2:6])
    config = tf.estimator.RunConfig(save_checkpoints_steps=full_every, keep_checkpoint_max=3)
    est = tf.estimator.Estimator(model_fn, model_dir=model_dir, config=config)
    est.train(lambda: input_fn(keys), steps=steps,
              hooks=[graphmod.GraphModifierHook(incremental_every_steps=delta_every)])
""")


def template(root: str) -> str:
    """graphmod's SavedModel of the model (trained one step): the graph."""
    import tensorflow as tf
    import graphmod
    scope = {}
    exec(MODEL, scope)  # pylint: disable=exec-used
    est = tf.estimator.Estimator(scope["model_fn"], os.path.join(root, "template_model"))
    est.train(lambda: scope["input_fn"](10), steps=1, hooks=[graphmod.GraphModifierHook()])
    return graphmod.export_saved_model(est, scope["receiver"],
                                       os.path.join(root, "template")).decode()


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys-per-step", type=int, default=25_000)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--full-every", type=int, default=40)
    ap.add_argument("--delta-every", type=int, default=4)
    ap.add_argument("--poll-secs", type=float, default=0.2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from graphmod.checkpoint import serving_versions
    root = tempfile.mkdtemp(prefix="graphmod-freshness-")
    trainer = None
    try:
        source = template(root)
        model_dir, base = os.path.join(root, "model"), os.path.join(root, "serving")
        trainer = subprocess.Popen(
            [sys.executable, "-c", TRAIN, model_dir, str(args.steps), str(args.keys_per_step),
             str(args.full_every), str(args.delta_every)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        rows = []
        while True:
            finished = trainer.poll() is not None
            try:
                with Meter() as m:
                    report = serving_versions.export_new_version(source, model_dir, base, keep=3)
            except serving_versions.merged.NoCheckpoint:
                report = None
            if report is not None:
                version = os.path.join(base, str(report["step"]))
                rows.append(dict(step=report["step"], deltas=report["deltas"],
                                 rows=sum(t["rows"] for t in report["tables"]),
                                 seconds_from_commit=report["seconds_from_commit"],
                                 export_wall=m.wall, export_cpu=m.cpu, bytes=du(version)))
                print(f"version {report['step']:>5}: {rows[-1]['rows']:>9,} rows, "
                      f"{report['deltas']} deltas, commit->servable "
                      f"{report['seconds_from_commit']:.2f} s, export {m.wall:.2f} s wall "
                      f"{m.cpu:.2f} s CPU, {rows[-1]['bytes'] / 1e6:.1f} MB", flush=True)
            elif finished:
                break
            else:
                time.sleep(args.poll_secs)
        if trainer.returncode != 0:
            raise SystemExit(trainer.stderr.read()[-3000:])
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        shutil.rmtree(root, ignore_errors=True)
    if not rows:
        raise SystemExit("no version was written")
    col = {k: [r[k] for r in rows] for k in rows[0]}
    per_m = [w / (r / 1e6) for w, r in zip(col["export_wall"], col["rows"])]
    print(f"\n{len(rows)} versions, tables up to {max(col['rows']):,} rows (dim 16), "
          f"poll {args.poll_secs} s, {machine()}")
    print(f"  commit -> servable    {spread(col['seconds_from_commit'])} s")
    print(f"  export wall           {spread(col['export_wall'])} s")
    print(f"  export process CPU    {spread(col['export_cpu'])} s")
    print(f"  export wall per 1M rows {spread(per_m)} s")
    print(f"  version bytes per row {spread([b / r for b, r in zip(col['bytes'], col['rows'])])}"
          f" (keys + rows: {8 + 4 * 16})")
    if args.json:
        write_json(args.json, dict(machine=machine(), args=vars(args), versions=rows))


if __name__ == "__main__":
    main()
