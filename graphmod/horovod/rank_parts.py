"""The part layout of tables split across Horovod ranks (graphmod.checkpoint.parts).

A save runs on every rank at once (TableSaver; under GraphModifierHook at
rank 0's save steps, into rank 0's model_dir: graphmod.horovod.save_schedule):
rank r writes the keys it owns as part r of the checkpoint (of a table every
rank holds whole, graphmod.horovod.placement's "replicated", too: its copy's
keys that rank r owns, so parts are hash ranges whatever the placement, and
a restore reads them into any other), all ranks meet
in an allreduce once their parts are written, and rank 0 then commits the
manifest before its Saver writes the dense variables and the `checkpoint`
state file; deltas alike.
"""
import hashlib
import os
from typing import List, Optional

import tensorflow as tf

from graphmod.checkpoint import deltas
from graphmod.checkpoint.parts import (PartLayout, TableParts, absolute, commit, commit_delta,
                                       manifest_path, part_prefix)
from graphmod.embeddings.table import _TableDeltaSaveable, _TableSaveable, write_tables
from graphmod.state import graph_state

tf1 = tf.compat.v1


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


class RankParts(PartLayout):
    """Each Horovod rank saves and restores the part it owns (see the module
    docstring). rank0_dir: where every rank's save goes, rank 0's model_dir
    (None: the path TableSaver.save is given); stream: where rank 0's
    model_dir is on no file system this rank shares, (a
    graphmod.horovod.part_stream.PartStream, the local folder its parts are
    written in before they go to rank 0)."""
    collective = True

    def __init__(self, saveables: List[_TableSaveable], rank0_dir: Optional[str] = None,
                 stream: Optional[tuple] = None):
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        self.rank, self.size = hvd.rank(), hvd.size()
        self.whose = f"rank {self.rank} of {self.size}"
        # Tables every rank holds whole read every part (a reader of their
        # own, where there are any); the rest, their owner's.
        self.replicated = graph_state().replicated
        self.readers = [TableParts(self._of(saveables, False), self.rank, self.size)]
        if self._of(saveables, True):
            self.readers.append(TableParts(self._of(saveables, True)))
        self.rank0_dir = rank0_dir
        self.stream, self.staging = stream or (None, None)
        with tf1.name_scope("graphmod_sharded_checkpoint"):
            # Every rank must write to the same checkpoint: compared first.
            self._path = tf1.placeholder(tf.int64, [1], name="path_fingerprint")
            self._paths = hvd.allgather(self._path, name="graphmod_checkpoint_paths")
            self._part = tf1.placeholder(tf.string, [], name="part")
            with tf.control_dependencies([self._write(saveables, self._part)]):
                # Returns on every rank once every rank's part is written.
                self._written = hvd.allreduce(_barrier_input(self._part), op=hvd.Sum,
                                              name="graphmod_tables_written")
            # Returns on every rank once rank 0 committed the checkpoint: a
            # rank reading it next (an evaluation) finds it complete.
            self._committed = hvd.allreduce(_barrier_input(self._part), op=hvd.Sum,
                                            name="graphmod_checkpoint_committed")

    def _of(self, saveables, replicated: bool) -> list:
        return [s for s in saveables if (s.table.name in self.replicated) == replicated]

    def _write(self, saveables, part: tf.Tensor) -> tf.Operation:
        """Writes the keys this rank owns of every table, replicated or not."""
        return write_tables(saveables, part, part=True,
                            owned_only=[s.table.name in self.replicated for s in saveables],
                            owner=(self.rank, self.size))

    def owned_parts(self, table) -> list:
        if table.name in self.replicated:
            return [(table, 0, 1)]  # every key
        return [(table, self.rank, self.size)]  # this rank's part, of the keys it owns

    def where(self, save_path: str) -> str:
        # Every rank writes its part into rank 0's model_dir, whatever its own.
        return os.path.join(self.rank0_dir, os.path.basename(save_path)) if self.rank0_dir \
            else save_path

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

    def build_deltas(self, saveables: List[_TableDeltaSaveable]) -> list:
        """This rank writes the changes to the keys it owns as a part of the
        delta, all ranks meet once all parts are written."""
        for reader, replicated in zip(self.readers, (False, True)):  # (the second, if any)
            reader.build_deltas(self._of(saveables, replicated))
        with tf1.name_scope("graphmod_sharded_delta"):
            self._delta_part = tf1.placeholder(tf.string, [], name="part")
            with tf.control_dependencies([self._write(saveables, self._delta_part)]):
                import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
                self._delta_written = hvd.allreduce(_barrier_input(self._delta_part),
                                                    op=hvd.Sum,
                                                    name="graphmod_table_deltas_written")
            self._delta_committed = hvd.allreduce(_barrier_input(self._delta_part), op=hvd.Sum,
                                                  name="graphmod_table_delta_committed")
        return []

    def save(self, sess, checkpoint: str) -> str:
        """Writes this rank's part; rank 0 commits the manifest once all are
        (then the rest of the checkpoint, and every rank waits in saved())."""
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
            if tf.io.gfile.exists(manifest_path(checkpoint)):
                tf.io.gfile.remove(manifest_path(checkpoint))
        self._write_part(sess, self._written, self._part, checkpoint)
        if self.rank == 0:
            commit(checkpoint, self.size)
        return checkpoint

    def saved(self, sess, path: Optional[str]) -> None:
        """Returns once every rank called it: after rank 0 has committed the
        checkpoint (its manifest, dense variables and state file)."""
        sess.run(self._committed, {self._part: path})

    def save_delta(self, sess, base: str, index: int, step: int, feed: dict, save_rest) -> str:
        """Rank 0 writes the rest and commits the delta. Every rank calls it
        at the same step."""
        prefix = os.path.join(deltas.directory(base), deltas.delta_name(index))
        if self.stream is None or self.rank == 0:  # (else written where it streams from)
            tf.io.gfile.makedirs(os.path.dirname(prefix))
        self._write_part(sess, self._delta_written, self._delta_part, prefix, feed)
        if self.rank == 0:
            commit_delta(base, index, step, self.size, save_rest)
        # Every rank returns once the delta is committed (a restore next reads it).
        sess.run(self._delta_committed, {self._delta_part: prefix})
        return prefix
