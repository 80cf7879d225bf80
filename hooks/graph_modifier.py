"""GraphModifierHook: turns an unchanged Estimator's embeddings into tables.

>>> estimator.train(input_fn, hooks=[graphmod.GraphModifierHook()])
>>> estimator.evaluate(input_fn, hooks=[graphmod.GraphModifierHook()])

In begin() (before the Estimator builds its Saver and init op) it runs the
one rewrite pipeline (graphmod.rewrite.pipeline: plan, rules, validity
check) and logs the RewriteReport, also written as JSON under
<model_dir>/graphmod/. Training saves the conversion plan there, and every
later graph of the model (evaluate, predict, export, resume) replays it. A
failed rewrite is undone and raised; a variable a rule refuses stays dense,
with a warning naming it and the reason.

Per-table admission and eviction settings (TableSettings) become the tables'
policies (graphmod.embeddings.features); when training, the hook then drives an
EvictHook (and, when asked, an IncrementalSaveHook), adds TensorBoard
summaries of each table's counters and logs them at the end. The rewrite also
makes the graph's Saver graphmod's TableSaver (incremental deltas, adoption
of dense checkpoints) and, when asked, builds a warm start from other models
into the variables' initialization.

Under Horovod (several ranks, hvd.DistributedOptimizer), the tables are
sharded by key across the ranks (graphmod.horovod): every rank saves its
keys at rank 0's save steps (steps or seconds, its RunConfig's, and
incremental_every_steps/secs) into rank 0's model_dir, whatever model_dir
the other ranks have, and restores from there
(graphmod.horovod.save_schedule, which begin() sets up and which refuses
ranks that cannot follow rank 0); every rank must evaluate with the hook too.
"""
import os
import sys
import weakref
from typing import Any, NamedTuple, Optional

import tensorflow as tf
from absl import logging

from graphmod import profiles, tf_private
from graphmod.ps import tables as ps
from graphmod.embeddings import features
from graphmod.horovod import save_schedule
from graphmod.hooks.evict import EvictHook
from graphmod.hooks.incremental_save import IncrementalSaveHook
from graphmod.hooks.profile import ProfileHook
from graphmod.checkpoint.serving_versions import ServingExport
from graphmod.checkpoint.warm_start import WarmStartSettings
from graphmod.rewrite.mode import graph_mode
from graphmod.rewrite.pipeline import rewrite
from graphmod.rewrite_rules import RULES
from graphmod.settings import MIN_ROWS, RewriteSettings
from graphmod.rewrite.report import RewriteReport
from graphmod.state import graph_state, tables as graphmod_tables

tf1 = tf.compat.v1


def _rank() -> int:
    """This process's Horovod rank (0 where Horovod does not run)."""
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd.rank() if hvd is not None and hvd.is_initialized() else 0


def _chief(estimator) -> bool:
    """The Estimator's chief, and Horovod's rank 0 where Horovod runs."""
    return estimator.config.is_chief and _rank() == 0


def _process(estimator) -> str:
    """This process's name among those training the model (its profile's
    file): its Horovod rank, its cluster task, or "train"."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        return f"rank{hvd.rank()}"
    if estimator is not None and estimator.config.cluster_spec.jobs:
        return f"{estimator.config.task_type}{estimator.config.task_id}"
    return "train"


class _Run(NamedTuple):
    """The graph begin() rewrites, and where its results go."""
    graph: tf.Graph
    estimator: Any  # the Estimator running it, if any
    mode: str
    model_dir: Optional[str]  # where the plan lives: beside the checkpoints it describes
    out_dir: Optional[str]  # where reports and graph dumps go (the hook's model_dir= first)

    @staticmethod
    def of(graph: tf.Graph, hook_dir: Optional[str]) -> "_Run":
        estimator = tf_private.running_estimator()
        estimator_dir = estimator.model_dir if estimator is not None else None
        return _Run(graph, estimator, graph_mode(graph, estimator is not None),
                    estimator_dir or hook_dir, hook_dir or estimator_dir)


def _check_ps_op_library(run: _Run) -> None:
    """A ps task without graphmod's ops fails here, named, before training."""
    config = run.estimator.config if run.estimator is not None else None
    if run.mode == "train" and config is not None and config.master and any(
            ps.ps_task(t.handle.device) is not None for t in graphmod_tables(run.graph)):
        ps.check_op_library(config.master, ps.ps_tasks(run.graph), config.session_config)


