"""sparse_lookup: read table rows for dense, sparse or ragged ids.

>>> emb = graphmod.sparse_lookup(table, features["tags"], is_training=True, combiner="mean")
>>> user, item = graphmod.fused_lookup([users, items], [features["user"], features["item"]])
"""
from typing import List, Optional, Sequence, Union

import tensorflow as tf

from graphmod import horovod
from graphmod.embeddings import features, fused
from graphmod._ops import ops
from graphmod.state import Lookup, graph_state
from graphmod.embeddings.table import Table

COMBINERS = ("sum", "mean", "sqrtn")

Ids = Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor]


def to_keys(table_name: str, ids: tf.Tensor) -> tf.Tensor:
    """int64 keys of ids: integers as they are, strings by a 64-bit fingerprint."""
    if ids.dtype == tf.string:
        flat = tf.reshape(ids, [-1])
        keys = tf.bitcast(tf.fingerprint(flat), tf.int64)  # FarmHash64, all 64 bits
        return tf.reshape(keys, tf.shape(ids))
    if ids.dtype.is_integer:
        return tf.cast(ids, tf.int64)
    raise TypeError(f"graphmod table '{table_name}': ids must be integers or strings, "
                    f"got {ids.dtype.name}")


def lookup_rows(table: Table, keys: tf.Tensor, is_training: bool) -> tf.Tensor:
    """Rows of int64 keys (any shape) -> keys.shape + [dim].

    Training lookups insert new keys (as the table's admission policy allows,
    see graphmod.embeddings.features), stamp them with the graph's clock, and are
    recorded (graphmod.training_lookups) so the sparse optimizers can find
    their gradients and row handles. Sharded across Horovod ranks
    (graphmod.horovod), the keys' owners look them up.
    """
    if horovod.active(table.graph):
        lookup = horovod.exchanged_find_or_insert if is_training else horovod.exchanged_find
        return lookup([table], [keys])[0]
    if not is_training:
        return ops.graphmod_table_find(table.handle, keys, dim=table.dim)
    rows, handles = find_or_insert(table, keys)
    graph_state(table.graph).lookups.append(Lookup(table, keys, rows, handles))
    return rows


def find_or_insert(table: Table, keys: tf.Tensor):
    """(rows, row handles) of a training lookup under the table's policy."""
    policy = features.policy_of(table)
    return ops.graphmod_table_find_or_insert(
        table.handle, keys, features.clock(table.graph, policy.eviction_unit), dim=table.dim,
        access_threshold=policy.access_threshold)


def sparse_lookup(table: Table, ids: Ids, is_training: bool = True,
                  combiner: Optional[str] = None, name: Optional[str] = None) -> tf.Tensor:
    """Embeds ids with table.

    Args:
      table: from graphmod.create_table.
      ids: int or string ids: a dense Tensor, a 2-D tf.SparseTensor or a
        2-D tf.RaggedTensor (a batch of variable-length id lists).
      is_training: True inserts unseen ids (training); False only reads, and
        unseen ids get the table's missing value.
      combiner: None keeps one row per id (dense ids only: result has shape
        ids.shape + [dim]); "sum", "mean" or "sqrtn" combines each example's
        ids (the last axis of dense ids) as tf.nn.embedding_lookup_sparse does;
        examples without ids get zeros. Sparse and ragged ids default to "mean".

    Returns:
      float32 rows: ids.shape + [dim] without combiner, else [batch, dim].

    >>> emb = graphmod.sparse_lookup(table, tf.constant([[3, 7], [7, 9]]), combiner="sum")
    """
    scope = f"graphmod_lookup_{table.name}" if isinstance(table, Table) else "graphmod_lookup"
    with tf.compat.v1.name_scope(name, scope):
        keys, finish = _prepare(table, ids, is_training, combiner)
        return finish(lookup_rows(table, keys, is_training))


