"""Dynamic embedding tables: create_table and the Table handle.

A table maps any int64 id to a row of `dim` floats that is created the first
time a training lookup sees the id, so there is no vocabulary size to guess and
no hash-bucket collision. Its rows, optimizer slots and per-key metadata are
saved by the ordinary tf.compat.v1.train.Saver (so by every Estimator).

>>> table = graphmod.create_table("user", dim=16,
...                               optimizer=graphmod.optimizers.Adagrad(0.05))
>>> emb = graphmod.sparse_lookup(table, features["user_id"], is_training=True)
"""
import inspect
import math
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.training.saving import saveable_object

from graphmod._ops import ops
from graphmod.embeddings import stored_rows
from graphmod.embeddings.initializers import TableInitializer, to_table_initializer
from graphmod.settings import TABLE_SETTINGS, table_attrs
from graphmod.state import graph_state

tf1 = tf.compat.v1


class Table:
    """A handle on one dynamic table in one graph; build it with create_table.

    Everything but the optimizer is read from the table op's attributes, so a
    Table can also wrap an op imported with a MetaGraph.
    """

    def __init__(self, handle: tf.Tensor, optimizer=None):
        op = handle.op
        self.handle = handle
        self.graph = op.graph
        self.name = op.get_attr("table_name").decode()
        self.dim = op.get_attr("dim")
        self.num_slots = op.get_attr("num_slots")
        self.slot_init = tuple(op.get_attr("slot_init"))
        self.initializer = TableInitializer(op.get_attr("initializer").decode(),
                                            op.get_attr("init_a"), op.get_attr("init_b"))
        for setting in TABLE_SETTINGS:  # default_value, max_rows, ... as create_table's
            setattr(self, setting.name, setting.read(op))
        self.optimizer = optimizer

    def __repr__(self) -> str:
        return f"<graphmod.Table '{self.name}' dim={self.dim} slots={self.num_slots}>"

    def info(self) -> Dict[str, tf.Tensor]:
        """Scalars: size (rows held), memory_bytes, version (optimizer steps
        applied), and since the table was created: admitted (rows lookups
        created), rejected (lookups given no row), evicted, pending (ids counted
        towards admission), latest (the newest clock value a lookup passed),
        stale (by-address gradients dropped because their row had been
        removed, evicted or reused since the lookup), ids_looked_up (the ids
        training lookups were given, every occurrence) and lookups (the
        distinct ids among them, per call: ids_looked_up / lookups is how
        often a batch repeats an id). A call is one lookup op's: a fused
        lookup's covers every feature sharing the table, and under Horovod
        an owner's the ids every rank sent it."""
        return ops.graphmod_table_info(self.handle)._asdict()

    def tier_info(self) -> Dict[str, tf.Tensor]:
        """Scalars of the memory and disk tiers (a table with a memory_budget;
        zeros otherwise): memory_rows, disk_rows; since the table was created:
        promoted (rows brought up from disk by training steps: the hit ratio
        is 1 - promoted / info()["lookups"]), spilled (rows moved to disk),
        disk_reads and disk_read_bytes, read_passes (batched reads), disk_file_bytes and disk_live_bytes (the
        segment files and their live records), compactions, compaction_ms,
        prefetched (rows prefetch brought up ahead of their step)."""
        return ops.graphmod_table_tier_info(self.handle)._asdict()

    def prefetch(self, keys) -> tf.Operation:
        """A hint for a table with a memory_budget (nothing without one):
        brings the on-disk rows of keys (int64, any shape) the next training
        step will look up into memory, in one batched read, and keeps them
        there until that step. No row changes, so training is the same with
        or without it; run it while the step before trains (the hook does
        that from the input pipeline, see rewrite_rules.tier_prefetch)."""
        return ops.graphmod_table_prefetch(self.handle, tf.reshape(keys, [-1]))

    def size(self) -> tf.Tensor:
        return self.info()["size"]

    def export(self, min_version: Any = 0, stored: bool = False) -> Dict[str, tf.Tensor]:
        """Rows with version >= min_version: keys, values, slots, counts,
        last_seen, versions. values and slots are float32, or with stored=True
        as the table stores them (storage_dtype; stored_rows reads them)."""
        # A Python number becomes one int64 constant (a cast would be a second
        # op per table: every table's saveable exports from version 0).
        version = (tf.constant(min_version, tf.int64) if isinstance(min_version, int)
                   else tf.cast(min_version, tf.int64))
        values, slots = self.stored_dtypes if stored else (tf.float32, tf.float32)
        out = ops.graphmod_table_export(self.handle, version, dim=self.dim,
                                        num_slots=self.num_slots, Tvalues=values, Tslots=slots)
        return out._asdict()

    @property
    def stored_dtypes(self) -> Tuple[tf.DType, tf.DType]:
        """The tensor dtypes of its values and slots as stored (stored_rows)."""
        forms = stored_rows.forms(self.storage_dtype, self.slot_storage_dtype)
        return stored_rows.dtype_of(forms[0]), stored_rows.dtype_of(forms[1])

    def export_pending(self, min_version: Any = 0) -> Dict[str, tf.Tensor]:
        """Ids counted towards admission at version >= min_version, without a
        row yet: keys, counts, last_seen; and the admission sketch's counters."""
        version = (tf.constant(min_version, tf.int64) if isinstance(min_version, int)
                   else tf.cast(min_version, tf.int64))
        return ops.graphmod_table_export_pending(self.handle, version)._asdict()

    def import_rows(self, keys, values, slots=None, counts=None, last_seen=None, versions=None,
                    replace: bool = False) -> tf.Operation:
        """Inserts or overwrites rows. Missing counts and last_seen start at
        zero; missing versions are the coming step's, as a lookup's would be
        (so the next incremental checkpoint holds the rows)."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        n = tf.shape(keys)[:1]
        if slots is None:
            init = tf.constant(self.slot_init, tf.float32)
            slots = tf.tile(tf.reshape(init, [1, self.num_slots, 1]),
                            tf.concat([n, [1, self.dim]], 0))
        zeros = tf.zeros(n, tf.int64)
        return ops.graphmod_table_import(
            self.handle, keys, _rows(values, self.stored_dtypes[0]),
            _rows(slots, self.stored_dtypes[1]),
            zeros if counts is None else tf.convert_to_tensor(counts, tf.int64),
            zeros if last_seen is None else tf.convert_to_tensor(last_seen, tf.int64),
            tf.fill(n, self.info()["version"] + 1) if versions is None
            else tf.convert_to_tensor(versions, tf.int64),
            replace=replace)

    def evict(self, before) -> tf.Tensor:
        """Removes rows and pending ids last seen before `before`; returns rows removed."""
        return ops.graphmod_table_evict(self.handle, tf.cast(before, tf.int64))

    def remove(self, keys) -> tf.Tensor:
        """Removes rows; returns how many of the keys had one."""
        return ops.graphmod_table_remove(self.handle, tf.convert_to_tensor(keys, tf.int64))

    def clear(self) -> tf.Operation:
        return ops.graphmod_table_clear(self.handle)


# The layout of a table in checkpoints, saved as `<name>-format`. A change
# to the entries below gets a new number; restoring a number this version
# does not read fails with a message naming the table and both numbers.
CHECKPOINT_FORMAT = 1


def _format_constant(graph: tf.Graph) -> tf.Tensor:
    """One constant per graph that every table's saveable saves."""
    state = graph_state(graph)
    if state.format_constant is None:
        with graph.control_dependencies(None), tf1.name_scope(None):
            state.format_constant = tf.constant(CHECKPOINT_FORMAT, tf.int64,
                                                name="graphmod/checkpoint_format")
    return state.format_constant


