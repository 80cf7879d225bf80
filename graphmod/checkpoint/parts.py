"""Checkpoints of tables in parts, and the part layouts TableSaver delegates to.

Where a TableSaver's tables live in its checkpoints is its PartLayout: in
one process (OneProcess), in the checkpoint itself; when tables are
split by key (graphmod.embeddings.partition) over owners, Horovod
ranks (graphmod.horovod.rank_parts.RankParts) or ps tasks
(graphmod.ps.tables.PsParts), each owner writes the keys it owns as a part
of the checkpoint, `<checkpoint>.tables-0000r-of-0000N` (the tables' usual
entries, written a chunk of rows at a time), and once every part is written
`<checkpoint>.tables.json` (the number of parts and their files) commits
them, before the chief's Saver writes the dense variables and the
`checkpoint` state file; deltas alike. A checkpoint without its manifest
was never complete: TableSaver's restore refuses it, naming it.

A restore on M owners (any M, one process included) has owner m read only
the parts whose hash ranges overlap its own and import the keys it owns:
with M == N exactly its own part. A checkpoint whose tables are in it
restores as one part. Admission sketches are restored when M == N only
(each owner's counted its own keys).
"""
import abc
import json
import os
import re
from typing import List, Optional

import tensorflow as tf

from graphmod.checkpoint import deltas
from graphmod.embeddings.table import _restore_from, _TableDeltaSaveable, _TableSaveable

tf1 = tf.compat.v1


def absolute(path: Optional[str]) -> Optional[str]:
    """A local path made absolute; a URL (gs://, hdfs://, s3://) as it is."""
    return path if not path or "://" in path else os.path.abspath(path)


def part_prefix(checkpoint: str, owner: int, owners: int) -> str:
    return f"{checkpoint}.tables-{owner:05d}-of-{owners:05d}"


def manifest_path(checkpoint: str) -> str:
    return f"{checkpoint}.tables.json"


def has_parts(checkpoint: str) -> bool:
    """Whether a part of checkpoint's tables is in its folder."""
    return any(".tables-" in f for f in _own_part_files(checkpoint))


def overlapping(old_size: int, rank: int, size: int) -> List[int]:
    """The old owners (of old_size) whose hash ranges overlap owner rank's (of size)."""
    return [j for j in range(old_size) if j * size < (rank + 1) * old_size
            and rank * old_size < (j + 1) * size]


class TableParts:
    """Reads the parts of checkpoints and deltas into these tables, keeping
    the keys owner rank (of size) owns: all of them in one process (rank 0
    of 1: an export, a prediction, a restart on one rank). Needs no Horovod."""
    def __init__(self, saveables: List[_TableSaveable], rank: int = 0, size: int = 1):
        self.rank, self.size = rank, size
        # How many owners wrote the checkpoint last restored, and whether in
        # parts (its deltas were written alike).
        self._restored_size, self._restored_in_parts = self.size, True
        with tf1.name_scope("graphmod_table_parts"):
            self._clear = tf.group([s.table.clear() for s in saveables])
            self._read = tf1.placeholder(tf.string, [], name="read")
            self._import_own, self._import_mine = self._imports(saveables)

    def _imports(self, saveables):
        """(import of a part this owner owns all of (as many owners wrote it),
        import of one whose keys other owners own some of)."""
        rank, size = self.rank, self.size
        own = tf.group([self._import(s, (0, 1)) for s in saveables])
        if size == 1:  # one owner owns every key
            return own, own
        return own, tf.group([self._import(s, (rank, size)) for s in saveables])

    def _import(self, saveable, owner) -> tf.Operation:
        """The import of a part (full or delta) read from self._read, a
        stored slice at a time: the rows whose keys owner[0] of owner[1]
        owns. Removals name keys of the part's old owner only: an owner
        that does not hold them removes nothing."""
        return _restore_from(saveable.table, self._read, replace=False,
                             with_removed=isinstance(saveable, _TableDeltaSaveable), part=True,
                             owner=owner)

    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> None:
        """The imports of deltas' parts (graphmod.checkpoint.deltas)."""
        with tf1.name_scope("graphmod_table_parts"):
            self._delta_own, self._delta_mine = self._imports(saveables)

    @staticmethod
    def in_parts(checkpoint: str) -> bool:
        """Whether the checkpoint's tables were saved in parts."""
        return tf.io.gfile.exists(manifest_path(checkpoint))

    def restore(self, sess, checkpoint: str) -> List[str]:
        """Replaces the tables' contents with the keys this owner owns in the
        checkpoint; returns the parts read."""
        path = manifest_path(checkpoint)
        old, in_parts = 1, tf.io.gfile.exists(path)
        if in_parts:
            with tf.io.gfile.GFile(path) as f:
                old = json.load(f)["ranks"]
            parts = [part_prefix(checkpoint, j, old)
                     for j in overlapping(old, self.rank, self.size)]
        elif has_parts(checkpoint):
            raise ValueError(f"graphmod: checkpoint {checkpoint} has table parts "
                             f"but no {os.path.basename(path)}: its save never "
                             "completed")
        else:
            parts = [checkpoint]  # written by one process: the tables are in the checkpoint
        self._restored_size, self._restored_in_parts = old, in_parts
        sess.run(self._clear)
        imports = self._import_own if old == self.size else self._import_mine
        for part in parts:
            sess.run(imports, {self._read: part})
        return parts

    def restore_delta(self, sess, prefix: str) -> List[str]:
        """Applies this owner's keys of a delta of the full checkpoint last
        restored (the owners that wrote it wrote its deltas); returns the
        parts read."""
        old = self._restored_size
        parts = ([part_prefix(prefix, j, old) for j in overlapping(old, self.rank, self.size)]
                 if self._restored_in_parts else [prefix])
        imports = self._delta_own if old == self.size else self._delta_mine
        for part in parts:
            sess.run(imports, {self._read: part})
        return parts


