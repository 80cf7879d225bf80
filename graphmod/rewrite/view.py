"""A read-only view of a tf.Graph for matching rewrite patterns.

Uses of a tensor or op come from TF's own index (cheap on graphs of tens of
thousands of ops); `nx` offers the whole graph as a networkx MultiDiGraph
(ops by name; an edge producer -> consumer carries the tensor index and the
consumer's input index, or `control=True`) for matching that needs paths,
built on first use. Rules match on the view and mutate only through
graphmod.rewriter.Rewriter.

>>> view = GraphView(tf.compat.v1.get_default_graph())
>>> [op.name for op in view.consumers(ids)]
"""
import functools
from typing import List

import networkx as nx
import tensorflow as tf


class GraphView:
    def __init__(self, graph: tf.Graph):
        self.graph = graph

    @functools.cached_property
    def nx(self) -> nx.MultiDiGraph:
        g = nx.MultiDiGraph()
        for op in self.graph.get_operations():
            g.add_node(op.name, op=op)
            for i, t in enumerate(op.inputs):
                g.add_edge(t.op.name, op.name, tensor=t.value_index, input=i, control=False)
            for c in op.control_inputs:
                g.add_edge(c.name, op.name, control=True)
        return g

    def consumers(self, tensor: tf.Tensor) -> List[tf.Operation]:
        """Ops reading tensor as a data input (each once)."""
        out = []
        for op in tensor.consumers():
            if op not in out:
                out.append(op)
        return out

    def control_consumers(self, op: tf.Operation) -> List[tf.Operation]:
        """Ops that wait for op."""
        return list(op._control_outputs)  # pylint: disable=protected-access
