"""Tables split by key over the ps tasks of a parameter-server cluster.

Under TF_CONFIG with ps tasks, the Estimator's replica_device_setter puts
each variable on one ps task. A converted variable's table is instead cut
into one part per ps task (rewrite_rules.ps_shards): part i lives on
`/job:ps/task:i` and holds the keys whose owner (graphmod.embeddings.partition,
the same hash ranges as Horovod's ranks) is i. Workers hold no rows: a step's
lookups and applies run on the owning ps tasks.

Checkpoints (PsParts, the part layout TableSaver delegates to on the chief):
each ps task writes its parts of every table as part i of the checkpoint,
as Horovod ranks write theirs (graphmod.checkpoint.parts), so a checkpoint
restores on any number of ps tasks, on Horovod ranks, and in one process
with no cluster (evaluate, predict, export, the CLI).
"""
import json
import os
from typing import Dict, List, Optional

import tensorflow as tf

from graphmod.checkpoint import deltas
from graphmod.checkpoint.parts import PartLayout, TableParts, commit, commit_delta, part_prefix
from graphmod.embeddings.table import _TableDeltaSaveable, _TableSaveable, write_tables

tf1 = tf.compat.v1


def ps_task(device: str) -> Optional[int]:
    """The ps task a device string names (None: not a ps task)."""
    if not device:
        return None
    spec = tf.DeviceSpec.from_string(device)
    return spec.task or 0 if spec.job == "ps" else None


def ps_tasks(graph: tf.Graph) -> int:
    """How many ps tasks graph's variables are spread over: 0 when none is
    on a ps task (one process, or the evaluator of a cluster), else
    TF_CONFIG's number (what the Estimator reads), or without it the
    highest task a variable is on, plus one."""
    tasks = [ps_task(v.device) for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]
    tasks = [t for t in tasks if t is not None]
    if not tasks:
        return 0
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    except ValueError:
        cluster = {}
    return len(cluster.get("ps") or []) or max(tasks) + 1


def part_device(device: str, task: int) -> str:
    """device, on ps task `task`."""
    return tf.DeviceSpec.from_string(device).replace(job="ps", task=task).to_string()


class PsParts(PartLayout):
    """Each ps task saves and restores its part of every table; the chief
    drives them and writes the rest. parts: {table name: its parts, in ps
    task order} (graphmod.state's ps_shards). The ops of task i's part (its
    write, its restore and import) run on the task, so no table's rows
    travel through the chief."""

    def __init__(self, saveables: List[_TableSaveable], parts: Dict[str, list]):
        alone = sorted(s.table.name for s in saveables if s.table.name not in parts)
        if alone:
            raise ValueError(f"graphmod: tables {alone} (made with graphmod.create_table) are "
                             f"not sharded over the ps tasks, while {sorted(parts)} (converted "
                             "by the hook) are: one checkpoint cannot hold both; in a "
                             "parameter-server cluster, let GraphModifierHook convert embedding "
                             "variables instead")
        self._parts = parts
        self.size = len(next(iter(parts.values())))
        self.whose = f"{self.size} ps tasks"
        self._devices = [parts[saveables[0].table.name][i].handle.device
                         for i in range(self.size)]
        self.readers: List[TableParts] = []
        self._part, self._write = [], []
        for i in range(self.size):
            mine = [_TableSaveable(parts[s.table.name][i]) for s in saveables]
            with tf.device(self._devices[i]), tf1.name_scope(f"graphmod_ps_tables/ps{i}"):
                self.readers.append(TableParts(mine, i, self.size))
                self._part.append(tf1.placeholder(tf.string, [], name="part"))
                self._write.append(write_tables(mine, self._part[i], part=True))
        self._delta_part: List[tf.Tensor] = []
        self._delta_write: List[tf.Operation] = []

    def parts_of(self, table) -> list:
        return self._parts[table.name]

    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> list:
        for i in range(self.size):
            mine = [s for s in saveables if ps_task(s.table.handle.device) == i]
            with tf.device(self._devices[i]), tf1.name_scope(f"graphmod_ps_tables/ps{i}"):
                self.readers[i].build_deltas(mine)
                self._delta_part.append(tf1.placeholder(tf.string, [], name="delta_part"))
                self._delta_write.append(write_tables(mine, self._delta_part[i], part=True))
        return []

    def save(self, sess, checkpoint: str) -> str:
        """Every ps task writes its part at once; then the manifest commits
        them. A checkpoint saved again under its name (the chief saves the
        step it restored in every new session, e.g. after a ps task
        restarted) keeps its manifest until the new one replaces it: its
        parts are rewritten with the same rows, so a failed save leaves it
        restorable. Its old deltas go first: once the parts are written,
        ps tasks may write their parts of this checkpoint's first delta."""
        deltas.drop(checkpoint)
        sess.run(self._write, {p: part_prefix(checkpoint, i, self.size)
                               for i, p in enumerate(self._part)})
        commit(checkpoint, self.size)
        return checkpoint

    def save_delta(self, sess, base: str, index: int, step: int, feed: dict, save_rest) -> str:
        prefix = os.path.join(deltas.directory(base), deltas.delta_name(index))
        tf.io.gfile.makedirs(os.path.dirname(prefix))
        sess.run(self._delta_write, {**feed, **{
            p: part_prefix(prefix, i, self.size) for i, p in enumerate(self._delta_part)}})
        return commit_delta(base, index, step, self.size, save_rest)


def check_op_library(master: str, tasks: int, config=None) -> None:
    """Fails at once, naming the task, when a ps task's process lacks
    graphmod's op library (a stock tf.distribute.Server): TensorFlow's own
    error comes at the first step, worded as a missing op in "the binary
    running on" a host. Creates a one-column table named graphmod_probe on
    each task."""
    from graphmod.embeddings.table import create_table  # pylint: disable=import-outside-toplevel
    for i in range(tasks):
        with tf.Graph().as_default():
            with tf.device(f"/job:ps/task:{i}"):
                probe = create_table("graphmod_probe", 1, num_shards=1)
            try:
                with tf1.Session(master, config=config) as sess:
                    sess.run(probe.handle.op)
            except tf.errors.NotFoundError as e:
                if "Op type not registered" not in str(e):
                    raise
                raise RuntimeError(
                    f"graphmod: ps task {i} runs without graphmod's op library, so it cannot "
                    "hold the tables sharded onto it: start every ps task with a program that "
                    "imports graphmod (train_and_evaluate's script does, in every task)") from None
