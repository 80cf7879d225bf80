"""When tables split across Horovod ranks are saved: rank 0 decides, every rank writes.

A save of tables split across ranks is a collective (graphmod.horovod.rank_parts):
every rank writes the keys it owns as a part of one checkpoint, at the same
step. Horovod's examples lay training out so that the ranks' own saver
hooks would not agree on that: rank 0 alone has the model_dir (the
Estimator makes a temporary one on the others) or every rank its own, and
the RunConfig default saves every 600 seconds, by each rank's clock. So,
when GraphModifierHook begins training with tables split across ranks:

- coordinate() gathers every rank's save settings once (an allgather, in a
  graph of its own): rank 0's model_dir, CheckpointSaverHook schedule and
  delta settings become every rank's. The other ranks' own save settings
  and model_dirs are not used for the tables.
- Every rank's CheckpointSaverHook gets a SharedTimer: saves by steps
  trigger at rank 0's steps on every rank (every rank counts the same
  global steps); saves by time are decided by rank 0's clock alone, before
  a step, and the decision travels with that step's collectives (a
  one-element hvd.broadcast fetched beside the train op), so that every
  rank saves after the next step: a time-based save comes one step after
  rank 0's timer expired, at the same step everywhere. Deltas by time
  (incremental_every_secs) the same, at the step of the decision.
- Every rank writes its parts into rank 0's model_dir (TableSaver's
  rank0_dir) where it sees it (rank 0 writes a marker file there, which
  every rank looks for). Where some rank does not, ranks > 0 write their
  parts (of checkpoints and deltas) locally and send them to rank 0
  (graphmod.horovod.part_stream), and rank 0 sends the checkpoint to
  restore to the ranks > 0 (training and evaluation).
- Ranks > 0 restore rank 0's latest checkpoint (their session creator is
  pointed at rank 0's model_dir), and note rank 0's model_dir in their own
  (<model_dir>/graphmod/rank0_model_dir), where their predictions find
  the checkpoint to restore (restore_from_rank0). An evaluation of split tables is a
  collective: there every rank restores the checkpoint rank 0 restores
  (evaluate_rank0_checkpoint), also in a later process.
- Ranks that cannot follow rank 0 are refused on every rank before
  training: several CheckpointSaverHooks, a rank that saves checkpoints
  where rank 0 does not (or the reverse), other delta settings.
"""
import atexit
import json
import os
import shutil
import tempfile
import time
import uuid
from typing import List, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from graphmod import tf_private
from graphmod.checkpoint.parts import absolute

tf1 = tf.compat.v1

POINTER = os.path.join("graphmod", "rank0_model_dir")  # in a rank's own model_dir


class SharedTimer:
    """Stands in for a CheckpointSaverHook's SecondOrStepTimer (same
    methods): triggers at rank 0's save steps, or once `due` (set on every
    rank from rank 0's broadcast decision) for a save by time."""

    def __init__(self, every_steps: Optional[int], every_secs: Optional[float]):
        self.every_steps, self.every_secs = every_steps, every_secs
        self.due = False
        self.pending = False  # decided in the step just run: due from the next one
        self._last_step: Optional[int] = None
        self._last_time: Optional[float] = None

    def reset(self) -> None:
        self._last_step = self._last_time = None

    def arm(self) -> None:
        """Before a step: a decision that came with the previous step is due
        in this one, for every hook alike, whatever order the hooks'
        after_run() run in."""
        self.due, self.pending = self.due or self.pending, False

    def time_due(self) -> bool:
        """On rank 0, before a step: whether its clock says save (and no
        decision is pending already)."""
        return (self.every_secs is not None and not self.due and not self.pending
                and self._last_time is not None
                and time.time() - self._last_time >= self.every_secs)

    def should_trigger_for_step(self, step: int) -> bool:
        if self._last_step is None:
            return True
        if step == self._last_step:
            return False
        return self.due or (self.every_steps is not None and
                            step >= self._last_step + self.every_steps)

    def update_last_triggered_step(self, step: int):
        elapsed = (None if self._last_time is None else time.time() - self._last_time,
                   None if self._last_step is None else step - self._last_step)
        self._last_step, self._last_time, self.due = step, time.time(), False
        return elapsed

    def last_triggered_step(self) -> Optional[int]:
        return self._last_step


