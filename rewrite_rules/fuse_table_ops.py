"""Rule: the table lookups and applies the rewrite built become fused ops.

After the other rules, a step holds one lookup per converted read and one
apply per converted variable. This rule replaces each set of single-table ops
that always run together, and can run as one, with one fused op
(graphmod.embeddings.fused), so the step pays one kernel for its reads and one for its
updates however many features the model has. Ops join one fused op only when
they
  - are of one type, on one device, with their tables on one device, outside
    v1 control flow, and wait for the same control inputs;
  - read the same input sources (placeholders, dataset iterators): a serving
    graph's signatures each feed their own placeholders (two towers), and a
    dense read over a whole table (which reads no input) is not dragged into
    every per-batch lookup;
  - for applies: are waited for by the same ops (one optimizer's update), so
    a train op never runs another train op's updates;
  - sit at the same dependency level: a lookup whose keys come from another
    lookup's rows (or an apply waiting for another) lands in a later group,
    so fusing never makes a cycle.
Consumers read the fused op's outputs; ops that waited for an apply wait for
the fused apply. The fused op's outputs equal the ops' (graphmod.embeddings.fused), so
this rule changes no number.
"""
import collections
from typing import Dict, List, NamedTuple

import tensorflow as tf

from graphmod.embeddings import fused
from graphmod.rewrite.levels import levels_and_sources
from graphmod.rewrite.rule import Context
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "fuse_table_ops"
AFTER = ("optimizer_updates", "shard_exchange", "ps_shards")  # fuses the table ops they leave
Fused = NamedTuple("Fused", [("fused", dict)])  # for the report: op type -> [fused, built]


def rewrite(rw, conversions, context: Context) -> None:
    # Fusing refuses nothing: what cannot be fused stays as it is.
    handles = {context.built(Lookups, c).table.handle.name for c in conversions}
    # (A single op an earlier rule replaced, e.g. shard_exchange's one-rank
    # lookups, is used no more and must not join a live fused op.)
    candidates = [op for op in rw.index.of_type(*fused.FUSES)
                  if op.inputs[0].name in handles
                  and not rw.index.in_control_flow(op)
                  and rw.index.used(op)]
    if len(candidates) < 2:
        return
    levels, sources = levels_and_sources(candidates)
    done = Fused({})
    groups: Dict[tuple, List[tf.Operation]] = collections.defaultdict(list)
    for op in candidates:
        apply = op.type == "GraphmodTableApply"
        groups[(op.type, op.device, op.inputs[0].device, levels[op], sources[op],
                frozenset(c.name for c in op.control_inputs),
                op.get_attr("by_address") if apply else None,
                frozenset(c.name for c in rw.index.control_consumers(op)) if apply else None,
                )].append(op)
    for (kind, device, *_), ops in groups.items():
        if len(ops) < 2:
            continue
        with rw.rule(NAME), tf.device(device), tf.compat.v1.name_scope(
                f"graphmod/fused_{kind[len('GraphmodTable'):].lower()}"):
            with tf.control_dependencies(ops[0].control_inputs):  # the group's, all alike
                fused_op, outputs = fused.fuse(ops)
            for op, new in zip(ops, outputs):
                for old, t in zip(op.outputs, new):
                    rw.reroute(old, t)
                rw.replace_control_input(op, fused_op)
        counts = done.fused.setdefault(kind, [0, 0])
        counts[0] += len(ops)
        counts[1] += 1
    context.build(done)

