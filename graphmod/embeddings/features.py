"""Feature admission and eviction: per-table policies and the clock lookups stamp.

A table's policy says when a new id earns a row and when an idle row leaves:

- access_threshold: an id gets its row on its access_threshold-th sighting in
  training lookups; before that it reads the table's missing value and its
  gradients are dropped. Its sightings are counted exactly, and saved.
- eviction_threshold: graphmod.EvictHook removes rows (and counted ids) not
  seen within eviction_threshold of the table's newest lookup, in seconds or
  in global steps (eviction_unit).

Each training lookup stamps its rows with a clock: the global step for tables
evicting by steps; otherwise the newest value of the batch's timestamp feature
when one is marked (FeatureSpec(is_timestamp=True), or GraphModifierHook's
timestamp_feature), else the wall clock in seconds.

>>> specs = [graphmod.FeatureSpec("item", access_threshold=3, eviction_threshold=7 * 86400),
...          graphmod.FeatureSpec("ts", is_timestamp=True)]
>>> ids = graphmod.use_feature_specs(features, specs)   # in model_fn, before the lookups
>>> emb = graphmod.sparse_lookup(item_table, ids["item"], is_training=True)
"""
import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from graphmod.settings import NO_POLICY, TablePolicy, check_policy  # noqa: F401 (public here)
from graphmod.state import graph_state

tf1 = tf.compat.v1

@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """A feature of the input batch and the admission/eviction policy of its table.

    Args:
      name: the feature's name.
      table: the graphmod table its ids feed (default: name).
      access_threshold: sightings before an id gets a row (-1 or 0/1: at once).
      eviction_threshold: rows unseen for longer than this leave (-1: never).
      eviction_unit: "seconds" (the timestamp feature's clock, else the wall
        clock) or "steps" (global steps).
      is_timestamp: this feature is the batch's timestamp (int seconds); it
        feeds no table.
      index_key: the feature's key in the features dict (default: name).
    """
    name: str
    table: Optional[str] = None
    access_threshold: int = -1
    eviction_threshold: int = -1
    eviction_unit: str = "seconds"
    is_timestamp: bool = False
    index_key: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"FeatureSpec: name must be a non-empty string, got {self.name!r}")
        if self.is_timestamp:
            if self.table is not None or self.access_threshold != -1 or \
                    self.eviction_threshold != -1:
                raise ValueError(f"FeatureSpec '{self.name}': a timestamp feature feeds no table "
                                 "and takes no thresholds")
            return
        check_policy(f"graphmod table '{self.table_name}' (feature '{self.name}')",
                     self.access_threshold, self.eviction_threshold, self.eviction_unit)

    @property
    def table_name(self) -> str:
        return self.table or self.name

    @property
    def key(self) -> str:
        return self.index_key or self.name

    @property
    def policy(self) -> TablePolicy:
        return TablePolicy(self.access_threshold, self.eviction_threshold, self.eviction_unit)


def use_feature_specs(features: Mapping[str, tf.Tensor],
                      specs: Sequence[FeatureSpec]) -> Dict[str, tf.Tensor]:
    """Applies specs to the tables they name in the default graph; returns the
    ids of each non-timestamp feature by name. Call it before the lookups."""
    ids, timestamp = {}, None
    for spec in specs:
        if not isinstance(spec, FeatureSpec):
            raise TypeError(f"use_feature_specs wants FeatureSpecs, got {type(spec).__name__}")
        if spec.key not in features:
            raise ValueError(f"FeatureSpec '{spec.name}': the batch has no feature "
                             f"'{spec.key}' (it has {sorted(features)})")
        if spec.is_timestamp:
            if timestamp is not None:
                raise ValueError(f"FeatureSpec '{spec.name}': a batch has one timestamp "
                                 f"feature, '{timestamp.name}' is marked already")
            timestamp = spec
            continue
        set_policy(spec.table_name, spec.policy)
        ids[spec.name] = features[spec.key]
    if timestamp is not None:
        set_timestamp(features[timestamp.key], timestamp.name)
    return ids


def set_policy(table_name: str, policy: TablePolicy, graph: Optional[tf.Graph] = None,
               rw=None) -> None:
    """Sets the policy of table_name (created or yet to be) before its first
    lookup (through rw, a rewrite's Rewriter, where one runs: undo reverts it)."""
    state = graph_state(graph)
    old = state.policies.get(table_name)
    if old is not None and old != policy:
        raise ValueError(f"graphmod table '{table_name}': conflicting admission/eviction "
                         f"settings {old} and {policy} (features sharing a table must agree)")
    if old is None and any(lk.table.name == table_name for lk in state.lookups):
        raise ValueError(f"graphmod table '{table_name}': set its admission/eviction policy "
                         "before its first lookup")
    _write(state, rw, "policies", {**state.policies, table_name: policy})


