"""The exchange of ids and rows between ranks and their keys' owners.

One exchange serves the lookups of any number of tables in a step, in two
all-to-alls (and autodiff's reverse of the second when training):
1. each rank deduplicates each table's ids, counting each id's
   occurrences, and sends them to their owners, all tables together, each
   id with its count and its table;
2. each owner deduplicates what arrives per table (two ranks may send the
   same key: one row, one gradient sum) and looks each key up as often as
   it occurred in the step's batches, ranks in order (access counts, and so
   admission thresholds and LFU eviction, mean what they mean on one rank);
3. the rows go back, flattened so that tables of any dims travel together,
   each with (when training) how many of the id's lookups admission refused
   a row; each rank puts them back in its ids' order, the refused
   occurrences reading the missing value with no gradient, as on one rank.
Every rank issues the same collectives, named by the exchange's name scope,
also when it has no ids for a table (Horovod matches collectives by name,
and a collective one rank never issues hangs the others).

Training exchanges record the owner's lookup (graphmod.training_lookups), so
the sparse optimizers find each owned row's gradient there: autodiff brings
it back through the reverse all-to-alls, summed over the ranks that read
the row, and scaled by 1/size with combine="average" (sparse_lookup's and
fused_lookup's), as Horovod's DistributedOptimizer (op=Average, its
default) combines a dense variable's. The hook's tables take their
gradients another way (exchanged_gradients), keyed, since the model's
autodiff ran before the rewrite.
"""
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from graphmod.embeddings import features, fused
from graphmod.embeddings.partition import owner_of
from graphmod.state import Lookup, graph_state

tf1 = tf.compat.v1

_enabled = False
COMBINES = ("average", "sum")
# Each exchange adds the bytes this rank sends other ranks in it (ids, the
# rows it serves and, training, the gradients it returns; its part for
# itself left out; an int64 scalar) to this graph collection
# (benchmarks/horovod.py reads it).
BYTES_SENT = "graphmod_exchange_bytes_sent"


def enable(on: bool = True) -> None:
    """Shards tables across Horovod ranks from now on (when Horovod is
    initialized with more than one rank; see the package docstring)."""
    global _enabled
    _enabled = bool(on)


def _horovod():
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    return hvd


def _decided(graph: Optional[tf.Graph]) -> bool:
    """The graph's own decision (GraphModifierHook's rewrite sets it), else enable()'s."""
    sharded = graph_state(graph).split_over_ranks
    return _enabled if sharded is None else sharded


def enabled(graph: Optional[tf.Graph] = None) -> bool:
    """Whether graph's tables (default: the default graph's) are sharded:
    enable() called, or the hook's rewrite decided so, and Horovod
    initialized (with one rank too: checkpoints are then written in parts,
    of one)."""
    return _decided(graph) and _horovod().is_initialized()


def horovod_ranks() -> int:
    """How many ranks Horovod runs, 1 when this process has not imported or
    initialized it (the hook shards tables when a model runs on several)."""
    import sys  # pylint: disable=import-outside-toplevel
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd.size() if hvd is not None and hvd.is_initialized() else 1


def active(graph: Optional[tf.Graph] = None) -> bool:
    """Whether lookups in graph exchange ids with their owners: sharding
    enabled (see enabled) and Horovod initialized with more than one rank."""
    if not _decided(graph):
        return False
    hvd = _horovod()
    return hvd.is_initialized() and hvd.size() > 1


