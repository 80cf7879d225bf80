"""Placement benchmark: 26 tables of 50 to 10M rows on 2 Horovod ranks.

The model: 26 categorical features, each with its own embedding variable
(dim 8), their rows spaced evenly in log from 50 to 10M; ids uniform in each
variable's rows; the 26 rows concatenated into a 64-unit ReLU layer and a
logit; Adagrad under hvd.DistributedOptimizer, batch 1024 per rank from a
tf.data pipeline, hvd.BroadcastGlobalVariablesHook. Three runs, each on 2
ranks in fresh processes:
  dense         the model as written: Horovod allgathers the gradients
  all sharded   GraphModifierHook(min_rows=0, tables={"*": {"placement": "sharded"}})
  planned       GraphModifierHook(min_rows=0): the planner places each
                table (graphmod.horovod.placement)
Per run: examples/s (all ranks), process CPU-seconds per million examples
(all ranks), and per step and rank the bytes sent to other ranks: measured
(graphmod's exchanges count what they send, a replicated table's
allreduce counts its size) beside
the planner's estimate (the report's estimates of the placements taken,
summed over the tables). Each round runs the three in turn; figures are
medians (min-max) over the rounds. On this 2-core machine the 2 ranks
share the cores.

Usage: python benchmarks/placement.py [--steps 40] [--rounds 3] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rounds import interleaved, machine, ratio_per_round, spread, write_json  # noqa: E402

TABLES, DIM, BATCH, WARMUP = 26, 8, 1024, 10
ROWS = [int(round(x)) for x in np.logspace(np.log10(50), 7, TABLES)]
VARIANTS = {"dense": None, "all sharded": {"*": {"placement": "sharded"}}, "planned": {}}


def one_run(steps: int, variant: str, model_dir: str) -> None:
    """One rank's training (under horovodrun); prints JSON."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    import horovod.tensorflow as hvd
    import tensorflow as tf
    import graphmod
    from graphmod.horovod.exchange import BYTES_SENT
    tf1 = tf.compat.v1
    hvd.init()
    rng = np.random.default_rng(1 + hvd.rank())
    n = (WARMUP + steps) * BATCH
    feats = {f"f{i}": rng.integers(0, rows, n, dtype=np.int64) for i, rows in enumerate(ROWS)}
    labels = rng.integers(0, 2, n).astype(np.float32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((feats, labels)).batch(
            BATCH, drop_remainder=True).prefetch(2)

    def model_fn(features, labels, mode):
        parts = [tf.nn.embedding_lookup(tf1.get_variable(
            f"emb{i}", [rows, DIM], initializer=tf1.truncated_normal_initializer(stddev=0.1)),
            features[f"f{i}"]) for i, rows in enumerate(ROWS)]
        hidden = tf1.layers.dense(tf.concat(parts, 1), 64, tf.nn.relu)
        logits = tf.squeeze(tf1.layers.dense(hidden, 1), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.05))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
            loss, global_step=tf1.train.get_or_create_global_step()))

    class Measure(tf1.train.SessionRunHook):
        """Step times, CPU from the end of warm-up, bytes sent per step."""
        def begin(self):
            sent = tf1.get_collection(BYTES_SENT)
            self.sent = tf.add_n(sent) if sent else tf.constant(0, tf.int64)
            self.t, self.log, self.cpu = [], [], 0.0

        def before_run(self, ctx):
            if len(self.t) == WARMUP:
                self.cpu0 = time.process_time()
            self.t0 = time.perf_counter()
            return tf1.train.SessionRunArgs(self.sent)

        def after_run(self, ctx, values):
            self.t.append(time.perf_counter() - self.t0)
            if len(self.t) > WARMUP:
                self.log.append(int(values.results))
                self.cpu = time.process_time() - self.cpu0

    measure = Measure()
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    modifier = None
    if VARIANTS[variant] is not None:
        modifier = graphmod.GraphModifierHook(min_rows=0, tables=VARIANTS[variant])
        hooks.append(modifier)
    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=10**6,
                                    save_summary_steps=10**6, log_step_count_steps=10**6)
    tf.estimator.Estimator(model_fn, config=config).train(input_fn, steps=WARMUP + steps,
                                                          hooks=hooks + [measure])
    placed, estimate = {}, 0
    if modifier is not None:
        for t in modifier.report.tables:
            placed[t["variable"]] = t["placement"]
            estimate += t["placement_estimates"][t["placement"]]["bytes_per_step"]
    else:  # what the allgathers send: each gradient row and its int64 index
        estimate = TABLES * BATCH * (4 * DIM + 8) * (hvd.size() - 1)
    times = measure.t[WARMUP:]
    sent = float(np.median(measure.log)) if modifier is not None else estimate
    print(json.dumps(dict(rank=hvd.rank(), wall=float(np.sum(times)), cpu=measure.cpu,
                          examples=len(times) * BATCH, sent=sent,
                          estimate=estimate, placed=placed)), flush=True)


