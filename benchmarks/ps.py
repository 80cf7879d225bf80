"""PS benchmark: the reference Estimator over gRPC with 1 and 2 ps tasks, dense and hooked.

The workload is the project's reference (benchmarks/estimator.py, as in
benchmarks/horovod.py): FM + 128-64 DNN + linear term, 8 categorical
features of 120k Zipf ids in one embedding variable (dim 16) and one linear
weight (dim 1), 4 dense features, Adagrad, batch 1024 (256 batches of its
Zipf data, repeated; after the first pass the tables meet no new ids). Its model_fn is
unchanged; the hooked variant appends `graphmod.GraphModifierHook()` to the
EstimatorSpec's training_hooks. Each run is a real cluster on this machine
(examples/ps_cluster.py's run_cluster: one process per task, TF_CONFIG,
127.0.0.1 ports, every process stopped at the end): the chief (the only
worker) and 1 or 2 ps tasks, `tf.estimator.train_and_evaluate`, no
evaluator, no checkpoints or summaries while training. The Estimator's
replica_device_setter places the variables on the ps tasks; the hook puts
the tables wherever the current graphmod code puts them (this script does
not depend on it: it measures whatever the code does). Four runs:
  1 ps, dense      1 ps, hooked      2 ps, dense      2 ps, hooked
each in fresh processes, in turn within a round (ABCD, ABCD, ...).

Measured in the chief by a SessionRunHook over a window of steps: the
first --warmup steps (session start, graph warm-up, the tables' first
inserts) are excluded; the window runs from the end of step `warmup` to the
end of step `warmup + steps`. Per run:
  examples/s    window steps x 1024 / the window's wall-clock seconds
  step ms       median of the window's steps (before_run to after_run)
  CPU-s/M ex.   CPU-seconds (user + system, all threads) over the window of
                every process of the cluster (the chief and the ps tasks:
                /proc/<pid>/stat of the children of the benchmark process),
                per million examples; the ps tasks' share is reported too
  bytes/step    gRPC payload over the window, per step, read exactly from
                the kernel's per-socket TCP counters (tcp_info bytes_received
                and each socket's owner pid, via `ss -tinp`, netlink
                inet_diag) of the established TCP connections to the
                cluster's ports, snapshotted at both ends of the window (a
                connection opened inside it counts from zero). On loopback
                each connection is seen from both ends, and each end's
                bytes_received counts every payload byte once, on the side
                that received it: "to ps" is what the ps tasks' sockets
                received, "to chief" what the chief's did. (TensorFlow's
                runtime pulls tensors: a receiver asks the sender's server
                with RecvTensor, so the direction of the bytes is not that
                of the connection.) This is TCP payload: gRPC/HTTP2 framing
                and protobuf included, IP/TCP headers not; other traffic on
                the machine does not enter it. As a cross-check, the whole
                machine's loopback counter (/proc/net/dev "lo": headers and
                any other process's traffic included) over the same window
                is in the JSON (lo_bytes_per_step, approximate).
  placement     the devices of the embedding variables and of graphmod's
                tables in the chief's graph (JSON and printed once per run
                kind), so a reader sees which code was measured.
  other work    the machine's busy CPU-seconds over the window (/proc/stat)
                less the cluster's, as a share of all cores: how much other
                work shared the machine during the run (read the rates'
                spread against it); VM steal time is in the JSON. The
                machine's counters are sampled at clock ticks, the
                processes' come from scheduler run time: they disagree by a
                few % of the cores, so a small negative figure means none.
Figures are medians (min-max) over the rounds; ratios hooked / dense are
taken within each round and their median reported (benchmarks/rounds.py).

Limits (printed with the results): a 2-core VM shared with other work
runs the chief and every ps task: they contend for the same 2 cores (TF's
thread pools in each process are sized for 2 cores), so examples/s here
measure CPU contention more than a cluster's throughput, and 2 ps tasks
cannot run faster than 1 the way they would on their own machines; gRPC over
loopback has no network latency or bandwidth limit, so bytes per step (which
depend only on the graph and the data, and barely move between rounds) are
the figure that carries over to a real network. CPU-seconds per example are
steadier than wall-clock rates on a shared machine.

Usage: python benchmarks/ps.py [--steps 1000] [--warmup 100] [--rounds 5]
                               [--quick] [--json PATH]
  --quick: 1 round of 40 steps after 10 (a smoke test; writes no JSON
  unless --json is given). Default JSON: benchmarks/results/ps.json.
  The op library: graphmod's usual lookup (graphmod/_graphmod_ops.so of the
  imported package, or GRAPHMOD_OPS_LIBRARY), inherited by every task.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from rounds import machine, ratio_per_round, spread, write_json  # noqa: E402

RESULTS = os.path.join(HERE, "results", "ps.json")
RUNS = (("1 ps, dense", 1, False), ("1 ps, hooked", 1, True),
        ("2 ps, dense", 2, False), ("2 ps, hooked", 2, True))
TIMEOUT = 600  # seconds per cluster run


# --- measurements (run in the chief) ------------------------------------------

def cluster_pids():
    """The pids of the cluster's tasks: this process's siblings and itself
    (run_cluster starts every task as a child of the benchmark process)."""
    parent, pids = os.getppid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:  # fields[0] is the state, [1] the ppid
            pids.append(int(entry))
    return sorted(pids)


def cpu_seconds(pid):
    """User + system CPU-seconds of all threads of pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """(busy, steal) CPU-seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def lo_bytes():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])  # received bytes (= sent, on lo)
    return 0


_ADDR = re.compile(r"^\s*\d+\s+\d+\s+\S+:(\d+)\s+\S+:(\d+)")


def tcp_received(server_ports):
    """{(local port, peer port): (owner pid, bytes_received)} of the
    established TCP sockets of which either end is one of server_ports
    (kernel tcp_info counters and the sockets' owners, read with `ss -tinp`)."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    sockets, key = {}, None
    for line in out.splitlines():
        if not line[:1].isspace():  # "Recv-Q Send-Q local:port peer:port users:((..."
            head = _ADDR.match(line)
            key = (int(head.group(1)), int(head.group(2))) if head else None
            if key and (key[0] in server_ports or key[1] in server_ports):
                owner = re.search(r"\bpid=(\d+)", line)
                sockets[key] = (int(owner.group(1)) if owner else None, 0)
            else:
                key = None
        elif key is not None:  # its tcp_info line (bytes_received absent while 0)
            found = re.search(r"\bbytes_received:(\d+)", line)
            sockets[key] = (sockets[key][0], int(found.group(1)) if found else 0)
    return sockets


def task_main(hooked, model_dir, out_path, warmup, steps):
    """One task of the cluster (the same command runs as every task)."""
    import tensorflow as tf
    if hooked:
        import graphmod  # every task, ps tasks too: it loads the op library
    from estimator import B, make_data, make_model_fn
    tf1 = tf.compat.v1
    tf1.logging.set_verbosity(tf1.logging.WARN)
    config = json.loads(os.environ["TF_CONFIG"])
    all_ports = {int(a.rsplit(":", 1)[1]) for addrs in config["cluster"].values()
                 for a in addrs}

    class Window(tf1.train.SessionRunHook):
        """Wall clock, CPU of the cluster's processes, and TCP bytes over the
        window of steps after warm-up; writes them to out_path at its end."""

        def __init__(self):
            self.steps, self.step_s = 0, []

        def snapshot(self, start):
            """The counters; the CPU ones innermost, so that the `ss` process
            reading the TCP ones runs outside the window."""
            out = {} if start else dict(cpu={p: cpu_seconds(p) for p in self.pids},
                                        machine=machine_cpu())
            out.update(tcp=tcp_received(all_ports), lo=lo_bytes())
            if start:
                out.update(cpu={p: cpu_seconds(p) for p in self.pids}, machine=machine_cpu())
            return out

        def after_create_session(self, session, coord):
            """Where the embeddings live (after every hook's begin())."""
            ops = session.graph.get_operations()
            self.placement = dict(
                tables={op.name: op.device for op in ops if op.type == "GraphmodTable"},
                variables={op.name: op.device for op in ops if op.type == "VarHandleOp"
                           and op.name in ("emb", "w1")})

        def before_run(self, ctx):
            self.t = time.perf_counter()

        def after_run(self, ctx, values):
            now = time.perf_counter()
            self.steps += 1
            if warmup < self.steps <= warmup + steps:
                self.step_s.append(now - self.t)
            if self.steps == warmup:
                self.pids = cluster_pids()
                self.start = self.snapshot(start=True)
                self.t0 = time.perf_counter()  # the window starts after the snapshot
            elif self.steps == warmup + steps:
                wall = now - self.t0
                end = self.snapshot(start=False)
                self.write(wall, self.start, end)

        def write(self, wall, start, end):
            cpu = {p: end["cpu"][p] - start["cpu"][p] for p in self.pids}
            me = os.getpid()
            to_ps = to_chief = unowned = 0
            for key, (owner, received) in end["tcp"].items():
                delta = received - start["tcp"].get(key, (owner, 0))[1]
                if owner == me:
                    to_chief += delta  # received by the chief's sockets
                elif owner in cpu:
                    to_ps += delta  # received by a ps task's sockets
                else:
                    unowned += delta  # an owner ss could not name
            with open(out_path, "w") as f:
                json.dump(dict(wall_s=wall, steps=steps, batch=B, step_s=self.step_s,
                               cpu_s=sum(cpu.values()),
                               cpu_s_ps=sum(c for p, c in cpu.items() if p != me),
                               processes=len(self.pids),
                               to_ps=to_ps, to_chief=to_chief, unowned=unowned,
                               placement=self.placement,
                               lo=end["lo"] - start["lo"],
                               machine_busy_s=end["machine"][0] - start["machine"][0],
                               machine_steal_s=end["machine"][1] - start["machine"][1]), f)

    def model_fn(features, labels, mode):
        spec = make_model_fn("static")(features, labels, mode)
        if hooked:
            spec = spec._replace(training_hooks=tuple(spec.training_hooks)
                                 + (graphmod.GraphModifierHook(),))
        return spec

    task = config["task"]["type"]
    # 256 batches of data (as benchmarks/estimator.py, 200k rows), repeated;
    # every batch full.
    data = make_data(256 * B, seed=1) if task == "chief" else None

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(data).repeat().batch(
            B, drop_remainder=True).prefetch(2)

    run_config = tf.estimator.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=None, save_checkpoints_secs=None,
        save_summary_steps=10**9, log_step_count_steps=10**9)
    estimator = tf.estimator.Estimator(model_fn, config=run_config)
    hooks = [Window()] if task == "chief" else []
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=warmup + steps, hooks=hooks),
        tf.estimator.EvalSpec(input_fn, steps=1))


