"""`graphmod ckpt`: checkpoint tools for users joining or leaving graphmod.

  compact MODEL_DIR       the latest full checkpoint and its deltas (and a
                          sharded one's parts) -> one new full checkpoint
  convert --to=dense MODEL_DIR OUT
                          each table -> a plain variable of rows 0..N-1
                          (N: the variable's rows in the conversion plan)
                          and its optimizer slot variables, with every
                          other variable as it is: the unmodified model
                          resumes training from it
  convert --to=tables DENSE_CHECKPOINT OUT --variables=a,b
                          plain variables -> tables keyed 0..N-1 (what
                          GraphModifierHook's adoption does when training
                          starts from such a checkpoint)

Each builds a graph of its own holding the checkpoint's variables and
tables, restores with graphmod's TableSaver (which applies deltas and reads
parts) and saves anew.
"""
import os
from typing import Dict, List, Tuple

import numpy as np
import tensorflow as tf

from graphmod.checkpoint import merged
from graphmod.cli.graphs import InputError, read_plan

tf1 = tf.compat.v1


def _build(checkpoint: str):
    """(tables, variables) recreating what `checkpoint` holds, in the default graph."""
    try:
        return merged.stand_in(checkpoint)
    except merged.StateError as e:
        raise InputError(str(e)) from None


def compact(model_dir: str) -> str:
    """Writes `model.ckpt-<step of the last delta>` holding the latest full
    checkpoint with its deltas applied; returns its path."""
    try:
        state = merged.latest(model_dir)
        if not state.deltas:
            return state.checkpoint  # nothing to compact
        target = f"{state.checkpoint.rsplit('-', 1)[0]}-{state.step}"
        if tf.io.gfile.exists(target + ".index"):
            raise InputError(f"{target}: exists already (a checkpoint the state file no "
                             "longer lists?); not overwritten: move it away to compact")
        path, _ = merged.write(state, state.checkpoint.rsplit("-", 1)[0],
                               recover=list(tf.train.get_checkpoint_state(
                                   model_dir).all_model_checkpoint_paths))
    except merged.StateError as e:
        raise InputError(str(e)) from None
    if tf.io.gfile.exists(state.checkpoint + ".meta"):
        tf.io.gfile.copy(state.checkpoint + ".meta", path + ".meta")
    return path


def _empty_output(out: str) -> None:
    """A conversion writes a checkpoint of its own: never into one that holds
    anything (a model_dir's Saver state, deltas and parts would mix with it)."""
    if tf.io.gfile.exists(out) and tf.io.gfile.listdir(out):
        raise InputError(f"{out}: is not empty; give a new directory to write the converted "
                         "checkpoint to")


def to_dense(model_dir: str, out: str) -> Tuple[str, List[str]]:
    """The latest checkpoint (with its deltas) as plain variables: each
    planned table as its variable, rows 0..N-1 (a key without a row reads
    the table's initial row, as the variable's first lookup would), and its
    slot rows as the optimizer's slot variables (a key without a row has the
    slot's start value); the parts of a partitioned variable joined into the
    whole, as the variable's checkpoints hold it. Returns the written
    checkpoint's path and what did not convert exactly (findings)."""
    from graphmod.rewrite import plan_file  # pylint: disable=import-outside-toplevel
    from graphmod.checkpoint.saver import TableSaver  # pylint: disable=import-outside-toplevel
    latest = merged.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if latest is None:
        raise InputError(f"{model_dir}: holds no checkpoint")
    _empty_output(out)
    plan = read_plan(model_dir)
    if not plan:
        raise InputError(f"{model_dir}: holds no conversion plan (graphmod/plan.json): the "
                         "tables' variables and row counts are unknown")
    with tf.Graph().as_default():
        tables, variables = _build(latest)
        by_name = {t.name: t for t in tables}
        lost = sorted(p.table for p in plan.values() if p.table not in by_name)
        if lost:
            raise InputError(f"{latest}: holds no table {', '.join(lost)} of the plan "
                             f"{plan_file.path(model_dir)}")
        exports = {p.variable: by_name[p.table].export() for p in plan.values()}
        with tf1.Session() as sess:
            _restore(lambda: TableSaver(sharded=False).restore(sess, latest), latest)
            found = sess.run(exports)
            dense = {v.op.name: sess.run(v) for v in variables}
    pieces: Dict[str, dict] = {}  # name in checkpoints -> {first row: rows}
    whole: Dict[str, int] = {}    # name in checkpoints -> rows of the whole
    findings = []
    for p in sorted(plan.values(), key=lambda p: p.variable):
        have = found[p.variable]
        if have["slots"].shape[1] != len(p.slots):
            raise InputError(f"{plan_file.path(model_dir)}: names {len(p.slots)} optimizer slot "
                             f"variables of {p.variable}, its table keeps "
                             f"{have['slots'].shape[1]} (a plan written before graphmod "
                             "recorded them: train a step with this graphmod to rewrite it)")
        at, take, note = _rows_of_keys(p, have)
        if note:
            findings.append(note)
        rows = _initial_rows(p)
        rows[at] = have["values"][take]
        name, first, total = p.part_of or (p.variable, 0, p.rows)
        arrays = [(name, rows)]
        for i, (slot, start) in enumerate(p.slots):
            slot_rows = np.full(rows.shape, start, np.float32)
            slot_rows[at] = have["slots"][take, i]
            arrays.append((slot, slot_rows))
        for n, a in arrays:
            pieces.setdefault(n, {})[first] = a
            whole[n] = total
    values = {n: _joined(n, parts, whole[n], model_dir) for n, parts in pieces.items()}
    clash = sorted(set(values) & set(dense))
    if clash:
        raise InputError(f"{latest}: holds {', '.join(clash)} densely as well as in tables")
    path = _save_variables({**dense, **values}, out, int(dense.get("global_step", 0)))
    return path, findings


