"""Rule: under Horovod, tables are sharded by key across the ranks.

When the model runs on several Horovod ranks, each key's row lives on one
owner rank (graphmod.horovod). This rule moves the table ops the
earlier rules built to the owners:
  - lookups: those of one dependency level become one exchange
    (graphmod.horovod.exchanged_find_or_insert, or exchanged_find in
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

from graphmod import horovod
from graphmod.embeddings import fused
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.levels import levels_and_sources
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Apply

NAME = "shard_exchange"
AFTER = ("optimizer_updates", "dense_reads")
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
        if GraphIndex.in_control_flow(g.op):
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
    built = {c.name: context.built(Lookups, c) for c in conversions}
    with rw.rule(NAME):
        _exchange_lookups(rw, list(built.values()))
        _exchange_applies(rw, [(built[c.name].table, context.built(Apply, c).op)
                               for c in conversions if c.training])


def _exchange_lookups(rw, lookups) -> None:
    """Each dependency level's lookups (of every table) become one exchange."""
    reads = [(lk.table, keys, rows) for lk in lookups for keys, rows in lk.reads
             if rows.op.type in _LOOKUPS]
    if not reads:
        return
    levels, _ = levels_and_sources([rows.op for _, _, rows in reads])
    groups = collections.defaultdict(list)
    for read in reads:
        op = read[2].op
        groups[(op.type, levels[op])].append(read)
    for (kind, _), group in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        tables = [table for table, _, _ in group]
        keys = [k for _, k, _ in group]
        if kind == "GraphmodTableFindOrInsert":
            # "sum": the hook's gradients do not flow back through the rows
            # (they travel by _exchange_applies), so no scaling is built.
            rows = horovod.exchanged_find_or_insert(tables, keys, combine="sum")
        else:
            rows = horovod.exchanged_find(tables, keys)
        for (_, _, old), new in zip(group, rows):
            rw.reroute(old, new)


def _exchange_applies(rw, applies) -> None:
    """The applies one set of ops waits for (one optimizer's step) exchange
    their gradients with the keys' owners, which apply them in one fused op."""
    groups = collections.defaultdict(list)
    for table, apply in applies:
        waiting = frozenset(op.name for op in rw.index.control_consumers(apply))
        groups[waiting].append((table, apply))
    for _, group in sorted(groups.items(), key=lambda g: sorted(g[0])):
        tables = [table for table, _ in group]
        old = [op for _, op in group]
        owned = horovod.exchanged_gradients(
            tables, [op.inputs[1] for op in old], [op.inputs[2] for op in old])
        with tf.compat.v1.name_scope("graphmod/owner_apply"):
            apply = fused.apply([t.handle for t in tables], [k for k, _ in owned],
                                [g for _, g in owned], [op.inputs[3] for op in old],
                                [op.get_attr("optimizer").decode() for op in old],
                                [op.get_attr("nesterov") for op in old], by_address=False)
        for op in old:
            rw.replace_control_input(op, apply)
