"""Checkpoints of tables sharded across Horovod ranks.

A save runs on every rank at once (graphmod.checkpoint.saver.TableSaver under
sharding; under GraphModifierHook at rank 0's save steps, into rank 0's
model_dir: graphmod.horovod.save_schedule): rank r writes the keys it owns as a part of the checkpoint,
`<checkpoint>.tables-0000r-of-0000N` (the tables' usual entries, written
a chunk of rows at a time), all ranks meet in an allreduce once their parts
are written, and rank 0 then commits `<checkpoint>.tables.json` (the number
of ranks and the parts' files) before its Saver writes the dense variables
and the `checkpoint` state file. A checkpoint without its manifest was never
complete: TableSaver's restore refuses it, naming it.

A restore on M ranks (any M, one included) has rank m read only the parts
whose hash ranges (graphmod.embeddings.partition) overlap its own and
import the keys it owns: with M == N exactly its own part. A checkpoint
written without sharding (tables in the checkpoint itself) restores as one
part. Admission sketches are restored when M == N only (each rank's counted
its own keys).
"""
import hashlib
import json
import os
import re
from typing import List, Optional

import tensorflow as tf

from graphmod.checkpoint import deltas
from graphmod.embeddings.table import (_restore_from, _TableDeltaSaveable, _TableSaveable,
                                       write_tables)

tf1 = tf.compat.v1


def absolute(path: Optional[str]) -> Optional[str]:
    """A local path made absolute; a URL (gs://, hdfs://, s3://) as it is."""
    return path if not path or "://" in path else os.path.abspath(path)


def part_prefix(checkpoint: str, rank: int, size: int) -> str:
    return f"{checkpoint}.tables-{rank:05d}-of-{size:05d}"


def manifest_path(checkpoint: str) -> str:
    return f"{checkpoint}.tables.json"


def _barrier_input(part: tf.Tensor) -> tf.Tensor:
    """What a barrier's allreduce sums: computed from the fed part name, so
    that Grappler cannot fold the allreduce into a constant (Horovod's ops
    are not stateful), which would leave the ranks unsynchronised."""
    return tf.strings.length(part)


