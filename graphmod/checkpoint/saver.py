"""TableSaver: the Saver of a graph with graphmod tables.

A tf.compat.v1.train.Saver (build deferred, saving what the graph's
collections hold) that also:
- restores the incremental checkpoints written after a full one: a restore
  of `model.ckpt-100` applies its committed deltas in order
  (graphmod.checkpoint.deltas), in training, evaluation, prediction and export alike;
- writes those deltas (`save_delta`, driven by graphmod.IncrementalSaveHook):
  each holds the table rows inserted or updated since the previous save, the
  keys removed since (tombstones), the admission counts that changed, and
  every other variable whole;
- writes the tables a chunk of rows at a time, as a part of their own in
  the checkpoint (a full save or a delta takes a chunk's rows of extra
  memory, not a second copy of the table);
- adopts dense checkpoints: when the hook converts variables that the
  checkpoint in model_dir holds densely (a model trained without graphmod),
  the restore imports each one's trained rows and optimizer slots into its
  table (row i becomes key i) and restores everything else as usual, so the
  model right after adoption computes what the dense model did; its first
  save writes the tables.

The rewrite rule table_saver installs it in place of the Saver an Estimator
or MonitoredTrainingSession would build, with the same settings.
"""
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import saver_pb2
from tensorflow.python.ops import variables as tf_variables
from tensorflow.python.training import saver as saver_lib

from graphmod._ops import ops
from graphmod.checkpoint import deltas, parts as part_files
from graphmod.ps import tables as ps
from graphmod.embeddings.partition import owner_of
from graphmod.embeddings import features
from graphmod.settings import UNITS
from graphmod.state import graph_state

tf1 = tf.compat.v1


class Adoption(NamedTuple):
    """A table that starts from a dense variable's checkpointed rows."""
    table: Any               # the graphmod.Table
    variable: str            # the variable's name in checkpoints
    slots: List[str]         # its optimizer slots' names, in the table's slot order
    rows: int


def _restore(path: tf.Tensor, name: str) -> tf.Tensor:
    return tf.raw_ops.RestoreV2(prefix=path, tensor_names=[name], shape_and_slices=[""],
                                dtypes=[tf.float32])[0]


def _is_table(saveable) -> bool:
    from graphmod.embeddings.table import _TableSaveable
    return isinstance(saveable, _TableSaveable)


def _writes_itself(saveable) -> bool:
    """A table's saveable, full or delta (graphmod.embeddings.table): tables are written
    by one op, a chunk of rows at a time."""
    from graphmod.embeddings.table import _TableDeltaSaveable
    return _is_table(saveable) or isinstance(saveable, _TableDeltaSaveable)


class _PartsBuilder(saver_lib.BulkSaverBuilder):
    """Saves a device's tables as a part of their own in a sharded (V2)
    checkpoint, written by graphmod.embeddings.table.write_tables one table shard at a
    time, beside the usual part for everything else; TensorFlow's merge
    makes the parts one checkpoint. A SaveV2 of a table's entries would take
    the whole table as tensors: a second copy of it in memory while it
    saves. Restores read tables the same way, a stored slice at a time."""

    def _AddShardedSaveOpsForV2(self, checkpoint_prefix, per_device):
        parts = []
        for device, saveables in per_device:
            parts += [(device, group) for group in _by_kind(saveables)]
        return super()._AddShardedSaveOpsForV2(checkpoint_prefix, parts)

    def _AddSaveOps(self, filename_tensor, saveables):
        groups = _by_kind(saveables)
        if len(groups) > 1:  # an unsharded Saver's
            return self._AddShardedSaveOpsForV2(filename_tensor, [("", saveables)])
        if groups and _writes_itself(groups[0][0]):
            from graphmod.embeddings.table import write_tables
            with tf.control_dependencies([write_tables(groups[0], filename_tensor)]):
                return tf.identity(filename_tensor)
        return super()._AddSaveOps(filename_tensor, saveables)

    def _AddRestoreOps(self, filename_tensor, saveables, restore_sequentially, reshape,
                       preferred_shard=-1, name="restore_all"):
        """Tables restore themselves from the checkpoint, one stored slice of
        rows at a time; a RestoreV2 would read every entry whole first."""
        tables = [s for s in saveables if _writes_itself(s)]
        if not tables:
            return super()._AddRestoreOps(filename_tensor, saveables, restore_sequentially,
                                          reshape, preferred_shard, name)
        restores = []
        for s in tables:
            with tf.device(s.table.handle.device):
                restores.append(s.restore_from(filename_tensor))
        others = [s for s in saveables if not _writes_itself(s)]
        if others:
            restores.append(super()._AddRestoreOps(filename_tensor, others, restore_sequentially,
                                                   reshape, preferred_shard, f"{name}_dense"))
        return tf.group(*restores, name=name)


