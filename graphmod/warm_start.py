"""WarmStartSettings: start a new model's tables and variables from other models.

>>> ws = graphmod.WarmStartSettings(
...     sources=["/models/user_tower", "/models/item_tower"],
...     mapping={"user_emb": "u_emb", "item_emb": "emb_items"},   # target: source name
...     key_filter=lambda target, keys: keys >= 0)
>>> estimator.train(input_fn, hooks=[graphmod.GraphModifierHook(warm_start=ws)])

On a fresh start (the model's own model_dir has no checkpoint yet), every
table and trainable variable of the training graph whose source entry one of
the sources holds starts from it:
- sources are checkpoint prefixes or model_dirs (their latest checkpoint),
  searched in order; a graphmod source table is read with its committed
  incremental deltas;
- a target table takes a source table's rows (keys, values, access counts)
  or a dense source variable's rows (row i as key i), all seen "now" as far
  as eviction goes (step 0, or the wall clock for eviction in seconds);
  optimizer slots start from their initial values, as
  tf.estimator.WarmStartSettings leaves them;
- a dense target variable takes a source variable of the same shape;
- `mapping` renames: {target table or variable name: name in the sources};
  unmapped targets look for their own name; a mapped source that no source
  holds is an error naming it;
- `key_filter(target, keys) -> bool mask` keeps only some keys of a table.
It runs as part of the variables' initialization, so before anything saves
the model; a restart resumes from the model's own checkpoint and warm-starts
nothing.
"""
import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from graphmod import deltas

tf1 = tf.compat.v1


@dataclasses.dataclass
class WarmStartSettings:
    sources: Sequence[str]
    mapping: Dict[str, str] = dataclasses.field(default_factory=dict)
    key_filter: Optional[Callable[[str, np.ndarray], np.ndarray]] = None

    def __post_init__(self):
        if isinstance(self.sources, str) or not self.sources:
            raise ValueError("graphmod.WarmStartSettings: sources must be a non-empty list of "
                             f"checkpoints or model_dirs, got {self.sources!r}")
        self.sources = list(self.sources)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.mapping.items()):
            raise ValueError("graphmod.WarmStartSettings: mapping must map target names to "
                             f"source names (strings), got {self.mapping!r}")
        if self.key_filter is not None and not callable(self.key_filter):
            raise TypeError("graphmod.WarmStartSettings: key_filter must be callable")


def _checkpoint_of(source: str) -> str:
    if tf.io.gfile.isdir(source):
        found = tf.train.latest_checkpoint(source)
        if found is None:
            raise ValueError(f"graphmod.WarmStartSettings: {source} holds no checkpoint")
        return found
    if not tf.io.gfile.exists(source + ".index"):
        raise ValueError(f"graphmod.WarmStartSettings: {source} is neither a model_dir nor a "
                         "checkpoint")
    return source


class _Source:
    """One source checkpoint, with its graphmod tables' deltas applied on read."""

    def __init__(self, path: str):
        self.path = path
        self.reader = tf.train.load_checkpoint(path)
        self.chain = deltas.committed(path)

    def holds_table(self, name: str) -> bool:
        return self.reader.has_tensor(f"{name}-keys")

    def holds_variable(self, name: str) -> bool:
        return self.reader.has_tensor(name)

    def table(self, name: str) -> Dict[str, np.ndarray]:
        """keys, values, counts, last_seen of a table after its deltas."""
        fields = ("keys", "values", "counts", "last_seen")
        rows = {f: self.reader.get_tensor(f"{name}-{f}") for f in fields}
        for prefix in self.chain:
            delta = tf.train.load_checkpoint(prefix)
            if not delta.has_tensor(f"{name}-keys"):
                continue
            gone = np.isin(rows["keys"], delta.get_tensor(f"{name}-removed_keys"))
            changed = {f: delta.get_tensor(f"{name}-{f}") for f in fields}
            stale = gone | np.isin(rows["keys"], changed["keys"])
            rows = {f: np.concatenate([rows[f][~stale], changed[f]]) for f in fields}
        return rows

    def variable(self, name: str) -> np.ndarray:
        value = self.reader.get_tensor(name)
        for prefix in self.chain:  # deltas hold dense variables whole
            delta = tf.train.load_checkpoint(prefix)
            if delta.has_tensor(name):
                value = delta.get_tensor(name)
        return value


