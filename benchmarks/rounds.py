"""Figures that hold on a noisy shared machine: interleaved rounds, medians
with their spread, and process CPU-seconds next to wall-clock rates.

Each benchmark runs its implementations in turn within a round (A B C, A B
C, ...), so slow spells of the machine fall on all of them alike; a ratio is
taken within each round and its median reported. CPU-seconds (all threads of
this process) per unit of work are steadier than wall-clock rates when other
work shares the cores.
"""
import json
import os
import platform
import time
from typing import Any, Callable, Dict, Iterable, List, Sequence

import numpy as np


class Meter:
    """Wall-clock and process CPU time of a block: `with Meter() as m: ...`."""

    def __enter__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """'median (min-max)' of values."""
    v = np.asarray(values, dtype=float)
    return f"{fmt.format(np.median(v))} ({fmt.format(v.min())}-{fmt.format(v.max())})"


def ratio_per_round(a: Sequence[float], b: Sequence[float]) -> List[float]:
    """a[r] / b[r] for each round r (both measured in that round)."""
    return [x / y for x, y in zip(a, b)]


def interleaved(variants: Iterable[str], rounds: int, run: Callable[[str], dict],
                line: Callable[[dict], str]) -> Dict[str, List[dict]]:
    """run(variant) for each variant in turn, `rounds` times (A B C, A B C,
    ...), printing line(result) of each as it ends; variant -> its results,
    in round order."""
    runs: Dict[str, List[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in runs:
            runs[variant].append(run(variant))
            print(f"  round {r + 1}, {variant}: {line(runs[variant][-1])}", flush=True)
    return runs


def medians(runs: Dict[str, List[float]]) -> Dict[str, float]:
    return {k: float(np.median(v)) for k, v in runs.items()}


def machine() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus"


def write_json(path: str, data: Any) -> None:
    """Writes data to path under a temporary name and renames it into place,
    so an interrupted benchmark never leaves half a results file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
