"""EvictHook: removes idle rows from tables with an eviction_threshold.

>>> estimator.train(input_fn, hooks=[graphmod.EvictHook(evict_step_interval=1000)])

Every evict_time_interval seconds and/or every evict_step_interval global
steps of training, each table whose policy (graphmod.embeddings.features) has an
eviction_threshold drops the rows and counted ids not seen within that
threshold of the table's newest lookup, and the hook logs what went. Add it to
training only; GraphModifierHook builds and drives one by itself.
"""
import time
from typing import List, Optional

import tensorflow as tf
from absl import logging

from graphmod import horovod, tf_private
from graphmod.embeddings import features
from graphmod.embeddings.table import Table
from graphmod.state import tables

tf1 = tf.compat.v1


def _check_interval(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"EvictHook: {name} must be a positive number or None, got {value!r}")


class EvictHook(tf1.train.SessionRunHook):
    """Triggers eviction by wall-clock interval, global-step interval, or both.

    Args:
      evict_enable: False makes the hook do nothing.
      evict_time_interval: seconds between evictions (None: not by time).
      evict_step_interval: global steps between evictions (None: not by steps).
      table_names: the tables to evict from (default: every table of the graph
        whose policy has an eviction_threshold).
    """

    def __init__(self, evict_enable: bool = True, evict_time_interval: Optional[float] = 86400,
                 evict_step_interval: Optional[int] = None,
                 table_names: Optional[List[str]] = None):
        _check_interval("evict_time_interval", evict_time_interval)
        _check_interval("evict_step_interval", evict_step_interval)
        if evict_enable and evict_time_interval is None and evict_step_interval is None:
            raise ValueError("EvictHook: give evict_time_interval, evict_step_interval or both")
        self.evict_enable = bool(evict_enable)
        self.enabled = self.evict_enable  # for this graph: decided again in every begin()
        self.time_interval = evict_time_interval
        self.step_interval = evict_step_interval
        self.table_names = table_names
        self.tables: List[Table] = []
        self.evictions = 0  # times eviction ran

    def begin(self) -> None:
        graph = tf1.get_default_graph()
        by_name = {t.name: t for t in tables(graph)}
        names = self.table_names
        if names is None:
            names = [n for n, t in by_name.items() if features.policy_of(t).evicts]
        for n in names:
            if n not in by_name:
                raise ValueError(f"EvictHook: no graphmod table '{n}' in the graph "
                                 f"(tables: {sorted(by_name)})")
            if not features.policy_of(by_name[n]).evicts:
                raise ValueError(f"EvictHook: graphmod table '{n}' has no eviction_threshold "
                                 "(set one with FeatureSpec or the hook's table settings)")
        self.tables = [by_name[n] for n in names]
        self.enabled = self.evict_enable
        if self.enabled and self.tables and not any(
                op.type in ("GraphmodTableFindOrInsert", "GraphmodFusedFindOrInsert")
                for op in graph.get_operations()):
            # Evaluation and prediction graphs only read tables: never evict there.
            logging.info("EvictHook: no training lookup in this graph; eviction is off")
            self.enabled = False
        # The step read CheckpointSaverHook uses (see after_run).
        self._step = tf_private.global_step_read(graph)
        if self.enabled and self.step_interval is not None and self._step is None:
            raise ValueError("EvictHook: evict_step_interval needs a global step in the graph")
        # Tables sharded across Horovod ranks hold their owner's keys only:
        # the table's newest lookup over every rank is the step's, which
        # after_run feeds (so a rank whose keys were not read this step cuts
        # where one rank would). Evicting needs no collective.
        sharded = horovod.active(graph)
        with tf1.name_scope("graphmod/evict"):
            self._step_now = tf1.placeholder_with_default(tf.constant(-1, tf.int64), [],
                                                          name="step_now")
            self._evict = {}
            for t in self.tables:
                policy = features.policy_of(t)
                # Parts on ps tasks cut where the table would: at its
                # newest lookup over every part.
                parts = features.parts(t)
                latest = (parts[0].info()["latest"] if len(parts) == 1 else
                          tf.reduce_max(tf.stack([p.info()["latest"] for p in parts])))
                if sharded and policy.eviction_unit == "steps":
                    latest = tf.where(self._step_now >= 0, self._step_now, latest)
                cut = latest - policy.eviction_threshold
                evicted = [p.evict(cut) for p in parts]
                self._evict[t.name] = dict(cut=cut, evicted=evicted[0] if len(evicted) == 1
                                           else tf.add_n(evicted))
            # Counted after the eviction, so the log shows what is left.
            with tf.control_dependencies([d["evicted"] for d in self._evict.values()]):
                self._counters = {t.name: features.counters(t) for t in self.tables}

    def after_create_session(self, session, coord) -> None:
        self._last_time = time.time()
        self._last_step = session.run(self._step) if self._step is not None else 0

    def before_run(self, run_context):
        if self._step is not None and self.tables and self.enabled:
            return tf1.train.SessionRunArgs(self._step)
        return None

    def after_run(self, run_context, run_values) -> None:
        if not (self.enabled and self.tables):
            return
        due = (self.time_interval is not None and
               time.time() - self._last_time >= self.time_interval)
        if self._step is None:
            if due:
                self.evict(run_context.session)
            return
        # The read fetched beside the train op runs before or after its
        # increment (nothing orders them): it may be this run's step (the
        # clock its lookups stamped) or one more. When that could be due,
        # a read after the run tells exactly (CheckpointSaverHook does the
        # same), so evictions never shift a step under load.
        step = run_values.results
        if due or (self.step_interval is not None and
                   step - self._last_step >= self.step_interval):
            step = run_context.session.run(self._step) - 1  # the run's own step
            due |= (self.step_interval is not None and
                    step - self._last_step >= self.step_interval)
        if due:
            self.evict(run_context.session, step)

    def evict(self, session, step: Optional[int] = None) -> dict:
        """Evicts now (after training step `step`, when known); returns
        {table: rows evicted}."""
        done, counters = session.run([self._evict, self._counters],
                                     {self._step_now: step} if step is not None else None)
        self._last_time, self._last_step = time.time(), step or 0
        self.evictions += 1
        for name, d in done.items():
            c = counters[name]
            logging.info("graphmod: evicted %d row(s) of table '%s' last seen before %d "
                         "(global step %d); rows %d, admitted %d, rejected lookups %d, "
                         "evicted %d, pending ids %d", d["evicted"], name, d["cut"], step,
                         c["size"], c["admitted"], c["rejected"], c["evicted"], c["pending"])
        return {name: int(d["evicted"]) for name, d in done.items()}
