"""The next step's ids exchanged during this step, for tables sharded across
Horovod ranks (rewrite_rules.shard_exchange builds it where it can).

A training step of sharded tables sends its ids to their owners before any
lookup can run: a round of Horovod's loop on the step's critical path. Where
the keys are a pure function of the tf.data iterator's element
(graphmod.rewrite.input_keys), that round moves one step ahead:
  - the step reads its batch from a stash (local variables holding the
    iterator's Optional of it, and an Optional of its exchange's plan), not
    from the iterator, and its lookups use the stashed plan of that batch's
    exchange (the route of its ids and the
    owners' plans: GraphmodExchangeRoute's and GraphmodExchangeServe's
    outputs);
  - the advance, which the step's applies wait for, takes the next element
    (IteratorGetNextAsOptional), computes its keys with copies of the ops
    that compute the step's, sends them to their owners (an all-to-all that
    runs beside the step's own collectives) and, once the step has read the
    stash, stashes the element and its plan.
`prime` stashes the first batch: run it once when the session is made
(GraphModifierHook.after_create_session does). At the end of the input the
advance stashes "no batch" and the next step raises OutOfRangeError, as the
iterator would have, before it starts any collective: training ends as it
would without the rewrite. Every rank runs one advance per training run, and
the prime, so the ids' all-to-alls match across ranks as the step's own do.
Exact: only ids move ahead; rows are read and updated in step order.

Only runs that train advance the input: a run that reads the model without
training (no optimizer update in it) is where the iterator would have
handed out a batch, so the run after it fails, saying so. A fetch of the
iterator's own outputs (a hook logging the raw labels) fails too: they come
from an iterator nothing initializes (the rule cuts the old get_next off, so
that it cannot take a batch the step never sees). An error of the input
pipeline (a corrupt record) surfaces in the advance: one step earlier than
without the rewrite, and that step's update is lost with it.
"""
from typing import Callable, List, NamedTuple, Sequence

import tensorflow as tf

from graphmod._ops import ops
from graphmod.horovod.exchange import BYTES_SENT, to_others

tf1 = tf.compat.v1

_NOT_PRIMED, _BATCH, _END, _TAKEN = 0, 1, 2, 3  # the stash's state
_ROUTE = ("sent", "splits", "float_splits", "at", "occurrence")
_PER_TABLE = {"at", "occurrence", "lookups", "keys", "last", "first", "count", "out_at"}
_PLAN = ("lookups", "keys", "last", "first", "count", "out_at", "back_splits")
Route = NamedTuple("Route", [(f, object) for f in _ROUTE])
Plan = NamedTuple("Plan", [(f, object) for f in _PLAN])


class Ahead(NamedTuple):
    element: List[tf.Tensor]  # the step's batch: what the iterator's get_next gave
    route: Route              # its ids' route, as GraphmodExchangeRoute gave it
    plan: Plan                # the owners' plan of them, as GraphmodExchangeServe gave it
    advance: tf.Operation     # stashes the next batch and its exchange; the applies wait for it
    prime: tf.Operation       # stashes the first batch: run once per session, before any step
    unset_iterator: tf.Tensor  # an iterator like get_next's that nothing initializes


