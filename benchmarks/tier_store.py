"""The disk tier's store against RocksDB: the steady state of a tier at its
budget (benchmarks/tier_store.cc says what runs), both stores interleaved
(log, rocksdb, log, rocksdb, ...), each run in a fresh process, medians
(min-max) over the rounds, process CPU-seconds beside wall-clock rates.

The driver is built by `make bench-store` (which installs Debian's
librocksdb-dev when it is missing) into build/tier_store.

Usage: python benchmarks/tier_store.py [--keys 1000000] [--steps 300]
       [--batch 2000] [--rounds 3] [--storage DIR] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, spread, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "..", "build", "tier_store")
STORES = ("log", "rocksdb")


def run(store: str, args) -> dict:
    out = subprocess.run([DRIVER, store, os.path.join(args.storage, store), str(args.keys),
                          str(args.steps), str(args.batch)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storage", default="build/bench-store",
                    help="a directory on the local disk the tier would use")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not os.path.exists(DRIVER):
        sys.exit(f"tier_store.py: {DRIVER} is missing: run `make bench-store` first")
    runs = {s: [] for s in STORES}
    for r in range(args.rounds):
        for s in STORES:
            x = run(s, args)
            runs[s].append(x)
            print(f"  round {r + 1} {s:8s} fill {x['fill_keys_per_s'] / 1e3:.0f}k keys/s, "
                  f"steps {x['step_keys_per_s'] / 1e3:.0f}k keys/s ({x['step_cpu_s']:.2f} "
                  f"CPU-s over {x['step_wall_s']:.2f} s), files {x['disk_bytes'] / 2**20:.0f} "
                  f"MiB, peak RSS {x['peak_rss_kib'] / 1024:.0f} MiB", flush=True)
    col = {s: {k: [x[k] for x in runs[s]] for k in runs[s][0] if k != "store"} for s in STORES}
    print(f"\n{args.keys:,} records of {runs['log'][0]['record_bytes']} B on disk; each step "
          f"promotes {args.batch} random ones (read, erase) and spills {args.batch} (put); "
          f"{args.steps} steps; median (min-max) over {args.rounds} interleaved rounds")
    print(f"  {'store':8s} {'fill keys/s':>22s} {'step keys/s':>22s} "
          f"{'CPU-s / 1M keys moved':>24s} {'files MiB':>16s} {'peak RSS MiB':>16s}")
    for s in STORES:
        c = col[s]
        cpu = [cs / (args.steps * args.batch) * 1e6 for cs in c["step_cpu_s"]]
        print(f"  {s:8s} {spread([v / 1e3 for v in c['fill_keys_per_s']], '{:.0f}k'):>22s} "
              f"{spread([v / 1e3 for v in c['step_keys_per_s']], '{:.0f}k'):>22s} "
              f"{spread(cpu, '{:.2f}'):>24s} "
              f"{spread([v / 2**20 for v in c['disk_bytes']], '{:.0f}'):>16s} "
              f"{spread([v / 1024 for v in c['peak_rss_kib']], '{:.0f}'):>16s}")
    ratio = [a / b for a, b in zip(col["log"]["step_keys_per_s"],
                                   col["rocksdb"]["step_keys_per_s"])]
    print(f"  log / rocksdb, step rate per round: {spread(ratio, '{:.1f}x')}")
    if args.json:
        write_json(args.json, dict(keys=args.keys, steps=args.steps, batch=args.batch,
                                   runs=col, log_over_rocksdb_step_rate=ratio,
                                   machine=machine(), date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
