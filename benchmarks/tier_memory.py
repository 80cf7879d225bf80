"""Memory per key on disk, measured from outside (issue 35).

Trains --keys new keys (dim 16, Adagrad: 152-byte records in 16 shards)
through a table with memory_budget=64 MiB, one lookup and one apply a batch
of 16,384 new ids, and samples the process's resident memory (VmRSS), the
table's rows on disk and its own memory counter every --every keys. Memory
in use other than the cold index is bounded by the budget, so the growth of
resident memory over the growth of rows on disk is what each key on disk
costs. Reported: the least-squares slope of VmRSS over disk rows (from the
sample where a quarter of the keys are on disk to the end, so the budget's
filling is not counted), the same for the counter (memory_bytes), and the
peak RSS. --track starts change tracking first (what a delta save needs).

Batches stay small against the budget: the rows of the last 16 steps are
never spilled (16 x 16,384 = 262K rows under the budget's 441K).

Usage: python benchmarks/tier_memory.py [--keys 4000000] [--every 250000]
                                        [--track] [--storage DIR] [--json FILE]
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, write_json  # noqa: E402

BATCH, DIM, BUDGET = 16384, 16, 64 << 20


def proc_status():
    """VmRSS and VmHWM in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                name, value = line.split(":")
                out[name] = int(value.split()[0]) * 1024
    return out


def slope(xs, ys):
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=4_000_000)
    ap.add_argument("--every", type=int, default=250_000)
    ap.add_argument("--track", action="store_true", help="change tracking on (deltas)")
    ap.add_argument("--storage", default=os.path.join(os.getcwd(), "bench-tier-memory"))
    ap.add_argument("--json")
    args = ap.parse_args()
    need = args.keys * 160 * 1.3  # records + crc, and garbage until compaction
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(args.storage))).free
    if free < need:
        sys.exit(f"tier_memory: {args.keys:,} keys need ~{need / 2**30:.1f} GiB on disk "
                 f"under {args.storage}; {free / 2**30:.1f} GiB are free")

    import tensorflow as tf
    import graphmod
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    shutil.rmtree(args.storage, ignore_errors=True)
    os.makedirs(args.storage)
    opt = graphmod.optimizers.Adagrad(0.1)
    table = graphmod.create_table("t", DIM, optimizer=opt, memory_budget=BUDGET,
                                  storage_path=args.storage)
    ids = tf1.placeholder(tf.int64, [None])
    rows = graphmod.sparse_lookup(table, ids, is_training=True)
    train = opt.minimize(tf.reduce_sum(rows * rows))
    counters = dict(table.info(), **table.tier_info())
    config = tf1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    samples = []
    with tf1.Session(config=config) as sess:
        if args.track:
            from graphmod._ops import ops as gops
            sess.run(gops.graphmod_table_track_removals(table.handle))
        done, start = 0, time.time()
        while done < args.keys:
            batch = np.arange(done, done + BATCH, dtype=np.int64) * 7919 + 13
            sess.run(train, {ids: batch})
            done += BATCH
            if done % args.every < BATCH or done >= args.keys:
                c = sess.run(counters)
                s = dict(keys=done, disk_rows=int(c["disk_rows"]),
                         memory_rows=int(c["memory_rows"]),
                         memory_bytes=int(c["memory_bytes"]), **proc_status())
                samples.append(s)
                print(json.dumps(s), file=sys.stderr, flush=True)
        train_s = time.time() - start
    shutil.rmtree(args.storage, ignore_errors=True)
    last = samples[-1]
    tail = [s for s in samples if s["disk_rows"] >= last["disk_rows"] / 4]
    result = dict(
        keys=args.keys, track=args.track, disk_rows=last["disk_rows"],
        rss_per_disk_row=slope([s["disk_rows"] for s in tail], [s["VmRSS"] for s in tail]),
        counter_per_disk_row=slope([s["disk_rows"] for s in tail],
                                   [s["memory_bytes"] for s in tail]),
        rss_mib=last["VmRSS"] / 2**20, peak_rss_mib=last["VmHWM"] / 2**20,
        train_s=train_s, samples=samples)
    print(f"{args.keys:,} keys, {last['disk_rows']:,} on disk"
          f"{' (change tracking on)' if args.track else ''}: "
          f"{result['rss_per_disk_row']:.1f} B of resident memory per disk row "
          f"({result['counter_per_disk_row']:.1f} B by the table's counter), "
          f"RSS {result['rss_mib']:.0f} MiB, peak {result['peak_rss_mib']:.0f} MiB, "
          f"{train_s:.0f} s")
    if args.json:
        write_json(args.json, dict(machine=machine(), **result))


if __name__ == "__main__":
    main()
