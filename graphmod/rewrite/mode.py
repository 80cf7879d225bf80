"""The mode of a graph ("train", "eval" or "predict"), read from the graph.

>>> graph_mode(tf.compat.v1.get_default_graph(), estimator=True)
'predict'
"""
import tensorflow as tf

from graphmod import tf_private
from graphmod.rewrite.plan import trains_anything


def graph_mode(graph: tf.Graph, estimator: bool) -> str:
    """The mode of graph; estimator: whether an Estimator built it.

    Evaluation loops (Estimator.evaluate's included) count their steps in
    the EVAL_STEP collection. An Estimator's model_fn may build its optimizer
    in every mode (which also fills TRAIN_OP), so for an Estimator's graph
    only what Estimator.train itself adds tells training from prediction.
    Any other graph trains when it holds an optimizer step.
    """
    if graph.get_collection(tf.compat.v1.GraphKeys.EVAL_STEP):
        return "eval"
    trains = tf_private.estimator_trains(graph) if estimator else trains_anything(graph)
    return "train" if trains else "predict"