def gather(obj, name: str) -> list:
    """Every rank's obj (JSON), in rank order (a collective: every rank
    calls it alike): an allgather of bytes fed
    through placeholders (collectives with constant inputs run while the
    graph is built), in a graph and session of its own."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    with tf.Graph().as_default() as graph:
        size = tf1.placeholder(tf.int64, [1])
        sent = tf1.placeholder(tf.uint8, [None])
        sizes = hvd.allgather(size, name=f"{name}_sizes")
        every = hvd.allgather(sent, name=name)
        with tf1.Session(graph=graph) as sess:
            got_sizes, got = sess.run([sizes, every], {size: [len(data)], sent: data})
    ends = np.cumsum(got_sizes)
    return [json.loads(got[end - n:end].tobytes().decode()) for n, end in zip(got_sizes, ends)]


def _refuse(ranks: List[int], what: str) -> None:
    if ranks:
        raise ValueError(f"graphmod: the tables are sharded across Horovod ranks and saved by "
                         f"every rank at rank 0's save steps, into rank 0's model_dir: ranks "
                         f"{ranks} {what}")


class SaveSchedule(tf1.train.SessionRunHook):
    """Carries rank 0's time-based save decisions to every rank (see the
    module docstring); driven by GraphModifierHook before its EvictHook and
    IncrementalSaveHook. Made by coordinate()."""

    def __init__(self, rank: int, timers: List[SharedTimer], incremental, time_based: bool,
                 stream=None):
        self.rank, self.timers, self.incremental = rank, timers, incremental
        self.stream = stream  # a PartStream, closed at the end (after the last save)
        self.restored_copy: Optional[str] = None  # removed once the session restored it
        self.staging: Optional[str] = None  # removed at the end
        self._sent = self._decision = None
        if time_based:  # else every rank computes the same step-based decisions
            import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
            with tf1.name_scope("graphmod_save_schedule"):
                self._sent = tf1.placeholder(tf.int32, [2], name="due")
                self._decision = hvd.broadcast(self._sent, root_rank=0,
                                               name="graphmod_save_decision")

    def before_run(self, run_context):
        if self._decision is None:
            return None
        for t in self.timers:
            t.arm()
        due = [0, 0]
        if self.rank == 0:
            due[0] = int(any(t.time_due() for t in self.timers))
            due[1] = int(self.incremental is not None and self.incremental.time_due())
        return tf1.train.SessionRunArgs(self._decision, feed_dict={self._sent: due})

    def after_run(self, run_context, run_values) -> None:
        if self._decision is None:
            return
        full, delta = (bool(x) for x in run_values.results)
        if full:  # every rank's CheckpointSaverHook saves after the next step
            for t in self.timers:
                t.pending = True
        if delta and self.incremental is not None:  # written after this step
            self.incremental.due_by_time = True

    def after_create_session(self, session, coord) -> None:
        if self.restored_copy is not None:
            shutil.rmtree(self.restored_copy, ignore_errors=True)

    def close(self) -> None:
        """At exit (a saver hook's end() may save after this hook's end(),
        and a training that raised reaches no end())."""
        if self.stream is not None:
            self.stream.close()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)


def coordinate(estimator, incremental, graph: tf.Graph) -> Optional[SaveSchedule]:
    """Makes this rank save at rank 0's steps into rank 0's model_dir and
    restore rank 0's latest checkpoint (see the module docstring); refuses,
    on every rank alike, ranks that cannot. A collective: every rank calls
    it when it begins training. None (the rule logged) when the session's
    saves cannot be seen."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    from graphmod.checkpoint.saver import TableSaver  # pylint: disable=import-outside-toplevel
    rank = hvd.rank()
    session = tf_private.beginning_session()
    if session is None:
        logging.warning("graphmod: the tables are sharded across %d Horovod ranks: every rank "
                        "must save at the same steps, into one model_dir", hvd.size())
        return None
    hooks, creator = session
    saver_hooks = [h for h in hooks if isinstance(h, tf1.train.CheckpointSaverHook)]
    model_dir = estimator.model_dir if estimator is not None else None
    if model_dir is None and saver_hooks:
        model_dir = tf_private.saver_hook_settings(saver_hooks[0])[0]
    secs, steps = (tf_private.saver_hook_settings(saver_hooks[0])[1:] if saver_hooks
                   else (None, None))
    marker = None
    if rank == 0 and saver_hooks:
        # Where the others must see it: they write their parts here.
        marker = os.path.join(absolute(model_dir), "graphmod",
                              f".shared-{uuid.uuid4().hex}")
        tf.io.gfile.makedirs(os.path.dirname(marker))
        with tf.io.gfile.GFile(marker, "w") as f:
            f.write("written by rank 0 to check that every rank sees its model_dir\n")
    # 2: an evaluation from a saver hook's listener (train_and_evaluate on
    # one machine) runs on each rank's own clock and own model_dir: a
    # collective only some ranks would enter. 4: ranks > 0 restore rank 0's
    # checkpoint through their ChiefSessionCreator.
    evaluates = any(type(listener).__name__ == "_NewCheckpointListenerForEvaluate"
                    for h in saver_hooks for listener in getattr(h, "_listeners", []))
    mine = dict(model_dir=absolute(model_dir), secs=secs,
                evaluates=evaluates,
                restorable=isinstance(creator, tf1.train.ChiefSessionCreator),
                steps=steps, saver_hooks=len(saver_hooks), marker=marker,
                delta_steps=incremental.every_steps if incremental else None,
                delta_secs=incremental.every_secs if incremental else None)
    every = gather(mine, "graphmod_save_settings")
    first = every[0]
    try:
        _refuse([r for r, s in enumerate(every) if s["saver_hooks"] > 1],
                "have several CheckpointSaverHooks; keep one")
        _refuse([r for r, s in enumerate(every) if s["evaluates"]],
                "evaluate from their saver hook (train_and_evaluate on one machine), each "
                "by its own clock and model_dir; train with estimator.train and evaluate "
                "with estimator.evaluate on every rank")
        _refuse([r for r, s in enumerate(every) if r > 0 and not s["restorable"]],
                "run a session whose restore cannot be pointed at rank 0's checkpoint "
                "(a MonitoredSession without a ChiefSessionCreator); use an Estimator or "
                "MonitoredTrainingSession")
        _refuse([r for r, s in enumerate(every) if s["saver_hooks"] != first["saver_hooks"]],
                "save checkpoints where rank 0 does not, or the reverse; give every rank "
                "a model_dir or checkpoint_dir (any: rank 0's is used), or none")
        delta = ("delta_steps", "delta_secs")
        _refuse([r for r, s in enumerate(every) if any(s[k] != first[k] for k in delta)],
                "write deltas at other settings than rank 0 "
                f"(rank 0: incremental_every_steps={first['delta_steps']}, "
                f"incremental_every_secs={first['delta_secs']}); give every rank's "
                "GraphModifierHook the same settings")
        seen = gather(first["marker"] is None or tf.io.gfile.exists(first["marker"]),
                       "graphmod_save_dir_shared")
    finally:
        if marker is not None:
            tf.io.gfile.remove(marker)
    rank0_dir = first["model_dir"]
    stream = staging = mirror = None
    unseen = [r for r, s in enumerate(seen) if not s]
    if unseen:
        # Rank 0's model_dir is on no file system these ranks share: the
        # parts travel to rank 0 (graphmod.horovod.part_stream).
        from graphmod.horovod.part_stream import PartStream  # pylint: disable=import-outside-toplevel
        stream = PartStream()
        logging.info("graphmod: ranks %s do not see rank 0's model_dir %s: every rank > 0 "
                     "sends its parts of checkpoints and deltas to rank 0", unseen, rank0_dir)
        staging = tempfile.mkdtemp(prefix="graphmod_parts_") if rank > 0 else None
    timers = []
    for h in saver_hooks:
        timers.append(SharedTimer(first["steps"], first["secs"]))
        tf_private.set_saver_hook_timer(h, timers[-1])
    for saver in graph.get_collection(tf1.GraphKeys.SAVERS):
        if isinstance(saver, TableSaver):  # (graphmod.horovod.rank_parts)
            saver.rank0_dir, saver.part_stream = rank0_dir, (stream, staging) if stream else None
    if rank > 0 and rank0_dir is not None:
        if tf_private.session_checkpoint(creator) is None:  # (no explicit checkpoint given)
            # Rank 0's latest checkpoint, not this rank's own (empty) model_dir.
            tf_private.set_session_checkpoint_dir(creator, rank0_dir)
    if stream is not None and rank0_dir is not None:
        # ... or a copy of it that rank 0 sends (every rank takes part).
        latest = tf.train.latest_checkpoint(rank0_dir) if rank == 0 else None
        mirror = _mirror_rank0_checkpoint(stream, latest)
        if rank > 0 and tf_private.session_checkpoint(creator) is None:
            # Rank 0's copy, or, when it has none, nothing (not whatever this
            # host holds at rank 0's path).
            tf_private.set_session_checkpoint_dir(
                creator, os.path.dirname(mirror) if mirror is not None else None)
    if rank > 0 and rank0_dir is not None:
        if mine["model_dir"] is not None and mine["model_dir"] != rank0_dir:
            pointer = os.path.join(mine["model_dir"], POINTER)
            tf.io.gfile.makedirs(os.path.dirname(pointer))
            with tf.io.gfile.GFile(pointer, "w") as f:
                f.write(rank0_dir)
        logging.info("graphmod: rank %d saves its tables' parts at rank 0's save steps into "
                     "rank 0's model_dir %s and restores from there", rank, rank0_dir)
    if incremental is not None:
        incremental.coordinated = True
    time_based = first["secs"] is not None or first["delta_secs"] is not None
    schedule = SaveSchedule(rank, timers, incremental, time_based, stream)
    schedule.staging = staging
    atexit.register(schedule.close)
    if rank > 0 and mirror is not None:
        schedule.restored_copy = os.path.dirname(mirror)
    return schedule


