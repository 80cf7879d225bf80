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
- a target table takes a source table's rows (keys, values, and access
  counts and last_seen: eviction treats them as the source saw them) or a
  dense source variable's rows (row i as key i); optimizer slots start from
  their initial values, as tf.estimator.WarmStartSettings leaves them;
- a dense target variable takes a source variable of the same shape;
- `mapping` renames: {target table or variable name: name in the sources};
  unmapped targets look for their own name; a mapped source that no source
  holds is an error naming it;
- `key_filter(target, keys) -> bool mask` keeps only some keys of a table.
A restart resumes from the model's own checkpoint and warm-starts nothing.
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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
    """The ops a warm start feeds (built before the graph is finalized) and
    the run that reads the sources and feeds them."""

    def __init__(self, settings: WarmStartSettings, graph: tf.Graph):
        from graphmod.table import tables
        self.settings = settings
        self.tables = {t.name: t for t in tables(graph)}
        self.variables = {v.op.name: v for v in graph.get_collection(
            tf1.GraphKeys.TRAINABLE_VARIABLES) if v.op.name not in self.tables}
        unknown = [t for t in settings.mapping if t not in self.tables and t not in self.variables]
        if unknown:
            raise ValueError(f"graphmod.WarmStartSettings: mapping names {', '.join(unknown)}, "
                             f"which are neither tables nor trainable variables of this graph")
        self._feeds: Dict[str, Tuple[tf.Tensor, ...]] = {}
        self._ops: Dict[str, tf.Operation] = {}
        with graph.as_default(), tf1.name_scope("graphmod_warm_start"):
            for name, table in self.tables.items():
                keys = tf1.placeholder(tf.int64, [None], name=f"{name}_keys")
                values = tf1.placeholder(tf.float32, [None, table.dim], name=f"{name}_values")
                counts = tf1.placeholder(tf.int64, [None], name=f"{name}_counts")
                seen = tf1.placeholder(tf.int64, [None], name=f"{name}_last_seen")
                self._feeds[name] = (keys, values, counts, seen)
                self._ops[name] = table.import_rows(keys, values, counts=counts, last_seen=seen)
            for name, v in self.variables.items():
                value = tf1.placeholder(v.dtype.base_dtype, v.shape, name=f"{name}_value")
                self._feeds[name] = (value,)
                self._ops[name] = v.assign(value).op

    def _find(self, sources: List[_Source], target: str):
        name = self.settings.mapping.get(target, target)
        is_table = target in self.tables
        for s in sources:
            if (is_table and (s.holds_table(name) or s.holds_variable(name))) or \
                    (not is_table and s.holds_variable(name)):
                return s, name
        if target in self.settings.mapping:
            raise ValueError(f"graphmod.WarmStartSettings: no source holds '{name}' (mapped to "
                             f"'{target}'); sources: {', '.join(s.path for s in sources)}")
        return None, name

    def run(self, session) -> List[str]:
        """Warm-starts what the sources hold; returns what it started."""
        sources = [_Source(_checkpoint_of(s)) for s in self.settings.sources]
        started = []
        for target in sorted(self.tables) + sorted(self.variables):
            source, name = self._find(sources, target)
            if source is None:
                continue
            if target in self.tables:
                rows = self._table_rows(source, name, self.tables[target].dim, target)
                if self.settings.key_filter is not None:
                    keep = np.asarray(self.settings.key_filter(target, rows["keys"]), bool)
                    rows = {f: v[keep] for f, v in rows.items()}
                session.run(self._ops[target], dict(zip(self._feeds[target], (
                    rows["keys"], rows["values"], rows["counts"], rows["last_seen"]))))
                what = f"{len(rows['keys'])} rows"
            else:
                value = source.variable(name)
                want = self.variables[target].shape.as_list()
                if list(value.shape) != want:
                    raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {source.path} has "
                                     f"shape {list(value.shape)}, '{target}' has {want}")
                session.run(self._ops[target], {self._feeds[target][0]: value})
                what = "its value"
            started.append(target)
            logging.info("graphmod: warm-started '%s' from '%s' in %s (%s)", target, name,
                         source.path, what)
        return started

    @staticmethod
    def _table_rows(source: _Source, name: str, dim: int, target: str) -> Dict[str, np.ndarray]:
        if source.holds_table(name):
            rows = source.table(name)
        else:  # a dense variable: row i is key i
            values = source.variable(name)
            n = values.shape[0] if values.ndim == 2 else -1
            rows = dict(keys=np.arange(max(n, 0), dtype=np.int64), values=values,
                        counts=np.zeros(max(n, 0), np.int64),
                        last_seen=np.zeros(max(n, 0), np.int64))
        if rows["values"].ndim != 2 or rows["values"].shape[1] != dim:
            raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {source.path} has rows "
                             f"of shape {list(rows['values'].shape[1:])}, table '{target}' "
                             f"has dim {dim}")
        return rows


def model_dir_has_checkpoint(model_dir: Optional[str]) -> bool:
    return bool(model_dir) and tf.train.latest_checkpoint(model_dir) is not None

