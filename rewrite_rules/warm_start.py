"""Rule: a variable warm-started from a checkpoint starts its table from the
checkpoint's rows.

Matches a converted variable whose initial value init_from_checkpoint (and so
tf.estimator.WarmStartSettings) replaced by a checkpoint read. Builds a
boolean variable `<table>/graphmod_warm_started` whose initializer first
imports the checkpoint's rows into the table (key i gets row i), so the
import runs exactly when the variable would have been initialized: on a
fresh start, and not when the Saver restores the model (the flag then comes
back from the checkpoint, with the table; a checkpoint written without the
flag restores the table and no flag is built). Every id starts from its own
checkpoint row, not a shared one; optimizer slots start from their initial
values (a warm start of the slots too, e.g. vars_to_warm_start=[".*"], keeps
the variable dense: its slots do not start from one value). A table split
over Horovod ranks (sharded) or over the ps tasks of a cluster imports into
each part the keys its rank or ps task owns. Refuses nothing (the planner
keeps warm-started variables with hashed, collision-free keys dense).
"""
import tensorflow as tf

from graphmod import horovod
from graphmod.rewrite.rule import Context
from graphmod.embeddings.partition import owner_of
from graphmod.rewrite_rules import ps_shards, shard_exchange
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "warm_start"
# RULES also lists it after ps_shards: a table split over ps tasks is warm
# started into every task's shard. (AFTER cannot say so: it names rules that
# must be present, and ps_shards is absent from one-machine rule sets; the
# rule fails when a split table has no shards yet.)
AFTER = ("gather_to_lookup",)
tf1 = tf.compat.v1


def rewrite(rw, conversions, context: Context) -> None:
    for c in conversions:
        if c.warm_start is None:
            continue
        table = context.built(Lookups, c).table
        flag_name = f"graphmod/{table.name}/graphmod_warm_started"
        if context.checkpoint_names and flag_name not in context.checkpoint_names:
            continue  # the model's checkpoint (from before the warm start) restores the table
        shards = context.built(ps_shards.Shards, c)
        if shards is None and context.ps_tasks > 1 and context.ranks <= 1:
            raise ValueError(f"graphmod: rule {NAME} ran before ps_shards split table "
                             f"'{table.name}' over the {context.ps_tasks} ps tasks: list it after")
        with rw.rule(NAME), tf1.name_scope(None), tf1.name_scope(f"graphmod/{table.name}"):
            # Where the checkpoint is read (in a cluster, a ps task): only
            # each part's rows move from there.
            with tf.device(c.warm_start.device):
                rows = tf.reshape(c.warm_start, [c.rows, c.dim])
                keys = tf.range(c.rows, dtype=tf.int64)
                if shards is not None:  # over the ps tasks: each task's shard its keys
                    parts = list(zip(shards.tables, _by_owner(keys, rows, len(shards.tables))))
                elif context.ranks > 1 and not shard_exchange.replicates(c, context):
                    # Sharded across Horovod ranks: this rank's part its keys.
                    parts = [(table, _by_owner(keys, rows, context.ranks)[horovod.horovod_rank()])]
                else:
                    parts = [(table, (keys, rows))]
            imported = tf.group([part.import_rows(*kept) for part, kept in parts])
            with tf.control_dependencies([imported]):
                done = tf.constant(True)
            # Beside the table: in a cluster, every worker's session sees it
            # (the chief initializes it, the others wait until it has).
            with tf.device(table.handle.device):
                tf1.Variable(done, trainable=False, name="graphmod_warm_started",
                             use_resource=True)


def _by_owner(keys: tf.Tensor, rows: tf.Tensor, owners: int) -> list:
    """(keys, rows) of each of `owners` owners (one pass over the keys)."""
    owner = owner_of(keys, owners)
    return list(zip(tf.dynamic_partition(keys, owner, owners),
                    tf.dynamic_partition(rows, owner, owners)))