class _TableSaveable(saveable_object.SaveableObject):
    """Saves a table as checkpoint entries `<name>-keys`, `-values`, ..., the
    ids counted towards admission as `<name>-pending_keys`, ..., and the
    format number `<name>-format`.

    graphmod's TableSaver writes them with `write_tables`, one shard at a
    time; any other Saver exports the whole table first (a second copy of it in
    memory while it saves). Restoring replaces the table's contents with the
    checkpoint's.
    """
    FIELDS = ("keys", "values", "slots", "counts", "last_seen", "versions")
    PENDING = ("keys", "counts", "last_seen", "sketch")

    def __init__(self, table: Table):
        self.table = table
        super().__init__(table.handle, _specs(table, lambda: tf.constant(0, tf.int64)),
                         table.name)

    def min_version(self) -> Any:
        """Rows and pending ids at this version and later are saved: all."""
        return 0

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        with tf1.name_scope(f"graphmod/{self.table.name}/restore"):
            return _import(self.table, restored_tensors, replace=True)

    def restore_from(self, prefix: tf.Tensor) -> tf.Operation:
        """Restores from the checkpoint at `prefix` itself, one stored slice
        of rows at a time (graphmod's TableSaver): no Saver reads the
        entries whole first."""
        with tf1.name_scope(f"graphmod/{self.table.name}/restore"):
            return _restore_from(self.table, prefix, replace=True)


