"""Files of checkpoints' parts sent between Horovod ranks that share no file system.

Where rank 0's model_dir is not on a file system every rank sees
(graphmod.horovod.save_schedule finds out), a rank > 0 writes its part
of a checkpoint or delta into a local staging folder (one table shard at a
time, as always) and PartStream.to_rank0 sends the part's files to rank 0,
which writes them beside its own part, before it commits the checkpoint;
a restore on a rank > 0 reads rank 0's checkpoint (and its deltas) from a
local copy rank 0 sent it (PartStream.from_rank0). Files travel in chunks of
at most CHUNK bytes: what a rank holds of them in memory at once.

Every rank calls each method at the same point (they are collectives), in a
graph and session of their own, beside the training's.
"""
import json
import os
from typing import Dict, List

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

CHUNK = 16 << 20


class PartStream:
    """The collectives that carry files (see the module docstring)."""

    def __init__(self):
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
        self.rank, self.size = hvd.rank(), hvd.size()
        self._graph = tf.Graph()
        with self._graph.as_default():
            # Placeholders: collectives with constant inputs run while the
            # graph is built (docs/notes/horovod_0.28.1_facts.md).
            self._length = tf1.placeholder(tf.int64, [1])
            self._bytes = tf1.placeholder(tf.uint8, [None])
            self._splits = tf1.placeholder(tf.int32, [self.size])
            self._lengths = hvd.allgather(self._length, name="graphmod_stream_listing_sizes")
            self._listings = hvd.allgather(self._bytes, name="graphmod_stream_listing")
            self._to_rank0 = hvd.alltoall(self._bytes, splits=self._splits,
                                          name="graphmod_stream_to_rank0")[0]
            self._from_rank0 = hvd.broadcast(self._bytes, root_rank=0,
                                             name="graphmod_stream_from_rank0")
        self._sess = tf1.Session(graph=self._graph)

    def close(self) -> None:
        self._sess.close()

    def _gather(self, obj) -> list:
        data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        sizes, got = self._sess.run([self._lengths, self._listings],
                                    {self._length: [len(data)], self._bytes: data})
        ends = np.cumsum(sizes)
        return [json.loads(got[end - n:end].tobytes().decode()) for n, end in zip(sizes, ends)]

    @staticmethod
    def _chunks(listing: List[list]) -> List[tuple]:
        """(file index, offset, length) of each chunk of [name, size] files."""
        return [(i, offset, min(CHUNK, size - offset)) for i, (_, size) in enumerate(listing)
                for offset in range(0, max(size, 1), CHUNK)]

    def to_rank0(self, files: List[str], folder: str) -> None:
        """Sends files (local paths; rank 0 gives none) to rank 0, which
        writes them under their names into folder."""
        listing = [[os.path.basename(f), tf.io.gfile.stat(f).length] for f in files]
        every = self._gather(listing)
        chunks = [self._chunks(l) for l in every]
        outputs = {}
        try:
            for round_ in range(max(len(c) for c in chunks)):
                sent, splits = np.zeros([0], np.uint8), np.zeros([self.size], np.int32)
                if round_ < len(chunks[self.rank]):
                    i, offset, length = chunks[self.rank][round_]
                    with tf.io.gfile.GFile(files[i], "rb") as f:
                        f.seek(offset)
                        sent = np.frombuffer(f.read(length), np.uint8)
                    splits[0] = len(sent)
                got = self._sess.run(self._to_rank0, {self._bytes: sent, self._splits: splits})
                if self.rank != 0:
                    continue
                start = 0  # the ranks' chunks of this round, in rank order
                for r, rank_chunks in enumerate(chunks):
                    if round_ >= len(rank_chunks):
                        continue
                    i, _, length = rank_chunks[round_]
                    name = every[r][i][0]
                    if (r, name) not in outputs:  # written under a temporary name
                        outputs[(r, name)] = tf.io.gfile.GFile(
                            os.path.join(folder, name + ".stream-tmp"), "wb")
                    outputs[(r, name)].write(got[start:start + length].tobytes())
                    start += length
        finally:
            for f in outputs.values():
                f.close()
        for (_, name) in outputs:  # complete: under their names
            tf.io.gfile.rename(os.path.join(folder, name + ".stream-tmp"),
                               os.path.join(folder, name), overwrite=True)

    def from_rank0(self, files: Dict[str, str], folder: str) -> List[str]:
        """Rank 0's files ({relative name: its path}; the other ranks give
        none) copied into folder on every rank > 0 under their relative
        names; returns the names."""
        listing = self._gather([[name, tf.io.gfile.stat(path).length]
                                for name, path in sorted(files.items())])[0]
        paths = dict(sorted(files.items()))
        for name, size in listing:
            if self.rank:
                target = os.path.join(folder, name)
                tf.io.gfile.makedirs(os.path.dirname(target))
            with (tf.io.gfile.GFile(paths[name], "rb") if self.rank == 0
                  else tf.io.gfile.GFile(target, "wb")) as f:
                for offset in range(0, max(size, 1), CHUNK):
                    length = min(CHUNK, size - offset)
                    data = (np.frombuffer(f.read(length), np.uint8) if self.rank == 0
                            else np.zeros([length], np.uint8))
                    got = self._sess.run(self._from_rank0, {self._bytes: data})
                    if self.rank:
                        f.write(got.tobytes())
        return [name for name, _ in listing]