class WarmStarter:
    """Builds the warm start into the graph's initialization: a flag variable
    `graphmod_warm_start/done` whose initializer first imports the sources'
    rows into the tables and assigns the dense variables (after their own
    initializers), reading the sources then. Initialization runs on a fresh
    start only, before anything saves the model (the Estimator's first
    checkpoint included), and never again in a session made after an error,
    which restores instead. `started` names what it warm-starts."""

    def __init__(self, settings: WarmStartSettings, graph: tf.Graph):
        from graphmod.state import tables
        self.settings = settings
        table_by_name = {t.name: t for t in tables(graph)}
        variables = {v.op.name: v for v in graph.get_collection(
            tf1.GraphKeys.TRAINABLE_VARIABLES) if v.op.name not in table_by_name}
        unknown = [t for t in settings.mapping if t not in table_by_name and t not in variables]
        if unknown:
            raise ValueError(f"graphmod.WarmStartSettings: mapping names {', '.join(unknown)}, "
                             f"which are neither tables nor trainable variables of this graph")
        sources = [_Source(_checkpoint_of(s)) for s in settings.sources]
        self.started: List[str] = []
        starts = []
        with graph.as_default(), tf1.name_scope(None), tf1.name_scope("graphmod_warm_start"):
            for target in sorted(table_by_name) + sorted(variables):
                source, name = self._find(sources, target, target in table_by_name)
                if source is None:
                    continue
                self.started.append(target)
                if target in table_by_name:
                    starts.append(self._start_table(table_by_name[target], source, name))
                else:
                    starts.append(self._start_variable(variables[target], source, name))
            if not starts:
                return
            with tf.control_dependencies(starts):
                done = tf.constant(True)
            tf1.Variable(done, trainable=False, name="done", use_resource=True)

    def _find(self, sources: List[_Source], target: str, is_table: bool):
        name = self.settings.mapping.get(target, target)
        for s in sources:
            if s.holds_variable(name) or (is_table and s.holds_table(name)):
                return s, name
        if target in self.settings.mapping:
            raise ValueError(f"graphmod.WarmStartSettings: no source holds '{name}' (mapped to "
                             f"'{target}'); sources: {', '.join(s.path for s in sources)}")
        return None, name

    def _start_table(self, table, source: _Source, name: str) -> tf.Operation:
        from graphmod import features
        unit = features.policy_of(table).eviction_unit

        def rows():
            got = self._table_rows(source, name, table.dim, table.name)
            if self.settings.key_filter is not None:
                keep = np.asarray(self.settings.key_filter(table.name, got["keys"]), bool)
                got = {f: v[keep] for f, v in got.items()}
            # Seen now, as far as eviction goes: a fresh start is at step 0,
            # and at the wall clock in seconds (the source's clock means
            # nothing to this model's).
            seen = np.full(len(got["keys"]), 0 if unit == "steps" else int(time.time()),
                           np.int64)
            logging.info("graphmod: warm-started table '%s' from '%s' in %s: %d rows",
                         table.name, name, source.path, len(got["keys"]))
            return got["keys"], got["values"].astype(np.float32), got["counts"], seen

        keys, values, counts, seen = tf.numpy_function(
            rows, [], [tf.int64, tf.float32, tf.int64, tf.int64], stateful=True,
            name=f"{table.name}_rows")
        keys.set_shape([None])
        values.set_shape([None, table.dim])
        return table.import_rows(keys, values, counts=counts, last_seen=seen)

    def _start_variable(self, v: tf.Variable, source: _Source, name: str) -> tf.Operation:
        want = v.shape.as_list()
        have = source.reader.get_variable_to_shape_map()[name]
        if list(have) != want:
            raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {source.path} has "
                             f"shape {list(have)}, '{v.op.name}' has {want}")

        def value():
            logging.info("graphmod: warm-started '%s' from '%s' in %s", v.op.name, name,
                         source.path)
            return source.variable(name).astype(v.dtype.base_dtype.as_numpy_dtype)

        read = tf.numpy_function(value, [], v.dtype.base_dtype, stateful=True,
                                 name=f"{v.op.name.replace('/', '_')}_value")
        with tf.control_dependencies([v.initializer]):  # after its own initial value
            return v.assign(tf.reshape(read, want)).op

    @staticmethod
    def _table_rows(source: _Source, name: str, dim: int, target: str) -> Dict[str, np.ndarray]:
        if source.holds_table(name):
            rows = source.table(name)
        else:  # a dense variable: row i is key i
            values = source.variable(name)
            n = values.shape[0] if values.ndim == 2 else 0
            rows = dict(keys=np.arange(n, dtype=np.int64), values=values,
                        counts=np.zeros(n, np.int64), last_seen=np.zeros(n, np.int64))
        if rows["values"].ndim != 2 or rows["values"].shape[1] != dim:
            raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {source.path} has rows "
                             f"of shape {list(rows['values'].shape[1:])}, table '{target}' "
                             f"has dim {dim}")
        return {f: rows[f] for f in ("keys", "values", "counts", "last_seen")}
