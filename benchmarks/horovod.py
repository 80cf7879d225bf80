"""Horovod benchmark: the reference Estimator on 1 and 2 ranks, dense and hooked.

The reference workload (benchmarks/estimator.py, shared/bench/estimator_peers.py):
FM + 128-64 DNN + linear term, 8 categorical features of 120k Zipf ids in
one embedding variable (dim 16) and one linear weight (dim 1), 4 dense
features, Adagrad, batch 1024 per rank. Its model_fn is unchanged but for
hvd.DistributedOptimizer around the optimizer, and every run has
hvd.BroadcastGlobalVariablesHook, as a Horovod user writes it. Four runs:
  1 rank, dense            the model as written
  1 rank, hook             with GraphModifierHook()
  2 ranks, dense           Horovod's own way: each rank holds the whole
                           variables, their gradients allgathered
  2 ranks, hook            GraphModifierHook(): tables sharded by key, ids,
                           rows and gradients exchanged with each key's owner
Per run: examples/s over the steps after warm-up (all ranks together), the
median step time, process CPU-seconds per million examples (all ranks), the
ops of one traced step (rank 0) and its rounds of Horovod collectives (see
ops_and_rounds),
and per step and rank the bytes of the embeddings' traffic to other ranks:
for the hook, what the exchanges send (ids, rows served, gradients), beside
what they would send without deduplication (every id occurrence, 8 bytes,
its row and its gradient, from the same batches); for the dense model,
what its allgathers send (each gradient row, 4 bytes a float, and its
int64 index). Each round runs the four in turn, each in fresh processes;
figures are medians (min-max) over the rounds. On this 2-core machine 2
ranks share the cores 1 rank's threads use: step times show the
collectives' cost, not a speed-up. Horovod's defaults (HOROVOD_CYCLE_TIME
etc.) apply.

Usage: python benchmarks/horovod.py [--steps 60] [--rounds 3] [--json out.json]
(the file's name is the issue's; run it as a script, not imported as `horovod`)
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rounds import interleaved, machine, spread, write_json  # noqa: E402

WARMUP = 10
DIMS = (16, 1)  # the embedding's and the linear weight's


def _reference():
    """benchmarks/estimator.py, loaded from its path (this folder must not
    be on sys.path when horovod is imported: this file would shadow it)."""
    spec = importlib.util.spec_from_file_location("reference_estimator",
                                                  os.path.join(HERE, "estimator.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_run(steps: int, hooked: bool, model_dir: str) -> None:
    """One rank's training (run by itself or under horovodrun); prints JSON."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    import horovod.tensorflow as hvd
    import tensorflow as tf
    import graphmod
    from graphmod.embeddings.partition import owner_of_numpy
    from graphmod.horovod.exchange import BYTES_SENT
    tf1 = tf.compat.v1
    reference = _reference()
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    feats, y = reference.make_data((WARMUP + steps) * reference.B, seed=1 + rank)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((feats, y)).batch(reference.B).prefetch(2)

    class Measure(reference.Timer):
        """Step times and CPU (Timer), each step's keys and exchange bytes, and
        one traced step's ops and rounds of Horovod collectives."""
        def begin(self):
            self.keys = tf1.get_collection("benchmark_keys")[0]
            sent = tf1.get_collection(BYTES_SENT)
            self.sent = tf.add_n(sent) if sent else tf.constant(0, tf.int64)
            self.log = []
            self.traced = None

        def before_run(self, ctx):
            super().before_run(ctx)
            trace = len(self.t) == self.warm + steps // 2
            return tf1.train.SessionRunArgs([self.keys, self.sent], options=tf1.RunOptions(
                trace_level=tf1.RunOptions.FULL_TRACE) if trace else None)

        def after_run(self, ctx, values):
            super().after_run(ctx, values)
            if len(self.t) > self.warm:
                self.log.append(values.results)
            if values.run_metadata is not None and values.run_metadata.step_stats.dev_stats:
                self.traced = ops_and_rounds(values.run_metadata.step_stats)

    measure = Measure(WARMUP)
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    if hooked:
        hooks.append(graphmod.GraphModifierHook())
    hooks.append(measure)
    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=10**6,
                                    save_summary_steps=10**6, log_step_count_steps=10**6)
    model_fn = reference.make_model_fn("static", wrap_optimizer=hvd.DistributedOptimizer)
    tf.estimator.Estimator(model_fn, config=config).train(input_fn, steps=WARMUP + steps,
                                                          hooks=hooks)
    times = measure.t[WARMUP:]
    sent, undeduplicated, allgathered = [], [], []
    offsets = np.arange(reference.N_CAT, dtype=np.int64) * reference.VOCAB
    for ids, exchanged in measure.log:
        keys = (ids + offsets).reshape(-1)
        others = int((owner_of_numpy(keys, size) != rank).sum()) if size > 1 else 0
        sent.append(int(exchanged))
        undeduplicated.append(sum(others * (8 + 2 * 4 * d) for d in DIMS) if hooked else 0)
        allgathered.append(sum(keys.size * (4 * d + 8) for d in DIMS) * (size - 1))
    ops, rounds = measure.traced or (0, 0)
    print(json.dumps(dict(rank=rank, size=size, wall=float(np.sum(times)), ops=ops, rounds=rounds,
                          examples=len(times) * reference.B, cpu=measure.cpu,
                          step_s=float(np.median(times)), sent=float(np.median(sent)),
                          undeduplicated=float(np.median(undeduplicated)),
                          allgathered=float(np.median(allgathered)))), flush=True)


