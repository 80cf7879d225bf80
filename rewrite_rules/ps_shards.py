"""Rule: in a parameter-server cluster, tables are sharded by key over the ps tasks.

Matches the conversions whose variable the device setter put on a ps task,
when the cluster has several (graphmod.ps); with one ps task,
the tables stay whole on it and only the applies change, as below. The table
gather_to_lookup built there becomes that task's shard; a shard with the
same settings is built on every other ps task, and a key's owner
(graphmod.embeddings.partition) holds its row. Then, like shard_exchange
for Horovod ranks:
  - lookups: those of one dependency level (and input sources) route
    their keys to their owners on the worker, each table's distinct keys
    once with how often they occur (GraphmodExchangeRoute), and become one
    fused lookup per ps task, over every table's shard there, which looks
    each key up as often as it occurred and sends back each distinct key's
    row once (graphmod.embeddings.routing); the worker puts the rows in the
    keys' order;
  - applies: those of one optimizer's step (the ops that wait for them, past
    the NoOps grouping its updates per device) sum each key's gradient rows
    on the worker (as a dense variable's sparse update sums duplicate
    indices), partition the keys by owner and become one fused apply per ps
    task, which steps each row once.
A group's tensors for one ps task cross as one tensor and their lengths
(TensorFlow's runtime moves each tensor in an RPC of its own).
A key's lookup and update run on one table (its owner's), with that table's
admission counts and eviction, so each row moves as in one table; max_rows
and an admission sketch apply per shard (reported as approximations).

Refuses, when the cluster shards tables: a variable not placed on a ps task
(its table would sit on a worker beside shards on the ps tasks), reads
inside v1 control flow (a partition outside the loop or branch cannot feed
it), and reads of the whole variable.
A dense checkpoint in model_dir is adopted as on one machine: each ps task
imports the rows it owns (graphmod.checkpoint.saver); so does a warm start
from checkpoint rows (rewrite_rules/warm_start.py).
"""
import collections
from typing import List, NamedTuple

import tensorflow as tf

from graphmod._ops import ops
from graphmod.ps import tables as ps
from graphmod.embeddings import routing
from graphmod.embeddings.partition import owner_of
from graphmod.embeddings.table import Table
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.levels import levels_and_sources
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Apply
from graphmod.state import graph_state

NAME = "ps_shards"
AFTER = ("optimizer_updates", "dense_reads")
_LOOKUPS = ("GraphmodTableFindOrInsert", "GraphmodTableFind")


class Shards(NamedTuple):
    tables: List[Table]  # a table's shard on each ps task, in task order

    def table_entry(self) -> dict:
        return dict(ps_shards=len(self.tables))


def _sharded(conversion: Conversion, context: Context) -> bool:
    return context.ps_tasks > 1 and ps.ps_task(conversion.variable.device) is not None


def check(conversion: Conversion, context: Context) -> None:
    if context.ps_tasks <= 1 or context.ranks > 1:
        return
    n = context.ps_tasks
    if not _sharded(conversion, context):
        raise Refused(f"it is placed on '{conversion.variable.device or 'no device'}', not on "
                      f"a ps task, while tables are sharded over the {n} ps tasks")
    for g in conversion.gathers:
        if GraphIndex.in_control_flow(g.op):
            raise Refused(f"{g.op.name} reads it inside v1 control flow: its keys cannot be "
                          f"partitioned over the {n} ps tasks there")
    if conversion.dense_reads:
        raise Refused(f"it is read whole, which a table sharded over {n} ps tasks cannot serve")
    s = conversion.settings
    if s.max_rows is not None:
        context.approximate(conversion, f"max_rows bounds each of its {n} shards (one per ps "
                            f"task: up to {n} x {s.max_rows} rows), whose victims are chosen "
                            "per shard")
    if s.admission_sketch_width:
        context.approximate(conversion, f"its admission sketch counts per shard (one per ps "
                            "task), with other collisions than one table's; a restore on "
                            "another number of ps tasks starts it empty")