def exchanged_find_or_insert(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor],
                             combine: str = "average") -> List[tf.Tensor]:
    """Training lookups of keys[i] (any shape) in tables[i], each key's row
    kept by its owner: rows of shape keys[i].shape + [dim]."""
    if combine not in COMBINES:
        raise ValueError(f"graphmod: combine must be one of {COMBINES}, got {combine!r}")
    for t in tables:
        policy = features.policy_of(t)
        if policy.eviction_unit == "seconds" and graph_state(t.graph).timestamp is not None:
            # The owner would stamp rows with its own batch's newest timestamp
            # (none at all when its batch is empty), not the sender's.
            raise ValueError(f"graphmod table '{t.name}': a clock from the batch's timestamp "
                             "is not built for tables sharded across Horovod ranks yet (use "
                             "eviction_unit='steps')")
    scale = 1.0 / _horovod().size() if combine == "average" else 1.0

    def serve(owned_tables, owned_keys):
        rows, handles = fused.find_or_insert(owned_tables, owned_keys)
        graph_state(owned_tables[0].graph).lookups.extend(
            Lookup(t, k, r, h) for t, k, r, h in zip(owned_tables, owned_keys, rows, handles))
        return [_scale_gradient(r, scale) for r in rows], handles

    return _exchange(tables, keys, serve, "graphmod_exchange")


def exchanged_find(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Read-only lookups as exchanged_find_or_insert's (keys without a row
    read their table's missing value, as on one rank)."""
    return _exchange(tables, keys, lambda t, k: (fused.find(t, k), None),
                     "graphmod_exchange_find")


def exchanged_gradients(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor],
                        grads: Sequence[tf.Tensor]) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """Gradient rows sent to their keys' owners, for applies there: this
    rank's rows grads[i] ([n, dim]) of keys[i] ([n] int64) of tables[i]
    (each summed per key first) go to each key's owner in two all-to-alls
    for all tables (keys with their tables, and the rows flattened across
    dims). Returns, per table, the (keys, gradient rows) this rank owns, from
    every rank: a key read on several ranks comes once from each, for the
    keyed apply to sum.

    The hook's sharded tables take this path: their gradients were computed
    before the rewrite (autodiff cannot run through the rows' exchange), so
    they travel keyed, as the dense variable's allgather sent them.
    """
    hvd = _horovod()
    size, rank = hvd.size(), hvd.rank()
    tables = list(tables)
    with tf1.name_scope(None, "graphmod_gradient_exchange"):
        summed = []
        for k, g, t in zip(keys, grads, tables):
            u = tf.unique(tf.reshape(k, [-1]))
            summed.append((u.y, tf.math.unsorted_segment_sum(
                tf.reshape(g, [-1, t.dim]), u.idx, tf.size(u.y))))
        ids = tf.concat([k for k, _ in summed], 0)
        table_of = tf.concat([tf.fill(tf.shape(k), tf.constant(i, tf.int64))
                              for i, (k, _) in enumerate(summed)], 0)
        widths = tf.constant([t.dim for t in tables], tf.int32)
        width = tf.gather(widths, tf.cast(table_of, tf.int32))
        flat = tf.concat([tf.reshape(g, [-1]) for _, g in summed], 0)
        owner = owner_of(ids, size)
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(owner, minlength=size, maxlength=size, dtype=tf.int32)
        float_splits = tf.math.unsorted_segment_sum(width, owner, size)
        starts = tf.cumsum(width, exclusive=True)
        at = tf.gather(starts, order)
        floats = tf.gather(flat, tf.ragged.range(at, at + tf.gather(width, order)).flat_values)
        received, _ = hvd.alltoall(tf.gather(tf.stack([ids, table_of], 1), order),
                                   splits=splits, name="ids")
        received_rows, _ = hvd.alltoall(floats, splits=float_splits, name="rows")

        def others(s):
            s = tf.cast(s, tf.int64)
            return tf.reduce_sum(s) - s[rank]
        tf1.add_to_collection(BYTES_SENT, 16 * others(splits) + 4 * others(float_splits))

        received_table = tf.cast(received[:, 1], tf.int32)
        offsets = tf.cumsum(tf.gather(widths, received_table), exclusive=True)
        out = []
        for i, t in enumerate(tables):
            p = tf.where(tf.equal(received_table, i))[:, 0]
            out.append((tf.gather(received[:, 0], p),
                        tf.gather(received_rows, _elements(offsets, p, t.dim))))
        return out


