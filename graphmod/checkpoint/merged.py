"""The state a model_dir holds, as one plain checkpoint.

A model_dir's latest state is its latest full checkpoint, the committed
deltas after it (graphmod.checkpoint.deltas) and, for tables split across
Horovod ranks or ps tasks, every owner's part (graphmod.checkpoint.parts). This
restores all of it into a stand-in graph of the checkpoint's own variables
and tables and saves it as one checkpoint of the usual entries (`<table>-keys`,
`-values`, ... and each variable by name): what `graphmod ckpt compact`
writes into the model_dir and what a portable export reads its state from.

>>> state = latest("/models/ctr")          # which checkpoint, deltas, step
>>> write(state, "/tmp/merged/model.ckpt")  # one checkpoint of all of it

A table whose rows take more than STAND_IN_BUDGET bytes passes through a
stand-in table with a disk tier (that much in memory, the rest in a scratch
directory beside the output); restores and saves stream, so a table larger
than memory merges.
"""
import dataclasses
import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from graphmod.embeddings import stored_rows

tf1 = tf.compat.v1

# Bytes of rows a stand-in table keeps in memory; beyond it rows wait on disk.
STAND_IN_BUDGET = 256 << 20


class StateError(ValueError):
    """A model_dir whose state cannot be read; the message is one line naming
    the file and why."""


class NoCheckpoint(StateError):
    """A model_dir that holds no checkpoint (yet)."""


@dataclasses.dataclass(frozen=True)
class State:
    """A model_dir's latest state: its full checkpoint, the deltas a restore
    applies after it, and the global step of the last of them."""
    checkpoint: str
    deltas: List[str]
    step: int


def latest_checkpoint(model_dir: str) -> Optional[str]:
    """tf.train.latest_checkpoint, except that a `checkpoint` state file that
    cannot be read is a StateError naming it (TensorFlow logs its parse
    error and answers None, as if the folder held no checkpoint)."""
    from google.protobuf import text_format  # pylint: disable=import-outside-toplevel
    from tensorflow.python.training import checkpoint_state_pb2  # pylint: disable=import-outside-toplevel
    state_file = os.path.join(model_dir, "checkpoint")
    if tf.io.gfile.exists(state_file):
        try:
            with tf.io.gfile.GFile(state_file) as f:
                text_format.Parse(f.read(), checkpoint_state_pb2.CheckpointState())
        except (text_format.ParseError, UnicodeDecodeError, tf.errors.OpError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise StateError(f"{state_file}: cannot be read ({first[:200]})") from None
    return tf.train.latest_checkpoint(model_dir)


def latest(model_dir: str) -> State:
    """The latest full checkpoint of model_dir and its committed deltas. A
    delta the manifest lists but whose files are torn is an error here (a
    training restore stops before it; an export must not pass off an older
    state as the latest)."""
    from graphmod.checkpoint import deltas  # pylint: disable=import-outside-toplevel
    if not tf.io.gfile.isdir(model_dir):
        raise NoCheckpoint(f"{model_dir}: no such directory")
    checkpoint = latest_checkpoint(model_dir)
    if checkpoint is None:
        raise NoCheckpoint(f"{model_dir}: holds no checkpoint")
    listed = deltas.read_manifest(checkpoint)
    good = deltas.committed(checkpoint, listed)  # one reading: the training may commit meanwhile
    if len(good) < len(listed):
        raise StateError(f"{deltas.directory(checkpoint)}: delta {listed[len(good)]['name']} "
                         f"of {os.path.basename(checkpoint)} is torn (its files are missing or "
                         "fail their checksums)")
    step = listed[len(good) - 1]["step"] if good else int(checkpoint.rsplit("-", 1)[1])
    return State(checkpoint, good, int(step))


def table_entries(checkpoint: str) -> Dict[str, dict]:
    """{table: {entry: shape}} of a checkpoint's tables (its parts' too)."""
    from graphmod.checkpoint.parts import TableParts, manifest_path  # pylint: disable=import-outside-toplevel
    readers = [checkpoint]
    if TableParts.in_parts(checkpoint):
        with tf.io.gfile.GFile(manifest_path(checkpoint)) as f:
            manifest = json.load(f)
        folder = os.path.dirname(checkpoint)
        readers = sorted({os.path.join(folder, name.rsplit(".", 1)[0])
                          for name in manifest["files"] if name.endswith(".index")})
    tables: dict = {}
    for prefix in readers:
        try:
            reader = tf.train.load_checkpoint(prefix)
            shapes = reader.get_variable_to_shape_map()
            dtypes = reader.get_variable_to_dtype_map()
        except (tf.errors.OpError, ValueError) as e:
            raise StateError(f"{prefix}: unreadable checkpoint ({str(e).splitlines()[0]})") \
                from None
        for name, shape in shapes.items():
            if "-" not in name or not name.endswith(("-keys", "-values", "-slots",
                                                      "-pending_keys")):
                continue
            table, entry = name.rsplit("-", 1)
            totals = tables.setdefault(table, {})
            old = totals.get(entry)
            totals[entry] = list(shape) if old is None else [old[0] + shape[0]] + list(shape[1:])
            if entry in ("values", "slots"):  # the rows' stored form (stored_rows)
                totals[f"{entry}_form"] = stored_rows.form_of(dtypes[name])
    tables = {t: e for t, e in tables.items() if "keys" in e and "values" in e}
    if not tables and readers == [checkpoint] and unfinished(checkpoint):
        raise StateError(f"{checkpoint}: its save has not completed (table parts without "
                         f"{os.path.basename(manifest_path(checkpoint))})")
    return tables


def unfinished(checkpoint: str) -> bool:
    """Whether checkpoint's save has not completed: its tables neither in it
    nor committed in parts beside it (no manifest), but parts of them there.
    Horovod ranks saving the same step again write their parts before the
    manifest (or such a save was killed). A one-process checkpoint with
    stray parts (its save killed while removing them) holds its tables: it
    is complete."""
    from graphmod.checkpoint.parts import TableParts, has_parts  # pylint: disable=import-outside-toplevel
    if TableParts.in_parts(checkpoint) or not has_parts(checkpoint):
        return False
    try:
        names = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError):
        return True  # (its index is being written again too)
    return not any(n.endswith("-keys") for n in names)


