"""portable_saved_model: a graphmod SavedModel rewritten to serve on stock TensorFlow.

>>> report = portable_saved_model("/tmp/export/1700000000", "/srv/models/ctr/1")

graphmod.export_saved_model writes a SavedModel whose lookups are graphmod's
own ops (GraphmodTable, GraphmodTableFind), so it serves only where graphmod's
op library is loaded. Its variables already hold each table's merged state as
`<table>-keys` [n] and `<table>-values` [n, dim]. This rewrites its serving
graph, as protos (graphmod's ops are never instantiated), so that each table
becomes TensorFlow's own lookup:

  key --HashTableV2--> row number --gather--> `<table>-rows` variable

The hash table is filled by the Saver's restore (a saveable), which every
loader runs: tf.saved_model.load, tf.compat.v1.saved_model.load,
saved_model_cli and TF Serving. A table initializer would not be: the TF1
loader and saved_model_cli run only the main_op. Keys and rows stay in the
SavedModel's variables, never in GraphDef constants (the 2 GB proto limit).
A key the table lacks reads what graphmod reads: the table's initial row of
(key, seed), computed with stock integer and float ops, bit for bit
(native/initializer.cc), or its default_value. Optimizer slots, counts,
versions and ids pending admission are not serving state: dropped.
"""
import math
import os
import shutil
import tempfile
import uuid
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from google.protobuf import message
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.training.saving import saveable_object

_FIND, _FUSED_FIND, _TABLE = "GraphmodTableFind", "GraphmodFusedFind", "GraphmodTable"
_MAIN_OP, _LEGACY_INIT_OP = "saved_model_main_op", "legacy_init_op"
# GraphmodTable's attribute defaults (native/ops.cc): the export strips them.
_TABLE_DEFAULTS = dict(initializer=b"truncated_normal", init_a=0.0, init_b=0.05, seed=0,
                       missing_is_initializer=True, default_value=0.0)


class NotPortable(ValueError):
    """An input portable_saved_model cannot convert; the message is one line
    naming the path and why. Nothing was written."""


def portable_saved_model(source_dir: str, out_dir: str, *, variables: Optional[str] = None,
                         min_count: int = 0, seen_since: Optional[int] = None) -> Dict:
    """Writes to out_dir (absent or empty) a SavedModel of source_dir (a
    SavedModel graphmod.export_saved_model wrote) that uses only stock
    TensorFlow ops. Returns a report: the tables converted, their rows and
    what unseen keys read, the checkpoint entries dropped, the op types.

    variables: the prefix of a checkpoint of the same model to take the
    state from instead of source_dir's variables (graphmod.checkpoint.merged
    writes a model_dir's latest state as one). min_count, seen_since: rows
    seen fewer than min_count times, or last seen before seen_since (the
    table's clock: steps or seconds, as its eviction counts), are left out;
    their keys read what unseen keys read."""
    _check_out_dir(out_dir)
    if min_count < 0:
        raise NotPortable(f"min_count {min_count}: must be >= 0")
    meta = _serving_meta_graph(source_dir)
    _unfuse_finds(meta.graph_def)
    serving = _serving_nodes(meta)
    finds = [n for n in meta.graph_def.node if n.op == _FIND and n.name in serving]
    if not finds:
        raise NotPortable(f"{source_dir}: holds no graphmod tables on its serving path "
                          "(nothing to convert; it already serves on stock TensorFlow)")
    state = variables or os.path.join(source_dir, "variables", "variables")
    try:
        reader = tf.train.load_checkpoint(state)
    except (tf.errors.OpError, ValueError) as e:
        raise NotPortable(f"{state}: unreadable ({str(e).splitlines()[0][:200]})") from None
    stored = reader.get_variable_to_shape_map()
    tables = _table_specs(meta.graph_def, finds, stored, state)
    keep = _Keep(min_count, seen_since)
    for spec in tables.values():
        missing = [e for e in keep.entries(spec["table"]) if e not in stored]
        if missing:
            raise NotPortable(f"{state}: holds no {', '.join(missing)} to select rows by")
        spec["rows_kept"] = keep.count(reader, spec["table"], spec["rows"])
        spec["bytes_saved"] = (spec["rows"] - spec["rows_kept"]) * (8 + 4 * spec["dim"])
    graph_def = _serving_graph_def(meta, serving, {n.name for n in finds})
    graph, saveables, entries = _stock_graph(meta.graph_def, graph_def, finds, tables, reader,
                                             state, keep)
    new_meta = _stock_meta_graph(meta, graph, saveables)
    op_types = sorted({n.op for n in new_meta.graph_def.node})
    foreign = [t for t in op_types if not _is_stock(t)]
    if foreign:
        raise NotPortable(f"{source_dir}: its serving graph needs ops stock TensorFlow "
                          f"lacks: {', '.join(foreign)}")
    _write_atomically(out_dir, new_meta, entries, source_dir, state, reader)
    kept = {t["table"] + s for t in tables.values() for s in ("-keys", "-values")}
    return dict(source=source_dir, state=state, out=out_dir, tables=list(tables.values()),
                dropped=sorted(n for n in stored if n not in entries and n not in kept),
                op_types=op_types)