def _mirror_rank0_checkpoint(stream, checkpoint: Optional[str]) -> Optional[str]:
    """Rank 0's checkpoint (rank 0 gives its path, the others None), its
    tables' parts and its committed deltas, copied to every rank > 0 into a
    local folder, with a `checkpoint` state file naming it; returns the
    copy's path there (rank 0: its own; None when rank 0 has none)."""
    files = {}
    if checkpoint is not None:
        folder, name = os.path.split(checkpoint)
        files = {f: os.path.join(folder, f) for f in tf.io.gfile.listdir(folder)
                 if f.startswith(name + ".")}
        chain = os.path.join(folder, "graphmod", "deltas", name)
        if tf.io.gfile.isdir(chain):
            for f in tf.io.gfile.listdir(chain):  # (files: a crashed save's _temp/ stays)
                if not tf.io.gfile.isdir(os.path.join(chain, f)):
                    files[os.path.join("graphmod", "deltas", name, f)] = os.path.join(chain, f)
    local = tempfile.mkdtemp(prefix="graphmod_rank0_checkpoint_") if stream.rank else None
    names = stream.from_rank0(files, local)
    if stream.rank == 0:
        return checkpoint
    if not names:
        shutil.rmtree(local, ignore_errors=True)
        return None
    name = next(n for n in names if n.endswith(".index") and ".tables" not in n
                and os.sep not in n)[:-len(".index")]
    path = os.path.join(local, name)
    tf1.train.update_checkpoint_state(local, path)
    return path