def run(variant: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as model_dir:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                   __file__, "--one-run", variant, "--steps", str(steps), "--model-dir",
                   model_dir]
        done = subprocess.run(command, capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = done.stdout
    per_rank = [json.loads(line[line.index("{"):]) for line in out.splitlines() if '"rank"' in line]
    assert done.returncode == 0 and len(per_rank) == 2, (out + done.stderr)[-3000:]
    examples = sum(r["examples"] for r in per_rank)
    return dict(examples_per_s=examples / max(r["wall"] for r in per_rank),
                cpu_s_per_m=sum(r["cpu"] for r in per_rank) / examples * 1e6,
                sent=float(np.mean([r["sent"] for r in per_rank])),
                estimate=float(np.mean([r["estimate"] for r in per_rank])),
                placed=per_rank[0]["placed"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--one-run", choices=list(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_run:
        one_run(args.steps, args.one_run, args.model_dir)
        return
    runs = interleaved(VARIANTS, args.rounds, lambda v: run(v, args.steps), lambda x: (
        f"{x['examples_per_s']:,.0f} examples/s, {x['cpu_s_per_m']:.1f} CPU-s/M examples, "
        f"sent {x['sent'] / 1024:.1f} KiB/step/rank (estimate {x['estimate'] / 1024:.1f})"))
    placed = runs["planned"][0]["placed"]
    print(f"\n{TABLES} tables of {ROWS[0]:,} to {ROWS[-1]:,} rows (dim {DIM}, Adagrad), "
          f"uniform ids, batch {BATCH} per rank, 2 ranks, {args.steps} steps after {WARMUP} "
          f"of warm-up; median (min-max) over {args.rounds} rounds")
    print("planned: " + ", ".join(f"{v} ({rows:,} rows): {placed[v]}"
                                  for v, rows in zip(sorted(placed, key=lambda v: int(v[3:])),
                                                     ROWS)))
    print("| run | examples/s (all ranks) | x all sharded (per round) | CPU-s per M examples "
          "| KiB sent per step and rank | estimate | measured / estimate |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = [x["examples_per_s"] for x in runs["all sharded"]]
    for variant, col in runs.items():
        c = {k: [x[k] for x in col] for k in col[0] if k != "placed"}
        print(f"| {variant} | {spread(c['examples_per_s'], '{:,.0f}')} | "
              f"{spread(ratio_per_round(c['examples_per_s'], base))} | "
              f"{spread(c['cpu_s_per_m'], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['sent']], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['estimate']], '{:.1f}')} | "
              f"{spread([s / e for s, e in zip(c['sent'], c['estimate'])])} |")
    if args.json:
        write_json(args.json, dict(runs=runs, rows=ROWS, batch=BATCH, steps=args.steps,
                                   machine=machine(), date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
