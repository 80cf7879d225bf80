"""The one read-only index of a tf.Graph that the planner and every rule read.

Built in one scan of the graph when a rewrite starts, and kept current by the
Rewriter (the only writer): it indexes the ops each rule builds when the rule
ends, and follows reroutes and control-input edits as they happen. It offers
  - uses: data consumers (TF's own index, public) and control consumers (ops
    that wait for an op, indexed here: TF keeps them only privately);
  - ops by type and by name scope;
  - the few walks the rewrite needs, written once: `walk` (depth first, each
    item once), `ancestors`, `feeds_only` and `sinks`;
  - the op predicates the rules share (`strip_identity`, `reads_variable`).
networkx earns its place for whole-graph questions (`nx`, built on first use).

>>> index = GraphIndex(tf.compat.v1.get_default_graph())
>>> [op.name for op in index.consumers(ids)], index.control_consumers(train_op)
"""
import bisect
import collections
import functools
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set

import networkx as nx
import tensorflow as tf

# Control flow v2's ops: a branch or loop as functions, outputs wrapped in Identity ops.
_FUNCTIONAL_FLOW = ("If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase")


def _key(item):
    return item.ref() if isinstance(item, tf.Tensor) else item


def walk(starts: Iterable, step: Callable[[object], Iterable]) -> Iterator:
    """Yields each item (op or tensor) reachable from starts once, depth
    first; step(item) gives the items after it. The caller may stop early:
    step runs for an item only when the caller asks for the next one."""
    seen: Set = set()
    stack = list(starts)
    while stack:
        item = stack.pop()
        key = _key(item)
        if key in seen:
            continue
        seen.add(key)
        yield item
        stack.extend(step(item))


def strip_identity(t: tf.Tensor) -> tf.Tensor:
    """t before any chain of Identity ops."""
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    return t


def reads_variable(t: tf.Tensor) -> bool:
    """t is a variable's value: a resource read, or a reference variable's
    `/read` Identity."""
    return t.op.type == "ReadVariableOp" or (
        t.op.type == "Identity" and t.op.inputs[0].dtype != t.op.inputs[0].dtype.base_dtype)


