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
from typing import Dict, List

import numpy as np
import tensorflow as tf
from absl import logging

from graphmod.cli.graphs import InputError

tf1 = tf.compat.v1


def _tables_of(checkpoint: str) -> Dict[str, dict]:
    from graphmod.cli.commands import _table_entries  # pylint: disable=import-outside-toplevel
    return _table_entries(checkpoint)


def _dense_entries(checkpoint: str, tables) -> Dict[str, tuple]:
    """{name: (shape, dtype)} of the checkpoint's other entries."""
    reader = tf.train.load_checkpoint(checkpoint)
    dtypes = reader.get_variable_to_dtype_map()
    out = {}
    for name, shape in reader.get_variable_to_shape_map().items():
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH" or any(name.startswith(t + "-") for t in tables):
            continue
        out[name] = (shape, dtypes[name])
    return out


def _build(checkpoint: str):
    """(tables, variables) recreating what `checkpoint` holds, in the default graph."""
    import graphmod  # pylint: disable=import-outside-toplevel
    from graphmod import optimizers  # pylint: disable=import-outside-toplevel
    from graphmod.table import graph_state  # pylint: disable=import-outside-toplevel
    graph_state().reads_parts = True  # a sharded checkpoint's parts
    entries = _tables_of(checkpoint)
    tables = []
    for name, e in sorted(entries.items()):
        slots = e["slots"][1] if "slots" in e else 0
        # Only the number of slot rows matters to saving and restoring.
        opt = {0: None, 1: optimizers.Adagrad(0.0), 2: optimizers.Ftrl(0.0)}.get(slots)
        if slots > 2:
            raise InputError(f"{checkpoint}: table '{name}' keeps {slots} slot rows per key")
        tables.append(graphmod.create_table(name, e["values"][1], optimizer=opt))
    variables = [tf1.Variable(tf.zeros(shape, dtype), name=name, trainable=False)
                 for name, (shape, dtype) in sorted(_dense_entries(checkpoint, entries).items())]
    return tables, variables


def compact(model_dir: str) -> str:
    """Writes `model.ckpt-<step of the last delta>` holding the latest full
    checkpoint with its deltas applied; returns its path."""
    from graphmod import deltas  # pylint: disable=import-outside-toplevel
    from graphmod.saver import TableSaver  # pylint: disable=import-outside-toplevel
    latest = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if latest is None:
        raise InputError(f"{model_dir}: holds no checkpoint")
    chain = deltas.committed(latest)
    if not chain:
        return latest  # nothing to compact
    step = deltas.read_manifest(latest)[len(chain) - 1]["step"]
    with tf.Graph().as_default():
        _build(latest)
        saver = TableSaver(sharded=False, max_to_keep=None)
        saver.build()
        state = tf.train.get_checkpoint_state(model_dir)
        with tf1.Session() as sess:
            saver.restore(sess, latest)
            saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
            return saver.save(sess, os.path.join(os.path.dirname(latest),
                                                 latest.rsplit("-", 1)[0].rsplit("/", 1)[-1]),
                              global_step=step)


def to_dense(model_dir: str, out: str) -> str:
    """The latest checkpoint (with its deltas) as plain variables: each
    planned table as its variable, rows 0..N-1 (a key without a row reads
    the table's initial row, as the variable's first lookup would);
    returns the written checkpoint's path."""
    from graphmod.rewrite import plan_file  # pylint: disable=import-outside-toplevel
    from graphmod.saver import TableSaver  # pylint: disable=import-outside-toplevel
    latest = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if latest is None:
        raise InputError(f"{model_dir}: holds no checkpoint")
    plan = plan_file.read(model_dir)
    if not plan:
        raise InputError(f"{model_dir}: holds no conversion plan (graphmod/plan.json): the "
                         "tables' variables and row counts are unknown")
    with tf.Graph().as_default():
        tables, variables = _build(latest)
        by_name = {t.name: t for t in tables}
        exports = {p.variable: by_name[p.table].export() for p in plan.values()
                   if p.table in by_name}
        with tf1.Session() as sess:
            TableSaver(sharded=False).restore(sess, latest)
            found = sess.run(exports)
            dense = {v.op.name: sess.run(v) for v in variables}
    values = {}
    for p in plan.values():
        if p.variable not in found:
            continue
        rows = _initial_rows(p)
        have = found[p.variable]
        inside = have["keys"] < p.rows
        rows[have["keys"][inside]] = have["values"][inside]
        values[p.variable] = rows
        # The optimizer's slots, so that the dense model resumes training where
        # the tables left off; a key without a row has the slot's start value.
        if have["slots"].shape[1] and len(p.slots) != have["slots"].shape[1]:
            logging.warning("graphmod: table '%s' keeps %d slot rows but the plan names %d "
                            "slot variables: %s is written without its optimizer slots",
                            p.table, have["slots"].shape[1], len(p.slots), p.variable)
            continue
        for i, (slot, start) in enumerate(p.slots):
            values[slot] = np.full(rows.shape, start, np.float32)
            values[slot][have["keys"][inside]] = have["slots"][inside, i]
    with tf.Graph().as_default():
        made = [tf1.Variable(value, name=name) for name, value in
                sorted({**dense, **values}.items())]
        saver = tf1.train.Saver(made)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf.io.gfile.makedirs(out)
            step = int(dense.get("global_step", 0))
            return saver.save(sess, os.path.join(out, "model.ckpt"), global_step=step)


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
    from graphmod.saver import TableSaver  # pylint: disable=import-outside-toplevel
    import graphmod  # pylint: disable=import-outside-toplevel
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
    with tf.Graph().as_default():
        imports = []
        for v in variables:
            value = reader.get_tensor(v).astype(np.float32)
            # Its optimizer slots, `<v>/Adagrad`, `<v>/Ftrl` and `<v>/Ftrl_1`...:
            # by name, TF1's optimizers' slots come in the order tables keep.
            slot_names = sorted(n for n, shape in shapes.items()
                                if n.startswith(v + "/") and list(shape) == list(value.shape))
            if len(slot_names) > 2:
                raise InputError(f"{checkpoint}: variable {v} has {len(slot_names)} slot "
                                 f"variables ({', '.join(slot_names)}); tables keep up to 2")
            opt = [None, optimizers.Adagrad(0.0), optimizers.Ftrl(0.0)][len(slot_names)]
            table = graphmod.create_table(v, value.shape[1], optimizer=opt)
            slots = np.stack([reader.get_tensor(n) for n in slot_names], 1) if slot_names \
                else np.zeros([value.shape[0], 0, value.shape[1]], np.float32)
            imports.append(table.import_rows(
                tf.range(value.shape[0], dtype=tf.int64), tf.constant(value),
                tf.constant(slots.astype(np.float32)),
                last_seen=tf.zeros([value.shape[0]], tf.int64), replace=True))
        for n in sorted(shapes):  # every other entry, as it is (the slots of those dropped)
            if n != "_CHECKPOINTABLE_OBJECT_GRAPH" and not any(
                    n == v or n.startswith(v + "/") for v in variables):
                tf1.Variable(reader.get_tensor(n), name=n)
        saver = TableSaver(sharded=False)
        saver.build()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(imports)
            tf.io.gfile.makedirs(out)
            step = int(reader.get_tensor("global_step")) if "global_step" in shapes else 0
            return saver.save(sess, os.path.join(out, "model.ckpt"), global_step=step)