# --- reading the source ------------------------------------------------------

def _check_out_dir(out_dir: str) -> None:
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise NotPortable(f"{out_dir}: not empty (a portable export never overwrites)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotPortable(f"{out_dir}: exists and is not a directory")


def _serving_meta_graph(source_dir: str):
    path = os.path.join(source_dir, "saved_model.pb")
    if not os.path.isfile(path):
        raise NotPortable(f"{source_dir}: not a SavedModel directory (no saved_model.pb)")
    saved = saved_model_pb2.SavedModel()
    try:
        with open(path, "rb") as f:
            saved.ParseFromString(f.read())
    except message.DecodeError as e:
        raise NotPortable(f"{path}: not a SavedModel ({e})") from None
    serving = [m for m in saved.meta_graphs if "serve" in m.meta_info_def.tags]
    if not serving:
        raise NotPortable(f"{path}: holds no MetaGraph tagged 'serve'")
    return serving[0]


def _unfuse_finds(graph_def) -> None:
    """Each GraphmodFusedFind of N (table, keys) entries (the fuse_table_ops
    rule's) becomes N GraphmodTableFind nodes, each converted as any find:
    entry 0 keeps the fused node's name, entry i is named '<name>/entry_i',
    and a reader of output i reads entry i."""
    fused = {n.name: n for n in graph_def.node if n.op == _FUSED_FIND}
    entry = {}
    for name, node in fused.items():
        count, dims = node.attr["N"].i, list(node.attr["dims"].list.i)
        controls = [x for x in node.input if x.startswith("^")]
        parts = []
        for i in range(count):
            entry[(name, i)] = name if i == 0 else f"{name}/entry_{i}"
            part = node_def_pb2.NodeDef(name=entry[(name, i)], op=_FIND, device=node.device)
            part.input.extend([node.input[i], node.input[count + i]] + controls)
            part.attr["dim"].i = dims[i]
            parts.append(part)
        node.CopyFrom(parts[0])
        graph_def.node.extend(parts[1:])
    for node in graph_def.node if fused else ():
        for j, x in enumerate(node.input):
            base, _, index = x.partition(":")
            if not x.startswith("^") and base in fused:
                node.input[j] = entry[(base, int(index or 0))]


def _serving_nodes(meta) -> set:
    """The names of the nodes serving needs: those the signatures, the main
    op (it fills the model's own vocabulary tables) and the asset file names
    depend on. A find is walked through its keys only: its table handle, the
    graphmod Saver and the delta ops are not serving's."""
    nodes = {n.name: n for n in meta.graph_def.node}
    stack = [t.name.split(":")[0] for sig in meta.signature_def.values()
             for t in list(sig.outputs.values()) + list(sig.inputs.values())]
    stack += _init_ops(meta) + [a.tensor_info.name.split(":")[0] for a in meta.asset_file_def]
    keep = set()
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        keep.add(name)
        node = nodes.get(name)
        if node is None:
            raise NotPortable(f"its serving graph lacks node {name} (a broken SavedModel)")
        inputs = [node.input[1]] if node.op == _FIND else list(node.input)
        stack.extend(i.lstrip("^").split(":")[0] for i in inputs)
    return keep


def _serving_graph_def(meta, keep, find_names):
    """The nodes in keep, each GraphmodTableFind a float Placeholder of its
    name (rerouted to the stock lookup later)."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(meta.graph_def.versions)
    out.library.CopyFrom(meta.graph_def.library)
    for node in meta.graph_def.node:
        if node.name in keep:
            copy = out.node.add()
            copy.CopyFrom(node)
            if node.name in find_names:
                del copy.input[:]
                copy.op = "Placeholder"
                copy.attr.clear()
                copy.attr["dtype"].type = tf.float32.as_datatype_enum  # what the find returns
    return out


def _init_ops(meta) -> List[str]:
    """The names of the ops the loaders run after the restore (main_op, or a
    legacy_init_op)."""
    return [v.split(":")[0] for key in (_MAIN_OP, _LEGACY_INIT_OP)
            if key in meta.collection_def for v in meta.collection_def[key].node_list.value]


def _attr(node, key):
    if key not in node.attr:
        return _TABLE_DEFAULTS[key]
    value = node.attr[key]
    return getattr(value, value.WhichOneof("value"))


def _table_specs(graph_def, finds, stored, source_dir) -> Dict[str, Dict]:
    """{GraphmodTable node: its name, dim, rows and what a missing key reads}."""
    nodes = {n.name: n for n in graph_def.node}
    specs = {}
    for find in finds:
        table = _table_node(nodes, find)
        if table is None:
            raise NotPortable(f"{source_dir}: lookup {find.name} reads no GraphmodTable "
                              "(a table that cannot be frozen)")
        if table.name in specs:
            continue
        name = table.attr["table_name"].s.decode()
        if f"{name}-keys" not in stored or f"{name}-values" not in stored:
            raise NotPortable(f"{source_dir}: its variables lack {name}-keys/{name}-values "
                              "(not written by graphmod.export_saved_model?)")
        dim = int(stored[f"{name}-values"][1])
        a, b = float(_attr(table, "init_a")), float(_attr(table, "init_b"))
        spec = dict(table=name, dim=dim, rows=int(stored[f"{name}-keys"][0]),
                    initializer=_attr(table, "initializer").decode(), init_a=a, init_b=b,
                    seed=int(_attr(table, "seed")),
                    missing_is_initializer=bool(_attr(table, "missing_is_initializer")),
                    default_value=float(_attr(table, "default_value")))
        if spec["missing_is_initializer"] and spec["initializer"] not in _KINDS:
            raise NotPortable(f"{source_dir}: table {name}'s initializer "
                              f"{spec['initializer']!r} has no stock-ops form")
        if spec["missing_is_initializer"]:
            spec["unseen"] = f"initial row: {spec['initializer']}({a}, {b}), seed {spec['seed']}"
        else:
            spec["unseen"] = f"default_value {spec['default_value']}"
        specs[table.name] = spec
    return specs


def _table_node(nodes, find):
    node = nodes.get(find.input[0].lstrip("^").split(":")[0])
    while node is not None and node.op == "Identity":
        node = nodes.get(node.input[0].split(":")[0])
    return node if node is not None and node.op == _TABLE else None


# --- building the stock graph ------------------------------------------------

def _stock_graph(source_graph_def, graph_def, finds, tables, reader, source_dir, keep):
    """The serving graph (graph_def) with each find's stand-in replaced by a
    stock lookup of its table (found in source_graph_def). Returns (graph,
    the Saver's {name: saveable}, the entries to write: {name: the source's
    entry it copies, or a numpy value})."""
    graph = tf.Graph()
    with graph.as_default():
        try:  # an op unknown here (another library's) on the serving path
            tf.compat.v1.import_graph_def(graph_def, name="")
        except (ValueError, tf.errors.OpError) as e:
            raise NotPortable(f"{source_dir}: its serving graph does not import here "
                              f"({str(e).splitlines()[0][:200]})") from None
        saveables, entries = _model_variables(graph, graph_def, reader, source_dir)
        built = {}
        suffix = uuid.uuid4().hex[:12]  # two models' tables never share a resource
        for table_node, spec in tables.items():
            built[table_node] = _StockTable(spec, suffix)
            saveables.update(built[table_node].saveables())
            entries.update(built[table_node].checkpoint_entries(keep))
        nodes = {n.name: n for n in source_graph_def.node}
        for find in finds:
            stand_in = graph.get_operation_by_name(find.name).outputs[0]
            table = built[_table_node(nodes, find).name]
            keys_name = find.input[1] if ":" in find.input[1] else find.input[1] + ":0"
            with tf.compat.v1.name_scope(f"portable/{find.name}/"):
                rows = table.lookup(graph.get_tensor_by_name(keys_name))
            for consumer in list(stand_in.consumers()):
                for i, x in enumerate(consumer.inputs):
                    if x is stand_in:
                        consumer._update_input(i, rows)  # pylint: disable=protected-access
    return graph, saveables, entries


def _model_variables(graph, graph_def, reader, source_dir):
    """The model's own variables serving reads (dense layers, small
    embeddings), saved as the source saved them."""
    saveables, entries = {}, {}
    shapes = reader.get_variable_to_shape_map()
    for node in graph_def.node:
        if node.op != "VarHandleOp":
            continue
        if node.name not in shapes:
            raise NotPortable(f"{source_dir}: holds no variable {node.name} (a SavedModel "
                              "graphmod did not write, or of another model?)")
        shape = [d.size for d in node.attr["shape"].shape.dim]
        if not node.attr["shape"].shape.unknown_rank and shape != list(shapes[node.name]):
            raise NotPortable(f"{source_dir}: variable {node.name} has shape "
                              f"{list(shapes[node.name])}, the serving graph's {shape} (the "
                              "state of another model?)")
        handle = graph.get_tensor_by_name(node.name + ":0")
        # The Saver takes a variable's read, not its handle.
        saveables[node.name] = tf.raw_ops.ReadVariableOp(
            resource=handle, dtype=handle.op.get_attr("dtype"))
        entries[node.name] = node.name
    return saveables, entries


def _stock_meta_graph(meta, graph, saveables):
    """graph as the MetaGraph of a SavedModel: its Saver over saveables, the
    source's tags, signatures, asset files and init op."""
    with graph.as_default():
        for key in (_MAIN_OP, _LEGACY_INIT_OP):  # the loaders find them by collection
            if key in meta.collection_def:
                for name in meta.collection_def[key].node_list.value:
                    graph.add_to_collection(key, graph.get_operation_by_name(name.split(":")[0]))
        saver = tf.compat.v1.train.Saver(saveables, sharded=True)
        new_meta = tf.compat.v1.train.export_meta_graph(
            graph=graph, saver_def=saver.as_saver_def(), clear_devices=True,
            strip_default_attrs=True)
    new_meta.meta_info_def.tags[:] = list(meta.meta_info_def.tags)
    new_meta.asset_file_def.extend(meta.asset_file_def)
    for key, sig in meta.signature_def.items():  # signatures unchanged
        new_meta.signature_def[key].CopyFrom(sig)
    return new_meta