def table_dim(entry: dict) -> int:
    """The dim of a table_entries entry (its values' width, in their form)."""
    width = entry["values"][1]
    return width - stored_rows.INT8_PARAMS if entry["values_form"] == "int8" else width


def dense_entries(checkpoint: str, tables) -> Dict[str, tuple]:
    """{name: (shape, dtype)} of the checkpoint's entries that are not tables'."""
    reader = tf.train.load_checkpoint(checkpoint)
    dtypes = reader.get_variable_to_dtype_map()
    out = {}
    for name, shape in reader.get_variable_to_shape_map().items():
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH" or any(name.startswith(t + "-") for t in tables):
            continue
        out[name] = (shape, dtypes[name])
    return out


def stand_in(checkpoint: str, storage: Optional[str] = None, deltas: Sequence[str] = ()):
    """(tables, variables) recreating what `checkpoint` holds, in the default
    graph: what graphmod's TableSaver restores it into. With `storage` (a
    local directory), tables whose rows in the checkpoint and its `deltas`
    may take more than STAND_IN_BUDGET bytes keep that much in memory and
    the rest there."""
    from graphmod.embeddings.table import create_table  # pylint: disable=import-outside-toplevel
    from graphmod import optimizers  # pylint: disable=import-outside-toplevel
    from graphmod.state import graph_state  # pylint: disable=import-outside-toplevel
    graph_state().reads_parts = True  # a checkpoint's parts
    # Read here as one whole, never split across Horovod ranks (a rank
    # exporting while it trains with graphmod.horovod.enable()).
    graph_state().split_over_ranks = False
    entries = table_entries(checkpoint)
    written = _written(deltas)
    tables = []
    for name, e in sorted(entries.items()):
        slots = e["slots"][1] if "slots" in e else 0
        # Only the number of slot rows matters to saving and restoring.
        opt = optimizers.with_slots("", [0.0] * slots) if slots else None
        # Rows kept in the form the checkpoint and its deltas hold them in (a
        # save writes them back bit for bit); float32 where they differ (a
        # delta written after a restore into a table storing otherwise), so
        # no row is rounded on the way.
        delta = written.get(name, {})
        forms = {}
        for field, setting in (("values", "storage_dtype"), ("slots", "slot_storage_dtype")):
            seen = {e.get(f"{field}_form", e["values_form"])} | delta.get(field, set())
            forms[setting] = seen.pop() if len(seen) == 1 else "float32"
        dim = table_dim(e)
        # At most: a record is a 24-byte header, values and slots, 8-aligned.
        row_bytes = dim * 4 * (1 + slots) + 32
        rows = e["keys"][0] + delta.get("rows", 0)
        large = storage and rows * row_bytes > STAND_IN_BUDGET
        tier = dict(memory_budget=STAND_IN_BUDGET, storage_path=storage) if large else {}
        tables.append(create_table(name, dim, optimizer=opt, **forms, **tier))
    variables = [tf1.Variable(tf.zeros(shape, dtype), name=name, trainable=False)
                 for name, (shape, dtype) in sorted(dense_entries(checkpoint, entries).items())]
    return tables, variables