def _by_kind(saveables) -> List[list]:
    """The saveables in groups that make one part each: the tables' (one per
    kind of table saveable) and everything else."""
    groups: Dict[Any, list] = {}
    for s in saveables:
        groups.setdefault(type(s) if _writes_itself(s) else None, []).append(s)
    return list(groups.values())


def _sharded() -> bool:
    from graphmod import horovod  # pylint: disable=import-outside-toplevel
    return horovod.enabled(tf1.get_default_graph())


def _reads_parts() -> bool:
    """Whether the graph may restore tables saved in parts by several ranks:
    it runs under Horovod, or its rewrite found such a checkpoint in
    model_dir (an export after Horovod training). Only then are the reading
    ops built."""
    import sys  # pylint: disable=import-outside-toplevel
    hvd = sys.modules.get("horovod.tensorflow")
    return (hvd is not None and hvd.is_initialized()) or graph_state().reads_parts


def _builder(saver_kwargs) -> Optional[saver_lib.BaseSaverBuilder]:
    """Tables are saved a chunk of rows at a time in V2 checkpoints (the default
    format); a V1 Saver keeps TensorFlow's builder."""
    version = saver_kwargs.get("write_version", saver_pb2.SaverDef.V2)
    return _PartsBuilder(version) if version == saver_pb2.SaverDef.V2 else None


