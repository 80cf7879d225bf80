"""The one rewrite pipeline: plan -> rules -> validate -> report.

GraphModifierHook, export_saved_model (and the CLI) all call `rewrite`. It
plans the conversion (replaying the model's saved plan when model_dir has
one), lets every rule check every conversion (a refused variable stays dense,
with the reason), runs the rules through one Rewriter, checks the result, and
returns the RewriteReport; a training rewrite saves its plan for every later
graph of the model. A failed rewrite is undone by its Rewriter (graph edits,
collections and graphmod's per-graph state) and raised.

>>> report = rewrite(tf.compat.v1.get_default_graph(), RewriteSettings(), "train",
...                  rules=graphmod.rewrite_rules.RULES, model_dir="/tmp/model")
"""
import dataclasses
import time
from typing import List, Optional, Sequence

import tensorflow as tf

from graphmod import horovod
from graphmod.horovod import save_schedule
from graphmod.embeddings import features
from graphmod.ps import tables as ps
from graphmod.checkpoint.parts import TableParts
from graphmod.checkpoint import saver as table_saver
from graphmod.rewrite import plan_file, validate
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.plan import PlanMismatch, RewriteSettings, plan, trains_anything
from graphmod.rewrite.report import RewriteReport
from graphmod.rewrite.rewriter import Rewriter
from graphmod.rewrite.rule import Context, Refused, Rule

tf1 = tf.compat.v1
MODES = ("train", "eval", "predict")


def rewrite(graph: tf.Graph, settings: RewriteSettings, mode: str, *, rules: Sequence[Rule],
            model_dir: Optional[str] = None, timestamp: Optional[tf.Tensor] = None,
            timestamp_name: str = "", full_check: bool = False,
            estimator_training: bool = False) -> RewriteReport:
    """Rewrites graph's embedding variables into tables; returns the report.

    mode: "train" (lookups insert ids, updates become table applies), "eval"
    or "predict". model_dir: where the model's plan is read from (and, when
    training, written to). timestamp: the batch's timestamp tensor, which
    training lookups then stamp rows with (see graphmod.embeddings.features).
    rules: the registry to run (graphmod.rewrite.rule.registry; graphmod's
    own is graphmod.rewrite_rules.RULES, which its callers hand in).
    """

    if mode not in MODES:
        raise ValueError(f"graphmod: mode must be one of {MODES}, got {mode!r}")
    start = time.time()
    # A "training" graph that updates no variable at all only reads (a
    # MonitoredSession run for inference): its lookups must not insert.
    index = GraphIndex(graph)  # the one scan of the graph; the Rewriter keeps it current
    training = mode == "train" and trains_anything(index)
    replay = plan_file.read(model_dir)
    conversions, skipped = plan(index, settings, training, replay)
    ranks = horovod.horovod_ranks() if mode != "predict" else 1
    # Split across Horovod ranks, every rank restores rank 0's checkpoint
    # (graphmod.horovod.save_schedule), whatever its own model_dir holds:
    # what that one holds decides adoption on every rank alike. (Gathered: a
    # collective, which every rank runs, as it runs this graph's exchanges.)
    split = ranks > 1 and conversions and (
        not training or any(_combined_by_horovod(c) for c in conversions))
    names, in_parts = frozenset(), False
    if not split or horovod.horovod_rank() == 0:
        try:
            names, in_parts = _checkpoint_held(model_dir)
        except Exception as e:  # pylint: disable=broad-except
            if not split:
                raise
            names, in_parts = e, False  # every rank raises it, below
    if split:
        # With it, where rank 0's plan placed each table: every rank places
        # it alike (a rank without the model_dir has no plan of its own).
        placed = {v: p.placement for v, p in (replay or {}).items() if p.placement}
        held, in_parts, placed = save_schedule.gather(
            [sorted(names) if isinstance(names, frozenset) else f"{names!r}", in_parts, placed],
            "graphmod_rank0_checkpoint")[0]
        if isinstance(held, str):
            raise ValueError(f"graphmod: rank 0 could not read its checkpoint: {held}")
        names = frozenset(held)
        conversions = [dataclasses.replace(c, planned_placement=placed.get(c.name, ""))
                       for c in conversions]
    # exact=True: keys stay as the model squeezed them (collisions included).
    # Estimator.train puts its Saver in the SAVERS collection before hooks run,
    # unless the model's Scaffold brings one: then no other Saver is used.
    scaffold_saver = estimator_training and not graph.get_collection(tf1.GraphKeys.SAVERS)
    rw = Rewriter(graph, index)
    rw.set_state("reads_parts", in_parts)
    context = Context(graph, training, settings.collision_free and not settings.exact,
                      settings.exact,
                      ranks=ranks,
                      ps_tasks=ps.ps_tasks(graph),
                      checkpoint_names=names, scaffold_saver=scaffold_saver, current=rw.current,
                      # a fresh start (no checkpoint in model_dir) imports the sources' rows
                      warm_start=settings.warm_start if training and not names else None,
                      ids_ahead=settings.ids_ahead)
    ready = []
    for c in conversions:
        try:
            for rule in rules:
                if rule.check is not None:
                    context.build(rule.check(c, context), c)
        except Refused as e:
            if replay is not None and c.name in replay:
                raise PlanMismatch(f"graphmod: '{c.name}' was converted to a table when "
                                   f"training, but cannot be in this graph: {e}") from None
            skipped.append((c.name, str(e)))
            continue
        ready.append(c)
    planned = time.time()
    try:
        if ready and horovod.horovod_ranks() > 1:
            # Under Horovod, training and evaluation shard the tables across
            # the ranks (lookups exchange ids with the keys' owners, every
            # rank saves the keys it owns); a prediction or export graph
            # holds every key (its restore reads every rank's part).
            rw.set_state("split_over_ranks", context.ranks > 1)
        if training and timestamp is not None:
            features.set_timestamp(timestamp, timestamp_name, graph, rw)
        for c in ready:
            features.set_policy(c.table_name, c.settings.policy, graph, rw)
        # What reads the variables or waits for their updates: the rules make
        # it read or wait for what they build instead (the validity check's roots).
        roots = [op for c in ready for t in [g.op.outputs[0] for g in c.gathers] + c.dense_reads
                 for op in index.consumers(t)]
        roots += [op for c in ready if c.training
                  for op in index.control_consumers(c.update.update_op)]
        for rule in rules:
            rule.rewrite(rw, ready, context)
        rewritten = time.time()
        validate.check(graph, [c.variable for c in ready], roots, training=training,
                       full=full_check)
        if training and model_dir:
            _save_plan(model_dir, replay, ready, context)
        return RewriteReport(
            graph=mode,
            seconds=time.time() - start,
            phase_seconds=dict(plan=planned - start, rewrite=rewritten - planned,
                               validate=time.time() - rewritten),
            tables=[_table_entry(c, context) for c in ready],
            skipped=[dict(variable=v, reason=r) for v, r in skipped],
            approximations=[dict(variable=c.name, what=a)
                            for c in ready for a in context.approximations.get(c.name, [])],
            rules=rw.summary(), replayed_plan=replay is not None,
            sharded_ranks=context.ranks if ready else 1, record=rw.record(),
            **context.report_fields())
    except Exception:
        rw.undo()  # graph, collections and graphmod's state: the rewrite can run again
        raise


