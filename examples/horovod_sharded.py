"""graphmod on several Horovod ranks: embedding tables sharded by key.

Each of the 26 categorical features of synthetic.py's Criteo-like stream
gets a table (dim 8); with `graphmod.horovod.enable()`, every key lives
on one owner rank, and each step's lookups of all 26 tables exchange ids
and rows with the owners in one exchange. The dense layers are
data-parallel through `hvd.DistributedOptimizer`. Each rank trains on its
own slice of every global batch.

Run on two ranks over loopback (one command; `-np 3` works too):
  .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/horovod_sharded.py

It prints, per rank, the global loss every 50 steps and, at the end, how
many rows each rank owns and that every one of them is its own.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import graphmod  # noqa: E402
import synthetic as data  # noqa: E402

tf1 = tf.compat.v1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch_size", type=int, default=256, help="examples per rank and step")
    args = ap.parse_args()
    tf1.disable_eager_execution()
    hvd.init()
    graphmod.horovod.enable()
    size, rank = hvd.size(), hvd.rank()
    cfg = data.SyntheticCriteo(seed=7)

    # Placeholders fed from numpy: every rank builds the same graph, so its
    # collectives match by name (and none runs while the graph is built).
    cats = {c: tf1.placeholder(tf.int64, [None, 1], name=c) for c in cfg.categorical_names}
    dense = {d: tf1.placeholder(tf.float32, [None, 1], name=d) for d in cfg.dense_names}
    labels = tf1.placeholder(tf.float32, [None, 1], name="labels")
    table_opt = graphmod.optimizers.Adagrad(0.05)
    tables = [graphmod.create_table(c, 8, optimizer=table_opt) for c in cfg.categorical_names]
    embedded = graphmod.fused_lookup(tables, [cats[c] for c in cfg.categorical_names],
                                     combiners=["sum"] * len(tables))
    h = tf.concat(embedded + [tf.math.log1p(tf.nn.relu(dense[d])) for d in cfg.dense_names], 1)
    for units in (64, 32):
        h = tf1.layers.dense(h, units, tf.nn.relu)
    logits = tf1.layers.dense(h, 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense_opt = hvd.DistributedOptimizer(tf1.train.AdagradOptimizer(0.05))
    train = tf.group(table_opt.minimize(loss), dense_opt.minimize(loss))
    global_loss = hvd.allreduce(loss, op=hvd.Average, name="global_loss")
    sizes = tf.stack([t.size() for t in tables])
    owned = tf.reduce_all([tf.reduce_all(tf.equal(
        graphmod.horovod.owner_of(t.export()["keys"], size), rank)) for t in tables])

    with tf1.train.SingularMonitoredSession(
            hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
        for step in range(args.steps):
            start = (step * size + rank) * args.batch_size  # this rank's slice
            feats, y = data.generate(cfg, args.batch_size, start)
            feed = {labels: y}
            feed.update({cats[c]: feats[c] for c in cats})
            feed.update({dense[d]: feats[d] for d in dense})
            value, _ = sess.run([global_loss, train], feed)
            if step % 50 == 0 or step == args.steps - 1:
                print(f"rank {rank}/{size} step {step}: global loss {value:.4f}", flush=True)
        rows, all_own = sess.run([sizes, owned])
    print(f"rank {rank}/{size}: {int(np.sum(rows)):,} rows over {len(tables)} tables, "
          f"all owned by this rank: {bool(all_own)}", flush=True)


if __name__ == "__main__":
    main()