class GraphModifierHook(tf1.train.SessionRunHook):
    """Rewrites embedding variables into dynamic tables when the session starts.

    Args:
      min_rows: variables read only through gathers by identity ids and with at
        least this many rows are converted (default 10,000); variables read by
        hashed or modulo ids (hash-bucket columns, `ids % N` with N >= 1000)
        convert at any size, since their collisions are what the tables remove.
      tables: {fnmatch pattern of variable names: graphmod.TableSettings or a
        dict of its fields}; a matching variable is converted whatever its size
        (convert=False excludes it), with those settings.
      collision_free: feed tables the full key where a hash-bucket column or
        `ids % N` squeezed it into the variable's rows (default True; reported
        as an approximation, since ids that shared a row no longer do). A
        variable adopted from a dense checkpoint keeps its buckets.
      exact: convert only what trains exactly as the dense model: variables
        under a whole-variable L2 penalty and TF1 Adam variables (both
        approximated on a table) stay dense, and hashed ids keep their buckets.
      dump_graph: also write the GraphDefs before and after the rewrite.
      full_check: also prove the rewritten GraphDef imports (about a second
        per 10,000 ops; see graphmod.rewrite.validate).
      model_dir: where the report (and graphs) go, default the Estimator's; without
        an Estimator, also where the plan is kept (beside the checkpoints).
      timestamp_feature: name of the batch's timestamp feature (int seconds),
        or the tensor itself; lookups then stamp rows with the batch's newest
        timestamp instead of the wall clock.
      evict_time_interval, evict_step_interval: when tables with an
        eviction_threshold evict while training (see graphmod.EvictHook).
      incremental_every_steps, incremental_every_secs: when training writes
        incremental checkpoints (deltas) between the Estimator's full ones
        (see graphmod.IncrementalSaveHook); None for both: no deltas.
      warm_start: a graphmod.WarmStartSettings: on a fresh start (model_dir
        has no checkpoint yet), training starts tables and variables from
        other models' checkpoints, with renaming and a key filter.
      serving_export: a graphmod.ServingExport: while the chief trains
        an Estimator, a thread writes a portable SavedModel (stock TensorFlow
        ops only) as a new TF Serving version after each full checkpoint or
        committed delta (graphmod.checkpoint.serving_versions).
      profile_every_steps: every Nth training step of each process is traced
        and its op times and the tables' counters written to
        <model_dir>/graphmod/profile/ (graphmod.profiles), for `graphmod
        profile MODEL_DIR`.
      ids_ahead: under Horovod, a step's ids go to their owners during the
        step before, where they come from a plain tf.data iterator
        (graphmod.horovod.ids_ahead); False: each step sends its own.

    Only training decides what converts: evaluate, predict, export and resumes
    replay the plan training saved in model_dir (settings given to a later
    hook for variables of the plan do not change their tables).
    """

    def __init__(self, min_rows: int = MIN_ROWS, tables: Optional[dict] = None,
                 collision_free: bool = True, exact: bool = False, dump_graph: bool = False,
                 full_check: bool = False, model_dir: Optional[str] = None,
                 timestamp_feature=None, evict_time_interval: Optional[float] = 86400,
                 evict_step_interval: Optional[int] = None,
                 incremental_every_steps: Optional[int] = None,
                 incremental_every_secs: Optional[float] = None,
                 warm_start: Optional[WarmStartSettings] = None,
                 serving_export: Optional[ServingExport] = None,
                 profile_every_steps: Optional[int] = None, ids_ahead: bool = True):
        # (validates min_rows and the tables' settings, naming the hook)
        self.settings = RewriteSettings(min_rows, tables, collision_free, exact, warm_start,
                                        ids_ahead)
        self.dump_graph = dump_graph
        self.full_check = full_check
        self.model_dir = model_dir
        if timestamp_feature is not None and not isinstance(timestamp_feature, (str, tf.Tensor)):
            raise TypeError("GraphModifierHook: timestamp_feature must be a feature name or a "
                            f"tensor, got {type(timestamp_feature).__name__}")
        self.timestamp_feature = timestamp_feature
        # Which tables evict is known in begin() (the model's plan may say).
        self.evict_hook = EvictHook(evict_time_interval is not None or
                                    evict_step_interval is not None,
                                    evict_time_interval, evict_step_interval)
        self.incremental_hook = (
            IncrementalSaveHook(incremental_every_steps, incremental_every_secs)
            if incremental_every_steps is not None or incremental_every_secs is not None
            else None)
        if warm_start is not None and not isinstance(warm_start, WarmStartSettings):
            raise TypeError("GraphModifierHook: warm_start must be a graphmod.WarmStartSettings, "
                            f"got {type(warm_start).__name__}")
        self.warm_start = warm_start
        if serving_export is not None and not isinstance(serving_export, ServingExport):
            raise TypeError("GraphModifierHook: serving_export must be a graphmod.ServingExport, "
                            f"got {type(serving_export).__name__}")
        self.serving_export = serving_export
        self.profile_hook = (ProfileHook(profile_every_steps)
                             if profile_every_steps is not None else None)
        # Per graph: whether its session exports for serving, and its
        # tables' counters (a training graph with tables: its session drives
        # the EvictHook and IncrementalSaveHook). Kept by graph because one
        # hook may serve a training session and, while it runs, evaluations
        # (train_and_evaluate on one machine evaluates at each checkpoint).
        self._exporting: "weakref.WeakKeyDictionary[tf.Graph, bool]" = weakref.WeakKeyDictionary()
        self._counters: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()
        # Per graph too: a training graph's graphmod.horovod.save_schedule.SaveSchedule
        self._schedules: "weakref.WeakKeyDictionary[tf.Graph, Any]" = weakref.WeakKeyDictionary()
        # And the training graphs this process profiles.
        self._profiled: "weakref.WeakKeyDictionary[tf.Graph, bool]" = weakref.WeakKeyDictionary()
        self.report: Optional[RewriteReport] = None

    def begin(self) -> None:
        # The same hook may serve train, then evaluate or predict: nothing of
        # an earlier graph carries over (the EvictHook starts over in its begin()).
        run = _Run.of(tf1.get_default_graph(), self.model_dir)
        before = run.graph.as_graph_def() if self.dump_graph else None
        self.report = self._rewrite(run)
        self.report.log()
        _check_ps_op_library(run)
        self._follow_rank0(run)
        self._start_serving_export(run)
        self._write_report(run, before)
        self._start_profile(run)
        self._start_table_hooks(run)

    def _rewrite(self, run: "_Run") -> RewriteReport:
        timestamp, ts_name = None, ""
        try:
            if run.mode == "train" and self.timestamp_feature is not None:
                ts = self.timestamp_feature
                timestamp = tf_private.input_feature(ts) if isinstance(ts, str) else ts
                ts_name = ts if isinstance(ts, str) else ts.name
            return rewrite(run.graph, self.settings, run.mode, rules=RULES,
                           model_dir=run.model_dir, timestamp=timestamp, timestamp_name=ts_name,
                           full_check=self.full_check,
                           estimator_training=run.estimator is not None and run.mode == "train")
        except Exception as e:
            raise RuntimeError(f"graphmod: the rewrite failed and was undone: {e}") from e

    def _follow_rank0(self, run: "_Run") -> None:
        """Sharded ranks save together, at rank 0's save steps (by steps or by
        its clock), into rank 0's model_dir (the SaveSchedule to drive; None
        when the session's saves cannot be seen: the rule is logged). They
        restore rank 0's checkpoint: every rank in a sharded evaluation (a
        collective), a rank > 0 that trained so in its predictions."""
        sharded = self.report.sharded_ranks > 1
        if run.mode == "train" and self.incremental_hook is not None:
            self.incremental_hook.coordinated = False  # until this graph's ranks coordinate
        if run.mode == "train" and sharded:
            self._schedules[run.graph] = save_schedule.coordinate(
                run.estimator, self.incremental_hook, run.graph)
        elif run.mode == "eval" and sharded:
            save_schedule.evaluate_rank0_checkpoint()
        elif run.mode != "train" and run.estimator is not None and _rank() > 0:
            save_schedule.restore_from_rank0(run.estimator.model_dir)

    def _start_serving_export(self, run: "_Run") -> None:
        self._exporting[run.graph] = (self.serving_export is not None and run.mode == "train"
                                      and run.estimator is not None and _chief(run.estimator))
        if self._exporting[run.graph]:
            self.serving_export.start(run.estimator, RULES)

    def _write_report(self, run: "_Run", before) -> None:
        """The report (and the graphs before and after, for `graphmod diff
        MODEL_DIR`) under <model_dir>/graphmod/, by the chief or an evaluator:
        the workers of a parameter-server cluster share the chief's model_dir."""
        if run.out_dir and (run.estimator is None or run.estimator.config.is_chief
                            or run.estimator.config.task_type == "evaluator"):
            out = os.path.join(run.out_dir, "graphmod")
            self.report.write(out)
            if before is not None:
                tf.io.write_graph(before, out, f"graph_before_{run.mode}.pbtxt")
                tf.io.write_graph(run.graph.as_graph_def(), out, f"graph_after_{run.mode}.pbtxt")
                self.report.write_record(out)

    def _start_profile(self, run: "_Run") -> None:
        self._profiled[run.graph] = (self.profile_hook is not None and run.mode == "train"
                                     and run.out_dir is not None)
        if self._profiled[run.graph]:  # every process its own steps
            self.profile_hook.start(
                profiles.path_for(run.out_dir, _process(run.estimator)),
                self.report.counters or {})

    def _start_table_hooks(self, run: "_Run") -> None:
        """Evictions and deltas in a training graph with tables. They change
        the tables every task shares: in a parameter-server cluster the chief
        alone runs them (as it alone saves); Horovod ranks each run them on
        the keys they own."""
        drives = (run.estimator is None or run.estimator.config.is_chief
                  or self.report.sharded_ranks > 1)
        if not (self.report.counters and drives):
            return
        self._counters[run.graph] = self.report.counters
        self.evict_hook.table_names = [t.name for t in graphmod_tables(run.graph)
                                       if t.name in self.report.counters
                                       and features.policy_of(t).evicts]
        self.evict_hook.begin()
        if self.incremental_hook is not None:
            self.incremental_hook.begin()

    # The EvictHook and IncrementalSaveHook run inside this hook, in training
    # graphs with tables; first, with sharded tables, the SaveSchedule that
    # carries rank 0's save decisions (a step's full save precedes its
    # eviction, its delta follows it).
    def _driven(self, session):
        schedule = self._schedules.get(session.graph)
        driven = [schedule] if schedule is not None else []
        if self._counters.get(session.graph):
            driven += [h for h in (self.evict_hook, self.incremental_hook) if h is not None]
        if self._profiled.get(session.graph):
            driven.append(self.profile_hook)
        return driven

    def after_create_session(self, session, coord) -> None:
        for prime in graph_state(session.graph).primes:  # every rank alike, as the steps
            session.run(prime)
        for hook in self._driven(session):
            hook.after_create_session(session, coord)

    def before_run(self, run_context):
        args = [(i, h.before_run(run_context))
                for i, h in enumerate(self._driven(run_context.session))]
        args = [(i, a) for i, a in args if a is not None]
        if not args:
            return None
        feeds, options = {}, None
        for _, a in args:
            feeds.update(a.feed_dict or {})
            if a.options is not None:  # a profiled step's trace level
                options = options or tf1.RunOptions()
                options.MergeFrom(a.options)
        return tf1.train.SessionRunArgs({i: a.fetches for i, a in args}, feed_dict=feeds or None,
                                        options=options)

    def after_run(self, run_context, run_values) -> None:
        results = run_values.results or {}
        for i, hook in enumerate(self._driven(run_context.session)):
            hook.after_run(run_context, tf1.train.SessionRunValues(
                results.get(i), run_values.options, run_values.run_metadata))

    def end(self, session) -> None:
        if self._exporting.get(session.graph):  # its last version: the final checkpoint's
            self.serving_export.finish(int(session.run(tf1.train.get_global_step())))
        if not self._counters.get(session.graph):
            return
        for name, c in session.run(self._counters[session.graph]).items():
            logging.info("graphmod: table '%s': %d rows, %d admitted, %d lookups given no row, "
                         "%d evicted, %d ids pending admission", name, c["size"],
                         c["admitted"], c["rejected"], c["evicted"], c["pending"])
            if "disk_rows" in c:
                logging.info("graphmod: table '%s': %d rows in memory, %d on disk (%.1f MiB "
                             "of files); %.1f%% of looked-up ids were in memory (%d rows "
                             "prefetched); %d rows read from disk (%.1f MiB), %d ms compacting",
                             name, c["memory_rows"], c["disk_rows"], c["disk_file_bytes"] / 2**20,
                             100 * (1 - c["promoted"] / max(c["lookups"], 1)), c["prefetched"],
                             c["disk_reads"], c["disk_read_bytes"] / 2**20, c["compaction_ms"])