def _entry(results: list, kind: str) -> dict:
    """The fields results give an entry of kind "table_entry" or "plan_entry"."""
    return {k: v for r in results if hasattr(r, kind) for k, v in getattr(r, kind)().items()}


def _table_entry(c, context: Context) -> dict:
    # How Horovod combines the variable's gradient over ranks ("average",
    # "sum"), as its table's owners then do ("" when it does not).
    combined = c.update.combined if c.update is not None else None
    combine = combined.collective.combine if combined and combined.collective.runs else ""
    # Fields in the report's order, with what they say when no rule gives them.
    entry = dict(variable=c.name, table=None, rows=c.rows, dim=c.dim, slots=0,
                 lookups=len(c.gathers), slot_variables=[], optimizer=None, initializer=None,
                 unsqueezed=None, dense_reads=len(c.dense_reads),
                 warm_started=c.warm_start is not None, ranks_combine=combine, ps_shards=0)
    return dict(entry, **_entry(context.results(c), "table_entry"))


def _save_plan(model_dir: str, replay, ready: List, context: Context) -> None:
    """The training graph's decisions, added to those of earlier runs."""
    planned = dict(replay or {})
    for c in ready:
        info = getattr(c.variable, "_save_slice_info", None)
        part_of = [info.full_name, int(info.var_offset[0]), int(info.full_shape[0])] \
            if info is not None else None
        planned[c.variable.op.name] = plan_file.Planned(
            c.variable.op.name, c.table_name, c.rows, c.dim, c.settings, c.initializer,
            c.seed, part_of=part_of, **_entry(context.results(c), "plan_entry"))
    plan_file.write(model_dir, planned)


def install_saver(graph: tf.Graph) -> Rewriter:
    """Makes the Saver of a graph built with the table API (no rewrite ran on
    it) graphmod's TableSaver, through a Rewriter that records the change, as
    the table_saver rule does in a rewrite; returns that Rewriter. Raises
    graphmod.checkpoint.saver.NotReplaceable when the graph's Saver cannot be."""
    rw = Rewriter(graph)
    with rw.rule("table_saver"):
        table_saver.install(rw, graph)
    return rw


def _combined_by_horovod(conversion) -> bool:
    """The variable's gradient goes through a Horovod collective (its table
    is then split across the ranks)."""
    update = conversion.update
    return update is not None and update.combined is not None and update.combined.collective.runs


def _checkpoint_held(model_dir: Optional[str]):
    """The variable names of model_dir's latest checkpoint, and whether its
    tables are in parts (none and False without one)."""
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    if latest is None:
        return frozenset(), False
    return frozenset(n for n, _ in tf.train.list_variables(latest)), TableParts.in_parts(latest)
