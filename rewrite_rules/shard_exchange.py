"""Rule: under Horovod, tables are sharded by key across the ranks.

When the model runs on several Horovod ranks, each key's row lives on one
owner rank (graphmod.distributed). This rule moves the table ops the
earlier rules built to the owners:
  - lookups: those of one dependency level become one exchange
    (graphmod.distributed.exchanged_find_or_insert, or exchanged_find in
    graphs that do not train): ids go to their owners, which look them up
    and send the rows back;
  - applies: each rank's gradient rows (optimizer_updates took them before
    Horovod's collective, as this rank's share of the combination) go to
    their keys' owners in one exchange (exchanged_gradients), where one
    fused apply sums the shares per key and steps each row once.
Every rank builds the same graph, so the exchanges' collectives match by name.

Refuses, when the model runs on several ranks: a variable each rank trains
on its own (its gradient takes no Horovod collective, so the ranks' copies
differ and no one table can follow them), reads inside v1 control flow (a
lookup there is a collective every rank would have to run alike), reads
of the whole variable, and warm starts from checkpoint rows.
"""
import collections

import tensorflow as tf

from graphmod import distributed, fused
from graphmod.rewrite.levels import levels_and_sources
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused

NAME = "shard_exchange"
_LOOKUPS = ("GraphmodTableFindOrInsert", "GraphmodTableFind")


def check(conversion: Conversion, context: Context) -> None:
    if context.ranks <= 1:
        return
    update = conversion.update
    if conversion.training and (update.combined is None or not update.combined.collective.runs):
        raise Refused(f"each of the {context.ranks} Horovod ranks trains its own copy of it "
                      "(its gradient goes through no Horovod collective): one table sharded "
                      "across the ranks cannot follow copies that differ")
    for g in conversion.gathers:
        if g.op._control_flow_context is not None:  # pylint: disable=protected-access
            raise Refused(f"{g.op.name} reads it inside v1 control flow: its lookup would be a "
                          "collective every Horovod rank must run alike")
    if conversion.dense_reads:
        raise Refused("it is read whole, which tables sharded across Horovod ranks cannot serve")
    if conversion.warm_start is not None:
        # Every rank would import every checkpoint row, keys it does not own included.
        raise Refused("a warm start into a table sharded across Horovod ranks is not built")


def rewrite(rw, conversions, context: Context) -> None:
    if context.ranks <= 1:
        return
    with rw.rule(NAME):
        _exchange_lookups(rw, conversions)
        _exchange_applies(rw, conversions)


def _exchange_lookups(rw, conversions) -> None:
    reads = [(c, i) for c in conversions for i, (_, rows) in enumerate(c.lookups)
             if rows.op.type in _LOOKUPS]
    if not reads:
        return
    levels, _ = levels_and_sources([c.lookups[i][1].op for c, i in reads])
    groups = collections.defaultdict(list)
    for c, i in reads:
        op = c.lookups[i][1].op
        groups[(op.type, levels[op])].append((c, i))
    for (kind, _), group in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        tables = [c.table for c, _ in group]
        keys = [c.lookups[i][0] for c, i in group]
        if kind == "GraphmodTableFindOrInsert":
            # "sum": the hook's gradients do not flow back through the rows
            # (they travel by _exchange_applies), so no scaling is built.
            rows = distributed.exchanged_find_or_insert(tables, keys, combine="sum")
        else:
            rows = distributed.exchanged_find(tables, keys)
        for (c, i), new in zip(group, rows):
            old = c.lookups[i][1]
            rw.reroute(old, new)
            c.lookups[i] = (c.lookups[i][0], new)
            c.outputs = [new if t is old else t for t in c.outputs]


def _exchange_applies(rw, conversions) -> None:
    groups = collections.defaultdict(list)
    for c in conversions:
        if c.apply is not None:
            waiting = frozenset(op.name for op in rw.index.control_consumers(c.apply))
            groups[waiting].append(c)
    for _, group in sorted(groups.items(), key=lambda g: sorted(g[0])):
        old = [c.apply for c in group]
        owned = distributed.exchanged_gradients(
            [c.table for c in group], [op.inputs[1] for op in old], [op.inputs[2] for op in old])
        with tf.compat.v1.name_scope("graphmod/owner_apply"):
            apply = fused.apply([c.table.handle for c in group], [k for k, _ in owned],
                                [g for _, g in owned], [op.inputs[3] for op in old],
                                [_text(op.get_attr("optimizer")) for op in old],
                                [op.get_attr("nesterov") for op in old], by_address=False)
        for c, op in zip(group, old):
            rw.replace_control_input(op, apply)
            c.apply = apply


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
