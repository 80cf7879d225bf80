"""Disk tier benchmark: a table 4x its memory budget against the same table
all in memory, training on skewed ids.

Each arm runs in a fresh process (so its RSS is its own): it fills a table
with KEYS rows (dim 16, Adagrad: one slot row), then trains on batches of B
ids drawn Zipf(a), for a = 1.05 and 1.2, over the keys (popular ranks
scattered over the key space): a lookup that inserts, then an Adagrad apply
by handle, as the hook's rewrite runs them. Arms:
  memory  every row in memory (the arena layout)
  tier    memory_budget=0.25 (a quarter of the rows in memory, the rest in
          segment files under --storage, a local disk)
  prefetch  tier, and the input pipeline prefetches each batch's cold rows
          while the step before trains (what rule tier_prefetch builds:
          dataset.map(Table.prefetch).prefetch(1))
Every arm reads the same batches from a tf.data pipeline (prefetch(1)),
and times two windows of STEPS steps:
  after_fill  the first steps after the fill (and 5 warm-up steps): the
              fill inserted the keys in order, so memory holds the last
              quarter inserted, not the popular ones; the window is a
              transient of many first reads of popular rows
  steady      after SETTLE steps more: the popular rows are in memory and
              the hit ratio has stopped rising (at Zipf 1.05 from 0.64
              after the fill to ~0.80 by step 300; measured 2026-11-29 in
              12 windows of 40 steps at 1M keys; more keys take more
              steps), what a long training run sees
Printed per arm and window: examples/s (one id an example),
process CPU-seconds per 1k examples, the tier's hit ratio (ids found in
memory; with prefetch, of those the step itself had to read), rows and bytes
read from disk per step (prefetched ones included), and peak RSS. Arms run
interleaved (memory, tier, prefetch, memory, ...), --rounds rounds; figures
are medians (min-max), and the tiers' examples/s ratios are taken per round.
The issue's goals: tier >= 0.5x memory at Zipf 1.2 and >= 0.4x at Zipf
1.05, with the budget at 25%; judged on the steady window, the after_fill
window printed beside it.

A table whose all-in-memory form does not fit this machine (--keys 200M)
cannot have a memory arm: then the run is benchmarks/tier_scale.py's plan
(fill, train at both Zipfs, a full checkpoint, a restart) with
memory_budget --budget bytes.

Usage: python benchmarks/tiers.py [--keys 1000000 | 200M] [--rounds 3] [--storage DIR]
                                  [--budget 1G] [--json results/tiers.json]
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, ratio_per_round, spread, write_json  # noqa: E402

B, DIM, STEPS, WARMUP, SETTLE = 16384, 16, 40, 5, 300
ZIPFS = (1.05, 1.2)
ARMS = ("memory", "tier", "prefetch")
WINDOWS = ("after_fill", "steady")


def zipf_batches(keys, a, steps, seed):
    """steps batches of B ids: Zipf(a) ranks (capped at keys) scattered over the keys."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(a, (steps, B)), keys) - 1
    return (ranks * 2654435761) % keys


def run_arm(arm, a, keys, storage):
    """One arm in this process: {window: {examples_s, cpu_per_k, hit_ratio, ...}}."""
    import tensorflow as tf
    import graphmod
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    tier = dict(memory_budget=0.25, storage_path=storage) if arm != "memory" else {}
    opt = graphmod.optimizers.Adagrad(0.1)
    table = graphmod.create_table("bench", DIM, optimizer=opt, **tier)
    batches = zipf_batches(keys, a, WARMUP + 2 * STEPS + SETTLE, seed=int(a * 100))
    # In int32 while they fit (the graph holds them as a constant: half the bytes).
    small = keys <= np.iinfo(np.int32).max
    steps = tf.data.Dataset.from_tensor_slices(batches.astype(np.int32 if small else np.int64))
    steps = steps.map(lambda b: tf.cast(b, tf.int64))
    if arm == "prefetch":
        def prefetch(b):
            with tf.control_dependencies([table.prefetch(b)]):
                return tf.identity(b)
        steps = steps.map(prefetch)
    steps = tf1.data.make_initializable_iterator(steps.prefetch(1))
    # The fill feeds ids; warm-up and timed steps read the pipeline.
    ids = tf1.placeholder_with_default(steps.get_next(), [None])
    rows = graphmod.sparse_lookup(table, ids, is_training=True)
    train = opt.minimize(tf.reduce_sum(rows * rows))  # a lookup, then Adagrad by handle
    counters = dict(table.info(), **table.tier_info())
    cfg = tf1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    with tf1.Session(config=cfg) as sess:
        # Every key gets its row (the table is 4x the budget), a batch of B at a time.
        for start in range(0, keys, B):
            sess.run(train, {ids: np.arange(start, min(start + B, keys))})
        sess.run(steps.initializer)
        for _ in range(WARMUP):  # the pipeline starts
            sess.run(train)
        out = {"after_fill": timed(sess, train, counters)}
        for _ in range(SETTLE):  # the popular rows come into memory
            sess.run(train)
        out["steady"] = timed(sess, train, counters)
    return out


