"""Horovod benchmark: a step of tables sharded across ranks, against one rank.

The reference workload's data and shape (shared/bench/estimator_peers.py):
8 categorical features of 120k Zipf-distributed ids read from one table
(dim 16, Adagrad), 4 dense features, a 128-64 DNN (Adagrad, averaged by
hvd.DistributedOptimizer on 2 ranks), batch 1024 per rank, written with the
table API (hook mode under Horovod is not built yet). Three runs: one rank;
two ranks each with a table of its own (Horovod for the dense layers only,
each rank's table trained on its own gradients: what graphmod did before
sharding); two ranks sharing sharded tables. Per run: examples/s
over the steps after warm-up (all ranks together), process CPU-seconds per
million examples (all ranks), and per step and rank the bytes the exchange
sends other ranks (ids, rows served, gradients returned), beside what it
would send without deduplication (every id, 8 bytes, its row and its
gradient, 64 bytes each, computed from the same batches). Each round runs
the three in turn, each in fresh processes; figures are medians (min-max)
over the rounds. On this 2-core machine 2 ranks share the
cores that 1 rank's threads use: the step times show the collectives' cost,
not a speed-up. Horovod's defaults (HOROVOD_CYCLE_TIME etc.) apply.

Usage: python benchmarks/horovod.py [--steps 60] [--rounds 3] [--json out.json]
(the file's name is the issue's; run it as a script, not imported as `horovod`)
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rounds import machine, spread, write_json  # noqa: E402

N_CAT, N_DENSE, VOCAB, B, D, WARMUP = 8, 4, 120_000, 1024, 16, 10


def batches(steps, rank, seed=0):
    r = np.random.default_rng(seed * 1000 + rank)
    for _ in range(steps):
        ids = np.minimum(r.zipf(1.2, size=(B, N_CAT)), VOCAB) - 1
        dense = r.normal(0, 1, size=(B, N_DENSE)).astype(np.float32)
        y = (r.random(B) < 0.3).astype(np.float32)
        yield ids.astype(np.int64), dense, y


def one_run(steps: int, shard: bool) -> None:
    """One rank's training (run by itself or under horovodrun); prints JSON."""
    # This file is horovod.py: its folder must not shadow the real package.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    import horovod.tensorflow as hvd
    import tensorflow as tf
    import graphmod
    from graphmod.distributed.exchange import BYTES_SENT
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    hvd.init()
    graphmod.distributed.enable(shard)
    size, rank = hvd.size(), hvd.rank()
    ids = tf1.placeholder(tf.int64, [None, N_CAT])
    dense = tf1.placeholder(tf.float32, [None, N_DENSE])
    labels = tf1.placeholder(tf.float32, [None])
    opt = graphmod.optimizers.Adagrad(0.05)
    table = graphmod.create_table("emb", D, optimizer=opt)
    emb = tf.reshape(graphmod.sparse_lookup(table, ids), [-1, N_CAT * D])
    h = tf.concat([emb, dense], 1)
    for units in (128, 64):
        h = tf1.layers.dense(h, units, tf.nn.relu)
    logits = tf.squeeze(tf1.layers.dense(h, 1), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense_opt = tf1.train.AdagradOptimizer(0.05)
    if size > 1:
        dense_opt = hvd.DistributedOptimizer(dense_opt)
    train = tf.group(opt.minimize(loss), dense_opt.minimize(loss))
    exchanges = tf1.get_collection(BYTES_SENT)
    sent = tf.add_n(exchanges) if exchanges else tf.constant(0, tf.int64)
    times, sent_bytes, undeduplicated = [], [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        if size > 1:
            sess.run(hvd.broadcast_global_variables(0))
        cpu0 = None
        for i, (x, d, y) in enumerate(batches(WARMUP + steps, rank)):
            if i == WARMUP:
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                start = time.perf_counter()
            t = time.perf_counter()
            _, b = sess.run([train, sent], {ids: x, dense: d, labels: y})
            if i >= WARMUP:
                times.append(time.perf_counter() - t)
                sent_bytes.append(int(b))
                # Without deduplication: every id to its owner, its row back and
                # its gradient to the owner again; ids this rank owns left out
                # (as for the real bytes).
                mine = graphmod_owners(x.reshape(-1), size) == rank
                undeduplicated.append(int((~mine).sum()) * (8 + 2 * 4 * D) if shard else 0)
        wall = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(dict(rank=rank, size=size, wall=wall, examples=steps * B,
                          cpu=(cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
                          step_s=float(np.median(times)),
                          sent=float(np.median(sent_bytes)),
                          undeduplicated=float(np.median(undeduplicated)))), flush=True)


def graphmod_owners(keys: np.ndarray, size: int) -> np.ndarray:
    """graphmod.distributed.owner_of, in numpy."""
    h = keys.astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(31))
        h = h * np.uint64(0x9E3779B97F4A7C15)
        h = h ^ (h >> np.uint64(29))
        return (((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32)).astype(np.int32)


VARIANTS = {"1 rank": (1, False), "2 ranks, a table per rank": (2, False),
            "2 ranks, sharded": (2, True)}


def run(variant: str, steps: int) -> dict:
    ranks, shard = VARIANTS[variant]
    command = [sys.executable, __file__, "--one-run", "--steps", str(steps)]
    command += ["--shard"] if shard else []
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"] + command
    out = subprocess.run(command, check=True, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")).stdout
    per_rank = [json.loads(line[line.index("{"):]) for line in out.splitlines() if '"rank"' in line]
    assert len(per_rank) == ranks, out[-2000:]
    examples = sum(r["examples"] for r in per_rank)
    return dict(examples_per_s=examples / max(r["wall"] for r in per_rank),
                cpu_s_per_m=sum(r["cpu"] for r in per_rank) / examples * 1e6,
                step_s=max(r["step_s"] for r in per_rank),
                sent=float(np.mean([r["sent"] for r in per_rank])),
                undeduplicated=float(np.mean([r["undeduplicated"] for r in per_rank])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_run:
        one_run(args.steps, args.shard)
        return
    runs = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS:
            runs[variant].append(run(variant, args.steps))
            x = runs[variant][-1]
            print(f"  round {r + 1}, {variant}: {x['examples_per_s']:,.0f} examples/s, "
                  f"step {x['step_s'] * 1e3:.1f} ms, {x['cpu_s_per_m']:.1f} CPU-s/M examples, "
                  f"sent {x['sent'] / 1024:.0f} KiB/step/rank (without dedup "
                  f"{x['undeduplicated'] / 1024:.0f})", flush=True)
    print(f"\nreference data (8 features x 120k Zipf ids, one table dim 16), batch {B} per "
          f"rank, {args.steps} steps; median (min-max) over {args.rounds} rounds")
    print("| run | examples/s (all ranks) | step ms | CPU-s per M examples | "
          "table KiB sent per step and rank | without deduplication |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant, col in runs.items():
        c = {k: [x[k] for x in col] for k in col[0]}
        print(f"| {variant} | {spread(c['examples_per_s'], '{:,.0f}')} | "
              f"{spread([v * 1e3 for v in c['step_s']], '{:.1f}')} | "
              f"{spread(c['cpu_s_per_m'], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['sent']], '{:.0f}')} | "
              f"{spread([v / 1024 for v in c['undeduplicated']], '{:.0f}')} |")
    if args.json:
        write_json(args.json, dict(runs=runs, batch=B,
                                   steps=args.steps, machine=machine(),
                                   date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
