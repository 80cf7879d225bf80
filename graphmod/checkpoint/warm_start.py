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
- `key_filter(target, keys) -> bool mask` keeps only some keys of a table;
  it is called once per stored slice of rows (and per delta), so it must
  decide each key on its own (not, say, by quantiles of all keys).
A source table is read a stored slice at a time (then each delta's removals
and changed rows), so a table larger than memory warm-starts a tiered table
without being in memory whole.
It runs as part of the variables' initialization, so before anything saves
the model; a restart resumes from the model's own checkpoint and warm-starts
nothing.
"""
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from graphmod._ops import ops
from graphmod.checkpoint import deltas
from graphmod.embeddings.partition import owner_of
from graphmod.embeddings import stored_rows

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
    from graphmod.checkpoint import merged  # pylint: disable=import-outside-toplevel
    if tf.io.gfile.isdir(source):
        try:
            found = merged.latest_checkpoint(source)
        except merged.StateError as e:
            raise ValueError(f"graphmod.WarmStartSettings: {e}") from None
        if found is None:
            raise ValueError(f"graphmod.WarmStartSettings: {source} holds no checkpoint")
        return found
    if not tf.io.gfile.exists(source + ".index"):
        raise ValueError(f"graphmod.WarmStartSettings: {source} is neither a model_dir nor a "
                         "checkpoint")
    return source


class _Source:
    """One source checkpoint: its entries' shapes and types, and the committed
    incremental deltas of its graphmod tables."""

    def __init__(self, path: str):
        self.path = path
        reader = tf.train.load_checkpoint(path)
        self.shapes = reader.get_variable_to_shape_map()
        self.dtypes = reader.get_variable_to_dtype_map()
        self.chain = deltas.committed(path)
        readers = {p: tf.train.load_checkpoint(p) for p in self.chain}
        self._deltas = {p: r.get_variable_to_shape_map() for p, r in readers.items()}
        self._delta_dtypes = {p: r.get_variable_to_dtype_map() for p, r in readers.items()}

    def holds_table(self, name: str) -> bool:
        return f"{name}-keys" in self.shapes

    def holds_variable(self, name: str) -> bool:
        return name in self.shapes

    def table_deltas(self, name: str) -> List[str]:
        """The deltas, oldest first, that change table `name`."""
        return [p for p in self.chain if f"{name}-keys" in self._deltas[p]]

    def variable_prefix(self, name: str) -> str:
        """The checkpoint holding dense variable `name`'s latest value: deltas
        hold dense variables whole, the newest one wins."""
        return next((p for p in reversed(self.chain) if name in self._deltas[p]), self.path)

    def row_shapes(self, name: str, is_table: bool) -> List[Tuple[str, List[int], tf.DType]]:
        """(checkpoint, shape, dtype) of each entry a table's rows come from
        (each in its own form: a delta written after a restore into a table
        that stores rows otherwise holds them in the table's form)."""
        def of(prefix, entry):
            if prefix == self.path:
                return prefix, self.shapes[entry], self.dtypes[entry]
            return prefix, self._deltas[prefix][entry], self._delta_dtypes[prefix][entry]
        if not is_table:
            return [of(self.variable_prefix(name), name)]
        return [of(p, f"{name}-values") for p in [self.path] + self.table_deltas(name)]


class WarmStarter:
    """Builds the warm start into the graph's initialization: a flag variable
    `graphmod_warm_start/done` whose initializer first imports the sources'
    rows into the tables and assigns the dense variables (after their own
    initializers), reading the sources then. Initialization runs on a fresh
    start only, before anything saves the model (the Estimator's first
    checkpoint included), and never again in a session made after an error,
    which restores instead. `started` names what it warm-starts. owners:
    table name -> (rank, ranks) for a table that holds only the keys that
    rank owns (split across Horovod ranks): it imports only those. A table
    split over a cluster's ps tasks imports into each task's part the keys
    that task owns (each stored slice read once, here, and split)."""

    def __init__(self, settings: WarmStartSettings, graph: tf.Graph,
                 owners: Optional[Dict[str, Tuple[int, int]]] = None):
        from graphmod.state import graph_state, tables
        self.settings = settings
        self.owners = owners or {}
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
                parts = graph_state(graph).ps_parts.get(target)
                if parts:  # split over the ps tasks: each part the keys its task owns
                    starts.append(self._start_table(
                        [(part, (task, len(parts))) for task, part in enumerate(parts)],
                        source, name))
                elif target in table_by_name:
                    starts.append(self._start_table(
                        [(table_by_name[target], self.owners.get(target))], source, name))
                else:
                    starts.append(self._start_variable(variables[target], source, name))
            if not starts:
                return
            with tf.control_dependencies(starts):
                done = tf.constant(True)
            # Beside the global step (else a table): in a cluster, on a ps
            # task, where every worker sees it (the chief initializes it, the
            # others wait until it has).
            step = tf1.train.get_global_step(graph)
            anchor = step.device if step is not None else \
                next(iter(table_by_name.values())).handle.device if table_by_name else ""
            with tf1.device(anchor):
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

    def _start_table(self, parts: List[Tuple[Any, Optional[Tuple[int, int]]]],
                     source: _Source, name: str) -> tf.Operation:
        """Imports the source's rows into a table, a stored slice at a time (a
        source table larger than memory never is in memory whole): the
        checkpoint's rows, then each delta's removals and changed rows, in
        order. parts: the table's parts, each with its owner (part, parts)
        when it holds only the keys that part owns (else None); each slice
        is read once and split among them."""
        from graphmod.embeddings import features
        table = parts[0][0]
        is_table = source.holds_table(name)
        chain = source.row_shapes(name, is_table)  # the checkpoint, then its deltas
        # A table's rows as it stored them (stored_rows), a variable's as it is.
        for prefix, shape, dtype in chain:
            width = stored_rows.dim_of(dtype, shape[1]) if is_table and len(shape) == 2 else None
            if len(shape) != 2 or (width if is_table else shape[1]) != table.dim:
                raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {prefix} has rows of "
                                 f"shape {list(shape[1:])}, table '{table.name}' has dim "
                                 f"{table.dim}")
        # Seen now, as far as eviction goes: a fresh start is at step 0, and
        # at the wall clock in seconds (the source's clock means nothing to
        # this model's).
        if features.policy_of(table).eviction_unit == "steps":
            seen = tf.constant(0, tf.int64)
        else:
            seen = tf.cast(tf.timestamp(), tf.int64)
        if not is_table:  # a dense variable: row i is key i
            prefix, shape, dtype = chain[0]
            done = self._import_slices(parts, prefix, shape, name, None, seen, dtype)
        else:
            _, shape, dtype = chain[0]
            done = self._import_slices(parts, source.path, shape, f"{name}-values", name,
                                       seen, dtype)
            for prefix, shape, dtype in chain[1:]:  # the deltas: removals, then changed rows
                with tf.control_dependencies([done]):
                    removed = _restore(prefix, f"{name}-removed_keys", tf.int64)
                    gone = tf.group([part.remove(removed) for part, _ in parts])
                with tf.control_dependencies([gone]):
                    done = self._import_slices(parts, prefix, shape, f"{name}-values", name,
                                               seen, dtype)
        with tf.control_dependencies([done]):
            return _logged(tf.add_n([part.size() for part, _ in parts]),
                           f"table '{table.name}' from '{name}' in {source.path}")

    def _import_slices(self, parts, prefix: str, shape: List[int], entry: str,
                       name: Optional[str], seen: tf.Tensor, dtype=tf.float32) -> tf.Operation:
        """A loop importing the rows of checkpoint `prefix` one stored slice of
        `entry` (the values, of `shape`) at a time: with the keys and access
        counts of table `name`'s entries, or row i as key i (name None). The
        keys are filtered, then split among the table's parts (each with its
        owner, _start_table's), and all seen at `seen`."""
        starts, lengths = ops.graphmod_checkpoint_row_slices(prefix, entry)
        key_filter = self.settings.key_filter
        table = parts[0][0]

        def kept(keys):
            keep = np.asarray(key_filter(table.name, keys), bool)
            if keep.shape != keys.shape:
                raise ValueError(f"graphmod.WarmStartSettings: key_filter('{table.name}', keys) "
                                 f"returned shape {keep.shape} for {keys.shape[0]} keys")
            return keep

        def body(i):
            rows = (shape[0], starts[i], lengths[i])
            values = _restore(prefix, entry, dtype, rows, shape[1:])
            # A table's rows decode from its form; a variable's cast.
            values = (stored_rows.decode_tf(values) if name is not None
                      else tf.cast(values, tf.float32))
            values.set_shape([None, table.dim])
            if name is None:
                keys = tf.range(rows[1], rows[1] + rows[2])
                counts = tf.zeros_like(keys)
            else:
                keys = _restore(prefix, f"{name}-keys", tf.int64, rows)
                counts = _restore(prefix, f"{name}-counts", tf.int64, rows)
            if key_filter is not None:
                keep = tf.numpy_function(kept, [keys], tf.bool, stateful=True,
                                         name=f"{table.name}_key_filter")
                keep.set_shape([None])
                keys, values, counts = (tf.boolean_mask(t, keep) for t in (keys, values, counts))
            # Each key's owner, once for all parts (their owners share one size).
            owners = parts[0][1] and owner_of(keys, parts[0][1][1])
            imports = []
            for part, owner in parts:
                mine = (keys, values, counts)
                if owner is not None:
                    mine = tuple(tf.boolean_mask(t, tf.equal(owners, owner[0])) for t in mine)
                imports.append(part.import_rows(mine[0], mine[1], counts=mine[2],
                                                last_seen=tf.fill(tf.shape(mine[0]), seen)))
            with tf.control_dependencies(imports):
                return i + 1

        return tf.while_loop(lambda i: i < tf.size(starts), body, [tf.constant(0)],
                             name=f"{table.name}_slices")[0].op

    def _start_variable(self, v: tf.Variable, source: _Source, name: str) -> tf.Operation:
        want = v.shape.as_list()
        prefix, have, dtype = source.row_shapes(name, is_table=False)[0]
        if list(have) != want:
            raise ValueError(f"graphmod.WarmStartSettings: '{name}' in {prefix} has "
                             f"shape {list(have)}, '{v.op.name}' has {want}")
        read = tf.cast(_restore(prefix, name, dtype), v.dtype.base_dtype)
        with tf.control_dependencies([v.initializer]):  # after its own initial value
            assign = v.assign(tf.reshape(read, want)).op
        return _logged(None, f"'{v.op.name}' from '{name}' in {prefix}", after=assign)


def _logged(rows: Optional[tf.Tensor], what: str, after: Optional[tf.Operation] = None):
    """An op that logs the warm start of `what` when it runs (with the rows
    the table then holds)."""
    def log(*n):
        logging.info("graphmod: warm-started %s%s", what, f": {n[0]} rows" if n else "")
        return True
    with tf.control_dependencies([after] if after is not None else []):
        return tf.numpy_function(log, [] if rows is None else [rows], tf.bool,
                                 stateful=True).op


def _restore(prefix: str, entry: str, dtype, rows=None, row_shape=()) -> tf.Tensor:
    """Checkpoint entry `entry` whole, or rows=(n, start, length): its rows
    [start, start + length) of n, each of row_shape. RestoreV2 then reads only
    the stored slices holding them."""
    spec = ""
    if rows is not None:
        n, start, length = rows
        full = " ".join(str(d) for d in (n, *row_shape))
        spec = tf.strings.join([f"{full} ", tf.strings.as_string(start), ",",
                                tf.strings.as_string(length), ":-" * len(row_shape)])
    return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[entry], shape_and_slices=[spec],
                                dtypes=[dtype])[0]
