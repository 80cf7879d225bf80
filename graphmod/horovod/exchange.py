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

The index work of both sides is native (GraphmodExchangeRoute on the
sender, GraphmodExchangeServe on the owner), and so are the rows' moves
(graphmod.embeddings.routing).

Training exchanges record the owner's lookup (graphmod.training_lookups), so
the sparse optimizers find each owned row's gradient there: autodiff brings
it back through the reverse all-to-alls, summed over the ranks that read
the row, and scaled by 1/size with combine="average" (sparse_lookup's and
fused_lookup's), as Horovod's DistributedOptimizer (op=Average, its
default) combines a dense variable's. The hook's tables take their
gradients another way, since the model's autodiff ran before the rewrite:
returned_gradients sends them in the layout the rows came in, without their
keys, where one exchange served exactly an optimizer step's tables
(exchanged_gradients, keyed, otherwise).
"""
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from graphmod._ops import ops
from graphmod.embeddings import features, fused, routing
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


def horovod_rank() -> int:
    """This process's Horovod rank (0 when Horovod is not initialized)."""
    import sys  # pylint: disable=import-outside-toplevel
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd.rank() if hvd is not None and hvd.is_initialized() else 0


def active(graph: Optional[tf.Graph] = None) -> bool:
    """Whether lookups in graph exchange ids with their owners: sharding
    enabled (see enabled) and Horovod initialized with more than one rank."""
    if not _decided(graph):
        return False
    hvd = _horovod()
    return hvd.is_initialized() and hvd.size() > 1


class Exchange(NamedTuple):
    """A training exchange's plan, which its gradients return by
    (returned_gradients): the tables, each entry's floats in the rows sent
    back, and the route (GraphmodExchangeRoute's outputs) and owner's plan
    (GraphmodExchangeServe's) of its ids."""
    tables: list
    widths: list
    route: Any
    plan: Any


def exchanged_find_or_insert(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor],
                             combine: str = "average") -> List[tf.Tensor]:
    """Training lookups of keys[i] (any shape) in tables[i], each key's row
    kept by its owner: rows of shape keys[i].shape + [dim]."""
    return training_exchange(tables, keys, combine)[0]


def training_exchange(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor],
                      combine: str = "average", ahead=None, autodiff: bool = True
                      ) -> Tuple[List[tf.Tensor], Exchange]:
    """exchanged_find_or_insert's rows, and its Exchange. ahead: the keys'
    exchange done a step ahead (graphmod.horovod.ids_ahead.Ahead), whose
    route and owners' plan the lookups then use. autodiff: the gradients go
    back through the rows' exchange (False: another way, returned_gradients;
    only what the step sends is counted in BYTES_SENT)."""
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

    return _exchange(tables, keys, serve, "graphmod_exchange", training=True, ahead=ahead,
                     autodiff=autodiff)


