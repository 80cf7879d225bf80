"""Lookup benchmark: graphmod's table beside its peers, in one process.

The workload and peers are those of the project's reference
(shared/bench/lookup_peers.py): batches of B = 65,536 int64 keys, 2 intra-op
and 2 inter-op threads, graph mode.
  small  Zipf(1.05) ids, about 100k distinct keys: a hot, cache-resident table
  large  8M distinct keys drawn uniformly: a cold, DRAM-bound table; the first
         insertion of all 8M keys (fill) is timed too
Figures (M keys/s, best of 3 rounds of 30 batches): train = lookup that
inserts missing keys (a training step's read), read = read-only lookup,
fill = first-insertion rate (large, one pass).
Peers: static tf.gather on a fixed tf.Variable (the ceiling: no hashing), TF's
DenseHashTable, and TFRA 0.7.2's cuckoo table.

Usage: python benchmarks/lookup.py [--regime small|large] [--dim 16] [--json out.json]
"""
import argparse
import json
import os
import platform
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
B = 65536
STEPS = 30
ROUNDS = 3  # each figure is the best of ROUNDS timings of STEPS batches (the machine is noisy)


def make_batches(regime, rng):
    if regime == "small":
        def draw():
            return np.minimum(rng.zipf(1.05, B), 10_000_000).astype(np.int64)
        batches = [(draw() * 2654435761) % (1 << 62) for _ in range(8)]
        return batches, batches  # the warm-up inserts the timed batches
    n = 8_000_000
    keys = (np.arange(n, dtype=np.int64) * 2654435761) % (1 << 62)
    fill = [keys[i:i + B] for i in range(0, n, B)]
    return fill, [keys[rng.integers(0, n, B)] for _ in range(8)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regime", choices=["small", "large"], default="small")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--json")
    ap.add_argument("--skip", default="", help="comma-separated impls to leave out")
    args = ap.parse_args()
    tf1.disable_eager_execution()
    import graphmod  # after disable_eager_execution, as a model script would

    fill, batches = make_batches(args.regime, np.random.default_rng(0))
    ph = tf1.placeholder(tf.int64, [None])
    skip = set(filter(None, args.skip.split(",")))
    results = []

    def timed(sess, fetch):
        best = 0.0
        for _ in range(ROUNDS):
            t = time.perf_counter()
            for i in range(STEPS):
                sess.run(fetch, {ph: batches[i % len(batches)]})
            best = max(best, B * STEPS / (time.perf_counter() - t) / 1e6)
        return best

    def bench(name, train_fetch, read_fetch, bytes_fetch=None):
        if name in skip:
            return
        cfg = tf1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
        with tf1.Session(config=cfg) as sess:
            sess.run(tf1.global_variables_initializer())
            t = time.perf_counter()
            for b in fill:
                sess.run(train_fetch, {ph: b})
            fill_rate = sum(len(b) for b in fill) / (time.perf_counter() - t) / 1e6
            row = dict(impl=name, regime=args.regime, dim=args.dim,
                       train_mkeys_s=timed(sess, train_fetch), read_mkeys_s=timed(sess, read_fetch),
                       fill_mkeys_s=fill_rate if args.regime == "large" else None,
                       bytes_per_key=None)
            if bytes_fetch is not None:
                size, memory = sess.run(bytes_fetch)
                row["bytes_per_key"] = memory / size
                row["rows"] = int(size)
        results.append(row)
        print(f"{name:22s} train {row['train_mkeys_s']:7.2f}  read {row['read_mkeys_s']:7.2f} Mkeys/s"
              + (f"  fill {fill_rate:6.2f}" if args.regime == "large" else "")
              + (f"  {row['bytes_per_key']:6.1f} B/key ({row['rows']} rows)"
                 if row["bytes_per_key"] else ""), flush=True)

    def read_then_insert(lookup, insert):
        """A peer's training read: look up, then insert what was read (new keys
        get the default/initial row), as the reference workload does."""
        vals = lookup(ph)
        with tf.control_dependencies([vals]):
            inserted = insert(ph, vals)
        with tf.control_dependencies([inserted]):
            return tf.reduce_sum(vals)

    rows = 8_000_000 if args.regime == "large" else 1_000_000
    v = tf1.get_variable("static", [rows, args.dim])
    g = tf.reduce_sum(tf.gather(v, ph % rows))
    bench("static_gather", g, g)

    table = graphmod.create_table("bench", args.dim)
    train = tf.reduce_sum(graphmod.sparse_lookup(table, ph, is_training=True))
    read = tf.reduce_sum(graphmod.sparse_lookup(table, ph, is_training=False))
    info = table.info()
    bench("graphmod", train, read, (info["size"], info["memory_bytes"]))

    t = tf.lookup.experimental.DenseHashTable(tf.int64, tf.float32, default_value=tf.zeros([args.dim]),
                                              empty_key=-1, deleted_key=-2)
    bench("tf_dense_hash_table", read_then_insert(t.lookup, t.insert),
          tf.reduce_sum(t.lookup(ph)))

    if "tfra_cuckoo" not in skip:
        import tensorflow_recommenders_addons as tfra
        de = tfra.dynamic_embedding
        dv = de.get_variable("tfra", key_dtype=tf.int64, value_dtype=tf.float32, dim=args.dim,
                             initializer=tf1.random_normal_initializer(), init_size=1 << 20)
        bench("tfra_cuckoo", read_then_insert(dv.lookup, dv.upsert),
              tf.reduce_sum(dv.lookup(ph)))

    base = next((r for r in results if r["impl"] == "static_gather"), None)
    if base:
        print("ratios to static_gather: " + ", ".join(
            f"{r['impl']} train {r['train_mkeys_s'] / base['train_mkeys_s']:.2f}x "
            f"read {r['read_mkeys_s'] / base['read_mkeys_s']:.2f}x" for r in results[1:]))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus"
        for r in results:
            r["machine"] = machine
            r["date"] = time.strftime("%Y-%m-%d")
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