class _TableDeltaSaveable(saveable_object.SaveableObject):
    """What changed in a table since a save made at table version `since`
    (an incremental checkpoint, graphmod.checkpoint.deltas): the rows updated or
    inserted since (entries as _TableSaveable's), the keys removed since
    (`<name>-removed_keys`, noted once graphmod.checkpoint.saver starts tracking), the
    admission counts that changed and the whole sketch.

    Restoring applies it on top of the table's contents: removals first,
    then rows, then admission counts.
    """

    def __init__(self, table: Table, since: tf.Tensor):
        self.table, self.since = table, since
        # Rows a step after the save touched carry a later version.
        specs = _specs(table, lambda: since + 1)
        specs.append(_lazy_spec(
            table, "removed_keys", tf.int64,
            lambda: ops.graphmod_table_export_removed(table.handle, since)))
        super().__init__(table.handle, specs, table.name)

    def min_version(self) -> Any:
        """Rows and pending ids changed after the save at `since` are saved."""
        return self.since + 1

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        with tf1.name_scope(f"graphmod/{self.table.name}/restore_delta"):
            return _import(self.table, restored_tensors[:-1], replace=False,
                           removed=restored_tensors[-1])

    def restore_from(self, prefix: tf.Tensor) -> tf.Operation:
        with tf1.name_scope(f"graphmod/{self.table.name}/restore_delta"):
            return _restore_from(self.table, prefix, replace=False, with_removed=True)


def write_tables(saveables: List[saveable_object.SaveableObject],
                 prefix: tf.Tensor, part: bool = False,
                 owned_only: Sequence[bool] = (), owner: Tuple[int, int] = (0, 1)
                 ) -> tf.Operation:
    """Writes the entries of tables' saveables (all _TableSaveable, or all
    _TableDeltaSaveable) as one checkpoint at `prefix`, a chunk of rows at a
    time (a part of a sharded checkpoint: graphmod.checkpoint.saver). part: the keys
    this rank owns of sharded tables (graphmod.checkpoint.parts). owned_only
    (one per saveable, or none): the table is a copy every rank holds
    whole, of whose keys only those `owner` (rank, of size) owns are written."""
    kinds = {type(s) for s in saveables}
    if len(kinds) != 1 or not kinds <= {_TableSaveable, _TableDeltaSaveable}:
        raise TypeError(f"graphmod: write_tables takes saveables of one kind of table "
                        f"saveable, got {sorted(k.__name__ for k in kinds)}")
    delta = kinds == {_TableDeltaSaveable}
    refusals = [] if part else [op for s in saveables for op in _unless_sharded(s.table)]
    with tf1.name_scope("graphmod/save_delta" if delta else "graphmod/save"), \
            tf.control_dependencies(refusals):
        versions = tf.stack([tf.cast(s.min_version(), tf.int64) for s in saveables])
        return ops.graphmod_table_save([s.table.handle for s in saveables], prefix, versions,
                                       checkpoint_format=CHECKPOINT_FORMAT,
                                       with_removed=delta, owned_only=list(owned_only),
                                       owner_rank=owner[0], owner_size=owner[1])


