"""Rule: the table lookups and applies the rewrite built become fused ops.

After the other rules, a step holds one lookup per converted read and one
apply per converted variable. This rule replaces each set of single-table ops
that can run as one (same op type, same device, outside v1 control flow, and
none depending on another's output) with one fused op (graphmod.fused), so
the step pays one kernel for its reads and one for its updates however many
features the model has. Ops are grouped by dependency level: a lookup whose
keys are computed from another lookup's rows (or an apply waiting for
another) lands in a later group, so fusing never makes a cycle. Consumers
read the fused op's outputs; ops that waited for an apply wait for the fused
apply. The fused op's outputs equal the ops' (graphmod.fused), so this rule
changes no number. Lookups inside v1 while/cond contexts keep their own ops.
"""
import collections
from typing import Dict, List

import tensorflow as tf

from graphmod import fused
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context

NAME = "fuse_table_ops"


def check(conversion: Conversion, context: Context) -> None:
    del conversion, context  # fusing refuses nothing: what cannot be fused stays as it is


def rewrite(rw, conversions, context: Context) -> None:
    handles = {c.table.handle.name for c in conversions if c.table is not None}
    candidates = [op for op in rw.graph.get_operations()
                  if op.type in fused.FUSES and op.inputs[0].name in handles
                  and op._control_flow_context is None]  # pylint: disable=protected-access
    if len(candidates) < 2:
        return
    levels = _levels(candidates)
    groups: Dict[tuple, List[tf.Operation]] = collections.defaultdict(list)
    for op in candidates:
        by_address = op.get_attr("by_address") if op.type == "GraphmodTableApply" else None
        groups[(op.type, op.device, by_address, levels[op])].append(op)
    replaced: Dict[str, tf.Tensor] = {}
    applies: Dict[str, tf.Operation] = {}
    for (kind, device, _, _), ops in groups.items():
        if len(ops) < 2:
            continue
        with rw.rule(NAME), tf.device(device), tf.compat.v1.name_scope(
                f"graphmod/fused_{kind[len('GraphmodTable'):].lower()}"):
            with tf.control_dependencies(sorted({c for op in ops for c in op.control_inputs},
                                                key=lambda c: c.name)):
                fused_op, outputs = fused.fuse(ops)
            for op, new in zip(ops, outputs):
                for old, t in zip(op.outputs, new):
                    rw.reroute(old, t)
                    replaced[old.name] = t
                rw.replace_control_input(op, fused_op)
                applies[op.name] = fused_op
        done = context.fused.setdefault(kind, [0, 0])
        done[0] += len(ops)
        done[1] += 1
    for c in conversions:  # the conversions' records follow their ops
        c.outputs = [replaced.get(t.name, t) for t in c.outputs]
        c.lookups = [(k, replaced.get(r.name, r)) for k, r in c.lookups]
        if c.apply is not None:
            c.apply = applies.get(c.apply.name, c.apply)


def _levels(candidates: List[tf.Operation]) -> Dict[tf.Operation, int]:
    """Per candidate, 1 + the highest level among the candidates it depends
    on (through data or control edges), 0 when it depends on none. A v1
    loop's back edge (NextIteration) is not followed: a loop-carried value is
    the previous iteration's."""
    chosen = set(candidates)
    reach: Dict[tf.Operation, int] = {}  # highest candidate level at or above an op (-1: none)
    levels: Dict[tf.Operation, int] = {}
    for root in candidates:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op in reach:
                continue
            parents = [] if op.type == "NextIteration" else \
                [t.op for t in op.inputs] + list(op.control_inputs)
            if not expanded:
                stack.append((op, True))
                stack.extend((p, False) for p in parents if p not in reach)
                continue
            above = max((reach[p] for p in parents), default=-1)
            if op in chosen:
                levels[op] = above + 1
                reach[op] = levels[op]
            else:
                reach[op] = above
    return levels