def build(get_next: tf.Operation, keys_of: Callable[[Sequence[tf.Tensor]], List[tf.Tensor]],
          widths: Sequence[int]) -> Ahead:
    """The stash of get_next's iterator's batches and their exchange (see the
    module docstring). keys_of: each table's keys from an element (built in
    a branch function); widths: each table's floats per entry in the rows
    its exchange sends back."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    types, shapes = get_next.get_attr("output_types"), get_next.get_attr("output_shapes")
    iterator = get_next.inputs[0]
    n = len(widths)
    with tf1.name_scope(None, "graphmod_ids_ahead"):
        def fetch(scope: str) -> list:
            """The iterator's next element (an Optional), whether it had one,
            and its ids' route and owners' plan (an Optional of them, one
            tensor to stash). (Only the advance's bytes count as the step's:
            the prime runs once.)"""
            with tf1.name_scope(scope):
                optional = tf.raw_ops.IteratorGetNextAsOptional(
                    iterator=iterator, output_types=types, output_shapes=shapes)
                has = tf.raw_ops.OptionalHasValue(optional=optional)

                def next_keys():
                    element = tf.raw_ops.OptionalGetValue(optional=optional, output_types=types,
                                                          output_shapes=shapes)
                    return [tf.reshape(tf.cast(k, tf.int64), [-1]) for k in keys_of(element)]

                keys = tf.cond(has, next_keys, lambda: [tf.zeros([0], tf.int64)] * n)
                route = ops.graphmod_exchange_route(list(keys), size=hvd.size(), widths=widths)
                received, received_splits = hvd.alltoall(route.sent, splits=route.splits,
                                                         name="ids")
                plan = ops.graphmod_exchange_serve(received, received_splits, N=n,
                                                   widths=list(widths))
                if scope == "next":
                    tf1.add_to_collection(BYTES_SENT, 24 * to_others(route.splits, hvd.rank()))
                exchanged = _flat(route, _ROUTE) + _flat(plan, _PLAN)
                layout.extend((t.dtype, t.shape) for t in exchanged[len(layout):])
                return [optional, tf.where(has, _BATCH, _END),
                        tf.raw_ops.OptionalFromValue(components=exchanged)]

        def stash_for(value: tf.Tensor, name: str):
            initial = (tf.raw_ops.OptionalNone() if value.dtype == tf.variant
                       else tf.constant(_NOT_PRIMED))
            return tf1.Variable(initial, trainable=False, use_resource=True, validate_shape=False,
                                shape=tf.TensorShape(None),
                                collections=[tf1.GraphKeys.LOCAL_VARIABLES], name=name)

        layout = []  # the exchange's tensors in the plan's Optional: (dtype, shape)
        primed = fetch("prime")
        stash = [stash_for(v, name) for v, name in zip(primed, ("batch", "state", "exchange"))]
        prime = tf.group([s.assign(v, read_value=False) for s, v in zip(stash, primed)],
                         name="prime")
        reads = [s.read_value() for s in stash]
        ready = tf.switch_case(reads[1], [_not_primed, lambda: tf.constant(0),
                                          lambda: _end_of_input(iterator, types, shapes),
                                          _taken],
                               name="ready")
        # Nothing of the step (and of the advance) starts before the stash
        # holds a batch: at the end of the input, no rank starts a collective.
        # The batch read is marked taken until an advance stashes the next:
        # a run that reads it without training fails the next run.
        with tf.control_dependencies([ready]):
            taken = stash[1].assign(_TAKEN, read_value=False)
        with tf.control_dependencies([taken]):
            batch, exchange = tf.identity(reads[0]), tf.identity(reads[2])
            fresh = fetch("next")
        with tf.control_dependencies([r.op for r in reads] + [taken]):
            advance = tf.group([s.assign(v, read_value=False) for s, v in zip(stash, fresh)],
                               name="advance")
        element = tf.raw_ops.OptionalGetValue(optional=batch, output_types=types,
                                              output_shapes=shapes)
        exchanged = tf.raw_ops.OptionalGetValue(optional=exchange,
                                                output_types=[d for d, _ in layout],
                                                output_shapes=[s for _, s in layout])
        route = _unflat(exchanged, _ROUTE, n, Route)
        plan = _unflat(exchanged[3 + 2 * n:], _PLAN, n, Plan)
        unset = tf.raw_ops.IteratorV2(shared_name="", container="", output_types=types,
                                      output_shapes=shapes, name="unset_iterator")
    return Ahead(list(element), route, plan, advance, prime, unset)


def _flat(outputs, fields) -> List[tf.Tensor]:
    flat = []
    for f in fields:
        value = getattr(outputs, f)
        flat.extend(value if isinstance(value, (list, tuple)) else [value])
    return flat


def _unflat(flat: List[tf.Tensor], fields, n: int, kind):
    """kind's fields from flat (as _flat laid them out): the per-table ones
    (GraphmodExchangeRoute's and -Serve's list outputs) take n tensors, the
    others one."""
    values, at = {}, 0
    for f in fields:
        if f in _PER_TABLE:
            values[f], at = list(flat[at:at + n]), at + n
        else:
            values[f], at = flat[at], at + 1
    return kind(**values)


def _not_primed():
    check = tf.debugging.Assert(False, [
        "graphmod: the ids of each step are exchanged one step ahead, and nothing primed the "
        "first batch: run the prime op of graphmod once per session before training (the "
        "GraphModifierHook does)"])
    with tf.control_dependencies([check]):
        return tf.constant(0)


def _taken():
    check = tf.debugging.Assert(False, [
        "graphmod: a run read the input of the model without training (no optimizer update "
        "ran in it), where the unmodified model would have given it a batch and this run the "
        "next: with the ids of each step exchanged one step ahead, only runs that train move "
        "the input on. Read the input in the training run"])
    with tf.control_dependencies([check]):
        return tf.constant(0)


def _end_of_input(iterator, types, shapes):
    """Raises OutOfRangeError, as the step's get_next would have: the
    iterator has no element left."""
    last = tf.raw_ops.IteratorGetNext(iterator=iterator, output_types=types,
                                      output_shapes=shapes)
    with tf.control_dependencies([last[0].op]):
        return tf.constant(0)
