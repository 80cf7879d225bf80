"""Rewrite rules of graphmod (installed as graphmod.rewrite_rules), one per module.

Each implements graphmod.rewrite.rule's interface (NAME, check, rewrite);
RULES is the order the pipeline runs them in: keys first (lookups read the
unsqueezed ids), then the lookups (which build the tables), the warm start,
dense reads, penalties and updates (which use the tables' rows), the fusing
of the lookups and applies into one op each, the Saver swap, the adoption of
variables a dense checkpoint holds, and the tables' counter summaries last.
Every rule checks every conversion before any rewrites.
"""
from graphmod.rewrite_rules import (collisionless_keys, dense_adoption, dense_reads,
                                    fuse_table_ops, gather_to_lookup, l2_penalties,
                                    optimizer_updates, saver_swap, table_counters, warm_start)

RULES = (collisionless_keys, gather_to_lookup, warm_start, dense_reads, l2_penalties,
         optimizer_updates, fuse_table_ops, saver_swap, dense_adoption, table_counters)
