"""Rewrite rules of graphmod (installed as graphmod.rewrite_rules), one per module.

Each implements graphmod.rewrite.rule's interface (NAME, check, rewrite);
RULES is the order the pipeline runs them in: keys first (lookups read the
unsqueezed ids), then the lookups (which build the tables), the dense reads
and the updates (which use the tables), and the Saver swap last.
Every rule checks every conversion before any rewrites.
"""
from graphmod.rewrite_rules import (collisionless_keys, dense_reads, gather_to_lookup,
                                    optimizer_updates, saver_swap)

RULES = (collisionless_keys, gather_to_lookup, dense_reads, optimizer_updates, saver_swap)