class _StockTable:
    """One graphmod table in stock ops: a HashTableV2 key -> row number, the
    rows variable, and (a, b, b-a) of its initializer in a variable."""

    def __init__(self, spec: Dict, suffix: str):
        tf1 = tf.compat.v1
        self.spec = spec
        name = spec["table"]
        with tf1.name_scope(f"portable/{name}/"):
            self.table = tf.raw_ops.HashTableV2(key_dtype=tf.int64, value_dtype=tf.int64,
                                                shared_name=f"portable/{name}/{suffix}")
            self.rows = tf1.Variable(lambda: tf.zeros([0, spec["dim"]]), name="rows",
                                     shape=tf.TensorShape([None, spec["dim"]]),
                                     use_resource=True, collections=[])
            # In a variable, not constants: Grappler folds a*1 and reorders
            # constant additions, which moved 1 in 3 initial values by 1 ulp.
            self.init_ab = tf1.Variable(lambda: tf.zeros([3]), name="init_ab",
                                        use_resource=True, collections=[])
            self.keys_in_row_order = _keys_in_row_order(self.table)

    def saveables(self) -> Dict:
        name = self.spec["table"]
        out = {f"{name}-rows": self.rows, f"{name}-init_ab": self.init_ab}
        if self.spec["rows_kept"]:  # a hash table cannot import no keys (nor is it read)
            out[f"{name}-index"] = _IndexSaveable(self.table, self.keys_in_row_order, name)
        return out

    def checkpoint_entries(self, keep: "_Keep") -> Dict:
        name = self.spec["table"]
        a, b = np.float32(self.spec["init_a"]), np.float32(self.spec["init_b"])
        out = {f"{name}-rows": keep.select(name, "values"),
               f"{name}-init_ab": np.array([a, b, b - a], np.float32)}
        if self.spec["rows_kept"]:
            out[f"{name}-keys"] = keep.select(name, "keys")
        return out

    def lookup(self, keys):
        """keys (int64, any shape) -> rows of shape keys.shape + [dim]."""
        flat = tf.reshape(keys, [-1])
        shape = tf.concat([tf.shape(keys), [self.spec["dim"]]], 0)
        if self.spec["rows_kept"] == 0:  # nothing to gather from: every key is unseen
            return tf.reshape(self._unseen_rows(flat), shape)
        index = tf.raw_ops.LookupTableFindV2(table_handle=self.table, keys=flat,
                                             default_value=tf.constant(-1, tf.int64))
        rows = tf.gather(self.rows, tf.maximum(index, 0))

        def with_unseen():
            missing = tf.where(index < 0)  # [m, 1]
            return tf.tensor_scatter_nd_update(rows, missing,
                                               self._unseen_rows(tf.gather_nd(flat, missing)))
        # Initial rows only when the batch has keys the table lacks: most
        # serving batches have none, and the ~80 ops of an initial row cost
        # even on no keys (measured at batch 1: 1.19x the dense model's
        # latency without the cond, 1.14x with it; a stock If op).
        rows = tf.cond(tf.reduce_any(index < 0), with_unseen, lambda: rows)
        return tf.reshape(rows, shape)

    def _unseen_rows(self, keys):
        s = self.spec
        if not s["missing_is_initializer"]:
            return tf.fill(tf.stack([tf.size(keys), s["dim"]]), np.float32(s["default_value"]))
        return initial_rows(keys, s["initializer"], s["seed"], s["dim"],
                            self.init_ab.read_value())