def rewrite(rw, conversions, context: Context) -> None:
    if context.ps_tasks < 1 or context.ranks > 1:
        return
    built = {c.name: context.built(Lookups, c) for c in conversions}
    if context.ps_tasks == 1:
        # One ps task holds every table whole: only the gradient rows change
        # (summed per key, and sent as one tensor).
        on_ps = [c for c in conversions if c.training and ps.ps_task(c.variable.device) == 0]
        with rw.rule(NAME):
            _shard_applies(rw, [(built[c.name].table, context.built(Apply, c).op) for c in on_ps],
                           {built[c.name].table.name: [built[c.name].table] for c in on_ps})
        return
    with rw.rule(NAME):
        shards = {lk.table.name: _shards(lk.table, context.ps_tasks) for lk in built.values()}
        rw.set_state("ps_parts", {**graph_state(context.graph).ps_parts, **shards})
        _shard_lookups(rw, list(built.values()), shards)
        _shard_applies(rw, [(built[c.name].table, context.built(Apply, c).op)
                            for c in conversions if c.training], shards)
    for c in conversions:
        context.build(Shards(shards[built[c.name].table.name]), c)


def _shards(table: Table, n: int) -> List[Table]:
    """The table's shard on each of n ps tasks: itself on its own task, a
    table with its settings (and name: the checkpoint's) on each other one."""
    op = table.handle.op
    # Every attribute the op declares: a setting added to it is copied too.
    attrs = {a.name: GraphIndex.attr(op, a.name) for a in op.op_def.attr}
    mine = ps.ps_task(table.handle.device)
    shards = []
    for i in range(n):
        if i == mine:
            shards.append(table)
            continue
        with tf.device(ps.part_device(table.handle.device, i)), \
                op.graph.control_dependencies(None), tf.compat.v1.name_scope(None):
            handle = ops.graphmod_table(name=f"graphmod/{table.name}/table_ps{i}", **attrs)
        shards.append(Table(handle, table.optimizer))
    return shards


def _by_owner(keys: tf.Tensor, n: int):
    """(keys of each owner, their positions in keys, each key's owner), of
    keys flattened."""
    flat = tf.reshape(keys, [-1])
    owner = owner_of(flat, n)
    return (tf.dynamic_partition(flat, owner, n),
            tf.dynamic_partition(tf.range(tf.size(flat)), owner, n), owner)


def _shard_lookups(rw, lookups, shards) -> None:
    """Each group of lookups becomes one fused lookup per ps task."""
    found = [(lk.table, rows.op) for lk in lookups for _, rows in lk.reads
             if rows.op.type in _LOOKUPS]
    if not found:
        return
    for _, op in found:
        if op.type == "GraphmodTableFindOrInsert" and rw.index.consumers(op.outputs[1]):
            raise ValueError(f"graphmod: {op.name}'s row handles are read; a lookup sharded "
                             "over ps tasks has none")
    levels, sources = levels_and_sources([op for _, op in found])
    groups = collections.defaultdict(list)
    for table, op in found:
        groups[(op.type, levels[op], sources[op])].append((table, op))
    for (kind, _, _), group in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        n = len(shards[group[0][0].name])
        training = kind == "GraphmodTableFindOrInsert"
        tables = [t for t, _ in group]
        keys = [rw.index.data_input(op, 1) for _, op in group]
        # Each entry's floats in the rows sent back: its row and, training,
        # how many of its lookups were refused a row.
        widths = [t.dim + training for t in tables]
        with tf.compat.v1.name_scope("graphmod/ps_lookup"):
            # Each table's distinct keys (with how often each occurs), by
            # owner: what each ps task gets, in one tensor.
            route = ops.graphmod_exchange_route([tf.reshape(k, [-1]) for k in keys], size=n,
                                                widths=widths)
            parts = tf.split(route.sent, route.splits, num=n)
            back = []
            for i in range(n):
                handles = [shards[t.name][i].handle for t in tables]
                with tf.device(handles[0].device):
                    # The task looks each key up as often as it occurred, and
                    # sends back each entry's row once.
                    plan = ops.graphmod_exchange_serve(parts[i], route.splits[i:i + 1],
                                                       N=len(tables), widths=widths)
                    if training:
                        rows, row_handles = ops.graphmod_fused_find_or_insert(
                            handles, list(plan.lookups),
                            [rw.index.data_input(op, 2) for _, op in group],
                            dims=[t.dim for t in tables],
                            access_thresholds=[rw.index.attr(op, "access_threshold")
                                               for _, op in group])
                    else:
                        rows, row_handles = ops.graphmod_fused_find(
                            handles, list(plan.lookups), dims=[t.dim for t in tables]), None
                    back.append(routing.pack(rows, row_handles, plan, widths))
            rows = routing.unpack(tf.concat(back, 0), route, tables, keys, widths)
        for (_, op), new in zip(group, rows):
            rw.reroute(op.outputs[0], new)


