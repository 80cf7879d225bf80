"""Rewrite rules of graphmod (installed as graphmod.rewrite_rules), one per module.

Each implements graphmod.rewrite.rule's interface (NAME, AFTER, check,
rewrite); RULES is the order the pipeline runs them in, checked against
every rule's AFTER when this module loads: keys first (lookups read the
unsqueezed ids), then the lookups (which build the tables), dense reads,
penalties and updates (which use the tables' rows), under Horovod the
exchange of lookups and applies with each key's owner rank (in a
parameter-server cluster, the sharding of tables over the ps tasks), the
warm start (into each part of a table split over ps tasks), the fusing of the lookups
and applies into one op each, the Saver swap (variables out, tables in)
and Horovod's broadcast (variables out),
graphmod's TableSaver (deltas, adoption of dense checkpoints), the
tables' counter summaries, the input pipeline's prefetch of tiered tables'
rows, and last the warm start from other models'
checkpoints (GraphModifierHook(warm_start=...)), of the tables and
variables the graph then has.
Every rule checks every conversion before any rewrites.
"""
from graphmod.rewrite.rule import registry
from graphmod.rewrite_rules import (collisionless_keys, dense_reads, fuse_table_ops,
                                    gather_to_lookup, horovod_broadcast, l2_penalties,
                                    optimizer_updates, ps_shards, saver_swap, shard_exchange,
                                    table_counters, table_saver, tier_prefetch, warm_start,
                                    warm_start_sources)

RULES = registry(collisionless_keys, gather_to_lookup, dense_reads, l2_penalties,
                 optimizer_updates, shard_exchange, ps_shards, warm_start, fuse_table_ops,
                 saver_swap, horovod_broadcast, table_saver, table_counters, tier_prefetch,
                 warm_start_sources)
