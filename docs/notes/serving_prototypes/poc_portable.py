"""PoC: graphmod SavedModel -> portable SavedModel by splicing stock lookups in place of
GraphmodTableFind, in a process that never imports graphmod. usage: poc_portable.py SRC OUT"""
import sys, os, numpy as np, tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.training.saving import saveable_object
sys.path.insert(0, "/tmp/sf"); import stockinit
assert "graphmod" not in sys.modules
tf1 = tf.compat.v1
src, out = sys.argv[1], sys.argv[2]
sm = saved_model_pb2.SavedModel(); sm.ParseFromString(open(src + "/saved_model.pb", "rb").read())
mg = sm.meta_graphs[0]; nodes = {n.name: n for n in mg.graph_def.node}
DEFAULTS = dict(initializer=b"truncated_normal", init_a=0.0, init_b=0.05, seed=0, missing_is_initializer=True, default_value=0.0)  # ops.cc defaults (stripped)
def attr(n, k):
    if k not in n.attr: return DEFAULTS[k]
    v = n.attr[k]; return {"s": v.s, "f": v.f, "i": v.i, "b": v.b}[v.WhichOneof("value")]
sig = mg.signature_def["serving_default"]
finds = {n.name: n for n in mg.graph_def.node if n.op == "GraphmodTableFind"}
# nodes serving needs: reachable from the outputs (through a find's keys input, not its table)
keep, stack = set(), [t.name.split(":")[0] for t in sig.outputs.values()]
while stack:
    x = stack.pop()
    if x in keep: continue
    keep.add(x); n = nodes[x]
    ins = [n.input[1]] if n.op == "GraphmodTableFind" else list(n.input)
    stack += [i.split(":")[0].lstrip("^") for i in ins]
gd = tf1.GraphDef(); gd.versions.CopyFrom(mg.graph_def.versions); gd.library.CopyFrom(mg.graph_def.library)
for n in mg.graph_def.node:
    if n.name not in keep: continue
    m = gd.node.add(); m.CopyFrom(n)
    if n.op == "GraphmodTableFind":   # stand-in, rerouted below
        del m.input[:]; m.op = "Placeholder"; m.attr.clear(); m.attr["dtype"].type = tf.float32.as_datatype_enum
reader = tf.train.load_checkpoint(src + "/variables/variables")
tensors = {}
g = tf.Graph()
with g.as_default():
    tf1.import_graph_def(gd, name="")
    var_handles = {n.name: g.get_tensor_by_name(n.name + ":0") for n in gd.node if n.op == "VarHandleOp"}
    for name in var_handles: tensors[name] = reader.get_tensor(name)
    saveables = []
    class IndexSaveable(saveable_object.SaveableObject):
        def __init__(self, table, name):
            self.table = table; super().__init__(table, [saveable_object.SaveSpec(tf.zeros([0], tf.int64), "", name + "-keys")], name)
        def restore(self, restored, shapes):
            k = restored[0]
            return tf.raw_ops.LookupTableImportV2(table_handle=self.table, keys=k, values=tf.range(tf.size(k, out_type=tf.int64)))
    extra_vars = {}
    for fname, f in finds.items():
        t = nodes[f.input[0]]; tname = attr(t, "table_name").decode(); dim = attr(t, "dim") if "dim" in t.attr else f.attr["dim"].i
        kind, a, b = attr(t, "initializer").decode(), attr(t, "init_a"), attr(t, "init_b")
        keys_t = g.get_tensor_by_name(f.input[1] if ":" in f.input[1] else f.input[1] + ":0")
        with tf1.name_scope(f"portable/{tname}/"):
            k1 = tf.reshape(keys_t, [-1])
            table = tf.raw_ops.HashTableV2(key_dtype=tf.int64, value_dtype=tf.int64, shared_name=f"portable/{tname}")
            idx = tf.raw_ops.LookupTableFindV2(table_handle=table, keys=k1, default_value=tf.constant(-1, tf.int64))
            rows_v = tf1.Variable(lambda: tf.zeros([0, dim]), shape=tf.TensorShape([None, dim]), name="rows", use_resource=True, collections=[])
            ab_v = tf1.Variable(lambda: tf.zeros([3]), name="init_ab", use_resource=True, collections=[])
            seen = tf.gather(rows_v, tf.maximum(idx, 0))
            if attr(t, "missing_is_initializer"):
                missing = stockinit.initial_rows(k1, kind, a, b, attr(t, "seed"), dim, ab=ab_v.read_value())
            else:
                missing = tf.fill(tf.stack([tf.size(k1), dim]), np.float32(attr(t, "default_value")))
            rows = tf.where((idx >= 0)[:, None], seen, missing)
            rows = tf.reshape(rows, tf.concat([tf.shape(keys_t), [dim]], 0))
        stand_in = g.get_operation_by_name(fname)
        for c in list(stand_in.outputs[0].consumers()):
            for i, x in enumerate(c.inputs):
                if x is stand_in.outputs[0]: c._update_input(i, rows)
        saveables.append(IndexSaveable(table, tname))
        extra_vars[tname + "-rows"] = rows_v; extra_vars[tname + "-init_ab"] = ab_v
        keys = reader.get_tensor(tname + "-keys"); vals = reader.get_tensor(tname + "-values")
        tensors[tname + "-keys"] = keys; tensors[tname + "-rows"] = vals
        a32, b32 = np.float32(a), np.float32(b); tensors[tname + "-init_ab"] = np.array([a32, b32, b32 - a32], np.float32)
    var_reads = {k: tf.raw_ops.ReadVariableOp(resource=h, dtype=h.op.get_attr("dtype")) for k, h in var_handles.items()}
    saver = tf1.train.Saver({**var_reads, **extra_vars, **{s.name: s for s in saveables}}, sharded=True)
    new_mg = tf1.train.export_meta_graph(graph=g, saver_def=saver.as_saver_def(), clear_devices=True, strip_default_attrs=True)
new_mg.meta_info_def.tags.append("serve"); new_mg.signature_def["serving_default"].CopyFrom(sig)
os.makedirs(out + "/variables")
names = sorted(tensors)
tf.raw_ops.SaveV2(prefix=out + "/variables/variables", tensor_names=names, shape_and_slices=[""] * len(names), tensors=[tensors[n] for n in names])
osm = saved_model_pb2.SavedModel(saved_model_schema_version=1); osm.meta_graphs.add().CopyFrom(new_mg)
open(out + "/saved_model.pb", "wb").write(osm.SerializeToString())
from tensorflow.python.framework import op_def_registry
types = {n.op for n in new_mg.graph_def.node}
print("PORTABLE written:", out, "ops:", len(types), "not stock:", sorted(t for t in types if op_def_registry.get(t) is None), "checkpoint:", {n: tensors[n].shape for n in names})