class GraphIndex:
    def __init__(self, graph: tf.Graph):
        self.graph = graph
        self._waiting: Dict[tf.Operation, List[tf.Operation]] = collections.defaultdict(list)
        self._by_type: Dict[str, List[tf.Operation]] = collections.defaultdict(list)
        self._position: Dict[tf.Operation, int] = {}
        self._count = 0          # ops indexed so far (the graph's first _count ops)
        self._version = -1       # graph.version when last brought up to date
        self._sorted: Optional[List[tf.Operation]] = None  # by name, for scopes
        self.refresh()

    def refresh(self) -> None:
        """Indexes the ops added since the last call (the Rewriter calls it
        after each rule; queries call it when the graph has grown)."""
        if self.graph.version == self._version:
            return
        ops = self.graph.get_operations()  # in creation order
        for i, op in enumerate(ops[self._count:], self._count):
            self._position[op] = i
            self._by_type[op.type].append(op)
            for c in op.control_inputs:
                self._waiting[c].append(op)
        if len(ops) > self._count:
            self._sorted = None
        self._count, self._version = len(ops), self.graph.version

    # Called by the Rewriter when it changes an op's control inputs.
    def control_inputs_changed(self, op: tf.Operation, before: List[tf.Operation]) -> None:
        if op not in self._position:  # built since the last refresh: indexed as it is now
            self.refresh()
            return
        for c in before:
            self._waiting[c] = [o for o in self._waiting[c] if o is not op]
        for c in op.control_inputs:
            self._waiting[c].append(op)

    # -- uses ---------------------------------------------------------------
    @staticmethod
    def consumers(tensor: tf.Tensor) -> List[tf.Operation]:
        """Ops reading tensor as a data input (each once)."""
        return list(dict.fromkeys(tensor.consumers()))

    def op_consumers(self, op: tf.Operation) -> List[tf.Operation]:
        """Ops reading any output of op (each once)."""
        return list(dict.fromkeys(c for t in op.outputs for c in t.consumers()))

    def control_consumers(self, op: tf.Operation) -> List[tf.Operation]:
        """Ops that wait for op."""
        self.refresh()
        return list(self._waiting.get(op, ()))

    @staticmethod
    def producers(op: tf.Operation) -> List[tf.Operation]:
        """The ops whose outputs op reads as data inputs (each once)."""
        return list(dict.fromkeys(t.op for t in op.inputs))

    @staticmethod
    def data_input(op: tf.Operation, i: int = 0) -> tf.Tensor:
        """The tensor op reads as data input i."""
        return op.inputs[i]

    @staticmethod
    def outputs_read(ops: Iterable[tf.Operation], op: tf.Operation) -> List[int]:
        """Which of op's outputs the ops read, in order."""
        return sorted({t.value_index for o in ops for t in o.inputs if t.op is op})

    @staticmethod
    def attr(op: tf.Operation, name: str):
        """op's attribute `name` (its value as TensorFlow gives it)."""
        return op.get_attr(name)

    @staticmethod
    def stateless_copy(ops: Iterable[tf.Operation]) -> tf.compat.v1.GraphDef:
        """A GraphDef of copies of ops, free of devices, colocation and control
        inputs, to import elsewhere (a tf.data function). Only for ops that
        keep no state: nothing they waited for changes what they compute."""
        ops = list(ops)
        graph_def = tf.compat.v1.GraphDef()
        if ops:
            graph_def.versions.CopyFrom(ops[0].graph.graph_def_versions)
        for op in ops:
            node = graph_def.node.add()
            node.CopyFrom(op.node_def)
            node.device = ""
            node.attr.pop("_class", None)
            kept = [i for i in node.input if not i.startswith("^")]
            del node.input[:]
            node.input.extend(kept)
        return graph_def

    @staticmethod
    def stateful(op: tf.Operation) -> bool:
        """op's kernel keeps or changes state (its op def says so): running it
        elsewhere (another graph, a tf.data function) is not the same."""
        return op.op_def.is_stateful

    @staticmethod
    def reads_state(op: tf.Operation) -> bool:
        """op takes a resource (a variable, a table) or calls a function."""
        return any(t.dtype == tf.resource for t in op.inputs) or any(
            v.HasField("func") or v.list.func for v in op.node_def.attr.values())

    @staticmethod
    def in_control_flow(op: tf.Operation) -> bool:
        """op sits inside a v1 loop or branch (tf.while_loop, tf.cond)."""
        return op._control_flow_context is not None  # pylint: disable=protected-access

    def used(self, op: tf.Operation) -> bool:
        """Something reads or waits for op."""
        return bool(self.control_consumers(op)) or any(t.consumers() for t in op.outputs)

    # -- ops by type and scope ---------------------------------------------
    def of_type(self, *types: str) -> List[tf.Operation]:
        """Ops of the given types, in creation order."""
        self.refresh()
        if len(types) == 1:
            return list(self._by_type.get(types[0], ()))
        return sorted((op for t in types for op in self._by_type.get(t, ())),
                      key=self._position.__getitem__)

    def types(self) -> List[str]:
        self.refresh()
        return [t for t, ops in self._by_type.items() if ops]

    def under(self, scope: str) -> List[tf.Operation]:
        """Ops in name scope `scope` (binary search over the sorted names)."""
        self.refresh()
        if self._sorted is None:
            self._sorted = sorted(self.graph.get_operations(), key=lambda op: op.name)
            self._names = [op.name for op in self._sorted]
        # "/" sorts just before "0", so "scope/" ... "scope0" spans the scope.
        lo = bisect.bisect_left(self._names, scope + "/")
        hi = bisect.bisect_left(self._names, scope + "0")
        return self._sorted[lo:hi]

    # -- walks ----------------------------------------------------------------
    @staticmethod
    def ancestors(roots: Iterable[tf.Operation]) -> Set[tf.Operation]:
        """roots and every op they depend on (data and control)."""
        return set(walk(roots, lambda op: GraphIndex.producers(op) + list(op.control_inputs)))

    def feeds_only(self, op: tf.Operation, ends: Set[str], limit: int = 64) -> bool:
        """Every data path from op ends in ops named in `ends` (e.g. ops the
        rewrite replaces, which will not run); bounded, so a wide fan-out
        answers False."""
        seen = 0
        for o in walk([op], lambda o: [] if o.name in ends else self.op_consumers(o)):
            if o.name in ends:
                continue
            seen += 1
            if seen > limit or not self.op_consumers(o) and not self._unread_output(o):
                return False
        return True

    def _unread_output(self, op: tf.Operation) -> bool:
        """op is the Identity that cond_v2 and while_v2 put on an output of
        theirs, and nothing reads or waits for it (e.g. the dense shape of
        Horovod's sparse allreduce, a cond's output the gradient drops)."""
        return (op.type == "Identity" and op.inputs[0].op.type in _FUNCTIONAL_FLOW
                and not self.control_consumers(op))

    def sinks(self, ops: Iterable[tf.Operation]) -> List[tf.Operation]:
        """The ops that data paths from ops end in (ops nothing reads)."""
        return [o for o in walk(ops, self.op_consumers) if not self.op_consumers(o)]

    @functools.cached_property
    def nx(self) -> nx.MultiDiGraph:
        """The graph as a networkx MultiDiGraph (ops by name; an edge producer
        -> consumer carries the tensor and input index, or control=True), for
        whole-graph algorithms. A snapshot: built on first use."""
        g = nx.MultiDiGraph()
        for op in self.graph.get_operations():
            g.add_node(op.name, op=op)
            for i, t in enumerate(op.inputs):
                g.add_edge(t.op.name, op.name, tensor=t.value_index, input=i, control=False)
            for c in op.control_inputs:
                g.add_edge(c.name, op.name, control=True)
        return g
