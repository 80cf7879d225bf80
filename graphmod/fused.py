"""Fused table ops: the reads, or the updates, of many tables in one op.

A model with many embedding features would otherwise run one lookup op and
one apply op per feature and step, each partitioning its ids by shard and
taking its shards' locks; per-op overhead then dominates small batches. A
fused op takes lists (entry i reads or updates table i), runs its tables side
by side on the session's threads (a table with a large batch spreads its
shards over them instead), and works on a table listed in several entries
once: one batch, with an apply summing a key's gradients over the entries.
Its outputs equal those of the single-table ops it replaces.

Users reach them through graphmod.fused_lookup and the sparse optimizers;
the hook's rewrite fuses the lookups and applies it builds
(graphmod.rewrite_rules.fuse_table_ops, with `fuse` below).
"""
from typing import List, Sequence, Tuple

import tensorflow as tf

from graphmod import features
from graphmod._ops import ops

# single-table op type -> the fused op type that does the work of many
FUSES = {"GraphmodTableFindOrInsert": "GraphmodFusedFindOrInsert",
         "GraphmodTableFind": "GraphmodFusedFind",
         "GraphmodTableApply": "GraphmodFusedApply"}


def find_or_insert(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor]
                   ) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """(rows, row handles) of training lookups of keys[i] in tables[i], each
    under its table's admission policy and clock."""
    policies = [features.policy_of(t) for t in tables]
    return ops.graphmod_fused_find_or_insert(
        [t.handle for t in tables], list(keys),
        [features.clock(t.graph, p.eviction_unit) for t, p in zip(tables, policies)],
        dims=[t.dim for t in tables], access_thresholds=[p.access_threshold for p in policies])


def find(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Read-only rows of keys[i] in tables[i]."""
    return ops.graphmod_fused_find([t.handle for t in tables], list(keys),
                                   dims=[t.dim for t in tables])


def apply(handles: Sequence[tf.Tensor], ids: Sequence[tf.Tensor], grads: Sequence[tf.Tensor],
          hparams: Sequence[tf.Tensor], optimizers: Sequence[str], nesterov: Sequence[bool],
          by_address: bool) -> tf.Operation:
    """One optimizer step per table handle over its entries' (ids, grads)."""
    return ops.graphmod_fused_apply(list(handles), list(ids), list(grads), list(hparams),
                                    optimizers=list(optimizers), nesterov=list(nesterov),
                                    by_address=by_address)


def fuse(table_ops: Sequence[tf.Operation]) -> Tuple[tf.Operation, List[List[tf.Tensor]]]:
    """One fused op doing the work of table_ops (single-table ops of one
    type, none an input of another); returns it and, per op of table_ops,
    the fused outputs that replace that op's outputs, in the same order."""
    kind = table_ops[0].type
    if any(op.type != kind for op in table_ops) or kind not in FUSES:
        raise ValueError("fuse needs single-table graphmod ops of one type, got "
                         + ", ".join(sorted({op.type for op in table_ops})))
    handles = [op.inputs[0] for op in table_ops]
    keys = [op.inputs[1] for op in table_ops]
    if kind == "GraphmodTableFindOrInsert":
        rows, found = ops.graphmod_fused_find_or_insert(
            handles, keys, [op.inputs[2] for op in table_ops],
            dims=[op.get_attr("dim") for op in table_ops],
            access_thresholds=[op.get_attr("access_threshold") for op in table_ops])
        return rows[0].op, [[r, h] for r, h in zip(rows, found)]
    if kind == "GraphmodTableFind":
        rows = ops.graphmod_fused_find(handles, keys,
                                       dims=[op.get_attr("dim") for op in table_ops])
        return rows[0].op, [[r] for r in rows]
    by_address = {op.get_attr("by_address") for op in table_ops}
    if len(by_address) != 1:
        raise ValueError("fuse: applies by key and by address cannot share one op")
    op = apply(handles, keys, [op.inputs[2] for op in table_ops],
               [op.inputs[3] for op in table_ops],
               [op.get_attr("optimizer").decode() for op in table_ops],
               [op.get_attr("nesterov") for op in table_ops], by_address.pop())
    return op, [[] for _ in table_ops]