class TableSaver(tf1.train.Saver):
    """See the module docstring. `chain` is (the full checkpoint this
    session's state extends, how many of its deltas): set by every restore
    and full save, advanced by save_delta."""

    def __init__(self, adoptions: Optional[List[Adoption]] = None, **saver_kwargs):
        builder = saver_kwargs.pop("builder", None) or _builder(saver_kwargs)
        super().__init__(defer_build=True, builder=builder, **saver_kwargs)
        self.adoptions = list(adoptions or [])
        self.chain: Tuple[Optional[str], int] = (None, 0)
        self.restored: Tuple[Optional[str], int] = (None, 0)  # what the last restore applied
        # Per table, the version of the last save (full or delta) since
        # which a delta holds the changes; set once removals are tracked.
        self.marks: Optional[Dict[str, int]] = None
        self._adopt_path: Optional[tf.Tensor] = None
        self._adopt_ops: List[tf.Operation] = []
        self._adopt_clock: Dict[str, tf.Tensor] = {}  # eviction unit -> its "now"
        self._others: Optional[tf1.train.Saver] = None
        self._delta_saver: Optional[tf1.train.Saver] = None
        self._since: Dict[str, tf.Tensor] = {}
        self._versions: Dict[str, tf.Tensor] = {}
        self._track: Dict[str, tf.Tensor] = {}
        self._sharded_tables = None  # graphmod.checkpoint.parts.ShardedTables
        self._ps_tables = None  # graphmod.ps.PsTables
        self._parts = None  # a TableParts, when the tables are not sharded
        self._dense_reader: Optional[tf1.train.Saver] = None  # the dense variables alone
        # Sharded tables: where every rank's save goes, rank 0's model_dir
        # (set by graphmod.horovod.save_schedule; None: the path save() is given)
        self.rank0_dir: Optional[str] = None
        # ... and, where the ranks share no file system, (PartStream, local staging folder)
        self.part_stream: Optional[tuple] = None

    # ---------------------------------------------------------------- build

    def _build(self, checkpoint_path, build_save, build_restore):
        built = self._is_built
        saveables = list(self._var_list or tf_variables._all_saveable_objects())  # pylint: disable=protected-access
        tables = [x for x in saveables if _is_table(x)]
        dense = [x for x in saveables if not _is_table(x)]
        if not built and tables and _sharded():
            # Every rank saves the keys it owns (graphmod.checkpoint.parts);
            # the ordinary save and restore hold the rest.
            self._var_list = dense
            self._allow_empty = self._allow_empty or not dense  # the tables are saved
            self._sharded_tables = part_files.ShardedTables(tables)
        elif not built and tables and graph_state().ps_shards:
            # Every ps task saves its shards (graphmod.ps).
            self._var_list = dense
            self._allow_empty = self._allow_empty or not dense
            self._ps_tables = ps.PsTables(_ps_layout(tables))
        super()._build(checkpoint_path, build_save, build_restore)
        if built:
            return
        # Built beside the ordinary save and restore, before the graph is finalized.
        if self._sharded_tables is not None or self._ps_tables is not None:
            self._build_deltas(tables, dense)
            self._dense_reader = self._delta_saver
            if self._ps_tables is not None and self.adoptions and build_restore:
                self._build_adoption(saveables)
            return  # (no adoption of tables sharded across Horovod ranks yet)
        if self._is_empty:
            return
        if tables and _reads_parts():
            # Checkpoints of sharded tables (graphmod.checkpoint.parts)
            # restore into these tables, which then hold every rank's keys.
            self._parts = part_files.TableParts(tables)
            if dense:
                self._dense_reader = tf1.train.Saver(var_list=dense, sharded=False,
                                                     allow_empty=True)
        if tables:
            self._build_deltas(tables, dense)
        if self.adoptions and build_restore:
            self._build_adoption(saveables)

    def _build_deltas(self, tables, dense) -> None:
        """The delta's save and restore: a Saver of the dense variables and
        the tables' changes, or, with sharded tables, of the dense variables
        alone (None when there are none) beside the tables' parts."""
        from graphmod.embeddings.table import _TableDeltaSaveable
        with tf1.name_scope("graphmod_delta"):
            parts = []
            for t in tables:
                # A table sharded over ps tasks: each shard keeps its own versions.
                shards = (graph_state().ps_shards[t.table.name] if self._ps_tables is not None
                          else [t.table])
                for i, table in enumerate(shards):
                    key = t.table.name if len(shards) == 1 else f"{t.table.name}@ps{i}"
                    self._since[key] = tf1.placeholder(tf.int64, [], name=f"{table.name}_since")
                    self._versions[key] = table.info()["version"]
                    self._track[key] = ops.graphmod_table_track_removals(table.handle)
                    parts.append(_TableDeltaSaveable(table, self._since[key]))
            if self._sharded_tables is not None or self._ps_tables is not None:
                (self._sharded_tables or self._ps_tables).build_deltas(parts)
                parts = []
            elif self._parts is not None:
                self._parts.build_deltas(parts)
            if dense or parts:
                # Sharded: one part per device, as the full save (tables on ps tasks).
                self._delta_saver = tf1.train.Saver(var_list=dense + parts, sharded=True,
                                                    allow_empty=True, builder=_PartsBuilder())

    def _build_adoption(self, saveables) -> None:
        adopted = {a.table.name for a in self.adoptions}
        others = [x for x in saveables if not (_is_table(x) and x.table.name in adopted)]
        with tf1.name_scope("graphmod_adopt"):
            self._adopt_path = tf1.placeholder(tf.string, [], name="checkpoint_path")
            # Adopted rows count as seen at adoption, in each table's
            # eviction clock (the global step, or seconds).
            self._adopt_clock = {unit: tf1.placeholder(tf.int64, [], name=f"now_{unit}")
                                 for unit in UNITS}
            for a in self.adoptions:
                # A table sharded over ps tasks: each task reads the variable
                # and imports the rows it owns (no copy of it on the chief).
                shards = graph_state().ps_shards.get(a.table.name, [a.table])
                for i, table in enumerate(shards):
                    with tf1.name_scope(a.table.name), tf.device(table.handle.device):
                        self._adopt_ops.append(self._adoption(a, table, i, len(shards)))
            if self._ps_tables is not None:  # the tables' saveables are its own
                others = [x for x in others if not _is_table(x)]
            self._others = tf1.train.Saver(
                var_list=others, sharded=self._sharded, allow_empty=True,
                write_version=self._write_version)

    def _adoption(self, a: Adoption, table, shard: int, shards: int) -> tf.Operation:
        """The import of the adopted variable's rows (row i as key i) that
        the table (shard `shard` of `shards` over ps tasks) owns."""
        values = tf.reshape(_restore(self._adopt_path, a.variable), [a.rows, table.dim])
        if a.slots:
            slots = tf.stack([tf.reshape(_restore(self._adopt_path, s), [a.rows, table.dim])
                              for s in a.slots], 1)
        else:
            slots = tf.zeros([a.rows, 0, table.dim])
        keys = tf.range(a.rows, dtype=tf.int64)
        if shards > 1:
            mine = tf.where(tf.equal(owner_of(keys, shards), shard))[:, 0]
            keys, values, slots = (tf.gather(x, mine) for x in (keys, values, slots))
        now = self._adopt_clock[features.policy_of(a.table).eviction_unit]
        return table.import_rows(keys, values, slots, last_seen=tf.fill(tf.shape(keys), now),
                                 replace=True)

    # ---------------------------------------------------------------- restore

    def holds_tables_densely(self, save_path: str) -> bool:
        """True when the checkpoint holds every adopted table's variable
        densely; False when it holds the tables (or cannot be read: the
        ordinary restore says why); an error naming the table when it holds
        neither, or some of each."""
        try:
            reader = tf.train.load_checkpoint(save_path)
        except (tf.errors.OpError, ValueError):
            return False
        dense = []
        for a in self.adoptions:
            if reader.has_tensor(f"{a.table.name}-keys"):
                continue
            missing = [n for n in [a.variable] + a.slots if not reader.has_tensor(n)]
            if missing:
                raise ValueError(f"graphmod: checkpoint {save_path} holds neither table "
                                 f"'{a.table.name}' nor the variable it adopts "
                                 f"(missing: {', '.join(missing)})")
            dense.append(a)
        if dense and len(dense) != len(self.adoptions):
            raise ValueError(f"graphmod: checkpoint {save_path} holds some adopted variables "
                             f"densely and others as tables "
                             f"({', '.join(a.table.name for a in dense)} densely)")
        return bool(dense)

    def restore(self, sess, save_path):
        if self.saver_def is None:
            self.build()  # an export restores without finalizing a Scaffold
        if self._sharded_tables is not None or self._ps_tables is not None:
            if self.adoptions and save_path is not None and \
                    self.holds_tables_densely(save_path):
                self._adopt(sess, save_path)
                self.chain = self.restored = (save_path, 0)
                self.marks = None
            else:
                self._restore_parts(sess, save_path, self._sharded_tables or self._ps_tables)
            return
        if self._parts is not None and save_path is not None and \
                self._parts.is_sharded(save_path):
            self._restore_parts(sess, save_path, self._parts)
            return
        if self.adoptions and save_path is not None and self.holds_tables_densely(save_path):
            self._adopt(sess, save_path)
        else:
            super().restore(sess, save_path)
        applied = 0
        if self._delta_saver is not None and save_path is not None:
            for prefix in deltas.committed(save_path):
                self._restore_delta(sess, prefix)
                applied += 1
            if applied:
                logging.info("graphmod: restored %s and its %d delta(s) after it", save_path,
                             applied)
        self.chain = self.restored = (save_path, applied)
        self.marks = None  # this session's tables track nothing yet

    def _restore_parts(self, sess, save_path: str, parts) -> None:
        """From the tables' parts, this rank's keys (every key when the
        tables are not sharded) of a checkpoint and its committed deltas,
        then the dense variables. Tables first: other workers of a
        parameter-server cluster start stepping once the variables are
        initialized, and must not find tables half restored."""
        read = parts.restore(sess, save_path)
        logging.info("graphmod: restored the keys of %s from %s",
                     f"{parts.size} ps tasks" if parts is self._ps_tables
                     else f"rank {parts.rank} of {parts.size}", ", ".join(read))
        chain = deltas.committed(save_path)
        for prefix in chain:
            parts.restore_delta(sess, prefix)
        if self._dense_reader is not None:
            self._restore_delta(sess, save_path, self._dense_reader)
            for prefix in chain:
                if tf.io.gfile.exists(prefix + ".index"):
                    self._restore_delta(sess, prefix, self._dense_reader)
        if chain:
            logging.info("graphmod: restored %s and its %d delta(s) after it", save_path,
                         len(chain))
        self.chain = self.restored = (save_path, len(chain))
        self.marks = None  # this session's tables track nothing yet

    def _restore_delta(self, sess, prefix: str, saver=None) -> None:
        saver = saver or self._delta_saver
        sess.run(saver.saver_def.restore_op_name, {saver.saver_def.filename_tensor_name: prefix})

    def _adopt(self, sess, save_path: str) -> None:
        _keep_dense_checkpoint(save_path)
        fetches = list(self._adopt_ops)
        reader = tf.train.load_checkpoint(save_path)
        step = (int(reader.get_tensor("global_step")) if reader.has_tensor("global_step")
                else 0)
        feed = {self._adopt_path: save_path, self._adopt_clock["steps"]: step,
                self._adopt_clock["seconds"]: int(time.time())}
        if not self._others._is_empty:  # pylint: disable=protected-access
            fetches.append(self._others.saver_def.restore_op_name)
            feed[self._others.saver_def.filename_tensor_name] = save_path
        sess.run(fetches, feed)
        for a in self.adoptions:
            logging.info("graphmod: adopted %s from the dense checkpoint %s: %d trained rows "
                         "(keys 0..%d)%s into table '%s'", a.variable, save_path, a.rows,
                         a.rows - 1, f" with slots {', '.join(a.slots)}" if a.slots else "",
                         a.table.name)

    # ---------------------------------------------------------------- save

    def save(self, sess, save_path, global_step=None, *args, **kwargs):
        if self._sharded_tables is not None or self._ps_tables is not None:
            return self._save_sharded(sess, save_path, global_step, *args, **kwargs)
        # What a delta after this save follows (only read while tracking).
        versions = sess.run(self._versions) if self.marks is not None else None
        try:
            path = super().save(sess, save_path, global_step, *args, **kwargs)
        except Exception:
            _remove_parts(save_path)  # the previous checkpoints stay as they were
            raise
        if path:
            # A checkpoint written again under its name (a resumed run saves
            # the step it restored) holds what its old deltas added, and its
            # tables (written in parts by several ranks before) are in it now.
            deltas.drop(path)
            part_files.remove_parts(path)
            part_files.remove_orphans(os.path.dirname(path))
            self.chain = (path, 0)
            if self.marks is not None:
                self.marks = versions
            for name in deltas.remove_orphans(os.path.dirname(path)):
                logging.info("graphmod: removed the deltas of %s with it", name)
        return path

    @property
    def sharded(self) -> bool:
        """Whether it saves tables sharded across Horovod ranks: every rank
        must then save, and write deltas, at the same steps."""
        return self._sharded_tables is not None

    def _save_sharded(self, sess, save_path, global_step, *args, **kwargs):
        """Every rank (or ps task) writes its tables' part, rank 0 (the chief)
        commits their manifest and then saves the rest (and the `checkpoint`
        state file) as usual. Every Horovod rank must call it at the same step."""
        if self.saver_def is None:
            self.build()
        if self.rank0_dir:
            # Every rank writes its part into rank 0's model_dir, whatever its
            # own (graphmod.horovod.save_schedule).
            save_path = os.path.join(self.rank0_dir, os.path.basename(save_path))
        checkpoint = save_path
        if global_step is not None:
            # CheckpointSaverHook passes the step it fetched (a numpy integer).
            step = int(global_step) if isinstance(global_step, (int, np.integer)) else int(
                tf1.train.global_step(sess, global_step))
            # As the Saver names it.
            checkpoint = (f"{save_path}-{step:08d}" if self._pad_step_number  # pylint: disable=protected-access
                          else f"{save_path}-{step}")
        versions = sess.run(self._versions) if self.marks is not None else None
        parts = self._sharded_tables or self._ps_tables
        if self._ps_tables is not None and parts.rank == 0:
            # See save(). Before the parts are written: once they are, other
            # ps tasks may write their parts of this checkpoint's first delta.
            # (Horovod ranks: rank 0 drops them in ShardedTables.save, once no
            # rank is still restoring them.)
            deltas.drop(checkpoint)
        if self._sharded_tables is not None:
            self._sharded_tables.stream, self._sharded_tables.staging = (
                self.part_stream or (None, None))
        parts.save(sess, checkpoint)
        path = checkpoint
        if parts.rank == 0 and not self._is_empty:  # else tables alone
            path = super().save(sess, save_path, global_step, *args, **kwargs)
            # (a tables-only Saver keeps no list of checkpoints to delete)
            part_files.remove_orphans(os.path.dirname(path))
            for name in deltas.remove_orphans(os.path.dirname(path)):
                logging.info("graphmod: removed the deltas of %s with it", name)
        if self._sharded_tables is not None:
            self._sharded_tables.wait_committed(sess, checkpoint)
        self.chain = (path, 0)
        if self.marks is not None:
            self.marks = versions
        return path

    def start_tracking(self, sess) -> None:
        """This session's tables note changes and removals from now on; the
        next delta holds the changes since now (nothing has changed since the
        restore or save that set `chain`). Called once per session: a session
        made again after an error has tables that track nothing yet."""
        if self._track:
            self.marks = sess.run(self._track)

    def save_delta(self, sess, step: int) -> Optional[str]:
        """Writes and commits the next delta after `chain`'s full
        checkpoint; returns its prefix (None when there is no full
        checkpoint yet to follow)."""
        base, count = self.chain
        if base is None or not self._versions:
            return None
        if self.marks is None:
            self.start_tracking(sess)
        versions = sess.run(self._versions)  # what the delta will reflect
        feed = {self._since[name]: mark for name, mark in self.marks.items()}
        if self._sharded_tables is not None or self._ps_tables is not None:
            def save_dense(tmp):
                sess.run(self._delta_saver.saver_def.save_tensor_name,
                         {self._delta_saver.saver_def.filename_tensor_name: tmp})
            if self._sharded_tables is not None:
                self._sharded_tables.stream, self._sharded_tables.staging = (
                    self.part_stream or (None, None))
            prefix = (self._sharded_tables or self._ps_tables).save_delta(
                sess, base, count + 1, step, feed,
                save_dense if self._delta_saver is not None else None)
            self.chain, self.marks = (base, count + 1), versions
            return prefix
        tmp = deltas.temp_prefix(base, count + 1)
        feed[self._delta_saver.saver_def.filename_tensor_name] = tmp
        try:
            sess.run(self._delta_saver.saver_def.save_tensor_name, feed)
            prefix = deltas.publish(base, tmp, count + 1, step)
        except Exception:
            deltas.discard(tmp)  # the chain stays as it was; the next delta covers this one
            raise
        self.chain, self.marks = (base, count + 1), versions
        return prefix

    def continue_chain(self) -> None:
        """Drops what follows the deltas this session restored (a torn
        delta, or uncommitted files): a delta written after them must not
        be read after those."""
        base, count = self.restored
        if base is not None and (self._sharded_tables is None or
                                 self._sharded_tables.rank == 0):
            deltas.truncate(base, count)  # (one rank does it for all)


