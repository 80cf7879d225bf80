"""IncrementalSaveHook: writes incremental checkpoints (deltas) between full ones.

>>> estimator.train(input_fn, hooks=[graphmod.GraphModifierHook(incremental_every_steps=100)])
>>> # or, with the table API:
>>> estimator.train(input_fn, hooks=[graphmod.IncrementalSaveHook(every_steps=100)])

Every every_steps global steps and/or every_secs seconds of training, it
writes a delta after the latest full checkpoint (graphmod.checkpoint.deltas): the table
rows inserted or updated since the previous save, the keys removed since
(evicted, pushed out of a full table, removed), the admission counts that
changed, and every other variable whole. The full checkpoints stay the
Estimator's (save_checkpoints_steps/secs); each starts a new chain, and a
restore of it applies its committed deltas in order, in every mode. Deltas
need the graph's Saver to be graphmod's TableSaver, which GraphModifierHook's
rewrite installs (this hook installs it for table-API graphs).

With tables sharded across Horovod ranks every rank writes its part of a
delta at the same step: when GraphModifierHook drives this hook, rank 0's
settings and clock decide (graphmod.horovod.save_schedule); used alone
there, it writes by steps only.
"""
import os
import time
from typing import Optional

import tensorflow as tf
from absl import logging

from graphmod import tf_private
from graphmod.checkpoint import deltas
from graphmod.checkpoint import saver as table_saver
from graphmod.rewrite.pipeline import install_saver
from graphmod.state import tables

tf1 = tf.compat.v1


def _check_interval(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"IncrementalSaveHook: {name} must be a positive number or None, "
                         f"got {value!r}")


class IncrementalSaveHook(tf1.train.SessionRunHook):
    """Writes a delta every every_steps global steps and/or every_secs seconds."""

    def __init__(self, every_steps: Optional[int] = None, every_secs: Optional[float] = None):
        _check_interval("every_steps", every_steps)
        _check_interval("every_secs", every_secs)
        if every_steps is None and every_secs is None:
            raise ValueError("IncrementalSaveHook: give every_steps, every_secs or both")
        self.every_steps, self.every_secs = every_steps, every_secs
        self.saver: Optional[table_saver.TableSaver] = None
        self.deltas_written = 0
        # Sharded tables under GraphModifierHook: every_secs is rank 0's
        # clock, whose decision (graphmod.horovod.save_schedule) sets
        # due_by_time on every rank at the same step.
        self.coordinated = False
        self.due_by_time = False

    def begin(self) -> None:
        graph = tf1.get_default_graph()
        self.saver = None
        # The step read CheckpointSaverHook uses (see after_run).
        self._step = tf_private.global_step_read(graph)
        if self._step is None:
            raise ValueError("IncrementalSaveHook: the graph has no global step")
        savers = graph.get_collection(tf1.GraphKeys.SAVERS)
        if tables(graph) and not any(isinstance(s, table_saver.TableSaver) for s in savers):
            # A table-API graph: nothing installed graphmod's Saver yet.
            try:
                changes = install_saver(graph).summary()
            except table_saver.NotReplaceable as e:
                raise ValueError(f"IncrementalSaveHook: {e}; deltas need graphmod's "
                                 "TableSaver as the graph's Saver") from None
            logging.info("graphmod: IncrementalSaveHook made the graph's Saver graphmod's "
                         "TableSaver: %s", changes)

    def after_create_session(self, session, coord) -> None:
        del coord
        savers = [s for s in tf1.get_collection(tf1.GraphKeys.SAVERS)
                  if isinstance(s, table_saver.TableSaver)]
        if not savers:
            logging.warning("graphmod: IncrementalSaveHook: no deltas are written: the graph "
                            "has no graphmod tables, or its Saver is the model's own (a "
                            "Scaffold's, or already built), not graphmod's TableSaver")
            return
        if savers[0].sharded and self.every_secs is not None and not self.coordinated:
            # Every rank writes its part of a delta at the same step.
            raise ValueError("IncrementalSaveHook: the tables are sharded across Horovod ranks, "
                             "whose deltas must be written at the same steps: every_secs "
                             "would write them at different steps on each rank (use "
                             "every_steps)")
        self.saver = savers[0]
        # Tables note removals from here on; what follows the deltas this
        # session restored (a torn one, stray files) is dropped.
        self.saver.start_tracking(session)
        self.saver.continue_chain()
        self._last_step = session.run(self._step)
        self._last_time = time.time()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._step) if self.saver is not None else None

    def after_run(self, run_context, run_values) -> None:
        if self.saver is None:
            return
        # The read fetched beside the train op runs before or after its
        # increment (nothing orders them): it says the step is at most one
        # more than it read, and when that would be due, a read after the
        # run tells (CheckpointSaverHook does the same).
        step = run_values.results + 1
        if self.every_steps is not None and step - self._last_step >= self.every_steps:
            step = run_context.session.run(self._step)
        by_time = self.due_by_time if self.coordinated else self._time_elapsed()
        due = (self.every_steps is not None and step - self._last_step >= self.every_steps) or by_time
        if due:
            self._write(run_context.session)

    def _time_elapsed(self) -> bool:
        return self.every_secs is not None and time.time() - self._last_time >= self.every_secs

    def time_due(self) -> bool:
        """On rank 0, before a step: whether its clock says write a delta
        (graphmod.horovod.save_schedule)."""
        return self.saver is not None and not self.due_by_time and self._time_elapsed()

    def _write(self, session) -> None:
        step = session.run(self._step)
        start = time.time()
        base = self.saver.chain[0]
        prefix = self.saver.save_delta(session, step)
        self._last_step, self._last_time, self.due_by_time = step, time.time(), False
        if prefix is None:
            logging.warning("graphmod: no full checkpoint to follow yet: no delta at step %d",
                            step)
            return
        self.deltas_written += 1
        # (parts: sharded tables; none here on a rank > 0 that sent its part
        # to rank 0, graphmod.horovod.part_stream)
        written = (deltas.files(prefix) + deltas.part_files(prefix)
                   if tf.io.gfile.isdir(os.path.dirname(prefix)) else [])
        size = sum(tf.io.gfile.stat(f).length for f in written if tf.io.gfile.exists(f))
        logging.info("graphmod: delta %d after %s at step %d: %.1f KB in %.2fs",
                     self.saver.chain[1], base, step, size / 1024, time.time() - start)
