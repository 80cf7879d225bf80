import sys, json, numpy as np, tensorflow as tf
if sys.argv[3] == "graphmod": import graphmod
else: assert "graphmod" not in sys.modules
tf1 = tf.compat.v1
ids = np.array(json.loads(sys.argv[2])["ids"], np.int64); s = np.array(json.loads(sys.argv[2])["s"]).astype(bytes)
if sys.argv[3] == "v2":
    f = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]; out = f(ids=tf.constant(ids), s=tf.constant(s))["p"].numpy()
else:
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.load(sess, ["serve"], sys.argv[1]); sig = meta.signature_def["serving_default"]
        out = sess.run(sig.outputs["p"].name, {sig.inputs["ids"].name: ids, sig.inputs["s"].name: s})
print("OUT", json.dumps(out.tolist()))
