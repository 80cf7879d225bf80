"""Runs a training script as a parameter-server cluster on this machine.

    python examples/ps_cluster.py --ps 2 --workers 1 -- python examples/ps_train.py /tmp/ps_model

Starts one process per task, all running the same command, each with the
TF_CONFIG of its task (chief, workers, ps tasks, evaluator) on free
127.0.0.1 ports, as `tf.estimator.train_and_evaluate` expects: the ps tasks
serve the variables (and graphmod's tables: GraphModifierHook shards each
table by key over all ps tasks), the chief and workers train, the
evaluator evaluates each new checkpoint. Each task's output goes to
<log_dir>/<task>.log. When the chief, the workers and the evaluator have
exited, the ps tasks (which serve until stopped) are stopped. Exit status: the
first non-zero one of the training tasks, else 0.

On a real cluster, set TF_CONFIG on each machine the same way, with the
machines' host:port pairs (see docs/parameter_servers.md).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List


def free_ports(n: int) -> List[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_configs(ps: int, workers: int, evaluator: bool) -> Dict[str, dict]:
    """{task name: its TF_CONFIG} for a cluster on 127.0.0.1. The evaluator
    is not a member of the cluster spec (it only reads checkpoints)."""
    ports = free_ports(1 + workers + ps)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "ps": [f"127.0.0.1:{p}" for p in ports[1 + workers:]]}
    if workers:
        cluster["worker"] = [f"127.0.0.1:{p}" for p in ports[1:1 + workers]]
    tasks = [("ps", i) for i in range(ps)] + [("worker", i) for i in range(workers)] + \
        [("chief", 0)] + ([("evaluator", 0)] if evaluator else [])
    return {f"{kind}{index}": {"cluster": cluster, "task": {"type": kind, "index": index}}
            for kind, index in tasks}


def run_cluster(command: List[str], ps: int = 2, workers: int = 0, evaluator: bool = True,
                log_dir: str = "", timeout: float = 3600) -> Dict[str, int]:
    """Runs command as each task of the cluster; returns {task: exit status}
    of the chief, workers and evaluator. Every process started is stopped."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="ps_cluster-")
    os.makedirs(log_dir, exist_ok=True)
    procs = {}
    try:
        for name, config in tf_configs(ps, workers, evaluator).items():
            env = dict(os.environ, TF_CONFIG=json.dumps(config), CUDA_VISIBLE_DEVICES="")
            with open(os.path.join(log_dir, f"{name}.log"), "w") as log:
                # Its own process group: stopping a task stops what it started.
                procs[name] = subprocess.Popen(command, env=env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        return {name: p.wait(timeout=timeout) for name, p in procs.items()
                if not name.startswith("ps")}
    finally:
        for p in procs.values():  # the ps tasks serve until stopped
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="besides the chief")
    parser.add_argument("--no-evaluator", action="store_true")
    parser.add_argument("--log-dir", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.ps < 1 or args.workers < 0:
        parser.error("give --ps >= 1, --workers >= 0 and the command after --")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="ps_cluster-")
    status = run_cluster(command, args.ps, args.workers, not args.no_evaluator, log_dir)
    for name, code in status.items():
        print(f"{name}: exit status {code} (log: {os.path.join(log_dir, name + '.log')})")
    return next((code for code in status.values() if code), 0)


if __name__ == "__main__":
    sys.exit(main())