def _scale_gradient(x: tf.Tensor, scale: float) -> tf.Tensor:
    if scale == 1.0:
        return x

    @tf.custom_gradient
    def scaled(t):
        def grad(dy):
            if isinstance(dy, tf.IndexedSlices):
                return tf.IndexedSlices(dy.values * scale, dy.indices, dy.dense_shape)
            return dy * scale
        return tf.identity(t), grad

    return scaled(x)


def _exchange(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor],
              serve: Callable[[List["graphmod.Table"], List[tf.Tensor]], List[tf.Tensor]],
              name: str) -> List[tf.Tensor]:
    hvd = _horovod()
    size, rank = hvd.size(), hvd.rank()
    tables = list(tables)
    with tf1.name_scope(None, name) as scope:
        # 1. This rank's unique ids per table (with how often each occurs),
        # ordered by owner; one all-to-all sends them, tagged by table.
        flat = [tf.reshape(tf.convert_to_tensor(k, tf.int64), [-1]) for k in keys]
        unique = [tf.unique_with_counts(f) for f in flat]
        ids = tf.concat([u.y for u in unique], 0)
        table_of = tf.concat([tf.fill(tf.shape(u.y), t) for t, u in enumerate(unique)], 0)
        owner = owner_of(ids, size)
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(owner, minlength=size, maxlength=size, dtype=tf.int32)
        sent = tf.gather(tf.stack([ids, tf.cast(tf.concat([u.count for u in unique], 0),
                                                tf.int64),
                                   tf.cast(table_of, tf.int64)], 1), order)
        received, received_splits = hvd.alltoall(sent, splits=splits, name="ids")
        received_table = tf.cast(received[:, 2], tf.int32)

        # 2. The owner's lookups: each table's received ids (entries: an id
        # and how often one rank's batch holds it), deduplicated, each key
        # looked up as often as it occurred, ranks in order (as one rank
        # reads the global batch). A key's row is the one its last lookup
        # read: from its admission on, lookups read the row.
        positions = [tf.where(tf.equal(received_table, t))[:, 0] for t in range(len(tables))]
        entries = [(tf.gather(received[:, 0], p), tf.gather(received[:, 1], p))
                   for p in positions]
        owned = [tf.unique(k) for k, _ in entries]
        times = [tf.math.unsorted_segment_sum(c, o.idx, tf.size(o.y))
                 for (_, c), o in zip(entries, owned)]
        rows, handles = serve(tables, [tf.repeat(o.y, n) for o, n in zip(owned, times)])
        # Per entry, its key's row and, when training, how many of the
        # entry's lookups were refused a row (a float column: exact below 2^24).
        extra = 0 if handles is None else 1
        per_entry = []
        for t in range(len(tables)):
            row = tf.gather(tf.gather(rows[t], tf.cumsum(times[t]) - 1), owned[t].idx)
            if extra:
                refused = _refused(entries[t][1], owned[t].idx, handles[t])
                row = tf.concat([row, tf.cast(refused, tf.float32)[:, None]], 1)
            per_entry.append(tf.reshape(row, [-1]))

        # 3. Rows back, flattened (tables of any dims together) in the order
        # the ids arrived.
        widths = tf.constant([t.dim + extra for t in tables], tf.int32)
        received_widths = tf.gather(widths, received_table)
        offsets = tf.cumsum(received_widths, exclusive=True)
        back = tf.dynamic_stitch(
            [tf.reshape(_elements(offsets, p, t.dim + extra), [-1])
             for p, t in zip(positions, tables)], per_entry)
        back_splits = tf.math.unsorted_segment_sum(
            received_widths, tf.repeat(tf.range(size), received_splits), size)
        returned, returned_splits = _rows_alltoall(hvd, back, back_splits, scope)
        # What this rank sends the others: 3 int64 per id, 4 bytes per float
        # of the rows it serves and (training) of their gradients it returns.
        def others(s):
            s = tf.cast(s, tf.int64)
            return tf.reduce_sum(s) - s[rank]
        sent_bytes = 24 * others(splits) + 4 * others(back_splits)
        if extra:
            sent_bytes += 4 * others(returned_splits)
        tf1.add_to_collection(BYTES_SENT, sent_bytes)

        # This rank's rows, in each table's ids' order.
        sent_offsets = tf.cumsum(tf.gather(widths, tf.gather(table_of, order)), exclusive=True)
        sent_at = tf.math.invert_permutation(order)  # where each unique id was sent
        starts = tf.cumsum([tf.size(u.y) for u in unique], exclusive=True)
        out = []
        for t, (table, u, k) in enumerate(zip(tables, unique, keys)):
            at = tf.gather(sent_at, starts[t] + tf.range(tf.size(u.y)))
            mine = tf.gather(returned, _elements(sent_offsets, at, table.dim + extra))
            rows_t = tf.gather(mine[:, :table.dim], u.idx)
            if extra:
                rows_t = _without_refused(table, rows_t, u.idx, u.count,
                                          tf.cast(mine[:, table.dim], tf.int32))
            out.append(tf.reshape(rows_t, tf.concat([tf.shape(k, out_type=tf.int32),
                                                      [table.dim]], 0)))
        return out


