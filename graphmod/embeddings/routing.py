"""The rows' moves of a lookup whose keys are served elsewhere (by their
owners: Horovod ranks, graphmod.horovod.exchange; ps tasks,
rewrite_rules.ps_shards), around GraphmodExchangeRoute's and
GraphmodExchangeServe's plans (native/exchange_plan.h):
  - the owner sends back each entry's row (its key's last lookup's) and,
    training, how many of the entry's lookups were refused a row (pack);
  - the sender puts each id's row in place (unpack); the first `refused`
    occurrences of a key read the table's missing value and pass no
    gradient, as they do in one table.
Autodiff runs back through both as through the gathers they stand for.
"""
from typing import List, Sequence

import tensorflow as tf

from graphmod._ops import ops


def pack(rows: Sequence[tf.Tensor], handles, plan, widths: Sequence[int]) -> tf.Tensor:
    """The floats an owner sends back: rows[i] are table i's lookups' rows
    (plan.lookups[i]'s), handles their row handles when training (None
    otherwise); widths[i] is table i's dim, plus 1 when training."""
    return ops.graphmod_exchange_pack(list(rows), list(handles) if handles is not None else [],
                                      plan.last, plan.first, plan.count, plan.out_at,
                                      widths=list(widths))


def unpack(returned: tf.Tensor, route, tables, keys: Sequence[tf.Tensor],
           widths: Sequence[int]) -> List[tf.Tensor]:
    """Each table's rows of its keys (shaped keys[i].shape + [dim]) from the
    floats the owners sent back in the route's order."""
    mine = ops.graphmod_exchange_unpack(returned, route.at, route.occurrence,
                                        dims=[t.dim for t in tables], widths=list(widths))
    out = []
    for table, k, rows, no_row, width in zip(tables, keys, mine.rows, mine.no_row, widths):
        if width > table.dim:
            rows = _without_refused(table, rows, no_row)
        out.append(tf.reshape(rows, tf.concat([tf.shape(k, out_type=tf.int32), [table.dim]], 0)))
    return out


def _without_refused(table: "graphmod.Table", rows: tf.Tensor, no_row: tf.Tensor) -> tf.Tensor:
    """rows (per id, in batch order) where the ids no_row marks (the first
    `refused` occurrences of their key) read the missing value and pass no
    gradient, as they do on one table."""
    # The missing value: the table's initial row (the row's value when
    # admitted later in the step, read through the row), or its constant.
    missing = (tf.stop_gradient(rows) if table.default_value is None
               else tf.fill(tf.shape(rows), tf.constant(table.default_value, tf.float32)))
    return tf.where(no_row[:, None], missing, rows)


def elements(at: tf.Tensor, dim: int) -> tf.Tensor:
    """[len(at), dim] indices of the dim floats of each row starting at at."""
    return at[:, None] + tf.range(dim)[None, :]


# A row's gradient goes back where the row came from, summed where one row
# went to several places.
@tf.RegisterGradient("GraphmodExchangePack")
def _pack_gradient(op, d_back):
    n, h = op.get_attr("N"), op.get_attr("H")
    rows = op.inputs[:n]
    last, out_at = op.inputs[n + h:2 * n + h], op.inputs[4 * n + h:5 * n + h]
    d_back = tf.convert_to_tensor(d_back)
    d_rows = [tf.math.unsorted_segment_sum(tf.gather(d_back, elements(at, width - (1 if h else 0))),
                                           lookup, tf.shape(r)[0])
              for r, lookup, at, width in zip(rows, last, out_at, op.get_attr("widths"))]
    return d_rows + [None] * (len(op.inputs) - n)


@tf.RegisterGradient("GraphmodExchangeUnpack")
def _unpack_gradient(op, *grads):
    n, dims = op.get_attr("N"), op.get_attr("dims")
    returned, at = op.inputs[0], op.inputs[1:1 + n]
    parts = [(tf.reshape(tf.convert_to_tensor(g), [-1]), tf.reshape(elements(a, d), [-1]))
             for g, a, d in zip(grads[:n], at, dims) if g is not None]
    if not parts:
        return [None] * len(op.inputs)
    d_returned = tf.math.unsorted_segment_sum(tf.concat([g for g, _ in parts], 0),
                                              tf.concat([i for _, i in parts], 0),
                                              tf.size(returned))
    return [d_returned] + [None] * (len(op.inputs) - 1)