def _written(deltas: Sequence[str]) -> Dict[str, dict]:
    """{table: {"rows": rows, "values": forms, "slots": forms}} the deltas
    write, whole or in parts (Horovod ranks, ps tasks:
    graphmod.checkpoint.parts.part_prefix): rows an estimate from their
    indexes, forms those their rows are stored in; an unreadable one counts
    none (the restore then names it)."""
    out: Dict[str, dict] = {}
    for delta in deltas:
        indexes = tf.io.gfile.glob(delta + ".index") + tf.io.gfile.glob(delta + ".tables-*.index")
        for index in indexes:
            try:
                reader = tf.train.load_checkpoint(index[:-len(".index")])
                shapes = reader.get_variable_to_shape_map()
                dtypes = reader.get_variable_to_dtype_map()
            except (tf.errors.OpError, ValueError):
                continue
            for name, shape in shapes.items():
                table, _, field = name.rpartition("-")
                if field == "keys":  # (not -removed_keys, -pending_keys)
                    t = out.setdefault(table, {})
                    t["rows"] = t.get("rows", 0) + shape[0]
                elif field in ("values", "slots"):
                    out.setdefault(table, {}).setdefault(field, set()).add(
                        stored_rows.form_of(dtypes[name]))
    return out


def write(state: State, prefix: str, recover: Optional[List[str]] = None) -> Tuple[str, State]:
    """Saves state as one checkpoint at `prefix`-<step> (no deltas, no parts);
    returns its path and the state it holds (a delta committed since `state`
    was read is in it too). recover: the model_dir's checkpoint paths, when
    the checkpoint is written into it (its `checkpoint` state file is
    updated, keeping them); None writes no state file."""
    scratch = _scratch_beside(prefix)
    try:
        return _write(state, prefix, recover, scratch)
    finally:
        try:  # the tables removed their own files; a concurrent merge may still use it
            os.rmdir(scratch)
        except OSError:
            pass


def _scratch_beside(prefix: str) -> str:
    """The directory for the stand-in tables' disk tiers: beside the output
    (on its disk, which holds a copy of the rows anyway), or, when the output
    is not a local path, the user's own in the temporary directory. One path
    for every merge there, so a merge opening its tables removes what a
    killed one left (the disk tier's orphans)."""
    if "://" in prefix:
        path = os.path.join(tempfile.gettempdir(), f"graphmod-merge-{os.getuid()}")
    else:
        path = os.path.join(os.path.dirname(os.path.abspath(prefix)), ".graphmod-merge")
    os.makedirs(path, exist_ok=True)
    return path


def _write(state: State, prefix: str, recover: Optional[List[str]], scratch: str):
    from graphmod.checkpoint import deltas  # pylint: disable=import-outside-toplevel
    from graphmod.checkpoint.saver import TableSaver  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        _, variables = stand_in(state.checkpoint, storage=scratch, deltas=state.deltas)
        saver = TableSaver(sharded=False, max_to_keep=None)
        saver.build()
        with tf1.Session() as sess:
            try:
                saver.restore(sess, state.checkpoint)
            except (tf.errors.OpError, ValueError) as e:
                raise StateError(f"{state.checkpoint}: cannot be restored "
                                 f"({str(e).splitlines()[0]})") from None
            applied = saver.restored[1]
            # The restored global step (deltas carry it) is the state's: the
            # chain may change on disk while this reads it.
            steps = [v for v in variables if v.op.name == "global_step"]
            if steps:
                step = int(sess.run(steps[0]))
            else:  # a table-API model without a global step
                step = int(state.checkpoint.rsplit("-", 1)[1])
                if applied:
                    listed = deltas.read_manifest(state.checkpoint)
                    if len(listed) < applied:  # truncated or dropped since the restore read it
                        raise StateError(f"{deltas.directory(state.checkpoint)}: the delta chain "
                                         "changed while it was read")
                    step = int(listed[applied - 1]["step"])
            if recover is not None:
                saver.recover_last_checkpoints(recover)
            tf.io.gfile.makedirs(os.path.dirname(prefix) or ".")
            # The model's graph, not this stand-in's, describes the checkpoint.
            path = saver.save(sess, prefix, global_step=step, write_meta_graph=False,
                              write_state=recover is not None)
    folder = deltas.directory(state.checkpoint)
    return path, State(state.checkpoint, [os.path.join(folder, deltas.delta_name(i + 1))
                                          for i in range(applied)], step)


__all__ = ["State", "StateError", "NoCheckpoint", "latest", "write", "table_entries", "dense_entries",
           "stand_in"]