def _rows_alltoall(hvd, back: tf.Tensor, splits: tf.Tensor, scope: str):
    """hvd.alltoall of the rows, whose gradient (the reverse all-to-all) is
    named after the exchange: Horovod matches collectives across ranks by
    name, and the name autodiff would give it depends on every op built
    before it in the gradients' scope (a gradient one rank alone builds
    would shift it, and every rank would wait forever)."""
    received_splits = []

    @tf.custom_gradient
    def exchange_rows(x):
        out, got = hvd.alltoall(x, splits=splits, name="rows")
        received_splits.append(got)

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            return hvd.alltoall(dy, splits=got, name=scope + "rows_grad",
                                ignore_name_scope=True)[0]
        return out, grad

    returned = exchange_rows(back)
    return returned, received_splits[0]


def _refused(counts: tf.Tensor, key_of: tf.Tensor, handles: tf.Tensor) -> tf.Tensor:
    """Per entry (a rank's `counts` lookups of one key, keys `key_of`, in
    arrival order), how many of its lookups got no row (handle -1) in the
    owner's repeated lookups (each key's lookups together, entries in
    arrival order)."""
    grouped = tf.argsort(key_of, stable=True)
    # Where each entry's lookups start: after every earlier key's and every
    # earlier entry's of its key.
    start = tf.gather(tf.cumsum(tf.gather(counts, grouped), exclusive=True),
                      tf.math.invert_permutation(grouped))
    no_row = tf.concat([[0], tf.cumsum(tf.cast(handles < 0, tf.int64))], 0)
    return tf.cast(tf.gather(no_row, start + counts) - tf.gather(no_row, start), tf.int32)


def _without_refused(table: "graphmod.Table", rows: tf.Tensor, key_of: tf.Tensor, counts: tf.Tensor,
                     refused: tf.Tensor) -> tf.Tensor:
    """Rows per id (ids in batch order, of unique keys key_of occurring
    `counts` times) where the first `refused` occurrences of each key read
    the missing value and pass no gradient, as they do on one rank."""
    grouped = tf.argsort(key_of, stable=True)
    first = tf.cumsum(counts, exclusive=True)  # where each key's occurrences start, grouped
    occurrence = tf.gather(tf.range(tf.size(key_of)) - tf.gather(first, tf.gather(key_of, grouped)),
                           tf.math.invert_permutation(grouped))
    no_row = tf.expand_dims(occurrence < tf.gather(refused, key_of), 1)
    # The missing value: the table's initial row (the row's value when
    # admitted later in the step, read through the row), or its constant.
    missing = (tf.stop_gradient(rows) if table.default_value is None
               else tf.fill(tf.shape(rows), tf.constant(table.default_value, tf.float32)))
    return tf.where(no_row, missing, rows)


def _elements(offsets: tf.Tensor, positions: tf.Tensor, dim: int) -> tf.Tensor:
    """[len(positions), dim] indices of the floats of the ids at positions,
    each id's dim floats starting at its offset."""
    return tf.gather(offsets, positions)[:, None] + tf.range(dim)[None, :]
