"""A read-only index of a tf.Graph for matching rewrite patterns.

Ops are networkx nodes (by name); an edge producer -> consumer carries the
tensor index and the consumer's input index, or `control=True`. Rules match on
the view and mutate only through graphmod.rewriter.Rewriter; after a rule
changes the graph, the engine builds a fresh view.

>>> view = GraphView(tf.compat.v1.get_default_graph())
>>> [op.name for op in view.consumers(ids)]
"""
from typing import List

import networkx as nx
import tensorflow as tf


class GraphView:
    def __init__(self, graph: tf.Graph):
        self.graph = graph
        self.nx = nx.MultiDiGraph()
        for op in graph.get_operations():
            self.nx.add_node(op.name, op=op)
        for op in graph.get_operations():
            for i, t in enumerate(op.inputs):
                self.nx.add_edge(t.op.name, op.name, tensor=t.value_index, input=i, control=False)
            for c in op.control_inputs:
                self.nx.add_edge(c.name, op.name, control=True)

    def op(self, name: str) -> tf.Operation:
        return self.nx.nodes[name]["op"]

    def consumers(self, tensor: tf.Tensor) -> List[tf.Operation]:
        """Ops reading tensor as a data input (each once)."""
        out = []
        for _, dst, d in self.nx.out_edges(tensor.op.name, data=True):
            if not d["control"] and d["tensor"] == tensor.value_index:
                op = self.op(dst)
                if op not in out:
                    out.append(op)
        return out

    def control_consumers(self, op: tf.Operation) -> List[tf.Operation]:
        return [self.op(dst) for _, dst, d in self.nx.out_edges(op.name, data=True)
                if d["control"]]
