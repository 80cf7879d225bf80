"""The chain of incremental checkpoints (deltas) after a full checkpoint.

Each full checkpoint `<dir>/model.ckpt-100` may have a chain of deltas in
`<dir>/graphmod/deltas/model.ckpt-100/`:
  manifest.json                        the committed deltas, in order, with checksums
  delta-000001.index, .data-00000-of-00002 ...  each a TF checkpoint (graphmod.checkpoint.saver)
A delta is written under a temporary name, checksummed, renamed to its name,
and only then listed in the manifest, which is itself replaced by an atomic
rename: the manifest is the commit point. A crash at any moment leaves the
manifest listing complete deltas only (stray files are removed when the chain
continues); a delta whose files are missing or differ from their checksums
is reported, and a restore stops before it.

>>> for prefix in deltas.committed("/model/model.ckpt-100"): ...
"""
import json
import os
import re
import uuid
import zlib
from typing import List, Optional

import tensorflow as tf
from absl import logging

FORMAT = 1


def directory(base: str) -> str:
    """Where the deltas of the full checkpoint at prefix `base` live."""
    head, name = os.path.split(base)
    return os.path.join(head, "graphmod", "deltas", name)


def delta_name(index: int) -> str:
    return f"delta-{index:06d}"


def _crc(path: str) -> int:
    crc = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return crc
            crc = zlib.crc32(block, crc)


def _sync(path: str) -> None:
    """Flushes a local file (or directory) to disk; other file systems'
    writes are durable once closed."""
    if "://" in path:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files(prefix: str) -> List[str]:
    """The files of the checkpoint at `prefix`: its index and data files
    (the tables' part and the rest's, graphmod.checkpoint.saver)."""
    folder, name = os.path.split(prefix)
    data = re.compile(re.escape(name) + r"\.data-\d{5}-of-\d{5}")
    return [prefix + ".index"] + sorted(os.path.join(folder, f)
                                        for f in tf.io.gfile.listdir(folder)
                                        if data.fullmatch(f))


def read_manifest(base: str) -> List[dict]:
    """The committed deltas of `base` (none when there is no manifest; an
    unreadable one is reported and counts as none)."""
    path = os.path.join(directory(base), "manifest.json")
    if not tf.io.gfile.exists(path):
        return []
    try:
        with tf.io.gfile.GFile(path) as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')}, this graphmod reads {FORMAT}")
        return list(manifest["deltas"])
    except (ValueError, KeyError, TypeError) as e:
        logging.error("graphmod: the delta manifest %s is unreadable (%s): restoring %s "
                      "without its deltas", path, e, base)
        return []


def _write_manifest(base: str, entries: List[dict]) -> None:
    folder = directory(base)
    path = os.path.join(folder, "manifest.json")
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(dict(format=FORMAT, base=os.path.basename(base), deltas=entries), f, indent=1)
    _sync(tmp)
    tf.io.gfile.rename(tmp, path, overwrite=True)
    _sync(folder)


def committed(base: str, entries: Optional[List[dict]] = None) -> List[str]:
    """Prefixes of `base`'s deltas to apply in order: the manifest's, up to
    the first whose files are missing or fail their checksums (reported).
    entries: the manifest as the caller already read it (read_manifest), so
    that what it lists and what this verifies are one reading of a chain the
    training may extend meanwhile; None reads it here."""
    out = []
    folder = directory(base)
    entries = read_manifest(base) if entries is None else entries
    for i, entry in enumerate(entries):
        prefix = os.path.join(folder, entry["name"])
        bad = [name for name, crc in entry["files"].items()
               if not tf.io.gfile.exists(os.path.join(folder, name))
               or _crc(os.path.join(folder, name)) != crc]
        if bad:
            logging.error("graphmod: delta %s of %s is torn or corrupt (%s fail their "
                          "checksums): the restore stops at the delta before it (%d of %d "
                          "applied)", entry["name"], base, ", ".join(bad), i, len(entries))
            break
        out.append(prefix)
    return out


def temp_prefix(base: str, index: int) -> str:
    folder = directory(base)
    tf.io.gfile.makedirs(folder)
    return os.path.join(folder, f".tmp-{delta_name(index)}-{uuid.uuid4().hex[:8]}")


def part_files(prefix: str) -> List[str]:
    """The files of the tables' parts of the delta at `prefix`
    (graphmod.checkpoint.parts), every owner's."""
    folder, name = os.path.split(prefix)
    part = re.compile(re.escape(name) + r"\.tables-\d{5}-of-\d{5}\.(index|data-\d{5}-of-\d{5})")
    return sorted(os.path.join(folder, f) for f in tf.io.gfile.listdir(folder)
                  if part.fullmatch(f))


def publish(base: str, tmp: Optional[str], index: int, step: int) -> str:
    """Renames the delta written at prefix `tmp` to delta `index` of `base`
    and commits it in the manifest, with the tables' parts already
    written under its name (part_files); returns its prefix. tmp None: the
    delta is those parts alone."""
    folder = directory(base)
    entries = read_manifest(base)
    if len(entries) != index - 1:
        raise RuntimeError(f"graphmod: delta {index} of {base} would follow {len(entries)} "
                           f"committed deltas")
    name = delta_name(index)
    crcs = {}
    for path in files(tmp) if tmp is not None else []:
        target = name + path[len(tmp):]
        _sync(path)
        crcs[target] = _crc(path)
        tf.io.gfile.rename(path, os.path.join(folder, target), overwrite=True)
    for path in part_files(os.path.join(folder, name)):
        _sync(path)
        crcs[os.path.basename(path)] = _crc(path)
    _write_manifest(base, entries + [dict(name=name, step=int(step), files=crcs)])
    return os.path.join(folder, name)


def discard(tmp: str) -> None:
    """Removes a delta's half-written temporary files (and the folder its
    parts are written to before they are merged, graphmod.checkpoint.saver)."""
    for path in files(tmp):
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    if tf.io.gfile.isdir(tmp + "_temp"):
        tf.io.gfile.rmtree(tmp + "_temp")


def truncate(base: str, keep: int) -> None:
    """Continues `base`'s chain after its first `keep` deltas: the manifest
    lists only those, and every other file in the folder (deltas after them,
    half-written temporaries) is removed."""
    folder = directory(base)
    if not tf.io.gfile.isdir(folder):
        return
    committed_entries = read_manifest(base)
    entries = committed_entries[:keep]
    if len(entries) != len(committed_entries):
        _write_manifest(base, entries)
    kept = {name for e in entries for name in e["files"]} | {"manifest.json"}
    for name in tf.io.gfile.listdir(folder):
        path = os.path.join(folder, name.rstrip("/"))
        if name.rstrip("/") in kept:
            continue
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)


def drop(base: str) -> None:
    """Removes every delta of `base` (its full checkpoint was written again)."""
    folder = directory(base)
    if tf.io.gfile.isdir(folder):
        tf.io.gfile.rmtree(folder)


def remove_orphans(checkpoint_dir: str) -> List[str]:
    """Removes the delta chains whose full checkpoint is gone (deleted by the
    Saver's max_to_keep); returns their names."""
    root = os.path.join(checkpoint_dir, "graphmod", "deltas")
    if not tf.io.gfile.isdir(root):
        return []
    gone = []
    for name in tf.io.gfile.listdir(root):
        name = name.rstrip("/")
        if not tf.io.gfile.exists(os.path.join(checkpoint_dir, name) + ".index"):
            tf.io.gfile.rmtree(os.path.join(root, name))
            gone.append(name)
    return gone

