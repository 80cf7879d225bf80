"""Rule: a fresh training start imports other models' checkpoints
(GraphModifierHook(warm_start=graphmod.WarmStartSettings(...))).

Matches a training graph whose model_dir holds no checkpoint yet, given
WarmStartSettings. Builds graphmod.checkpoint.warm_start.WarmStarter's flag variable,
whose initializer imports the sources' rows into the tables (renamed, key
filtered, as the settings say) and assigns the dense variables, so the import
runs exactly when the model is initialized and never after a restore.
Split across Horovod ranks, each rank's sharded table imports the keys it
owns, and a replicated one every key (every rank reads the sources); split
over a cluster's ps tasks, each task's part imports the keys it owns.
Refuses nothing: a mapping naming no table or variable of the graph is an
error (the rewrite fails and is undone).
"""
from typing import NamedTuple

from graphmod import horovod
from graphmod.rewrite.rule import Context
from graphmod.checkpoint.warm_start import WarmStarter
from graphmod.rewrite_rules import shard_exchange

NAME = "warm_start_sources"
AFTER = ("gather_to_lookup", "saver_swap")  # the graph's tables, and its variables left dense
WarmStarted = NamedTuple("WarmStarted", [("warm_started", list)])  # for the report


def rewrite(rw, conversions, context: Context) -> None:
    if context.warm_start is None:
        return
    owners = {c.table_name: (horovod.horovod_rank(), context.ranks) for c in conversions
              if context.ranks > 1 and not shard_exchange.replicates(c, context)}
    with rw.rule(NAME):
        context.build(WarmStarted(WarmStarter(context.warm_start, context.graph,
                                              owners).started))