# --- the benchmark (the parent process) ----------------------------------------

def one_run(ps, hooked, warmup, steps):
    from ps_cluster import run_cluster
    root = tempfile.mkdtemp(prefix="graphmod_ps_bench_")
    try:
        out, logs = os.path.join(root, "window.json"), os.path.join(root, "logs")
        command = [sys.executable, os.path.abspath(__file__), "--task",
                   "--hooked" if hooked else "--dense", "--model-dir",
                   os.path.join(root, "model"), "--out", out,
                   "--warmup", str(warmup), "--steps", str(steps)]
        status = run_cluster(command, ps=ps, workers=0, evaluator=False, log_dir=logs,
                             timeout=TIMEOUT)
        if status != {"chief0": 0} or not os.path.exists(out):
            with open(os.path.join(logs, "chief0.log")) as f:
                raise RuntimeError(f"cluster run failed: {status}\n{f.read()[-3000:]}")
        with open(out) as f:
            w = json.load(f)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if w["processes"] != ps + 1:
        raise RuntimeError(f"found {w['processes']} cluster processes, expected {ps + 1}")
    examples = w["steps"] * w["batch"]
    return dict(examples_per_s=examples / w["wall_s"],
                step_ms=float(np.median(w["step_s"])) * 1e3,
                cpu_s_per_m=w["cpu_s"] / examples * 1e6,
                ps_cpu_s_per_m=w["cpu_s_ps"] / examples * 1e6,
                bytes_per_step=(w["to_ps"] + w["to_chief"] + w["unowned"]) / w["steps"],
                to_ps_per_step=w["to_ps"] / w["steps"],
                to_chief_per_step=w["to_chief"] / w["steps"],
                unowned_per_step=w["unowned"] / w["steps"],
                lo_bytes_per_step=w["lo"] / w["steps"],
                placement=w["placement"],
                other_work=(w["machine_busy_s"] - w["cpu_s"]) / (w["wall_s"] * os.cpu_count()),
                steal=w["machine_steal_s"] / (w["wall_s"] * os.cpu_count()))