def evaluate_rank0_checkpoint() -> None:
    """In an evaluation of split tables (a collective: every rank evaluates) beginning:
    every rank restores the checkpoint rank 0 restores, whatever its own
    model_dir holds (a temporary dir made in another process holds nothing)."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    session = tf_private.beginning_session()
    mine = tf_private.session_checkpoint(session[1]) if session is not None else None
    first = gather(absolute(mine), "graphmod_evaluated_checkpoint")[0]
    seen = gather(first is None or tf.io.gfile.exists(first + ".index"),
                   "graphmod_evaluated_checkpoint_seen")
    path = first
    if not all(seen):  # a copy sent by rank 0 (graphmod.horovod.part_stream)
        from graphmod.horovod.part_stream import PartStream  # pylint: disable=import-outside-toplevel
        stream = PartStream()
        try:
            path = _mirror_rank0_checkpoint(stream, first if hvd.rank() == 0 else None)
        finally:
            stream.close()
        if hvd.rank() > 0 and path is not None:  # (read when the session is made)
            atexit.register(shutil.rmtree, os.path.dirname(path), True)
    if session is not None and hvd.rank() > 0 and path != mine:
        tf_private.set_session_checkpoint(session[1], path)
        logging.info("graphmod: evaluating rank 0's checkpoint %s (as %s; not %s)", first, path,
                     mine)


def rank0_dir_of(model_dir: Optional[str]) -> Optional[str]:
    """Rank 0's model_dir, as a rank > 0 that trained with model_dir noted
    it there (None when it did not)."""
    if not model_dir:
        return None
    pointer = os.path.join(model_dir, POINTER)
    if not tf.io.gfile.exists(pointer):
        return None
    with tf.io.gfile.GFile(pointer) as f:
        return f.read().strip() or None


def restore_from_rank0(model_dir: Optional[str]) -> None:
    """In a prediction session beginning on a rank > 0 that trained saving
    into rank 0's model_dir (prediction is no collective: each rank alone):
    restores rank 0's latest checkpoint when the session would restore none
    of its own, or an older one (a dense model's, from before the rank's
    training with split tables)."""
    rank0_dir = rank0_dir_of(model_dir)
    session = tf_private.beginning_session()
    if session is None:
        return
    creator = session[1]
    own = tf_private.session_checkpoint(creator)
    if own is not None:
        latest = tf.train.latest_checkpoint(rank0_dir) if rank0_dir else None
        if latest is not None and _step_of(latest) > _step_of(own):
            tf_private.set_session_checkpoint(creator, latest)
            logging.info("graphmod: restoring rank 0's checkpoint %s (newer than this rank's "
                         "own %s)", latest, own)
        return
    if rank0_dir is None:
        # (a temporary model_dir made in another process than the training's)
        logging.warning("graphmod: this Horovod rank's model_dir %s holds no checkpoint and "
                        "no note of rank 0's, where the training saved: it predicts from "
                        "initial values; predict on rank 0, or give this rank rank 0's "
                        "model_dir", model_dir)
        return
    latest = tf.train.latest_checkpoint(rank0_dir)
    if latest is None:
        logging.warning("graphmod: this Horovod rank sees no checkpoint in rank 0's model_dir "
                        "%s (a file system it does not share?): it predicts from initial "
                        "values; predict on rank 0", rank0_dir)
    else:
        tf_private.set_session_checkpoint(creator, latest)
        logging.info("graphmod: restoring rank 0's checkpoint %s (this rank's model_dir %s "
                     "holds none)", latest, model_dir)


def _step_of(checkpoint: str) -> int:
    """The global step in a checkpoint's name (model.ckpt-<step>), -1 without one."""
    tail = checkpoint.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