def policy_of(table: "graphmod.Table") -> TablePolicy:
    return graph_state(table.graph).policies.get(table.name, NO_POLICY)


def set_timestamp(timestamp: tf.Tensor, feature: str = "timestamp",
                  graph: Optional[tf.Graph] = None, rw=None) -> None:
    """Makes the newest value of timestamp (int seconds, any shape) the
    clock of this graph's training lookups (rw: as set_policy's)."""
    state = graph_state(graph)
    if "seconds" in state.clocks:
        raise ValueError(f"graphmod: the timestamp feature '{feature}' must be set before the "
                         "first training lookup (a lookup already uses the wall clock)")
    if not (timestamp.dtype.is_integer or timestamp.dtype.is_floating):
        raise TypeError(f"graphmod: timestamp feature '{feature}' must be numeric (seconds), "
                        f"got {timestamp.dtype.name}")
    _write(state, rw, "timestamp", timestamp)


def _write(state, rw, name: str, value) -> None:
    if rw is not None:
        rw.set_state(name, value)
    else:
        setattr(state, name, value)


def clock(graph: tf.Graph, unit: str) -> tf.Tensor:
    """The int64 time a training lookup stamps its rows with (one tensor per
    graph and unit, so every lookup of a step agrees)."""
    state = graph_state(graph)
    if unit not in state.clocks:
        # Built at the root of the graph, so every lookup can use it: outside
        # the caller's dependencies, name scope and (TF clears it with the
        # dependencies) v1 control flow context.
        with graph.control_dependencies(None), tf1.name_scope(None):
            state.clocks[unit] = _build_clock(graph, unit, state.timestamp)
    return state.clocks[unit]


def _build_clock(graph: tf.Graph, unit: str, timestamp: Optional[tf.Tensor]) -> tf.Tensor:
    if unit == "steps":
        step = tf1.train.get_global_step(graph)
        if step is None:
            raise ValueError("graphmod: eviction by steps needs a global step in the graph "
                             "(tf.compat.v1.train.get_or_create_global_step())")
        return tf.cast(tf.identity(step, name="graphmod/clock_steps"), tf.int64)
    if timestamp is not None:
        # An empty batch has no newest timestamp: its lookups insert nothing anyway.
        newest = tf.reduce_max(tf.reshape(timestamp, [-1]))
        return tf.cast(newest, tf.int64, name="graphmod/clock_timestamp")
    return tf.cast(tf.timestamp(name="graphmod/clock_wall_seconds"), tf.int64,
                   name="graphmod/clock_wall")


# A tiered table's counters beside the others (Table.tier_info).
TIER_COUNTERS = ("memory_rows", "disk_rows", "promoted", "prefetched", "disk_reads",
                 "disk_read_bytes", "disk_file_bytes", "compaction_ms")


def counters(table: "graphmod.Table") -> Dict[str, tf.Tensor]:
    """Scalars: rows, bytes in memory, admitted, rejected (lookups given no
    row), evicted, pending, ids_looked_up and lookups (every id and the
    distinct ones, of training lookups), and with a memory budget
    TIER_COUNTERS; summed over its shards where it is sharded over ps tasks."""
    infos = [s.info() for s in parts(table)]
    names = ("size", "memory_bytes", "admitted", "rejected", "evicted", "pending",
             "ids_looked_up", "lookups")
    if table.memory_budget:
        infos = [dict(i, **s.tier_info()) for i, s in zip(infos, parts(table))]
        names += TIER_COUNTERS
    return {k: infos[0][k] if len(infos) == 1 else tf.add_n([i[k] for i in infos])
            for k in names}


def parts(table: "graphmod.Table") -> List["graphmod.Table"]:
    """The table's parts on the ps tasks (graphmod.ps); [table] where it is
    not split over them."""
    return graph_state(table.graph).ps_parts.get(table.name, [table])


def add_summaries(tables: List["graphmod.Table"]) -> Tuple[Dict[str, Dict[str, tf.Tensor]], tf.Tensor]:
    """TensorBoard scalars graphmod/<table>/<counter> for each (of at least one)
    table; returns ({table: counters}, the summary, added to SUMMARIES). One
    summary op writes them all (an op per scalar costs a millisecond each to
    build: a second for 200 tables)."""
    by_table = {}
    for t in tables:
        with tf1.name_scope(f"graphmod/{t.name}/"):  # each table's ops in its scope
            by_table[t.name] = counters(t)
    tags, values = [], []
    for name, c in by_table.items():
        for counter, value in c.items():
            tags.append(f"graphmod/{name}/{'rows' if counter == 'size' else counter}")
            values.append(value)
    with tf1.name_scope("graphmod/counter_values/"):
        values = tf.cast(tf.stack(values), tf.float32)
    summary = tf.raw_ops.ScalarSummary(tags=tags, values=values, name="graphmod/counters")
    tf1.add_to_collection(tf1.GraphKeys.SUMMARIES, summary)
    return by_table, summary