def _ps_layout(tables) -> List[list]:
    """The tables' shards on each ps task (graphmod.ps), in one
    table order; an error naming the tables that are not sharded, which no
    part of the checkpoint would hold."""
    shards = graph_state().ps_shards
    alone = sorted(t.table.name for t in tables if t.table.name not in shards)
    if alone:
        raise ValueError(f"graphmod: tables {alone} (made with graphmod.create_table) are not "
                         f"sharded over the ps tasks, while {sorted(shards)} (converted by the "
                         "hook) are: one checkpoint cannot hold both; in a parameter-server "
                         "cluster, let GraphModifierHook convert embedding variables instead")
    n = len(next(iter(shards.values())))
    return [[shards[t.table.name][i] for t in tables] for i in range(n)]


def _remove_parts(save_path: str) -> None:
    """Removes the parts a failed sharded save left in `<checkpoint>_temp/`
    (TensorFlow removes them only once they are merged)."""
    folder, name = os.path.split(save_path)
    for entry in tf.io.gfile.listdir(folder or "."):
        entry = entry.rstrip("/")
        path = os.path.join(folder, entry)
        if entry.startswith(name) and entry.endswith("_temp") and tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
            logging.warning("graphmod: removed %s, left by a failed save", path)


def _keep_dense_checkpoint(save_path: str) -> None:
    """Copies the adopted dense checkpoint's files to
    <dir>/graphmod/dense_before_adoption/, once: the first save after adoption
    may write its name again (in place: a hard link would see the new files)."""
    folder, name = os.path.split(save_path)
    keep = os.path.join(folder, "graphmod", "dense_before_adoption")
    files = [f for f in tf.io.gfile.listdir(folder)
             if f.startswith(name + ".") and not f.endswith(".meta")]
    tf.io.gfile.makedirs(keep)
    for f in files:
        target = os.path.join(keep, f)
        if tf.io.gfile.exists(target):
            continue
        tf.io.gfile.copy(os.path.join(folder, f), target + ".tmp", overwrite=True)
        tf.io.gfile.rename(target + ".tmp", target, overwrite=True)  # never half a copy
    logging.info("graphmod: the dense checkpoint %s is kept in %s", save_path, keep)