def placement_text(placement):
    """'emb on /job:ps/task:0, ...; tables: ...' from a run's placement."""
    def devices(d):
        return ", ".join(f"{k} {v.replace('/job:', '')}" for k, v in sorted(d.items())) or "none"
    return f"variables: {devices(placement['variables'])}; tables: {devices(placement['tables'])}"


def limits(rounds):
    return (f"Limits: {os.cpu_count()} cores, shared with other work, run the chief and every ps "
            f"task (2-3 processes, each with TF's thread pools sized for all cores): examples/s "
            f"measure their contention, not a cluster's throughput, and 2 ps tasks cannot "
            f"outrun 1 here as they would on their own machines. gRPC runs over loopback (no "
            f"network latency or bandwidth limit): bytes per step depend only on the graph and "
            f"the data and carry over to a real network; wall-clock rates move between runs "
            f"(CPU-seconds per example less so). {rounds} interleaved round(s).")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (1000)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (100)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (5)")
    ap.add_argument("--quick", action="store_true", help="1 round of 40 steps after 10")
    ap.add_argument("--json", default=None, help=f"default {RESULTS} (not written with --quick)")
    ap.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hooked", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dense", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    quick = args.quick
    steps = args.steps or (40 if quick else 1000)
    warmup = args.warmup if args.warmup is not None else (10 if quick else 100)
    rounds = args.rounds or (1 if quick else 5)
    if args.task:
        task_main(args.hooked, args.model_dir, args.out, warmup, steps)
        return
    if warmup < 1 or steps < 1 or rounds < 1:
        ap.error("--warmup, --steps and --rounds must be positive")
    if shutil.which("ss") is None:
        sys.exit("benchmarks/ps.py needs `ss` (iproute2) to read the TCP byte counters")
    print(limits(rounds), flush=True)
    load0 = os.getloadavg()
    started = time.time()
    runs = {name: [] for name, _, _ in RUNS}
    for r in range(rounds):
        for name, ps, hooked in RUNS:
            x = one_run(ps, hooked, warmup, steps)
            runs[name].append(x)
            print(f"  round {r + 1}, {name:12s}: {x['examples_per_s']:8,.0f} examples/s, "
                  f"step {x['step_ms']:5.1f} ms, {x['cpu_s_per_m']:6.1f} CPU-s/M examples "
                  f"(ps {x['ps_cpu_s_per_m']:5.1f}), {x['bytes_per_step'] / 1024:7.1f} KiB/step "
                  f"(to ps {x['to_ps_per_step'] / 1024:.1f}, to chief "
                  f"{x['to_chief_per_step'] / 1024:.1f}; lo {x['lo_bytes_per_step'] / 1024:.1f}), "
                  f"other work {x['other_work']:.0%} of the cores",
                  flush=True)
            if r == 0:
                print(f"    placement: {placement_text(x['placement'])}", flush=True)
    load1 = os.getloadavg()
    col = {name: {k: [x[k] for x in xs] for k in xs[0]} for name, xs in runs.items()}
    ratios = {}
    for ps in (1, 2):
        d, h = col[f"{ps} ps, dense"], col[f"{ps} ps, hooked"]
        ratios[f"{ps} ps"] = dict(
            examples_per_s=float(np.median(ratio_per_round(h["examples_per_s"],
                                                           d["examples_per_s"]))),
            cpu_per_example=float(np.median(ratio_per_round(h["cpu_s_per_m"], d["cpu_s_per_m"]))),
            bytes_per_step=float(np.median(ratio_per_round(h["bytes_per_step"],
                                                           d["bytes_per_step"]))))
    print(f"\nreference Estimator (8 features x 120k Zipf ids in one variable, dim 16 + linear "
          f"dim 1; FM + 128-64 DNN; Adagrad), batch 1024, chief + ps tasks over gRPC on "
          f"127.0.0.1; {steps} timed steps after {warmup} of warm-up per run; median (min-max) "
          f"over {rounds} interleaved round(s); load average {load0[0]:.2f} before, "
          f"{load1[0]:.2f} after; {(time.time() - started) / 60:.1f} min")
    print("| run | examples/s | step ms | CPU-s per M examples (all tasks) | of which ps | "
          "KiB per step over gRPC | to ps | to chief | other work | hooked / dense |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, ps, hooked in RUNS:
        c = col[name]
        rel = "-"
        if hooked:
            q = ratios[f"{ps} ps"]
            rel = (f"examples/s {q['examples_per_s']:.2f}x, CPU per example "
                   f"{q['cpu_per_example']:.2f}x, bytes {q['bytes_per_step']:.2f}x")
        print(f"| {name} | {spread(c['examples_per_s'], '{:,.0f}')} | "
              f"{spread(c['step_ms'], '{:.1f}')} | {spread(c['cpu_s_per_m'], '{:.1f}')} | "
              f"{spread(c['ps_cpu_s_per_m'], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['bytes_per_step']], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['to_ps_per_step']], '{:.1f}')} | "
              f"{spread([v / 1024 for v in c['to_chief_per_step']], '{:.1f}')} | "
              f"{spread([v * 100 for v in c['other_work']], '{:.0f}')}% | {rel} |")
    print(limits(rounds))
    out = args.json or (None if quick else RESULTS)
    if out:
        write_json(out, dict(runs=runs, ratios_hooked_over_dense=ratios, batch=1024,
                             steps=steps, warmup=warmup, rounds=rounds, limits=limits(rounds),
                             load_average=[load0, load1], machine=machine(),
                             date=time.strftime("%Y-%m-%d")))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