def _rows_of_keys(planned, have: dict) -> Tuple[np.ndarray, np.ndarray, str]:
    """(rows of the variable, indices of the table's entries written there,
    a finding or ""). A table fed the full ids of `ids % N` holds keys that
    share a row in the variable: the row takes its most recently seen key's."""
    keys = have["keys"]
    if planned.unsqueezed and len(keys):
        if set(planned.unsqueezed_types) != {"FloorMod"}:
            raise InputError(
                f"{planned.variable}: its table is keyed by the full fingerprints of hashed "
                f"strings ({', '.join(planned.unsqueezed)}), which do not give back the "
                "variable's hash buckets, so it has no dense equivalent (train with "
                "GraphModifierHook(collision_free=False) to keep bucket keys)")
        at = keys % planned.rows
        # By row, and within a row by when the key was seen: each row's last.
        order = np.lexsort((have["last_seen"], at))
        newest = np.r_[at[order][1:] != at[order][:-1], True]
        take = order[newest]
        at, rows_used = at[take], int(newest.sum())
        # Always a finding: the key lost the id's sign (masked to 63 bits),
        # and the plan keeps no modulus, so both are assumed.
        note = (f"{planned.variable}: its table holds the full ids of "
                f"{', '.join(planned.unsqueezed)}, each written at row key % {planned.rows} "
                f"(assumed: non-negative ids, a modulus of its row count); its {len(keys)} "
                f"keys fill {rows_used} rows")
        if rows_used < len(keys):
            note += ", a shared row holding its most recently seen key's"
        return at, take, note
    inside = np.flatnonzero((keys >= 0) & (keys < planned.rows))
    note = ""
    if len(inside) < len(keys):
        note = (f"{planned.variable}: {len(keys) - len(inside)} keys of its table lie outside "
                f"its rows 0..{planned.rows - 1} and are left out")
    return keys[inside], inside, note


def _joined(name: str, parts: dict, rows: int, model_dir: str) -> np.ndarray:
    """A whole variable from its parts {first row: rows}."""
    firsts = sorted(parts)
    expected = 0
    for first in firsts:
        if first != expected:
            break
        expected += len(parts[first])
    if expected != rows or firsts[0] != 0:
        raise InputError(f"{model_dir}: the plan has tables for rows "
                         f"{', '.join(f'{f}..{f + len(parts[f]) - 1}' for f in firsts)} of "
                         f"the partitioned variable {name} ({rows} rows), not for all")
    return np.concatenate([parts[f] for f in firsts]) if len(firsts) > 1 else parts[0]


def _restore(restore, checkpoint: str) -> None:
    try:
        restore()
    except (tf.errors.OpError, ValueError) as e:
        raise InputError(f"{checkpoint}: cannot be restored ({str(e).splitlines()[0]})") \
            from None