def install(rw, graph: tf.Graph, adoptions: Optional[List[Adoption]] = None) -> TableSaver:
    """Makes graph's Saver a TableSaver (through the Rewriter rw), with the
    settings of the deferred Saver it replaces (an Estimator's: sharded, its
    RunConfig's keep_checkpoint_max...) or of Scaffold's default; adds the
    adoptions to one already installed."""
    old = replaceable_saver(graph)
    if isinstance(old, TableSaver):
        old.adoptions.extend(adoptions or [])
        return old
    settings = dict(sharded=True, allow_empty=True)
    if old is not None:
        settings = dict(
            reshape=old._reshape, sharded=old._sharded,  # pylint: disable=protected-access
            max_to_keep=old._max_to_keep,  # pylint: disable=protected-access
            keep_checkpoint_every_n_hours=old._keep_checkpoint_every_n_hours,  # pylint: disable=protected-access
            name=old._name, restore_sequentially=old._restore_sequentially,  # pylint: disable=protected-access
            allow_empty=old._allow_empty, write_version=old._write_version,  # pylint: disable=protected-access
            pad_step_number=old._pad_step_number,  # pylint: disable=protected-access
            save_relative_paths=old._save_relative_paths, filename=old._filename)  # pylint: disable=protected-access
        rw.remove_from_collections(old, [tf1.GraphKeys.SAVERS], label="the graph's Saver")
    saver = TableSaver(adoptions, **settings)
    graph.add_to_collection(tf1.GraphKeys.SAVERS, saver)
    return saver


class NotReplaceable(ValueError):
    """The graph's Saver cannot become a TableSaver."""


def replaceable_saver(graph: tf.Graph):
    """The deferred Saver the session will build (a TableSaver already, or a
    plain one), None when it will create Scaffold's default; NotReplaceable
    when the graph's Saver is built already or there are several."""
    savers = graph.get_collection(tf1.GraphKeys.SAVERS)
    if len(savers) > 1:
        raise NotReplaceable("the graph has several Savers")
    if not savers:
        return None
    saver = savers[0]
    if saver.saver_def is not None or type(saver) not in (tf1.train.Saver, TableSaver):
        raise NotReplaceable("the graph's Saver is built already, or is not a "
                             "tf.compat.v1.train.Saver")
    return saver
