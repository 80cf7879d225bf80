"""The validity check run after a rewrite.

1. Nothing that must run reads a removed variable: the ops the rewrite
   rerouted or re-wired, and the losses, summaries and train ops in the
   graph's collections, do not depend on a converted variable.
2. With full=True, also: the graph is well formed, its GraphDef importing into
   a fresh graph (every input exists, every op is known, shapes agree). This
   costs about a second per 10,000 ops, so it is opt-in (the Rewriter already
   refuses reroutes across dtypes, and TF checks static shapes on reroute).
"""
from typing import Iterable, List

import tensorflow as tf

from graphmod.rewrite.index import GraphIndex

tf1 = tf.compat.v1
_ROOT_COLLECTIONS = (tf1.GraphKeys.LOSSES, tf1.GraphKeys.SUMMARIES)
# A model_fn may build its optimizer in eval and predict graphs too; only a
# training graph runs it.
_TRAINING_ROOT_COLLECTIONS = (tf1.GraphKeys.TRAIN_OP, tf1.GraphKeys.UPDATE_OPS)


class InvalidRewrite(Exception):
    pass


def check(graph: tf.Graph, removed: Iterable[tf.Variable], roots: List[tf.Operation],
          training: bool, full: bool = False) -> None:
    if full:
        try:
            with tf.Graph().as_default():
                tf1.import_graph_def(graph.as_graph_def(add_shapes=False), name="")
        except (ValueError, tf.errors.OpError) as e:
            raise InvalidRewrite(f"the rewritten graph is not well formed: {e}") from e
    roots = list(roots)
    for key in _ROOT_COLLECTIONS + (_TRAINING_ROOT_COLLECTIONS if training else ()):
        for item in graph.get_collection(key):
            op = getattr(item, "op", item)
            if isinstance(op, tf.Operation):
                roots.append(op)
    needed = GraphIndex.ancestors(roots)
    for v in removed:
        if v.op in needed:
            reader = next((op.name for op in needed if v.op in [t.op for t in op.inputs]), "?")
            raise InvalidRewrite(f"variable '{v.op.name}' was converted to a table but is "
                                 f"still read by ops that run ({reader})")