class _Keep:
    """Which rows of each table the export keeps: all, or those seen at least
    min_count times and last seen at seen_since or later."""

    def __init__(self, min_count: int, seen_since: Optional[int]):
        self.min_count, self.seen_since = min_count, seen_since

    def entries(self, table: str) -> List[str]:
        """The table's checkpoint entries the selection reads."""
        return ([f"{table}-counts"] if self.min_count > 0 else []) + \
            ([f"{table}-last_seen"] if self.seen_since is not None else [])

    def count(self, reader, table: str, rows: int) -> int:
        """How many of the table's rows are kept."""
        if not self.entries(table):
            return rows
        mask = np.ones(rows, bool)
        if self.min_count > 0:
            mask &= reader.get_tensor(f"{table}-counts") >= self.min_count
        if self.seen_since is not None:
            mask &= reader.get_tensor(f"{table}-last_seen") >= self.seen_since
        return int(mask.sum())

    def select(self, table: str, field: str):
        """What _copy_variables writes for the entry `<table>-<field>`: the
        source's entry, or a function of its reader making the kept rows."""
        entry = f"{table}-{field}"
        if not self.entries(table):
            return entry

        def kept(read):
            mask = tf.ones_like(read(f"{table}-keys"), tf.bool)
            if self.min_count > 0:
                mask &= read(f"{table}-counts") >= self.min_count
            if self.seen_since is not None:
                mask &= read(f"{table}-last_seen") >= self.seen_since
            return tf.gather(read(entry), tf.reshape(tf.where(mask), [-1]))
        return kept