def _shard_applies(rw, applies, shards) -> None:
    """The applies one set of ops waits for become one fused apply per ps task."""
    groups = collections.defaultdict(list)
    for table, apply in applies:
        groups[_step_of(rw, apply)].append((table, apply))
    for _, group in sorted(groups.items(), key=lambda g: sorted(g[0][0])):
        n = len(shards[group[0][0].name])
        with tf.compat.v1.name_scope("graphmod/ps_apply"):
            split = []
            for _, op in group:
                # A key's gradient rows summed on the worker (as a dense
                # variable's sparse update sums duplicate indices) cross once.
                keys, at = tf.unique(rw.index.data_input(op, 1), out_idx=tf.int32)
                grads = tf.math.unsorted_segment_sum(rw.index.data_input(op, 2), at,
                                                     tf.size(keys))
                ids, _, owner = _by_owner(keys, n)
                split.append((ids, tf.dynamic_partition(grads, owner, n)))
            dims = [t.dim for t, _ in group]
            per_task = []
            for i in range(n):
                handles = [shards[t.name][i].handle for t, _ in group]
                ids, sizes = _pack([ids[i] for ids, _ in split])
                grads, _ = _pack([g[i] for _, g in split])
                with tf.device(handles[0].device):
                    per_task.append(ops.graphmod_fused_apply(
                        handles, _unpack(ids, sizes, [None] * len(group)),
                        _unpack(grads, _times(sizes, dims), dims),
                        [rw.index.data_input(op, 3) for _, op in group],
                        optimizers=[rw.index.attr(op, "optimizer").decode() for _, op in group],
                        nesterov=[rw.index.attr(op, "nesterov") for _, op in group],
                        by_address=False))
            apply = tf.group(per_task)
        for _, op in group:
            rw.replace_control_input(op, apply)


# TensorFlow's runtime moves each tensor a step sends to another task in an
# RPC of its own: a group's tensors for one ps task travel as one
# (concatenated, flat) tensor and their lengths, and are cut apart there.
def _pack(tensors: List[tf.Tensor]):
    """(one flat tensor of tensors, their element counts); tensors alone when one."""
    if len(tensors) == 1:
        return tensors, None
    return (tf.concat([tf.reshape(t, [-1]) for t in tensors], 0),
            tf.stack([tf.size(t, out_type=tf.int32) for t in tensors]))


def _unpack(packed, sizes, dims) -> List[tf.Tensor]:
    """What _pack packed, each tensor with rows of dims[j] (None: 1-D)."""
    if sizes is None:
        return packed
    parts = tf.split(packed, sizes, num=len(dims))
    return [p if d is None else tf.reshape(p, [-1, d]) for p, d in zip(parts, dims)]


def _times(sizes, dims):
    """Element counts of rows of dims for sizes keys."""
    return None if sizes is None else sizes * tf.constant(dims, tf.int32)


def _step_of(rw, apply: tf.Operation):
    """What makes applies one optimizer step: the ops that wait for apply,
    past the per-device NoOps of a tf.group (an optimizer groups its updates
    by device: `update/NoOp`, `update/NoOp_1`, ... each waited for by
    `update` alone), and apply's own control inputs. A NoOp grouping
    anything else (a user's group of two train ops) is not passed: a train
    op never runs another's updates."""
    waiting = set()
    for op in rw.index.control_consumers(apply):
        above = rw.index.control_consumers(op)
        while op.type == "NoOp" and len(above) == 1 and op.name.startswith(above[0].name + "/"):
            op = above[0]
            above = rw.index.control_consumers(op)
        waiting.add(op.name)
    return frozenset(waiting), frozenset(c.name for c in apply.control_inputs)
