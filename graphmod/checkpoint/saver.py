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

from graphmod import horovod
from graphmod._ops import ops
from graphmod.checkpoint import deltas, parts as part_files
from graphmod.horovod.rank_parts import RankParts
from graphmod.ps import tables as ps
from graphmod.embeddings.partition import owned_by
from graphmod.embeddings import features
from graphmod.embeddings.table import _TableDeltaSaveable, _TableSaveable, write_tables
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
    return isinstance(saveable, _TableSaveable)


def _writes_itself(saveable) -> bool:
    """A table's saveable, full or delta (graphmod.embeddings.table): tables are written
    by one op, a chunk of rows at a time."""
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


def _reads_parts() -> bool:
    """Whether the graph may restore tables saved in parts by several
    owners: it runs under Horovod, or its rewrite found such a checkpoint
    in model_dir (an export after Horovod or ps training). Only then are
    the reading ops built."""
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
    and full save, advanced by save_delta. Where the tables live in its
    checkpoints is its part layout (graphmod.checkpoint.parts.PartLayout),
    picked when it is built."""

    def __init__(self, adoptions: Optional[List[Adoption]] = None, **saver_kwargs):
        builder = saver_kwargs.pop("builder", None) or _builder(saver_kwargs)
        super().__init__(defer_build=True, builder=builder, **saver_kwargs)
        self.adoptions = list(adoptions or [])
        self.chain: Tuple[Optional[str], int] = (None, 0)
        self.restored: Tuple[Optional[str], int] = (None, 0)  # what the last restore applied
        # Per table part, the version of the last save (full or delta) since
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
        self._layout: part_files.PartLayout = part_files.OneProcess()
        # What restores the dense variables beside tables read from parts.
        self._dense_reader: Optional[tf1.train.Saver] = None
        # Tables split across Horovod ranks (graphmod.horovod.rank_parts,
        # set by graphmod.horovod.save_schedule before the build): rank 0's
        # model_dir, where every rank saves (None: the path save() is given)
        self.rank0_dir: Optional[str] = None
        # ... and, where the ranks share no file system, (PartStream, local staging folder)
        self.part_stream: Optional[tuple] = None

    # ---------------------------------------------------------------- build

    def _build(self, checkpoint_path, build_save, build_restore):
        built = self._is_built
        saveables = list(self._var_list or tf_variables._all_saveable_objects())  # pylint: disable=protected-access
        tables = [x for x in saveables if _is_table(x)]
        dense = [x for x in saveables if not _is_table(x)]
        if not built and tables:
            self._layout = self._pick_layout(tables)
            if self._layout.apart:
                self._var_list = saveables = dense
                self._allow_empty = self._allow_empty or not dense  # the tables are saved
        super()._build(checkpoint_path, build_save, build_restore)
        if built or not tables:
            return
        # Built beside the ordinary save and restore, before the graph is finalized.
        if self._layout.readers and not self._layout.apart and dense:
            # (its delta Saver holds the tables' changes too)
            self._dense_reader = tf1.train.Saver(var_list=dense, sharded=False, allow_empty=True)
        self._build_deltas(tables, dense)
        if self.adoptions and build_restore:
            self._build_adoption(saveables)

    def _pick_layout(self, tables) -> part_files.PartLayout:
        if horovod.enabled(tf1.get_default_graph()):
            return RankParts(tables, self.rank0_dir, self.part_stream)
        if graph_state().ps_parts:
            return ps.PsParts(tables, graph_state().ps_parts)
        return part_files.OneProcess(tables if _reads_parts() else None)

    def _build_deltas(self, tables, dense) -> None:
        """The delta's save and restore: a Saver of the dense variables and
        of the tables' changes the layout does not write in parts (None when
        there are none)."""
        with tf1.name_scope("graphmod_delta"):
            changes = []
            for t in tables:
                parts = self._layout.parts_of(t.table)  # each keeps its own versions
                for i, table in enumerate(parts):
                    key = t.table.name if len(parts) == 1 else f"{t.table.name}@ps{i}"
                    self._since[key] = tf1.placeholder(tf.int64, [], name=f"{table.name}_since")
                    self._versions[key] = table.info()["version"]
                    self._track[key] = ops.graphmod_table_track_removals(table.handle)
                    changes.append(_TableDeltaSaveable(table, self._since[key]))
            changes = self._layout.build_deltas(changes)
            if dense or changes:
                # Sharded: one part per device, as the full save (tables on ps tasks).
                self._delta_saver = tf1.train.Saver(var_list=dense + changes, sharded=True,
                                                    allow_empty=True, builder=_PartsBuilder())
        if self._layout.apart:  # the delta Saver holds the dense variables alone
            self._dense_reader = self._delta_saver

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
                # Each part reads the variable and imports the rows its owner
                # owns (no copy of it on the chief).
                for table, owner, owners in self._layout.owned_parts(a.table):
                    with tf1.name_scope(a.table.name), tf.device(table.handle.device):
                        self._adopt_ops.append(self._adoption(a, table, owner, owners))
            self._others = tf1.train.Saver(
                var_list=others, sharded=self._sharded, allow_empty=True,
                write_version=self._write_version)

    def _adoption(self, a: Adoption, table, owner: int, owners: int) -> tf.Operation:
        """The import of the adopted variable's rows (row i as key i) that
        the table (the part of owner `owner` of `owners`) owns."""
        values = tf.reshape(_restore(self._adopt_path, a.variable), [a.rows, table.dim])
        if a.slots:
            slots = tf.stack([tf.reshape(_restore(self._adopt_path, s), [a.rows, table.dim])
                              for s in a.slots], 1)
        else:
            slots = tf.zeros([a.rows, 0, table.dim])
        keys = tf.range(a.rows, dtype=tf.int64)
        if owners > 1:
            mine = tf.where(owned_by(keys, owner, owners))[:, 0]
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
        chain = []
        if self.adoptions and save_path is not None and not self._layout.parted(save_path) \
                and self.holds_tables_densely(save_path):
            self._adopt(sess, save_path)
        else:
            # Tables first: other workers of a parameter-server cluster start
            # stepping once the variables are initialized, and must not find
            # tables half restored.
            read = self._layout.restore(sess, save_path)
            chain = deltas.committed(save_path) if self._versions else []
            if read is None:  # in the checkpoint: the Saver restores them with the rest
                super().restore(sess, save_path)
                for prefix in chain:
                    self._restore_delta(sess, prefix, self._delta_saver)
            else:
                logging.info("graphmod: restored the keys of %s from %s", self._layout.whose,
                             ", ".join(read))
                for prefix in chain:
                    self._layout.restore_delta(sess, prefix)
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

    @staticmethod
    def _restore_delta(sess, prefix: str, saver) -> None:
        sess.run(saver.saver_def.restore_op_name, {saver.saver_def.filename_tensor_name: prefix})

    def _adopt(self, sess, save_path: str) -> None:
        if self._layout.rank == 0:  # (every Horovod rank adopts from one checkpoint)
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
        """The layout writes the tables' parts (each owner its own), then the
        chief saves the rest (and the `checkpoint` state file) as usual.
        Under Horovod every rank must call it at the same step."""
        if self.saver_def is None:
            self.build()
        save_path = self._layout.where(save_path)
        checkpoint = save_path
        if global_step is not None:
            # CheckpointSaverHook passes the step it fetched (a numpy integer).
            global_step = int(global_step) if isinstance(global_step, (int, np.integer)) else \
                int(tf1.train.global_step(sess, global_step))
            # As the Saver names it.
            checkpoint = (f"{save_path}-{global_step:08d}" if self._pad_step_number
                          else f"{save_path}-{global_step}")
        # What a delta after this save follows (only read while tracking).
        versions = sess.run(self._versions) if self.marks is not None else None
        path = self._layout.save(sess, checkpoint)
        if self._layout.rank == 0 and not self._is_empty:  # (else the tables alone)
            try:
                path = super().save(sess, save_path, global_step, *args, **kwargs)
            except Exception:
                _remove_temp_folders(save_path)  # the previous checkpoints stay as they were
                raise
            part_files.remove_orphans(os.path.dirname(path))
            for name in deltas.remove_orphans(os.path.dirname(path)):
                logging.info("graphmod: removed the deltas of %s with it", name)
        self._layout.saved(sess, path)
        if path:
            self.chain = (path, 0)
            if self.marks is not None:
                self.marks = versions
        return path

    @property
    def sharded(self) -> bool:
        """Whether its tables are split across Horovod ranks: every
        rank must then save, and write deltas, at the same steps."""
        return self._layout.collective

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

        def save_rest(tmp):  # the dense variables, and the tables' changes held with them
            sess.run(self._delta_saver.saver_def.save_tensor_name,
                     {**feed, self._delta_saver.saver_def.filename_tensor_name: tmp})
        prefix = self._layout.save_delta(sess, base, count + 1, step, feed,
                                         save_rest if self._delta_saver is not None else None)
        self.chain, self.marks = (base, count + 1), versions
        return prefix

    def continue_chain(self) -> None:
        """Drops what follows the deltas this session restored (a torn
        delta, or uncommitted files): a delta written after them must not
        be read after those."""
        base, count = self.restored
        if base is not None and self._layout.rank == 0:
            deltas.truncate(base, count)  # (one owner does it for all)


def _remove_temp_folders(save_path: str) -> None:
    """Removes the per-device files a failed save left in `<checkpoint>_temp/`
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