def _keys_in_row_order(table):
    """The table's keys ordered by row, what `<table>-keys` held: so saving
    this SavedModel's variables again writes the same checkpoint."""
    keys, rows = tf.raw_ops.LookupTableExportV2(table_handle=table, Tkeys=tf.int64,
                                                Tvalues=tf.int64)
    return tf.scatter_nd(rows[:, None], keys, tf.shape(keys, out_type=tf.int64))


class _IndexSaveable(saveable_object.SaveableObject):
    """Checkpoint entry `<table>-keys`; restoring it fills the hash table with
    key i -> row i, so every loader that restores variables fills it."""

    def __init__(self, table, keys_in_row_order, name):
        self.table = table
        spec = saveable_object.SaveSpec(keys_in_row_order, "", name + "-keys")
        super().__init__(table, [spec], name + "-index")

    def restore(self, restored_tensors, restored_shapes):
        keys = restored_tensors[0]
        return tf.raw_ops.LookupTableImportV2(
            table_handle=self.table, keys=keys,
            values=tf.range(tf.size(keys, out_type=tf.int64)))


def _is_stock(op_type: str) -> bool:
    return not op_type.startswith("Graphmod") and op_def_registry.get(op_type) is not None


# --- graphmod's initial rows in stock ops (native/initializer.cc) -------------
# The C++ draws from a counter-based stream: base = Mix(key ^ Mix(seed ^ S)),
# draw c = Mix(base + GOLDEN * c), Mix being murmur3's fmix64 (native/bits.h).
# Here in int64 ops only (older servers lack uint64 kernels): int64 Mul and
# AddV2 wrap mod 2^64 like uint64, and a logical shift is an arithmetic one
# masked.

