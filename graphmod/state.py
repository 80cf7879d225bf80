"""What graphmod keeps per tf.Graph: its tables, training lookups, admission
and eviction policies, clocks, and how its tables are split into parts.

Kept apart from the Table handle (graphmod.embeddings.table) so that the modules that
read it (features, fused, optimizers, horovod) import no table code.
A rewrite changes it only through its Rewriter (Rewriter.set_state), which
records each change and restores the state on undo.
"""
import copy
import dataclasses
import weakref
from typing import Any, Dict, List, Optional

import tensorflow as tf


@dataclasses.dataclass
class Lookup:
    """One training lookup: the raw rows it read and their row handles."""
    table: Any           # graphmod.Table
    keys: tf.Tensor      # int64 [N]
    rows: tf.Tensor      # float [N, dim], before any combiner
    handles: tf.Tensor   # int64 [N], row addresses for by-address optimizers


@dataclasses.dataclass
class GraphState:
    tables: Dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> graphmod.Table
    lookups: List[Lookup] = dataclasses.field(default_factory=list)
    policies: Dict[str, Any] = dataclasses.field(default_factory=dict)  # table -> TablePolicy
    timestamp: Optional[tf.Tensor] = None  # the batch's timestamp feature
    clocks: Dict[str, tf.Tensor] = dataclasses.field(default_factory=dict)  # unit -> clock
    format_constant: Optional[tf.Tensor] = None  # saved by every table (CHECKPOINT_FORMAT)
    # Whether this graph's tables are split by key across Horovod ranks, as
    # GraphModifierHook's rewrite decided (None: graphmod.horovod.enable()'s)
    split_over_ranks: Optional[bool] = None
    # Of those, the tables every rank holds whole (graphmod.horovod.placement)
    replicated: frozenset = frozenset()
    # The model_dir's latest checkpoint holds tables in parts (graphmod.checkpoint.saver)
    reads_parts: bool = False
    # Tables split over ps tasks (graphmod.ps): name -> its
    # part on each ps task, in task order (`tables` holds one of them).
    ps_parts: Dict[str, List[Any]] = dataclasses.field(default_factory=dict)
    # Ops to run once per session before the first step (graphmod.horovod.ids_ahead's prime)
    primes: List[Any] = dataclasses.field(default_factory=list)
    # IteratorGetNext op name -> the tensors the step reads instead of its
    # outputs (graphmod.horovod.ids_ahead's stash of the batch)
    step_inputs: Dict[str, List[Any]] = dataclasses.field(default_factory=dict)

    def snapshot(self) -> "GraphState":
        """A copy whose containers are copies (their items are shared)."""
        return GraphState(**{f.name: copy.copy(getattr(self, f.name))
                             for f in dataclasses.fields(self)})

    def restore(self, snapshot: "GraphState") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, copy.copy(getattr(snapshot, f.name)))


_STATES: "weakref.WeakKeyDictionary[tf.Graph, GraphState]" = weakref.WeakKeyDictionary()


def graph_state(graph: Optional[tf.Graph] = None) -> GraphState:
    graph = graph or tf.compat.v1.get_default_graph()
    if graph not in _STATES:
        _STATES[graph] = GraphState()
    return _STATES[graph]


def tables(graph: Optional[tf.Graph] = None) -> List[Any]:
    """The tables (graphmod.Table) created in graph (default: the default graph)."""
    return list(graph_state(graph).tables.values())


def training_lookups(graph: Optional[tf.Graph] = None) -> List[Lookup]:
    """Training lookups made in graph, in creation order."""
    return list(graph_state(graph).lookups)