def timed(sess, train, counters):
    """STEPS steps of train: their rate, CPU and the tier's counters."""
    before = sess.run(counters)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(STEPS):
        sess.run(train)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    after = sess.run(counters)
    delta = {k: int(after[k] - before[k]) for k in after}
    # rss_mib: the process's peak so far, at the window's end.
    return dict(rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                examples_s=B * STEPS / wall, cpu_per_k=cpu / (B * STEPS / 1e3),
                hit_ratio=1 - delta["promoted"] / max(delta["lookups"], 1),
                prefetched_per_step=delta["prefetched"] / STEPS,
                disk_rows_per_step=delta["disk_reads"] / STEPS,
                disk_mib_per_step=delta["disk_read_bytes"] / STEPS / 2**20,
                memory_rows=int(after["memory_rows"]), disk_rows=int(after["disk_rows"]))


def count(text, base=1000):
    """1000000, 1M, 200M, 1.5G: K, M and G are powers of base."""
    text = text.strip().upper()
    power = "KMG".find(text[-1:]) + 1 if text[-1:] in ("K", "M", "G") else 0
    return int(float(text[:-1] if power else text) * base**power)


def fits_in_memory(keys):
    """Whether the memory arm's table (~2x its records with the index and the
    arena's slack, measured ~300 B a key) fits in half this machine's memory."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return keys * 300 < total / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=count, default=1_000_000)
    ap.add_argument("--budget", type=lambda t: count(t, 1024), default=2**30,
                    help="memory_budget in bytes for a table that does not fit in memory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storage", default=os.path.join(os.getcwd(), "bench-tier"),
                    help="a directory on a local disk (not a tmpfs)")
    ap.add_argument("--json")
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm, print JSON
    ap.add_argument("--zipf", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.zipf, args.keys, args.storage)))
        return
    if not fits_in_memory(args.keys):
        import tier_scale
        result = tier_scale.run(args.keys, args.budget, args.storage)
        if args.json:
            write_json(args.json, dict(result, machine=machine(), date=time.strftime("%Y-%m-%d")))
        return
    runs = {(a, arm, w): [] for a in ZIPFS for arm in ARMS for w in WINDOWS}
    try:
        for r in range(args.rounds):
            for a in ZIPFS:
                for arm in ARMS:
                    done = subprocess.run(
                        [sys.executable, __file__, "--arm", arm, "--zipf", str(a),
                         "--keys", str(args.keys), "--storage", args.storage],
                        capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        sys.exit(f"arm {arm} at Zipf {a} failed:\n{done.stderr[-3000:]}")
                    out = json.loads(done.stdout.strip().splitlines()[-1])
                    for w in WINDOWS:
                        f = out[w]
                        runs[(a, arm, w)].append(f)
                        print(f"  round {r + 1} zipf {a} {arm:8s} {w:10s} "
                              f"{f['examples_s'] / 1e3:7.1f}k ex/s hit {f['hit_ratio']:.3f} "
                              f"rss {f['rss_mib']:.0f} MiB", flush=True)
    finally:
        shutil.rmtree(args.storage, ignore_errors=True)
    print(f"\n{args.keys} keys, dim {DIM}, Adagrad, B={B}, {STEPS} steps a window (steady: "
          f"after {SETTLE} more), {args.rounds} interleaved rounds: median (min-max)")
    results = []
    for a in ZIPFS:
        for w in WINDOWS:
            results += summary(runs, a, w, args.keys)
    if args.json:
        for r in results:
            r["machine"], r["date"] = machine(), time.strftime("%Y-%m-%d")
        write_json(args.json, results)


def summary(runs, a, window, keys):
    """Prints the window's figures at Zipf a; returns their JSON records."""
    results = []
    for arm in ARMS:
        col = {k: [x[k] for x in runs[(a, arm, window)]] for k in runs[(a, arm, window)][0]}
        results.append(dict(zipf=a, arm=arm, window=window, keys=keys, dim=DIM,
                            batch=B, runs=col,
                            **{f"{k}_median": float(np.median(v)) for k, v in col.items()}))
        print(f"  zipf {a:4} {window:10s} {arm:8s} "
              f"{spread([x / 1e3 for x in col['examples_s']], '{:.1f}')}k "
              f"ex/s  cpu-s/1k ex {spread(col['cpu_per_k'], '{:.4f}')}  hit "
              f"{spread(col['hit_ratio'], '{:.3f}')}  disk rows/step "
              f"{spread(col['disk_rows_per_step'], '{:.0f}')} "
              f"({spread(col['disk_mib_per_step'])} MiB, prefetched "
              f"{spread(col['prefetched_per_step'], '{:.0f}')})  peak RSS "
              f"{spread(col['rss_mib'], '{:.0f}')} MiB")
    for arm in ARMS[1:]:
        ratio = ratio_per_round([x["examples_s"] for x in runs[(a, arm, window)]],
                                [x["examples_s"] for x in runs[(a, "memory", window)]])
        print(f"  zipf {a:4} {window:10s} {arm} / memory examples/s: {spread(ratio)}x")
        results.append({"zipf": a, "window": window, f"{arm}_vs_memory": ratio,
                        f"{arm}_vs_memory_median": float(np.median(ratio))})
    return results


if __name__ == "__main__":
    main()