class PartLayout(abc.ABC):
    """Where a TableSaver's tables live in its checkpoints (see the module
    docstring): what TableSaver delegates to, picked once when it is built.
    A new layout implements build_deltas, save and save_delta; the rest
    here is what the layouts of owners' parts share (adoption reads parts_of)."""
    rank = 0  # this process's owner; owner 0 also saves the rest of the checkpoint
    collective = False  # every process saves, and writes deltas, at the same steps
    apart = True  # the tables are in parts beside the checkpoint: the Saver holds the rest
    readers: List[TableParts] = []  # the parts' readers, an owner's keys each
    whose = "rank 0 of 1"  # whose keys a restore reads, as logged

    def where(self, save_path: str) -> str:
        """Where this process saves what TableSaver.save is told to save at save_path."""
        return save_path

    def parts_of(self, table) -> list:
        """The table's parts in this graph, in owner order (one: all of it)."""
        return [table]

    def owned_parts(self, table) -> list:
        """(part, its owner, of how many owners) of the table's parts in this
        graph: whose keys each holds (adoption imports only those)."""
        parts = self.parts_of(table)
        return [(part, owner, len(parts)) for owner, part in enumerate(parts)]

    @abc.abstractmethod
    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> list:
        """Builds the deltas' parts from the tables' delta saveables (each
        part's own); returns those the delta Saver holds beside the dense
        variables."""

    @abc.abstractmethod
    def save(self, sess, checkpoint: str) -> Optional[str]:
        """Before the Saver saves the rest: writes this process's parts of
        the tables (and commits them); returns the checkpoint (None: the
        Saver writes the tables)."""

    def saved(self, sess, path: Optional[str]) -> None:
        """After the Saver saved the rest at path (None: nothing saved)."""

    @abc.abstractmethod
    def save_delta(self, sess, base: str, index: int, step: int, feed: dict,
                   save_rest) -> str:
        """Writes delta `index` after the full checkpoint `base`: this
        process's parts (the tables' changes, fed the marks in feed), then
        the rest with save_rest(prefix) (None: there is none), then the
        chain's manifest commits it; returns its prefix."""

    def parted(self, checkpoint: str) -> bool:
        """Whether this layout reads the checkpoint's tables from parts."""
        return TableParts.in_parts(checkpoint)

    def restore(self, sess, checkpoint: str) -> Optional[List[str]]:
        """The keys this process's parts own, from the checkpoint; returns
        the parts read (None: the Saver restores the tables)."""
        return sorted({p for reader in self.readers for p in reader.restore(sess, checkpoint)})

    def restore_delta(self, sess, prefix: str) -> None:
        for reader in self.readers:
            reader.restore_delta(sess, prefix)


