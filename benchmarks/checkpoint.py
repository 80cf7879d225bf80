"""Checkpoint benchmark: full saves against incremental deltas, and the restore
of a full checkpoint with its chain.

One table of 5M keys, dim 16, Adagrad (one slot), filled by training
lookups and applies; between saves a step updates 1% of the keys (50,000:
half already in the table, half new) and evicts nothing. Per round: a full
save (seconds, bytes), then 10 deltas each after such a step (seconds,
bytes), then a restore of the full checkpoint and its 10 deltas into a fresh
session (seconds, and the peak bytes allocated beyond the restored table:
GraphmodTableRestore reads a stored slice at a time), checked to hold every
key; beside it, a plain Saver's restore of the full checkpoint (RestoreV2
reads each entry whole first). The full save's peak extra
RSS and peak extra bytes allocated (glibc's mallinfo2) are sampled every
millisecond. Each round runs in a fresh process with TF_ENABLE_ONEDNN_OPTS=0:
oneDNN's CPU allocator keeps a pool that malloc's counters do not see into
(nothing here computes with oneDNN).
Figures are medians (min-max) over the rounds; the ratios say what a delta
costs against a full save, and a save's memory against the table's.

Usage: python benchmarks/checkpoint.py [--keys 5000000] [--rounds 3] [--json out.json]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, spread, write_json  # noqa: E402

tf1 = tf.compat.v1
DIM, BATCH, DELTAS = 16, 500_000, 10


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def allocated_bytes() -> int:
    """Bytes malloc has handed out and not had back, over every arena."""
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


class Peak:
    """The largest RSS, and the most bytes allocated, above the starting
    ones while the block runs (sampled every millisecond). RSS alone can
    miss a save's buffers: malloc serves them from memory freed earlier,
    which the process still holds."""

    def __enter__(self):
        self.start = (rss_bytes(), allocated_bytes())
        self.rss = self.allocated = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _take(self):
        self.rss = max(self.rss, rss_bytes() - self.start[0])
        self.allocated = max(self.allocated, allocated_bytes() - self.start[1])

    def _sample(self):
        while not self._stop.is_set():
            self._take()
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._take()


def files_bytes(prefix: str) -> int:
    folder, name = os.path.split(prefix)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.startswith(name + ".") and not f.endswith(".meta"))


def build(n_keys):
    import graphmod
    from graphmod.checkpoint.saver import TableSaver
    step = tf1.train.get_or_create_global_step()
    opt = graphmod.optimizers.Adagrad(0.1)
    table = graphmod.create_table("bench", DIM, optimizer=opt)
    ids = tf1.placeholder(tf.int64, [None])
    rows = graphmod.sparse_lookup(table, ids, is_training=True)
    train = tf.group(opt.minimize(tf.reduce_sum(rows * rows)), step.assign_add(1))
    saver = TableSaver(sharded=True, max_to_keep=None)
    saver.build()
    return table, ids, train, saver, table.info()


def one_round(args, rng):
    out = {}
    folder = tempfile.mkdtemp(prefix="graphmod_ckpt_bench_")
    keys = np.arange(args.keys, dtype=np.int64) * 7919
    with tf.Graph().as_default():
        table, ids, train, saver, info = build(args.keys)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for i in range(0, args.keys, BATCH):
                sess.run(train, {ids: keys[i:i + BATCH]})
            size, memory = sess.run([info["size"], info["memory_bytes"]])
            out["table_bytes"] = float(memory)
            prefix = os.path.join(folder, "model.ckpt")
            with Peak() as peak:
                t = time.perf_counter()
                path = saver.save(sess, prefix, global_step=0)
                out["full_s"] = time.perf_counter() - t
            out["full_bytes"] = float(files_bytes(path))
            out["full_peak_rss"], out["full_peak_allocated"] = float(peak.rss), float(
                peak.allocated)
            saver.start_tracking(sess)
            delta_s, delta_bytes, fresh = [], [], args.keys
            for d in range(DELTAS):
                changed = args.keys // 100
                old = keys[rng.integers(0, args.keys, changed // 2)]
                new = (np.arange(fresh, fresh + changed // 2, dtype=np.int64)) * 7919
                fresh += changed // 2
                sess.run(train, {ids: np.concatenate([old, new])})
                t = time.perf_counter()
                delta = saver.save_delta(sess, d + 1)
                delta_s.append(time.perf_counter() - t)
                delta_bytes.append(files_bytes(delta))
            out["delta_s"], out["delta_bytes"] = float(np.median(delta_s)), float(
                np.median(delta_bytes))
            expected = sess.run(info["size"])
    with tf.Graph().as_default():
        table, ids, train, saver, info = build(args.keys)
        with tf1.Session() as sess:
            sess.run(info["size"])  # the table exists: its memory is not the restore's
            with Peak() as peak:
                t = time.perf_counter()
                saver.restore(sess, path)
                out["restore_s"] = time.perf_counter() - t
            restored, memory = sess.run([info["size"], info["memory_bytes"]])
            chain = saver.chain
    assert restored == expected and chain == (path, DELTAS), (restored, expected, chain)
    # What the restore held beside the rows it restored.
    out["restore_extra_allocated"] = float(peak.allocated - memory)
    # The same full checkpoint through a plain Saver: RestoreV2 reads each
    # entry whole, then the table imports it (what TableSaver did before).
    with tf.Graph().as_default():
        table, ids, train, _, info = build(args.keys)
        plain = tf1.train.Saver(sharded=True)
        with tf1.Session() as sess:
            sess.run(info["size"])
            with Peak() as peak:
                t = time.perf_counter()
                plain.restore(sess, path)
                out["plain_restore_s"] = time.perf_counter() - t
            memory = sess.run(info["memory_bytes"])
    out["plain_restore_extra_allocated"] = float(peak.allocated - memory)
    out["rows"] = float(size)
    tf.io.gfile.rmtree(folder)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--one-round", type=int, help=argparse.SUPPRESS)  # a round's own process
    args = ap.parse_args()
    tf1.disable_eager_execution()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    if args.one_round is not None:
        print(json.dumps(one_round(args, np.random.default_rng(args.one_round))))
        return
    runs = []
    for r in range(args.rounds):
        out = subprocess.run([sys.executable, __file__, "--keys", str(args.keys),
                              "--one-round", str(r)], check=True, capture_output=True,
                             text=True, env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        x = runs[-1]
        print(f"  round {r + 1}: full {x['full_s']:.2f} s {x['full_bytes'] / 2**20:.0f} MiB "
              f"(peak extra RSS {x['full_peak_rss'] / 2**20:.0f} MiB, allocated "
              f"{x['full_peak_allocated'] / 2**20:.0f} MiB), delta {x['delta_s']:.3f} s "
              f"{x['delta_bytes'] / 2**20:.1f} MiB, restore full + {DELTAS} deltas "
              f"{x['restore_s']:.2f} s (extra allocated "
              f"{x['restore_extra_allocated'] / 2**20:.0f} MiB), plain Saver's restore of the "
              f"full one {x['plain_restore_s']:.2f} s (extra allocated "
              f"{x['plain_restore_extra_allocated'] / 2**20:.0f} MiB)", flush=True)
    col = {k: [x[k] for x in runs] for k in runs[0]}
    mib = [v / 2**20 for v in col["table_bytes"]]
    print(f"\n{args.keys:,} keys, dim {DIM}, Adagrad; 1% of keys changed between saves; "
          f"median (min-max) over {args.rounds} rounds")
    print(f"  table in memory        {spread(mib, '{:.0f}')} MiB")
    print(f"  full save              {spread(col['full_s'], '{:.2f}')} s, "
          f"{spread([v / 2**20 for v in col['full_bytes']], '{:.0f}')} MiB, peak extra RSS "
          f"{spread([v / 2**20 for v in col['full_peak_rss']], '{:.0f}')} MiB, peak extra "
          f"allocated {spread([v / 2**20 for v in col['full_peak_allocated']], '{:.0f}')} MiB")
    print(f"  delta save             {spread(col['delta_s'], '{:.3f}')} s, "
          f"{spread([v / 2**20 for v in col['delta_bytes']], '{:.1f}')} MiB")
    print(f"  restore full + {DELTAS} deltas {spread(col['restore_s'], '{:.2f}')} s, peak "
          f"extra allocated {spread([v / 2**20 for v in col['restore_extra_allocated']], '{:.0f}')}"
          f" MiB (slice by slice)")
    print(f"  plain Saver, full only {spread(col['plain_restore_s'], '{:.2f}')} s, peak extra "
          f"allocated {spread([v / 2**20 for v in col['plain_restore_extra_allocated']], '{:.0f}')}"
          f" MiB (RestoreV2 reads each entry whole)")
    ratios = dict(
        delta_over_full_bytes=float(np.median([d / f for d, f in zip(col["delta_bytes"],
                                                                    col["full_bytes"])])),
        delta_over_full_seconds=float(np.median([d / f for d, f in zip(col["delta_s"],
                                                                      col["full_s"])])),
        full_peak_rss_over_table=float(np.median([p / t for p, t in zip(col["full_peak_rss"],
                                                                       col["table_bytes"])])),
        full_peak_allocated_over_table=float(np.median(
            [p / t for p, t in zip(col["full_peak_allocated"], col["table_bytes"])])))
    print(f"  delta / full: bytes {ratios['delta_over_full_bytes']:.3f}, time "
          f"{ratios['delta_over_full_seconds']:.3f}; a full save's peak extra RSS / table "
          f"{ratios['full_peak_rss_over_table']:.2f}, peak extra allocated / table "
          f"{ratios['full_peak_allocated_over_table']:.2f}")
    if args.json:
        write_json(args.json, dict(keys=args.keys, dim=DIM, runs=col, **ratios,
                                   machine=machine(), date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