def _unless_sharded(table: Table) -> List[tf.Operation]:
    """Control inputs for a table's save or restore by a Saver other than
    graphmod's TableSaver: an op that fails it, naming the table, while
    tables are sharded across Horovod ranks (graphmod.horovod), since
    that Saver would treat this rank's keys as all of them; none otherwise.
    A failure when the save or restore runs, not when the Saver is built:
    MonitoredTrainingSession builds one for every graph."""
    from graphmod import horovod  # pylint: disable=import-outside-toplevel
    if not horovod.active(table.graph):
        return []
    # Not a constant condition: TensorFlow would fail the graph's building.
    never = tf1.placeholder_with_default(False, [], name=f"graphmod/{table.name}/unsharded")
    return [tf.debugging.Assert(
        never, [f"graphmod table '{table.name}' is sharded across Horovod ranks: save and "
                "restore it with graphmod.checkpoint.saver.TableSaver on every rank (e.g. "
                "Scaffold(saver=graphmod.checkpoint.saver.TableSaver(...))), which writes every rank's "
                "keys; this Saver would treat this rank's keys as all of them"],
        name=f"graphmod/{table.name}/sharded")]


def _lazy_spec(table: Table, entry: str, dtype: tf.DType,
               make: Callable[[], tf.Tensor]) -> saveable_object.SaveSpec:
    """The spec of checkpoint entry `<table>-<entry>`, whose tensor is made
    only when a Saver writes it (a restore needs its name and type only)."""
    return saveable_object.SaveSpec(make, "", f"{table.name}-{entry}", dtype=dtype,
                                    device=table.handle.device)


def _rows(rows, stored: tf.DType) -> tf.Tensor:
    """Rows to import: a tensor as the table stores them passes as is (a
    checkpoint's), anything else as float32."""
    if isinstance(rows, tf.Tensor) and rows.dtype == stored:
        return rows
    return tf.convert_to_tensor(rows, tf.float32)


_DTYPES = dict(keys=tf.int64, values=tf.float32, slots=tf.float32, counts=tf.int64,
               last_seen=tf.int64, versions=tf.int64, sketch=tf.int32)


def _specs(table: Table, min_version: Callable[[], tf.Tensor]) -> List[saveable_object.SaveSpec]:
    """A table's checkpoint entries: rows and pending ids at version >=
    min_version(), and the format number. Their tensors come from one export
    of each kind, made when a Saver first asks for one."""
    exported: Dict[str, Dict[str, tf.Tensor]] = {}

    def field(kind: str, name: str) -> Callable[[], tf.Tensor]:
        def make():
            if not exported:
                with tf1.name_scope(f"graphmod/{table.name}/export"), \
                        tf.control_dependencies(_unless_sharded(table)):
                    version = min_version()
                    exported.update(rows=table.export(version, stored=True),
                                    pending=table.export_pending(version))
            return exported[kind][name]
        return make

    # Rows as the table stores them (the checkpoint keeps its storage_dtype).
    dtypes = dict(_DTYPES, values=table.stored_dtypes[0], slots=table.stored_dtypes[1])
    specs = [_lazy_spec(table, f, dtypes[f], field("rows", f)) for f in _TableSaveable.FIELDS]
    specs += [_lazy_spec(table, f"pending_{f}", _DTYPES[f], field("pending", f))
              for f in _TableSaveable.PENDING]
    specs.append(_lazy_spec(table, "format", tf.int64, lambda: _format_constant(table.graph)))
    return specs


