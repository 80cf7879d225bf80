"""GraphModifierHook: turns an unchanged Estimator's embeddings into tables.

>>> estimator.train(input_fn, hooks=[graphmod.GraphModifierHook()])
>>> estimator.evaluate(input_fn, hooks=[graphmod.GraphModifierHook()])

In begin() (before the Estimator builds its Saver and init op) it plans the
conversion (graphmod.conversion), runs the rules of graphmod.rewrite_rules
through one Rewriter, checks the result (graphmod.validate), and logs a
RewriteReport, also written as JSON under <model_dir>/graphmod/. A failed
rewrite is undone and raised; a variable a rule refuses stays dense, with a
warning naming it and the reason.

Per-table admission and eviction settings (TableSettings) become the tables'
policies (graphmod.features); when training, the hook then drives an
EvictHook, adds TensorBoard summaries of each table's counters and logs them
at the end.
"""
import dataclasses
import inspect
import json
import os
import time
from typing import Dict, List, Optional, Tuple

import tensorflow as tf
from absl import logging

from graphmod import features, validate
from graphmod.conversion import TableSettings, plan
from graphmod.hooks.evict import EvictHook
from graphmod.rewriter import Rewriter
from graphmod.table import graph_state
from graphmod.rewrite_rules import (collisionless_keys, gather_to_lookup, optimizer_updates,
                                    saver_swap)

tf1 = tf.compat.v1


@dataclasses.dataclass
class RewriteReport:
    graph: str                      # "train", "eval" or "predict"
    seconds: float
    phase_seconds: Dict[str, float]  # plan, rewrite, validate
    tables: List[dict]
    skipped: List[dict]
    rules: Dict[str, Dict[str, int]]
    dense_bytes_freed: int
    unsqueezed_keys: List[str]      # hash-bucket / modulo ops whose full keys now feed tables
    squeezed_keys_kept: List[dict]  # those left alone, with the reason

    def log(self) -> None:
        logging.info("graphmod: %d embedding variable(s) -> tables in %.2fs (%s graph), "
                     "%.1f MB of dense variables and slots no longer allocated",
                     len(self.tables), self.seconds, self.graph, self.dense_bytes_freed / 1e6)
        for t in self.tables:
            logging.info("graphmod:   %s [%d x %d] -> table '%s' (%d lookup(s), optimizer %s)",
                         t["variable"], t["rows"], t["dim"], t["table"], t["lookups"],
                         t["optimizer"])
        for s in self.skipped:
            logging.warning("graphmod: '%s' stays a dense variable: %s", s["variable"],
                            s["reason"])
        if self.unsqueezed_keys:
            logging.info("graphmod: collision-free keys from %s", ", ".join(self.unsqueezed_keys))
        for k in self.squeezed_keys_kept:
            logging.warning("graphmod: ids of '%s' keep sharing rows: %s", k["op"], k["reason"])


def _estimator_call() -> Tuple[Optional[str], Optional[str]]:
    """(model_dir, method) of the Estimator call building this graph, if any:
    hooks are not told either, but the Estimator is on the call stack."""
    frame = inspect.currentframe()
    found = (None, None)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, tf.compat.v1.estimator.Estimator):  # V2 subclasses it
            found = (owner.model_dir, frame.f_code.co_name)  # the outermost call wins
        frame = frame.f_back
    return found


def _input_feature(name: str) -> tf.Tensor:
    """The feature `name` of the batch the Estimator on the call stack feeds
    its model_fn (the `features` dict of its train/evaluate/predict frame)."""
    frame = inspect.currentframe()
    seen = None
    while frame is not None:
        batch = frame.f_locals.get("features")
        if isinstance(batch, dict):
            if name in batch:
                return batch[name]
            seen = sorted(batch)
        frame = frame.f_back
    raise ValueError(f"GraphModifierHook: timestamp_feature '{name}' is not in the input batch "
                     f"({'its features: ' + str(seen) if seen else 'no features dict found'}); "
                     "pass the timestamp tensor itself when not training an Estimator")


def _dense_in_checkpoint(model_dir: Optional[str]) -> set:
    """Variables the latest checkpoint in model_dir holds densely (not as tables)."""
    ckpt = tf.train.latest_checkpoint(model_dir) if model_dir else None
    if ckpt is None:
        return set()
    names = {name for name, _ in tf.train.list_variables(ckpt)}
    return {n for n in names if f"{n}-keys" not in names}