class OneProcess(PartLayout):
    """One process: the tables are in the checkpoint itself, saved and
    restored by the Saver with the rest; with `saveables`, checkpoints
    whose tables are in parts restore into them too, which then hold
    every owner's keys."""
    apart = False

    def __init__(self, saveables: Optional[List[_TableSaveable]] = None):
        self.readers = [TableParts(saveables)] if saveables else []

    def build_deltas(self, saveables):
        for reader in self.readers:
            reader.build_deltas(saveables)
        return saveables

    def save(self, sess, checkpoint):
        return None

    def saved(self, sess, path):
        if path:
            # A checkpoint written again under its name (a resumed run saves
            # the step it restored) holds what its old deltas added, and its
            # tables (in parts before) are in it now.
            deltas.drop(path)
            remove_parts(path)

    def save_delta(self, sess, base, index, step, feed, save_rest):
        return commit_delta(base, index, step, 0, save_rest)

    def parted(self, checkpoint):
        return bool(self.readers) and super().parted(checkpoint)

    def restore(self, sess, checkpoint):
        return super().restore(sess, checkpoint) if self.parted(checkpoint) else None


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
    # Parts an earlier save under this name wrote on another number of owners.
    for f in _own_part_files(checkpoint):
        if ".tables-" in f and f not in files:
            tf.io.gfile.remove(os.path.join(folder, f))


def commit_delta(base: str, index: int, step: int, size: int, save_rest) -> str:
    """Commits delta `index` of `base` once all `size` parts are written
    (none: the tables' changes are in the rest): the rest
    (save_rest(prefix); None: there is none), then the chain's manifest;
    returns the delta's prefix."""
    prefix = os.path.join(deltas.directory(base), deltas.delta_name(index))
    missing = [r for r in range(size) if not tf.io.gfile.exists(
        part_prefix(prefix, r, size) + ".index")]
    if missing:
        raise RuntimeError(f"graphmod: the parts {missing} of delta {prefix} are missing "
                           "after every part was written (is model_dir a file system every "
                           "rank or ps task shares?)")
    tmp = deltas.temp_prefix(base, index) if save_rest is not None else None
    try:
        if tmp is not None:
            save_rest(tmp)
        return deltas.publish(base, tmp, index, step)
    except Exception:
        if tmp is not None:
            deltas.discard(tmp)  # the chain stays as it was; the next delta covers this one
        raise


def remove_parts(checkpoint: str) -> None:
    """Removes a checkpoint's table parts (its manifest first, so that it
    is never read half removed): a save under the same name that writes the
    tables in the checkpoint (one process) replaces them."""
    if tf.io.gfile.exists(manifest_path(checkpoint)):
        tf.io.gfile.remove(manifest_path(checkpoint))
    folder = os.path.dirname(checkpoint)
    for f in _own_part_files(checkpoint):
        tf.io.gfile.remove(os.path.join(folder, f))


def remove_orphans(folder: str) -> None:
    """Removes the parts and manifests of checkpoints the Saver deleted."""
    for name in tf.io.gfile.listdir(folder or "."):
        match = _PART_FILE.fullmatch(name)
        if match and not tf.io.gfile.exists(os.path.join(folder, match[1] + ".index")):
            tf.io.gfile.remove(os.path.join(folder, name))


def _own_part_files(checkpoint: str) -> List[str]:
    """The names of checkpoint's table parts and manifest in its folder."""
    folder, name = os.path.split(checkpoint)
    try:
        listed = tf.io.gfile.listdir(folder or ".")
    except tf.errors.NotFoundError:
        return []
    return [f for f in listed if (m := _PART_FILE.fullmatch(f)) and m[1] == name]


# A file of a checkpoint's table parts: group 1 is the checkpoint's name.
_PART_FILE = re.compile(r"(.+)\.tables(?:-\d{5}-of-\d{5}\.(?:index|data-\d{5}-of-\d{5})"
                        r"|\.json(?:\.tmp)?)")