def _import(table: Table, restored: List[tf.Tensor], replace: bool,
            removed: Optional[tf.Tensor] = None) -> tf.Operation:
    """Imports entries as _specs wrote them, read whole by another Saver's
    restore, after checking their format (and removing `removed` keys
    first): nothing changes before the check passes."""
    n, p = len(_TableSaveable.FIELDS), len(_TableSaveable.PENDING)
    keys, values, slots, counts, last_seen, versions = restored[:n]
    pending, checkpoint_format = restored[n:n + p], restored[n + p]
    first = ([_check_format(table, checkpoint_format), _check_sketch_shards(table, pending[3])]
             + _unless_sharded(table))
    if removed is not None:
        with tf.control_dependencies(first):
            first = [ops.graphmod_table_remove(table.handle, removed)]
    if table.num_slots == 0:
        # A table that keeps no optimizer slots (an eval or predict graph)
        # restores from a training checkpoint by dropping them.
        slots = slots[:, :0, :]
    with tf.control_dependencies(first):
        rows = ops.graphmod_table_import(table.handle, keys, values, slots, counts, last_seen,
                                         versions, replace=replace)
    with tf.control_dependencies([rows]):  # the import clears the rows' pending ids
        return ops.graphmod_table_import_pending(table.handle, *pending)


def _restore_from(table: Table, prefix: tf.Tensor, replace: bool, with_removed: bool = False,
                  part: bool = False, owner: Tuple[int, int] = (0, 1)) -> tf.Operation:
    """The table's entries read from the checkpoint at `prefix` and imported
    one stored slice at a time (a restore of a table larger than memory);
    the kernel checks the format and every type and shape first. part: the
    entries are a sharded table's part of a checkpoint
    (graphmod.checkpoint.parts); then only the rows and pending ids
    whose keys rank owner[0] of owner[1] owns are imported, and with more
    than one owner not the admission sketch."""
    with tf.control_dependencies([] if part else _unless_sharded(table)):
        return ops.graphmod_table_restore(table.handle, prefix, table.name,
                                          checkpoint_format=CHECKPOINT_FORMAT, replace=replace,
                                          with_removed=with_removed, owner_rank=owner[0],
                                          owner_size=owner[1]).op


def _check_format(table: Table, checkpoint_format: tf.Tensor) -> tf.Operation:
    return tf.debugging.Assert(
        tf.equal(checkpoint_format, CHECKPOINT_FORMAT),
        [f"graphmod: table '{table.name}' is saved in checkpoint format", checkpoint_format,
         f"; this graphmod reads format {CHECKPOINT_FORMAT} (a checkpoint from a newer "
         "graphmod?)"])


def _check_sketch_shards(table: Table, sketch: tf.Tensor) -> tf.Operation:
    """Before anything changes, what the import of a saved admission sketch
    checks (native/table_resource.h CheckSketchShards): saved with a row of
    counters per shard, it must have as many rows as the table has shards
    (each shard counts its own keys); a vector (older checkpoints) passes."""
    if not table.admission_sketch_width:
        return tf.no_op()
    rows = tf.shape(sketch)[0]
    ok = tf.logical_or(tf.not_equal(tf.rank(sketch), 2),
                       tf.logical_or(tf.equal(tf.size(sketch), 0),
                                     tf.equal(rows, table.num_shards)))
    return tf.debugging.Assert(ok, [
        f"graphmod table '{table.name}': the admission sketch was saved by a table of", rows,
        f"shards and this one has {table.num_shards}: each shard counts its own keys, so the "
        "counters would count other keys here (create the table with num_shards=", rows,
        "to restore its admission counts)"])


def _saveable_to_proto(saveable, export_scope=None):
    """A MetaGraph keeps a table's saveable as the name of its table op."""
    if not isinstance(saveable, _TableSaveable):
        return None  # other saveables have no MetaGraph form (TF drops them too)
    return attr_value_pb2.NameAttrList(
        name=tf_ops.strip_name_scope(saveable.table.handle.op.name, export_scope))


def _saveable_from_proto(proto, import_scope=None):
    graph = tf1.get_default_graph()
    op = graph.get_operation_by_name(tf_ops.prepend_name_scope(proto.name, import_scope))
    table = Table(op.outputs[0])
    graph_state(graph).tables.setdefault(table.name, table)
    return _TableSaveable(table)