_M64 = (1 << 64) - 1
_C1, _C2 = 0xff51afd7ed558ccd, 0xc4ceb9fe1a85ec53
_GOLDEN, _SEED_MIX = 0x9e3779b97f4a7c15, 0x5851f42d4c957f2d
_BINS = 4096
_KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")  # initializer.cc
# Acklam's inverse normal CDF coefficients (initializer.cc NormalQuantile).
_A = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00]
_B = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01]
_C = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00]
_D = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00]
_TAIL = 0.02425


def _s64(u: int) -> int:
    """uint64 bits as the int64 of the same bits."""
    u &= _M64
    return u - (1 << 64) if u >> 63 else u


def _mix_py(k: int) -> int:
    k &= _M64
    k ^= k >> 33
    k = (k * _C1) & _M64
    k ^= k >> 33
    k = (k * _C2) & _M64
    return k ^ (k >> 33)


def _srl(x, n: int):
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(n, tf.int64)),
                                  tf.constant((1 << (64 - n)) - 1, tf.int64))


def _mix_tf(k):
    k = tf.bitwise.bitwise_xor(k, _srl(k, 33)) * tf.constant(_s64(_C1), tf.int64)
    k = tf.bitwise.bitwise_xor(k, _srl(k, 33)) * tf.constant(_s64(_C2), tf.int64)
    return tf.bitwise.bitwise_xor(k, _srl(k, 33))