def _fingerprint(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def _refuse_differing(fingerprints, what: str, mine: str) -> None:
    """Raises, on every rank alike (all see the same fingerprints), when
    some rank's fingerprint differs from rank 0's."""
    fingerprints = list(fingerprints)
    differ = [r for r, p in enumerate(fingerprints) if p != fingerprints[0]]
    if differ:
        raise ValueError(
            f"graphmod: ranks {differ} save sharded tables to another {what} than rank 0 "
            f"(this rank: {mine}): every rank writes its keys as a part of one checkpoint, "
            "so give every rank the same model_dir (a shared file system) and the same save "
            "steps")


def overlapping(old_size: int, rank: int, size: int) -> List[int]:
    """The old ranks (of old_size) whose hash ranges overlap rank's (of size)."""
    return [j for j in range(old_size) if j * size < (rank + 1) * old_size
            and rank * old_size < (j + 1) * size]


class TableParts:
    """Reads the parts of sharded tables' checkpoints and deltas into this
    rank's tables, keeping the keys rank (of size) owns: all of them for
    tables that are not sharded (rank 0 of 1: an export, a prediction, a
    restart on one rank). Needs no Horovod."""

    def __init__(self, saveables: List[_TableSaveable], rank: int = 0, size: int = 1):
        self.rank, self.size = rank, size
        # The ranks that wrote the checkpoint last restored, and whether it
        # was sharded (its deltas were written alike).
        self._restored_size, self._restored_sharded = self.size, True
        with tf1.name_scope("graphmod_table_parts"):
            self._clear = tf.group([s.table.clear() for s in saveables])
            self._read = tf1.placeholder(tf.string, [], name="read")
            self._import_own, self._import_mine = self._imports(saveables)

    def _imports(self, saveables):
        """(import of a part this rank owns all of (as many ranks wrote it),
        import of one whose keys other ranks own some of)."""
        rank, size = self.rank, self.size
        own = tf.group([self._import(s, (0, 1)) for s in saveables])
        if size == 1:  # one rank owns every key
            return own, own
        return own, tf.group([self._import(s, (rank, size)) for s in saveables])

    def _import(self, saveable, owner) -> tf.Operation:
        """The import of a part (full or delta) read from self._read, a
        stored slice at a time: the rows whose keys rank owner[0] of
        owner[1] owns. Removals name keys of the part's old rank only: a
        rank that does not hold them removes nothing."""
        return _restore_from(saveable.table, self._read, replace=False,
                             with_removed=isinstance(saveable, _TableDeltaSaveable), part=True,
                             owner=owner)

    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> None:
        """The imports of deltas' parts (graphmod.checkpoint.deltas)."""
        with tf1.name_scope("graphmod_table_parts"):
            self._delta_own, self._delta_mine = self._imports(saveables)

    @staticmethod
    def is_sharded(checkpoint: str) -> bool:
        """Whether the checkpoint's tables were saved in parts."""
        return tf.io.gfile.exists(manifest_path(checkpoint))

    def restore(self, sess, checkpoint: str) -> List[str]:
        """Replaces the tables' contents with the keys this rank owns in the
        checkpoint; returns the parts read."""
        path = manifest_path(checkpoint)
        old = 1
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                old = json.load(f)["ranks"]
            parts = [part_prefix(checkpoint, j, old)
                     for j in overlapping(old, self.rank, self.size)]
        else:
            folder, name = os.path.split(checkpoint)
            if any(f.startswith(name + ".tables-") for f in tf.io.gfile.listdir(folder or ".")):
                raise ValueError(f"graphmod: checkpoint {checkpoint} has parts of sharded "
                                 f"tables but no {os.path.basename(path)}: its save never "
                                 "completed")
            parts = [checkpoint]  # written by one rank: the tables are in the checkpoint
        self._restored_size, self._restored_sharded = old, tf.io.gfile.exists(path)
        sess.run(self._clear)
        imports = self._import_own if old == self.size else self._import_mine
        for part in parts:
            sess.run(imports, {self._read: part})
        return parts

    def restore_delta(self, sess, prefix: str) -> List[str]:
        """Applies this rank's keys of a delta of the full checkpoint last
        restored (the ranks that wrote it wrote its deltas); returns the
        parts read."""
        old = self._restored_size
        parts = ([part_prefix(prefix, j, old) for j in overlapping(old, self.rank, self.size)]
                 if self._restored_sharded else [prefix])
        imports = self._delta_own if old == self.size else self._delta_mine
        for part in parts:
            sess.run(imports, {self._read: part})
        return parts


class ShardedTables(TableParts):
    """The save and restore ops of sharded tables (see the module docstring)."""

    def __init__(self, saveables: List[_TableSaveable]):
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        super().__init__(saveables, hvd.rank(), hvd.size())
        with tf1.name_scope("graphmod_sharded_checkpoint"):
            # Every rank must write to the same checkpoint: compared first.
            self._path = tf1.placeholder(tf.int64, [1], name="path_fingerprint")
            self._paths = hvd.allgather(self._path, name="graphmod_checkpoint_paths")
            self._part = tf1.placeholder(tf.string, [], name="part")
            with tf.control_dependencies([write_tables(saveables, self._part, part=True)]):
                # Returns on every rank once every rank's part is written.
                self._written = hvd.allreduce(_barrier_input(self._part), op=hvd.Sum,
                                              name="graphmod_tables_written")
            # Returns on every rank once rank 0 committed the checkpoint: a
            # rank reading it next (an evaluation) finds it complete.
            self._committed = hvd.allreduce(_barrier_input(self._part), op=hvd.Sum,
                                            name="graphmod_checkpoint_committed")
        # Where rank 0's model_dir is on no file system this rank shares: a
        # graphmod.horovod.part_stream.PartStream and the local folder
        # its parts are written in before they go to rank 0 (set by TableSaver).
        self.stream, self.staging = None, None

    def _write_part(self, sess, written, placeholder, prefix: str, feed=None) -> None:
        """Writes this rank's part of `prefix` (rank 0's name for it) and
        returns once every rank wrote its own; streamed to rank 0 where
        the ranks share no file system."""
        part = part_prefix(prefix, self.rank, self.size)
        if self.stream is None:
            sess.run(written, {**(feed or {}), placeholder: part})
            return
        if self.rank > 0:
            part = os.path.join(self.staging, os.path.basename(part))
        sess.run(written, {**(feed or {}), placeholder: part})
        folder, name = os.path.split(part)
        files = ([os.path.join(folder, f) for f in tf.io.gfile.listdir(folder)
                  if f.startswith(name + ".")] if self.rank > 0 else [])
        self.stream.to_rank0(files, os.path.dirname(prefix))
        for f in files:
            tf.io.gfile.remove(f)

    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> None:
        """The ops of deltas (graphmod.checkpoint.deltas): this rank writes the changes
        to the keys it owns as a part of the delta, all ranks meet once all
        parts are written; a restore imports the parts as the full ones."""
        super().build_deltas(saveables)
        with tf1.name_scope("graphmod_sharded_delta"):
            self._delta_part = tf1.placeholder(tf.string, [], name="part")
            with tf.control_dependencies([write_tables(saveables, self._delta_part, part=True)]):
                import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
                self._delta_written = hvd.allreduce(_barrier_input(self._delta_part),
                                                    op=hvd.Sum,
                                                    name="graphmod_table_deltas_written")
            self._delta_committed = hvd.allreduce(_barrier_input(self._delta_part), op=hvd.Sum,
                                                  name="graphmod_table_delta_committed")

    def wait_committed(self, sess, checkpoint: str) -> None:
        """Returns once every rank called it: after rank 0 has committed the
        checkpoint save() wrote (its manifest, dense variables and state file)."""
        sess.run(self._committed, {self._part: checkpoint})

    def save(self, sess, checkpoint: str) -> None:
        """Writes this rank's part; rank 0 commits the manifest once all are
        (then the rest of the checkpoint, and every rank calls wait_committed)."""
        _refuse_differing(sess.run(self._paths, {
            self._path: [_fingerprint(absolute(checkpoint))]}), "checkpoint", checkpoint)
        if self.rank == 0:
            # Saved again under its name (a resumed run saves the step it
            # restored): its old deltas go, and it is
            # incomplete until the new manifest is written. Only now: every
            # rank has joined the check above, so none is still restoring
            # them. Before the parts are written: once they are, other ranks
            # may write their parts of this checkpoint's first delta.
            deltas.drop(checkpoint)
            uncommit(checkpoint)
        self._write_part(sess, self._written, self._part, checkpoint)
        if self.rank == 0:
            commit(checkpoint, self.size)

    def save_delta(self, sess, base: str, index: int, step: int, feed: dict, save_dense
                   ) -> str:
        """Writes this rank's part of delta `index` after the full
        checkpoint `base`; rank 0 then writes the dense variables' part with
        save_dense(prefix) (None: there are none) and commits the delta in
        the chain's manifest. Every rank calls it at the same step."""
        prefix = os.path.join(deltas.directory(base), deltas.delta_name(index))
        if self.stream is None or self.rank == 0:  # (else written where it streams from)
            tf.io.gfile.makedirs(os.path.dirname(prefix))
        self._write_part(sess, self._delta_written, self._delta_part, prefix, feed)
        if self.rank == 0:
            commit_delta(base, prefix, index, step, self.size, save_dense)
        # Every rank returns once the delta is committed (a restore next reads it).
        sess.run(self._delta_committed, {self._delta_part: prefix})
        return prefix


def uncommit(checkpoint: str) -> None:
    """Before a checkpoint's parts are written: one saved again under its
    name (a resumed run saves the step it restored) is incomplete until its
    new manifest is written."""
    if tf.io.gfile.exists(manifest_path(checkpoint)):
        tf.io.gfile.remove(manifest_path(checkpoint))


def commit(checkpoint: str, size: int) -> None:
    """Commits a checkpoint's tables once all `size` parts are written: its
    manifest (the number of parts and their files), written aside and renamed."""
    folder = os.path.dirname(checkpoint)
    parts = [os.path.basename(part_prefix(checkpoint, r, size)) for r in range(size)]
    missing = [r for r, p in enumerate(parts)
               if not tf.io.gfile.exists(os.path.join(folder, p + ".index"))]
    if missing:
        raise RuntimeError(f"graphmod: the parts {missing} of {checkpoint} are missing after "
                           "every part was written (is model_dir a file system every rank or "
                           "ps task shares?)")
    files = sorted(f for f in tf.io.gfile.listdir(folder or ".")
                   if any(f.startswith(p + ".") for p in parts))
    tmp = manifest_path(checkpoint) + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(dict(format=1, ranks=size, files=files), f, indent=1)
    tf.io.gfile.rename(tmp, manifest_path(checkpoint), overwrite=True)
    # Parts an earlier save under this name wrote on another number of ranks.
    name = os.path.basename(checkpoint)
    for f in tf.io.gfile.listdir(folder or "."):
        match = _PART_FILE.fullmatch(f)
        if match and match[1] == name and ".tables-" in f and f not in files:
            tf.io.gfile.remove(os.path.join(folder, f))


def commit_delta(base: str, prefix: str, index: int, step: int, size: int, save_dense) -> None:
    """Commits delta `index` of `base` once all `size` parts are written: the
    dense variables' part (save_dense(prefix); None: there are none), then
    the chain's manifest."""
    missing = [r for r in range(size) if not tf.io.gfile.exists(
        part_prefix(prefix, r, size) + ".index")]
    if missing:
        raise RuntimeError(f"graphmod: the parts {missing} of delta {prefix} are missing "
                           "after every part was written (is model_dir a file system every "
                           "rank or ps task shares?)")
    tmp = None
    if save_dense is not None:
        tmp = deltas.temp_prefix(base, index)
        try:
            save_dense(tmp)
        except Exception:
            deltas.discard(tmp)
            raise
    deltas.publish(base, tmp, index, step)


def remove_parts(checkpoint: str) -> None:
    """Removes a checkpoint's sharded tables (its manifest first, so that it
    is never read half removed): a save under the same name that writes the
    tables otherwise (one rank, unsharded) replaces them."""
    if tf.io.gfile.exists(manifest_path(checkpoint)):
        tf.io.gfile.remove(manifest_path(checkpoint))
    folder, name = os.path.split(checkpoint)
    for f in tf.io.gfile.listdir(folder or "."):
        match = _PART_FILE.fullmatch(f)
        if match and match[1] == name:
            tf.io.gfile.remove(os.path.join(folder, f))


def remove_orphans(folder: str) -> None:
    """Removes the parts and manifests of checkpoints the Saver deleted."""
    for name in tf.io.gfile.listdir(folder or "."):
        match = _PART_FILE.fullmatch(name)
        if match and not tf.io.gfile.exists(os.path.join(folder, match[1] + ".index")):
            tf.io.gfile.remove(os.path.join(folder, name))


# A file of a checkpoint's sharded tables: group 1 is the checkpoint's name.
_PART_FILE = re.compile(r"(.+)\.tables(?:-\d{5}-of-\d{5}\.(?:index|data-\d{5}-of-\d{5})"
                        r"|\.json(?:\.tmp)?)")