# Tables join checkpoints through the SAVEABLE_OBJECTS collection; these make
# that collection survive export_meta_graph / import_meta_graph.
tf_ops.register_proto_function(tf1.GraphKeys.SAVEABLE_OBJECTS,
                               proto_type=attr_value_pb2.NameAttrList,
                               to_proto=_saveable_to_proto, from_proto=_saveable_from_proto)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in " :,"):
        raise ValueError(f"graphmod table name must be a non-empty string without spaces, "
                         f"':' or ',', got {name!r}")
    return name


# Optimizers whose step divides by a slot row's value (Adam's second moment,
# RMSProp's mean square): their slots refuse int8 storage.
DIVIDING_BY_A_SLOT = ("adam", "rmsprop")


def create_table(name: str, dim: int, *, initializer: Any = None, optimizer: Any = None,
                 seed: Optional[int] = None, shape_hint: Optional[List[int]] = None,
                 **settings) -> Table:
    """Creates a dynamic embedding table in the default graph.

    Args:
      name: unique in the graph; also the table's name in checkpoints.
      dim: row width.
      initializer: None (truncated normal, stddev 1/sqrt(dim)), a number, a
        graphmod.embeddings.initializers.TableInitializer or a tf/keras initializer.
      optimizer: the graphmod.optimizers instance that will train the table
        (decides the optimizer slot rows each key keeps); None = no slots (SGD).
      default_value: what read-only (eval/predict) lookups return for unknown
        ids: None = the row the id would be initialized with, else this number.
      num_shards: power of two; shards spread a batch over intra-op threads.
      seed: row-initialization seed; default derived from the name, so every
        process gives an id the same initial row.
      max_rows: None = unbounded. Else at most this many rows; restoring a
        checkpoint brings back every row regardless.
      when_full: what a training lookup of a new id does in a table at
        max_rows: "lru" evicts the least recently seen, "lfu" the least often
        seen of the rows near the id's index slot (sampled, as Redis and
        HierarchicalKV do; rows seen in the current step are spared);
        "refuse" gives the id no row (it reads the missing value, no gradient).
      admission_sketch_width: None counts the sightings of ids waiting for
        admission (graphmod.FeatureSpec access_threshold) exactly, one map entry
        per id; W counts them in a count-min sketch of 4 x W counters (16 W
        bytes, whatever the number of ids). The sketch may admit an id early:
        its count exceeds the true one by more than e * N / W (N: sightings
        counted since the sketch last aged, in the id's shard, times the shard
        count) with probability at most e**-4 (1.8%); eviction halves the
        counters.
      layout: how a shard holds its rows. "arena": a key index over packed
        records (two dependent memory misses a lookup, about record + 14
        bytes a key); "buckets": records inline in hash buckets (one miss,
        records 60-90% of their memory, so up to ~1.6x the bytes). See
        benchmarks/lookup.py for both, measured side by side.
      memory_budget, storage_path: a disk tier. None (default): every row in
        memory. Else each shard keeps its share of memory_budget (a fraction
        of the table's rows in (0, 1], or bytes of records: an integer > 1)
        in memory and moves the least recently used rows (least often used
        under when_full="lfu"), with their optimizer slots and counts, to
        files in a fresh subdirectory of storage_path (a local disk: not a
        tmpfs, which is memory). A training lookup brings the cold rows it
        needs back first, in one batched read, so the table trains exactly
        as it would all in memory. The files are scratch: checkpoints hold
        the rows, and the files go when the table does.
      storage_dtype: how rows are stored: "float32" (default), "float16",
        "bfloat16" or "int8" (row-wise: a float32 scale and bias per row and
        one byte a value). Lookups return float32 and updates compute in
        float32, then round the row to its form (to nearest, ties to even;
        int8: to the nearest of 256 levels between the row's minimum and
        maximum, so every update re-rounds the row). An approximation: the
        rewrite's report says so. float16 saturates at +-65504 and flushes
        magnitudes below 6e-8 to zero (mind an Adam second moment);
        bfloat16 keeps float32's range with 8 bits of precision.
        Checkpoints keep rows in their stored form (a float16 table saves
        halves; an int8 row as uint8 [scale, bias, codes]); a checkpoint of
        another form converts on restore.
      slot_storage_dtype: the same for the optimizer slot rows; None (default)
        stores them as storage_dtype. Adam's and RMSProp's slots refuse
        int8 (their step divides by a slot).
      shape_hint: [rows, dim] of a variable being replaced, for fan-based initializers.

    >>> t = graphmod.create_table("item", dim=8, optimizer=graphmod.optimizers.Adam(1e-3))
    """
    from graphmod.optimizers import SparseOptimizer  # the optimizers import this module

    name = _check_name(name)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"graphmod table '{name}': dim must be a positive integer, got {dim!r}")
    if optimizer is not None and not isinstance(optimizer, SparseOptimizer):
        raise TypeError(f"graphmod table '{name}': optimizer must be a graphmod.optimizers "
                        f"optimizer, got {type(optimizer).__name__}")
    attrs = table_attrs(f"graphmod table '{name}'", settings)
    slots_form = attrs["slot_storage_dtype"] or attrs["storage_dtype"]
    if optimizer is not None and optimizer.kind in DIVIDING_BY_A_SLOT and slots_form == "int8":
        # A row-wise int8 moment reads a true 0 as a small non-zero value
        # where its second moment reads 0: the step divides by epsilon.
        raise ValueError(f"graphmod table '{name}': {type(optimizer).__name__} divides by a "
                         f"slot row, which int8 storage cannot keep (a 0 reads as a fraction of "
                         f"the row's range): set slot_storage_dtype='float32' or 'bfloat16'")
    max_rows, num_shards = attrs["max_rows"], attrs["num_shards"]
    if 0 <= max_rows < 64 * num_shards and attrs["when_full"] != "refuse":
        from absl import logging
        logging.warning("graphmod table '%s': max_rows %d over %d shards leaves about %d rows "
                        "a shard; a new id only evicts within its own shard, so some will be "
                        "refused: use num_shards <= %d", name, max_rows, num_shards,
                        max_rows // num_shards, max(1, 2 ** int(math.log2(max(max_rows // 64, 1)))))
    state = graph_state()
    if name in state.tables:
        raise ValueError(f"graphmod table '{name}' already exists in this graph")
    init = to_table_initializer(initializer, name, dim, shape_hint)
    if init.kind == "uniform" and not init.a < init.b:
        raise ValueError(f"graphmod table '{name}': uniform initializer needs low < high, "
                         f"got [{init.a}, {init.b})")
    if init.kind in ("normal", "truncated_normal") and init.b < 0:
        raise ValueError(f"graphmod table '{name}': normal initializer needs stddev >= 0, "
                         f"got {init.b}")
    if seed is None:
        seed = zlib.crc32(name.encode())
    # The handle op sits at the root of the graph, outside any control
    # dependency of the caller: every op of the table reuses it.
    graph = tf1.get_default_graph()
    with graph.control_dependencies(None), tf1.name_scope(None):
        handle = ops.graphmod_table(
            table_name=name, shared_name=name, dim=dim,
            num_slots=len(optimizer.slot_init) if optimizer is not None else 0,
            slot_init=list(optimizer.slot_init) if optimizer is not None else [],
            initializer=init.kind, init_a=init.a, init_b=init.b, seed=int(seed),
            name=f"graphmod/{name}/table", **attrs)
    table = Table(handle, optimizer)
    state.tables[name] = table
    tf1.add_to_collection(tf1.GraphKeys.SAVEABLE_OBJECTS, _TableSaveable(table))
    return table


# help() and the docs' checks see each setting (graphmod.settings) as a keyword.
create_table.__signature__ = inspect.signature(create_table).replace(parameters=[
    *list(inspect.signature(create_table).parameters.values())[:-1],
    *(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default)
      for s in TABLE_SETTINGS)])
