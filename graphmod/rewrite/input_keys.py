"""Keys that are a pure function of a tf.data iterator's element, and their
recomputation from another element (the next one, in the input pipeline).

A lookup's keys qualify when every op between one IteratorGetNext and them
is stateless, takes no resource, calls no function and sits outside control
flow: the same ops, copied, compute the same keys from any element. The
disk tier's prefetch (rewrite_rules.tier_prefetch) and the exchange of ids
one step ahead (graphmod.horovod.ids_ahead) recompute keys so.
"""
from typing import Callable, List, Sequence, Tuple

import tensorflow as tf

from graphmod.rewrite.index import GraphIndex, walk


class NotFromInput(Exception):
    """Why some keys are not a pure function of one iterator's element."""


def pure_path(keys: tf.Tensor, index: GraphIndex) -> Tuple[tf.Operation, List[tf.Operation]]:
    """The IteratorGetNext keys come from, and the ops computing them from it."""
    ops, sources = [], set()

    def inputs(op):  # the walk stops at the iterator's outputs
        return () if op.type == "IteratorGetNext" else index.producers(op)

    for op in walk([keys.op], inputs):
        if op.type == "IteratorGetNext":
            sources.add(op)
            continue
        # (A fed placeholder's default is not what the step reads.)
        if index.stateful(op) or op.type in ("Placeholder", "PlaceholderWithDefault"):
            raise NotFromInput(f"its keys are computed with {op.type} op '{op.name}', which the "
                               "input pipeline cannot run")
        if index.in_control_flow(op):
            raise NotFromInput(f"its keys are computed in control flow ('{op.name}')")
        if index.reads_state(op):
            raise NotFromInput(f"its keys are computed with state or a function ('{op.name}')")
        ops.append(op)
    if len(sources) != 1:
        raise NotFromInput("its keys do not come from one tf.data iterator" if not sources else
                           "its keys come from more than one tf.data iterator")
    return sources.pop(), ops


def recompute(index: GraphIndex, get_next: tf.Operation,
              keyed: Sequence[Tuple[tf.Tensor, List[tf.Operation]]]
              ) -> Callable[[Sequence[tf.Tensor]], List[tf.Tensor]]:
    """A function of an element (get_next's outputs' values, in order) that
    builds each (keys, ops computing them)'s keys from it, with copies of the
    ops (built where it is called: a tf.data or branch function)."""
    copies = [(keys, index.stateless_copy(ops), index.outputs_read(ops, get_next))
              for keys, ops in keyed]

    def keys_of(element: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        out = []
        for keys, graph_def, read in copies:
            if keys.op is get_next:  # an element's component itself
                out.append(element[keys.value_index])
                continue
            used = {f"{get_next.name}:{i}": element[i] for i in read}
            copy, = tf.graph_util.import_graph_def(graph_def, input_map=used,
                                                   return_elements=[keys.name], name="keys")
            out.append(copy)
        return out

    return keys_of