def _quantile(p: float) -> float:
    """NormalQuantile in float64, in the C++'s order of operations."""
    if p < _TAIL or p > 1.0 - _TAIL:
        q = math.sqrt(-2.0 * math.log(p if p < _TAIL else 1.0 - p))
        x = ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
             / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
        return x if p < _TAIL else -x
    q = p - 0.5
    r = q * q
    return ((((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q
            / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0))


def _quantile_table(truncated: bool) -> np.ndarray:
    """initializer.cc MakeQuantileTable: 4097 float32 quantiles (16 KB)."""
    low = 0.022750131948179195  # Phi(-2)
    t = np.zeros(_BINS + 1, np.float32)
    for i in range(_BINS + 1):
        u = i / _BINS
        if truncated:
            t[i] = np.float32(_quantile(low + (1.0 - 2.0 * low) * u))
        elif i not in (0, _BINS):  # the normal's outer bins are inverted exactly
            t[i] = np.float32(_quantile(u))
    return t


def _tail_quantile_tf(p):
    """_quantile's tail branch on a float64 tensor (the normal's outer bins)."""
    lower = p < _TAIL
    q = tf.sqrt(-2.0 * tf.math.log(tf.where(lower, p, 1.0 - p)))
    x = ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
         / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    return tf.where(lower, x, -x)


def initial_rows(keys, kind: str, seed: int, dim: int, ab):
    """keys int64 [n] -> float32 [n, dim], bit for bit graphmod's initial
    rows (InitialValues). ab: float32 [3] tensor (a, b, b - a), read from a
    variable so Grappler cannot reassociate the float arithmetic."""
    n = tf.shape(keys)[0]
    if kind == "zeros":
        return tf.zeros(tf.stack([n, dim]), tf.float32)
    if kind == "constant":
        return tf.fill(tf.stack([n, dim]), ab[0])
    if kind not in _KINDS:
        raise NotPortable(f"table initializer {kind!r} has no stock-ops form")
    seed_mix = tf.constant(_s64(_mix_py((seed & _M64) ^ _SEED_MIX)), tf.int64)
    base = _mix_tf(tf.bitwise.bitwise_xor(keys, seed_mix))
    draws = dim if kind == "uniform" else (dim + 1) // 2
    steps = tf.constant([_s64(_GOLDEN * c) for c in range(1, draws + 1)], tf.int64)
    x = _mix_tf(base[:, None] + steps[None, :])  # [n, draws]
    if kind == "uniform":  # a + (b - a) * Uniform01: 24 bits
        u = (tf.cast(_srl(x, 40), tf.float32) + 0.5) * np.float32(1.0 / 16777216.0)
        return ab[0] + ab[2] * u
    # Two 32-bit draws per 64-bit one, the high half first; 12 bits pick the
    # quantile bin, 20 place the value inside it.
    r = tf.reshape(tf.stack([_srl(x, 32), tf.bitwise.bitwise_and(x, 0xFFFFFFFF)], 2),
                   tf.stack([n, 2 * draws]))[:, :dim]
    bins = _srl(r, 20)
    frac = (tf.cast(tf.bitwise.bitwise_and(r, 0xFFFFF), tf.float32) + 0.5) \
        * np.float32(1.0 / 1048576.0)
    table = tf.constant(_quantile_table(kind == "truncated_normal"))
    lo, hi = tf.gather(table, bins), tf.gather(table, bins + 1)
    z = lo + frac * (hi - lo)
    if kind == "normal":  # its outermost bins reach to infinity: invert exactly
        outer = tf.logical_or(tf.equal(bins, 0), tf.equal(bins, _BINS - 1))
        p = (tf.cast(bins, tf.float64) + tf.cast(frac, tf.float64)) / _BINS
        z = tf.where(outer, tf.cast(_tail_quantile_tf(p), tf.float32), z)
    return ab[0] + ab[1] * z


# --- writing -----------------------------------------------------------------

def _write_atomically(out_dir: str, meta, entries: Dict, source_dir: str, state: str,
                      reader) -> None:
    """The SavedModel is written into a temp dir beside out_dir, then renamed:
    a reader (TF Serving polls its base dir) never sees half of it. The temp
    name starts with '.', which TF Serving's version parser skips."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-portable-", dir=parent)
    try:
        _copy_variables(state, os.path.join(tmp, "variables", "variables"), entries, reader)
        saved = saved_model_pb2.SavedModel(saved_model_schema_version=1)
        saved.meta_graphs.add().CopyFrom(meta)
        with open(os.path.join(tmp, "saved_model.pb"), "wb") as f:
            f.write(saved.SerializeToString())
        for assets in ("assets", "assets.extra"):  # vocabulary files and the like
            if os.path.isdir(os.path.join(source_dir, assets)):
                shutil.copytree(os.path.join(source_dir, assets), os.path.join(tmp, assets))
        _fsync_tree(tmp)
        os.rename(tmp, out_dir)  # replaces an empty out_dir; fails on a non-empty one
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _copy_variables(source_prefix: str, out_prefix: str, entries: Dict, reader) -> None:
    """Writes out_prefix's checkpoint: each entry the source's entry it names
    (renamed), a numpy value, or a function of the source's reader (the kept
    rows). One graph restores and saves, so each tensor is in memory once, as
    TensorFlow's own buffer, no numpy copy (measured: 10M keys at dim 4,
    240 MB, converted in 0.4 s at a peak of 1.1x that)."""
    dtypes = reader.get_variable_to_dtype_map()
    names = sorted(entries)
    with tf.Graph().as_default(), tf.device("/cpu:0"):
        restored = {}

        def read(entry):
            if entry not in restored:
                restored[entry] = tf.raw_ops.RestoreV2(
                    prefix=source_prefix, tensor_names=[entry], shape_and_slices=[""],
                    dtypes=[dtypes[entry]])[0]
            return restored[entry]

        def tensor(value):
            if isinstance(value, str):
                return read(value)
            return value(read) if callable(value) else value

        tensors = [tensor(entries[n]) for n in names]
        save = tf.raw_ops.SaveV2(prefix=out_prefix, tensor_names=names,
                                 shape_and_slices=[""] * len(names), tensors=tensors)
        with tf.compat.v1.Session() as sess:
            try:
                sess.run(save)
            except tf.errors.OpError as e:  # a torn or truncated source
                raise NotPortable(f"{source_prefix}: cannot be copied "
                                  f"({str(e).splitlines()[0][:200]})") from None


def _fsync_tree(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__: List[str] = ["portable_saved_model", "NotPortable", "initial_rows"]