def _graph_mode(graph: tf.Graph, method: Optional[str]) -> str:
    """'train', 'eval' or 'predict'. An Estimator's model_fn may build its
    optimizer in every mode, so the optimizer alone does not tell."""
    if method == "predict" or method == "export_saved_model":
        return "predict"
    if graph.get_collection(tf1.GraphKeys.EVAL_STEP):
        return "eval"
    return "train"


class GraphModifierHook(tf1.train.SessionRunHook):
    """Rewrites embedding variables into dynamic tables when the session starts.

    Args:
      min_rows: variables read only through gathers and with at least this many
        rows are converted (default 10,000).
      tables: {fnmatch pattern of variable names: graphmod.TableSettings or a
        dict of its fields}; a matching variable is converted whatever its size
        (convert=False excludes it), with those settings.
      collision_free: feed tables the full key where a hash-bucket column or
        `ids % N` squeezed it into the variable's rows (default True).
      dump_graph: also write the GraphDefs before and after the rewrite.
      full_check: also prove the rewritten GraphDef imports (about a second
        per 10,000 ops; see graphmod.validate).
      model_dir: where the report (and graphs) go; default: the Estimator's.
      timestamp_feature: name of the batch's timestamp feature (int seconds),
        or the tensor itself; lookups then stamp rows with the batch's newest
        timestamp instead of the wall clock.
      evict_time_interval, evict_step_interval: when tables with an
        eviction_threshold evict while training (see graphmod.EvictHook).
    """

    def __init__(self, min_rows: int = 10_000, tables: Optional[dict] = None,
                 collision_free: bool = True, dump_graph: bool = False,
                 full_check: bool = False, model_dir: Optional[str] = None,
                 timestamp_feature=None, evict_time_interval: Optional[float] = 86400,
                 evict_step_interval: Optional[int] = None):
        if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 0:
            raise ValueError(f"GraphModifierHook: min_rows must be an integer >= 0, got {min_rows!r}")
        self.min_rows = min_rows
        self.tables = {}
        for pattern, settings in (tables or {}).items():
            if isinstance(settings, dict):
                try:
                    settings = TableSettings(**settings)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"GraphModifierHook: bad settings for tables pattern "
                                     f"'{pattern}': {e}") from None
            if not isinstance(settings, TableSettings):
                raise TypeError(f"GraphModifierHook: settings for '{pattern}' must be a dict or "
                                f"TableSettings, got {type(settings).__name__}")
            self.tables[pattern] = settings
        self.collision_free = collision_free
        self.dump_graph = dump_graph
        self.full_check = full_check
        self.model_dir = model_dir
        if timestamp_feature is not None and not isinstance(timestamp_feature, (str, tf.Tensor)):
            raise TypeError("GraphModifierHook: timestamp_feature must be a feature name or a "
                            f"tensor, got {type(timestamp_feature).__name__}")
        self.timestamp_feature = timestamp_feature
        evicting = [p for p, t in self.tables.items() if t.policy.evicts and t.convert]
        self.evict_hook = EvictHook(bool(evicting), evict_time_interval, evict_step_interval)
        self.report: Optional[RewriteReport] = None
        self._counters = {}

    def begin(self) -> None:
        graph = tf1.get_default_graph()
        start = time.time()
        # The same hook may serve train, then evaluate or predict: nothing of
        # an earlier graph carries over (the EvictHook starts over in its begin()).
        self._counters = {}
        estimator_dir, method = _estimator_call()
        model_dir = self.model_dir or estimator_dir
        mode = _graph_mode(graph, method)
        before = graph.as_graph_def() if self.dump_graph else None
        conversions, skipped = plan(graph, self.min_rows, self.tables, training=mode == "train")
        dense_in_checkpoint = _dense_in_checkpoint(model_dir)
        variables_by_op = {v.op: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
        ready = []
        for c in conversions:
            if c.variable.op.name in dense_in_checkpoint:
                # Restoring would fail; taking a dense checkpoint into a table is
                # warm start's job.
                skipped.append((c.variable.op.name, "the checkpoint in model_dir holds it as a "
                                "dense variable (trained without the hook, or refused then)"))
                continue
            try:
                gather_to_lookup.check(c)
                translation = (optimizer_updates.translate(c.update, variables_by_op)
                               if c.training else None)
                layout = translation.slot_layout() if translation else None
            except (gather_to_lookup.Refused, optimizer_updates.Untranslatable) as e:
                skipped.append((c.variable.op.name, str(e)))
                continue
            ready.append((c, translation, layout))
        training = mode == "train"
        planned = time.time()
        rw = Rewriter(graph)
        freed = 0
        unsqueezed, kept = [], []
        state = graph_state(graph)
        clocks, timestamp = dict(state.clocks), state.timestamp
        try:
            if training and self.timestamp_feature is not None:
                ts = self.timestamp_feature
                features.set_timestamp(_input_feature(ts) if isinstance(ts, str) else ts,
                                       ts if isinstance(ts, str) else ts.name, graph)
            for c, _, _ in ready:
                features.set_policy(c.table_name, c.settings.policy, graph)
            if self.collision_free:
                unsqueezed, kept = collisionless_keys.unsqueeze(
                    rw, {c.table_name: [g.op for g in c.gathers] for c, _, _ in ready},
                    # old updates never run, in any mode: a model_fn may build
                    # its optimizer in eval and predict graphs too, and the keys
                    # must be the same in every mode.
                    {op.name for c, _, _ in ready if c.update is not None for op in c.update.ops})
            for c, translation, layout in ready:
                gather_to_lookup.rewrite(rw, c, layout)
                if translation is not None:
                    optimizer_updates.rewrite(rw, c, translation)
                freed += saver_swap.rewrite(rw, c)
            roots = [op for c, _, _ in ready for t in c.outputs for op in t.consumers()]
            roots += [op for c, _, _ in ready if c.apply is not None
                      for op in c.apply._control_outputs]  # pylint: disable=protected-access
            rewritten = time.time()
            validate.check(graph, [c.variable for c, _, _ in ready], roots,
                           training=mode == "train", full=self.full_check)
        except Exception as e:
            rw.undo()
            # So that begin() can run again on this graph:
            state.clocks, state.timestamp = clocks, timestamp
            for c, _, _ in ready:
                state.policies.pop(c.table_name, None)
                if c.table is not None:
                    state.tables.pop(c.table.name, None)
            raise RuntimeError(f"graphmod: the rewrite failed and was undone: {e}") from e
        self.report = RewriteReport(
            graph=mode,
            seconds=time.time() - start,
            phase_seconds=dict(plan=planned - start, rewrite=rewritten - planned,
                               validate=time.time() - rewritten),
            tables=[dict(variable=c.variable.op.name, table=c.table.name, rows=c.rows, dim=c.dim,
                         slots=c.table.num_slots, lookups=len(c.gathers),
                         optimizer=t.kind if t else None,
                         initializer=dataclasses.asdict(c.table.initializer))
                    for c, t, _ in ready],
            skipped=[dict(variable=v, reason=r) for v, r in skipped],
            rules=rw.summary(), dense_bytes_freed=freed, unsqueezed_keys=unsqueezed,
            squeezed_keys_kept=[dict(op=o, reason=r) for o, r in kept])
        self.report.log()
        if model_dir:
            self._write(model_dir, before, graph)
        if training and ready:
            converted = [c.table for c, _, _ in ready]
            self._counters = features.add_summaries(converted)
            self.evict_hook.table_names = [t.name for t in converted
                                           if features.policy_of(t).evicts]
            self.evict_hook.begin()

    # The EvictHook runs inside this hook, in training graphs with tables to evict.
    def after_create_session(self, session, coord) -> None:
        if self._counters:
            self.evict_hook.after_create_session(session, coord)

    def before_run(self, run_context):
        return self.evict_hook.before_run(run_context) if self._counters else None

    def after_run(self, run_context, run_values) -> None:
        if self._counters:
            self.evict_hook.after_run(run_context, run_values)

    def end(self, session) -> None:
        if not self._counters:
            return
        for name, c in session.run(self._counters).items():
            logging.info("graphmod: table '%s': %d rows, %d admitted, %d lookups given no row, "
                         "%d evicted, %d ids pending admission", name, c["size"],
                         c["admitted"], c["rejected"], c["evicted"], c["pending"])

    def _write(self, model_dir: str, before, graph: tf.Graph) -> None:
        out = os.path.join(model_dir, "graphmod")
        tf.io.gfile.makedirs(out)
        kind = self.report.graph
        # Written aside and renamed, so a failed write never leaves half a report.
        path = os.path.join(out, f"rewrite_report_{kind}.json")
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            json.dump(dataclasses.asdict(self.report), f, indent=1)
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
        if before is not None:
            tf.io.write_graph(before, out, f"graph_before_{kind}.pbtxt")
            tf.io.write_graph(graph.as_graph_def(), out, f"graph_after_{kind}.pbtxt")