def ops_and_rounds(step_stats):
    """A traced step's ops, and its rounds of Horovod collectives: the most of
    its collectives that ran one after another, each starting after the one
    before it ended (collectives that overlap in time waited in the same
    rounds of Horovod's background loop)."""
    nodes = [n for d in step_stats.dev_stats for n in d.node_stats]
    spans = sorted((n.all_start_micros + n.all_end_rel_micros, n.all_start_micros)
                   for n in nodes if " = Horovod" in n.timeline_label)
    rounds, end = 0, -1
    for stop, start in spans:  # by end: the longest chain of disjoint spans
        if start > end:
            rounds, end = rounds + 1, stop
    return len(nodes), rounds


VARIANTS = {"1 rank, dense": (1, False), "1 rank, hook": (1, True),
            "2 ranks, dense (Horovod allgather)": (2, False),
            "2 ranks, hook (sharded tables)": (2, True)}


def run(variant: str, steps: int) -> dict:
    ranks, hooked = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as model_dir:
        command = [sys.executable, __file__, "--one-run", "--steps", str(steps),
                   "--model-dir", model_dir] + (["--hooked"] if hooked else [])
        if ranks > 1:
            horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
            command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}",
                       "--gloo"] + command
        done = subprocess.run(command, capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = done.stdout
    per_rank = [json.loads(line[line.index("{"):]) for line in out.splitlines() if '"rank"' in line]
    assert done.returncode == 0 and len(per_rank) == ranks, (out + done.stderr)[-3000:]
    examples = sum(r["examples"] for r in per_rank)
    return dict(examples_per_s=examples / max(r["wall"] for r in per_rank),
                cpu_s_per_m=sum(r["cpu"] for r in per_rank) / examples * 1e6,
                step_s=max(r["step_s"] for r in per_rank),
                ops=per_rank[0]["ops"], rounds=max(r["rounds"] for r in per_rank),
                sent=float(np.mean([r["sent"] for r in per_rank])),
                undeduplicated=float(np.mean([r["undeduplicated"] for r in per_rank])),
                allgathered=float(np.mean([r["allgathered"] for r in per_rank])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hooked", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_run:
        one_run(args.steps, args.hooked, args.model_dir)
        return
    runs = interleaved(VARIANTS, args.rounds, lambda v: run(v, args.steps), lambda x: (
        f"{x['examples_per_s']:,.0f} examples/s, step {x['step_s'] * 1e3:.1f} ms, "
        f"{x['cpu_s_per_m']:.1f} CPU-s/M examples, {x['ops']} ops and {x['rounds']} Horovod "
        f"round(s) a step, sent {x['sent'] / 1024:.0f} KiB/step/rank (without dedup "
        f"{x['undeduplicated'] / 1024:.0f}, dense allgather {x['allgathered'] / 1024:.0f})"))
    print(f"\nreference Estimator (8 features x 120k Zipf ids, dim 16 + linear dim 1), batch "
          f"1024 per rank, {args.steps} steps after {WARMUP} of warm-up; median (min-max) over "
          f"{args.rounds} rounds")
    print("| run | examples/s (all ranks) | step ms | CPU-s per M examples | ops a step | "
          "Horovod rounds a step | embedding KiB sent per step and rank | without "
          "deduplication |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for variant, col in runs.items():
        c = {k: [x[k] for x in col] for k in col[0]}
        hooked = VARIANTS[variant][1]
        sent = c["sent"] if hooked else c["allgathered"]
        print(f"| {variant} | {spread(c['examples_per_s'], '{:,.0f}')} | "
              f"{spread([v * 1e3 for v in c['step_s']], '{:.1f}')} | "
              f"{spread(c['cpu_s_per_m'], '{:.1f}')} | "
              f"{spread(c['ops'], '{:.0f}')} | {spread(c['rounds'], '{:.0f}')} | "
              f"{spread([v / 1024 for v in sent], '{:.0f}')}"
              f"{'' if hooked else ' (allgather)'} | "
              f"{spread([v / 1024 for v in c['undeduplicated']], '{:.0f}') if hooked else '-'} |")
    if args.json:
        write_json(args.json, dict(runs=runs, batch=1024, steps=args.steps,
                                   machine=machine(), date=time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