def exchanged_find(tables: Sequence["graphmod.Table"], keys: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Read-only lookups as exchanged_find_or_insert's (keys without a row
    read their table's missing value, as on one rank)."""
    return _exchange(tables, keys, lambda t, k: (fused.find(t, k), None),
                     "graphmod_exchange_find", training=False, autodiff=False)[0]


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
    size = hvd.size()
    dims = [t.dim for t in tables]
    with tf1.name_scope(None, "graphmod_gradient_exchange"):
        route = ops.graphmod_exchange_route([tf.reshape(k, [-1]) for k in keys], size=size,
                                            widths=dims, with_counts=False)
        # This rank's rows summed per key, each key's where its entry goes.
        floats = tf.math.unsorted_segment_sum(
            tf.concat([tf.reshape(g, [-1]) for g in grads], 0),
            tf.concat([tf.reshape(routing.elements(at, d), [-1])
                       for at, d in zip(route.at, dims)], 0),
            tf.reduce_sum(route.float_splits))
        received, received_splits = hvd.alltoall(route.sent, splits=route.splits, name="ids")
        received_rows, _ = hvd.alltoall(floats, splits=route.float_splits, name="rows")
        tf1.add_to_collection(BYTES_SENT, 16 * to_others(route.splits, hvd.rank())
                              + 4 * to_others(route.float_splits, hvd.rank()))
        plan = ops.graphmod_exchange_serve(received, received_splits, N=len(dims), widths=dims)
        return [(plan.keys[i], tf.gather(received_rows, routing.elements(plan.out_at[i], d)))
                for i, d in enumerate(dims)]


def returned_gradients(exchange: Exchange, keys: Sequence[tf.Tensor],
                       grads: Sequence[tf.Tensor]) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """exchanged_gradients for the keys a training exchange looked up
    (keys[i] and grads[i] of exchange.tables[i]), sent without their keys: in
    the layout the rows came back in (each entry's summed gradient and
    whether one reached it), to owners that know which keys they served; one
    all-to-all for all tables. Returns, per table, the (keys, gradient rows)
    this rank owns, from every rank, as exchanged_gradients does."""
    hvd = _horovod()
    with tf1.name_scope(None, "graphmod_gradient_return"):
        floats = ops.graphmod_exchange_scatter_gradients(
            exchange.route.sent, [tf.reshape(k, [-1]) for k in keys],
            [tf.reshape(g, [-1]) for g in grads], widths=exchange.widths)
        received, _ = hvd.alltoall(floats, splits=exchange.route.float_splits, name="rows")
        tf1.add_to_collection(BYTES_SENT, 4 * to_others(exchange.route.float_splits, hvd.rank()))
        owned = ops.graphmod_exchange_gather_gradients(
            received, list(exchange.plan.keys), list(exchange.plan.out_at), widths=exchange.widths)
        return list(zip(owned.reached_keys, owned.rows))


def to_others(splits: tf.Tensor, rank: int) -> tf.Tensor:
    """How much of splits (per rank) goes to ranks other than `rank` (int64)."""
    s = tf.cast(splits, tf.int64)
    return tf.reduce_sum(s) - s[rank]


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
              name: str, training: bool, ahead=None, autodiff: bool = False
              ) -> Tuple[List[tf.Tensor], Exchange]:
    hvd = _horovod()
    size, rank = hvd.size(), hvd.rank()
    tables = list(tables)
    # Each entry's floats in the rows sent back: its row and, when training,
    # how many of the entry's lookups were refused a row (exact below 2^24).
    extra = 1 if training else 0
    widths = [t.dim + extra for t in tables]
    with tf1.name_scope(None, name) as scope:
        # 1. This rank's distinct ids per table, with how often each occurs,
        # by owner; one all-to-all sends them, tagged by table (unless done
        # a step ahead).
        if ahead is None:
            route = ops.graphmod_exchange_route(
                [tf.reshape(tf.convert_to_tensor(k, tf.int64), [-1]) for k in keys],
                size=size, widths=widths)
            received, received_splits = hvd.alltoall(route.sent, splits=route.splits,
                                                     name="ids")
            ids_bytes = 24 * to_others(route.splits, rank)
            plan = ops.graphmod_exchange_serve(received, received_splits, N=len(widths),
                                               widths=widths)
        else:
            route, plan, ids_bytes = ahead.route, ahead.plan, 0  # (the advance counts its ids)

        # 2. The owner's lookups (the plan says which): each table's keys
        # looked up as often as they occurred in the step's batches, ranks in
        # order (as one rank reads the global batch). An entry's row is the
        # one its key's last lookup read: from its admission on, lookups read
        # the row.
        rows, handles = serve(tables, list(plan.lookups))
        # 3. Rows back, flattened (tables of any dims together) in the order
        # the ids arrived, each with (training) how many of its lookups were
        # refused a row.
        back = routing.pack(rows, handles if extra else None, plan, widths)
        returned, returned_splits = _rows_alltoall(hvd, back, plan.back_splits, scope)
        # What this rank sends the others: 3 int64 per id, 4 bytes per float
        # of the rows it serves and (autodiff) of their gradients it returns.
        sent_bytes = ids_bytes + 4 * to_others(plan.back_splits, rank)
        if autodiff:
            sent_bytes += 4 * to_others(returned_splits, rank)
        tf1.add_to_collection(BYTES_SENT, sent_bytes)

        # This rank's rows, in each table's ids' order.
        out = routing.unpack(returned, route, tables, keys, widths)
        return out, Exchange(tables, widths, route, plan)


def _rows_alltoall(hvd, back: tf.Tensor, splits: tf.Tensor, scope: str):
    """hvd.alltoall of the rows, whose gradient (the reverse all-to-all) is
    named after the exchange: Horovod matches collectives across ranks by
    name, and the name autodiff would give it depends on every op built
    before it in the gradients' scope (a gradient one rank alone builds
    would shift it, and every rank would wait forever)."""
    received_splits = []

    # splits is an input, not captured: custom_gradient looks for variables
    # read by what the function captures (a stash of ids_ahead is local).
    @tf.custom_gradient
    def exchange_rows(x, s):
        out, got = hvd.alltoall(x, splits=s, name="rows")
        received_splits.append(got)

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            return hvd.alltoall(dy, splits=got, name=scope + "rows_grad",
                                ignore_name_scope=True)[0], None
        return out, grad

    returned = exchange_rows(back, splits)
    return returned, received_splits[0]