def fused_lookup(tables: Sequence[Table], ids: Sequence[Ids], is_training: bool = True,
                 combiners: Optional[Sequence[Optional[str]]] = None,
                 name: Optional[str] = None) -> List[tf.Tensor]:
    """sparse_lookup of many tables in one op: returns, for each i, what
    sparse_lookup(tables[i], ids[i], is_training, combiners[i]) returns.

    One op per step instead of one per feature: a model with many features
    pays one kernel launch, its tables run side by side on the session's
    threads, and a table listed twice (features sharing it) is looked up once
    for both. Training lookups are recorded as sparse_lookup's are, so the
    sparse optimizers train them the same way.

    >>> user_emb, item_emb = graphmod.fused_lookup(
    ...     [user, item], [features["user"], features["item"]], combiners=[None, "mean"])
    """
    tables, ids = list(tables), list(ids)
    combiners = list(combiners) if combiners is not None else [None] * len(tables)
    if not (len(tables) == len(ids) == len(combiners)) or not tables:
        raise ValueError(f"fused_lookup needs as many ids and combiners as tables (at least "
                         f"one), got {len(tables)} tables, {len(ids)} ids, "
                         f"{len(combiners)} combiners")
    with tf.compat.v1.name_scope(name, "graphmod_fused_lookup"):
        prepared = [_prepare(t, i, is_training, c) for t, i, c in zip(tables, ids, combiners)]
        keys = [k for k, _ in prepared]
        if horovod.active(tables[0].graph):
            lookup = (horovod.exchanged_find_or_insert if is_training
                      else horovod.exchanged_find)
            rows = lookup(tables, keys)
        elif is_training:
            rows, handles = fused.find_or_insert(tables, keys)
            state = graph_state(tables[0].graph)
            state.lookups += [Lookup(t, k, r, h) for t, k, r, h in zip(tables, keys, rows, handles)]
        else:
            rows = fused.find(tables, keys)
        return [finish(r) for (_, finish), r in zip(prepared, rows)]


def _prepare(table: Table, ids: Ids, is_training: bool, combiner: Optional[str]):
    """(int64 keys to look up, the function that turns their rows into the
    lookup's result) for sparse_lookup's arguments, checked."""
    if not isinstance(table, Table):
        raise TypeError(f"sparse_lookup needs a graphmod table, got {type(table).__name__}")
    if not isinstance(is_training, bool):
        raise TypeError(f"graphmod table '{table.name}': is_training must be a Python bool, "
                        f"got {type(is_training).__name__}")
    if combiner is not None and combiner not in COMBINERS:
        raise ValueError(f"graphmod table '{table.name}': combiner must be one of {COMBINERS} "
                         f"or None, got {combiner!r}")
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank != 2:
            raise ValueError(f"graphmod table '{table.name}': sparse ids must be 2-D "
                             f"[batch, ids], got rank {ids.shape.rank}")
        return to_keys(table.name, ids.values), lambda rows: _combine(
            rows, ids.indices[:, 0], ids.dense_shape[0], combiner or "mean")
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.flat_values.shape.rank != 1:
            raise ValueError(f"graphmod table '{table.name}': ragged ids must be "
                             f"[batch, (ids)], got {ids.shape}")
        return to_keys(table.name, ids.flat_values), lambda rows: _combine(
            rows, ids.value_rowids(), ids.nrows(), combiner or "mean")
    ids = tf.convert_to_tensor(ids)
    if combiner is None:
        return to_keys(table.name, ids), lambda rows: rows
    if ids.shape.rank is not None and ids.shape.rank < 1:
        raise ValueError(f"graphmod table '{table.name}': a combiner needs ids of rank >= 1")

    def combine(rows):
        total = tf.reduce_sum(rows, axis=-2)
        if combiner == "sum":
            return total
        count = tf.maximum(tf.cast(tf.shape(ids)[-1], tf.float32), 1.0)
        return total / (count if combiner == "mean" else tf.sqrt(count))
    return to_keys(table.name, ids), combine


def _combine(rows: tf.Tensor, segments: tf.Tensor, batch: tf.Tensor, combiner: str) -> tf.Tensor:
    segments = tf.cast(segments, tf.int32)
    batch = tf.cast(batch, tf.int32)
    total = tf.math.unsorted_segment_sum(rows, segments, batch)
    if combiner == "sum":
        return total
    count = tf.math.unsorted_segment_sum(tf.ones_like(segments, tf.float32), segments, batch)
    scale = count if combiner == "mean" else tf.sqrt(count)
    return total / tf.maximum(scale, 1.0)[:, None]
