"""Medians over rounds of benchmarks/native/table_bench.cc's JSON files.

    python benchmarks/native/report.py new.1.json new.2.json new.3.json \
        [--baseline old.1.json old.2.json old.3.json] [--json out.json]

Prints a Markdown table: per op, ids, dim and thread count, the median M
ids/s with its spread (min-max) over the rounds, the ratio to the static
gather (for apply: the plain scatter) taken within each round, CPU-seconds
per M ids, and the serial share (the part of a call's wall time outside its
parallel sections) with the Amdahl bound it sets on the speed-up at 16
threads. With --baseline, the same figures of another build, side by side
(run the two interleaved: A B A B ...). Python only, no TensorFlow.
"""
import argparse
import json
import statistics
import sys
from typing import Dict, List, Tuple

PEER = {"train": "gather", "read": "gather", "apply": "scatter"}
ORDER = ["gather", "train", "read", "scatter", "apply", "fill"]

Key = Tuple[str, str, int, int]  # op, ids, dim, threads


def load(paths: List[str]) -> List[Dict[Key, dict]]:
    rounds = []
    for path in paths:
        with open(path) as f:
            figures = json.load(f)["figures"]
        rounds.append({(x["op"], x["ids"], x["dim"], x["threads"]): x for x in figures})
    return rounds


def summary(rounds: List[Dict[Key, dict]]) -> Dict[Key, dict]:
    out = {}
    for key in rounds[0]:
        op, ids, dim, threads = key
        rates = [r[key]["mkeys_per_s"] for r in rounds if key in r]
        row = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
               "cpu": statistics.median(r[key]["cpu_s_per_mkey"] for r in rounds if key in r),
               "serial": statistics.median(r[key]["serial_share"] for r in rounds if key in r)}
        peer = (PEER.get(op), ids, dim, threads)
        ratios = [r[key]["mkeys_per_s"] / r[peer]["mkeys_per_s"]
                  for r in rounds if key in r and peer in r]
        row["ratio"] = statistics.median(ratios) if ratios else None
        out[key] = row
    return out


def cell(row: dict) -> str:
    text = f"{row['median']:.1f} ({row['min']:.1f}-{row['max']:.1f})"
    return text + (f" {row['ratio']:.2f}x" if row["ratio"] is not None else "")


def amdahl(serial: float, threads: int = 16) -> float:
    return 1.0 / (serial + (1.0 - serial) / threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rounds", nargs="+")
    parser.add_argument("--baseline", nargs="*", default=[])
    parser.add_argument("--json")
    args = parser.parse_args()
    new = summary(load(args.rounds))
    old = summary(load(args.baseline)) if args.baseline else {}
    header = "| op | ids | dim | threads | M ids/s, ratio | CPU-s/M | serial | bound at 16 |"
    if old:
        header += " baseline M ids/s, ratio | baseline CPU-s/M | baseline serial | bound at 16 |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    keys = sorted(new, key=lambda k: (k[2], k[1] != "uniform", ORDER.index(k[0]), k[3]))
    for key in keys:
        op, ids, dim, threads = key
        line = f"| {op} | {ids} | {dim} | {threads} | {cell(new[key])} | {new[key]['cpu']:.3f} |"
        line += f" {new[key]['serial']:.3f} | {amdahl(new[key]['serial']):.1f}x |"
        if old and key in old:
            line += (f" {cell(old[key])} | {old[key]['cpu']:.3f} | {old[key]['serial']:.3f} |"
                     f" {amdahl(old[key]['serial']):.1f}x |")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": len(args.rounds),
                       "figures": [dict(op=k[0], ids=k[1], dim=k[2], threads=k[3], **new[k],
                                        baseline=old.get(k)) for k in keys]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