def _save_variables(values: Dict[str, np.ndarray], out: str, step: int) -> str:
    """A checkpoint of plain variables, values fed (a constant in the graph
    cannot exceed 2 GB; a table can)."""
    with tf.Graph().as_default():
        made, feeds = {}, {}
        for name, value in sorted(values.items()):
            fed = tf1.placeholder(value.dtype, value.shape)
            made[name] = tf1.Variable(fed, name=name)
            feeds[fed] = value
        saver = tf1.train.Saver(made)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer(), feeds)
            tf.io.gfile.makedirs(out)
            return saver.save(sess, os.path.join(out, "model.ckpt"), global_step=step,
                              write_meta_graph=False)  # this stand-in graph is not the model


def _initial_rows(planned) -> np.ndarray:
    """The rows a planned table gives keys 0..rows-1 it has not seen: its
    initializer's, from (key, seed); a table of the same name in a graph of
    its own (an unseeded table's seed comes from its name)."""
    import graphmod  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        table = graphmod.create_table(planned.table, planned.dim, initializer=planned.initializer,
                                      seed=planned.seed)
        rows = graphmod.sparse_lookup(table, tf.range(planned.rows, dtype=tf.int64),
                                      is_training=False)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return sess.run(rows)


def to_tables(checkpoint: str, out: str, variables: List[str]) -> str:
    """Plain variables of a dense checkpoint as tables keyed 0..N-1, with
    their optimizer slots (`<variable>/<slot>` of the same shape) as the
    tables' slot rows; every other entry as it is. Returns the written
    checkpoint's path."""
    from graphmod.checkpoint.saver import TableSaver  # pylint: disable=import-outside-toplevel
    import graphmod  # pylint: disable=import-outside-toplevel
    _empty_output(out)
    try:
        reader = tf.train.load_checkpoint(checkpoint)
    except (tf.errors.OpError, ValueError) as e:
        raise InputError(f"{checkpoint}: unreadable checkpoint ({str(e).splitlines()[0]})") \
            from None
    shapes = reader.get_variable_to_shape_map()
    missing = [v for v in variables if v not in shapes or len(shapes[v]) != 2]
    if missing:
        raise InputError(f"{checkpoint}: no [rows, dim] variable {', '.join(missing)}")
    from graphmod import optimizers  # pylint: disable=import-outside-toplevel
    feeds = {}

    def fed(value: np.ndarray) -> tf.Tensor:  # not a constant: those cannot exceed 2 GB
        placeholder = tf1.placeholder(value.dtype, value.shape)
        feeds[placeholder] = value
        return placeholder

    with tf.Graph().as_default():
        imports = []
        for v in variables:
            value = reader.get_tensor(v).astype(np.float32)
            # Its optimizer slots, `<v>/Adagrad`, `<v>/Ftrl` and `<v>/Ftrl_1`...:
            # by name, TF1's optimizers' slots come in the order tables keep.
            slot_names = sorted(n for n, shape in shapes.items()
                                if _is_slot_of(n, v) and list(shape) == list(value.shape))
            opt = optimizers.with_slots("", [0.0] * len(slot_names)) if slot_names else None
            table = graphmod.create_table(v, value.shape[1], optimizer=opt)
            slots = np.stack([reader.get_tensor(n) for n in slot_names], 1) if slot_names \
                else np.zeros([value.shape[0], 0, value.shape[1]], np.float32)
            imports.append(table.import_rows(
                tf.range(value.shape[0], dtype=tf.int64), fed(value),
                fed(slots.astype(np.float32)),
                last_seen=tf.zeros([value.shape[0]], tf.int64), replace=True))
        for n in sorted(shapes):  # every other entry, as it is (the slots of those dropped)
            if n != "_CHECKPOINTABLE_OBJECT_GRAPH" and not any(
                    n == v or _is_slot_of(n, v) for v in variables):
                tf1.Variable(fed(reader.get_tensor(n)), name=n)
        saver = TableSaver(sharded=False)
        saver.build()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer(), feeds)
            sess.run(imports, feeds)
            tf.io.gfile.makedirs(out)
            step = int(reader.get_tensor("global_step")) if "global_step" in shapes else 0
            return saver.save(sess, os.path.join(out, "model.ckpt"), global_step=step,
                              write_meta_graph=False)  # this stand-in graph is not the model


def _is_slot_of(name: str, variable: str) -> bool:
    """`<variable>/<slot>`, an optimizer's slot (`emb/Adagrad`, `emb/Ftrl_1`),
    not another variable kept beside it (a moving average)."""
    rest = name[len(variable) + 1:] if name.startswith(variable + "/") else ""
    return bool(rest) and "/" not in rest and not rest.startswith("ExponentialMovingAverage")
