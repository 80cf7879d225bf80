"""Lookup benchmark: graphmod's table beside its peers, in one process.

The workload and peers are those of the project's reference
(shared/bench/lookup_peers.py): batches of B = 65,536 int64 keys, 2 intra-op
and 2 inter-op threads, graph mode.
  small  Zipf(1.05) ids, about 100k distinct keys: a hot, cache-resident table
  large  8M distinct keys drawn uniformly: a cold, DRAM-bound table; the first
         insertion of all 8M keys (fill) is timed too
Figures (M keys/s): train = lookup that inserts missing keys (a training
step's read), read = read-only lookup, fill = first-insertion rate (large,
one pass), and the process CPU-seconds per million keys of train.
Implementations run interleaved: each round builds every implementation
afresh (fill included) and times STEPS batches of each, in turn; figures are
medians over the rounds with their spread (min-max), ratios are taken within
each round (see benchmarks/rounds.py).
graphmod runs in both shard layouts (graphmod_buckets: records inline in hash
buckets, one memory miss a key; graphmod_arena: a key index over packed
records, two dependent misses), with their bytes per key; with --forms,
also with rows stored smaller (graphmod_arena_float16: storage_dtype
"float16", and so on).
Peers: static tf.gather on a fixed tf.Variable (the ceiling: no hashing), TF's
DenseHashTable, and TFRA 0.7.2's cuckoo table.

Usage: python benchmarks/lookup.py [--regime small|large] [--dim 16] [--rounds 3]
                                   [--skip tfra_cuckoo] [--forms float16,int8]
                                   [--json out.json]
"""
import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import Meter, machine, ratio_per_round, spread, write_json  # noqa: E402

tf1 = tf.compat.v1
B = 65536
STEPS = 30


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


def build(impl, regime, dim):
    """(graph, placeholder, train fetch, read fetch, size/bytes fetch or None)."""
    graph = tf.Graph()
    with graph.as_default():
        ph = tf1.placeholder(tf.int64, [None])

        def read_then_insert(lookup, insert):
            """A peer's training read: look up, then insert what was read (new
            keys get the default/initial row), as the reference workload does."""
            vals = lookup(ph)
            with tf.control_dependencies([vals]):
                inserted = insert(ph, vals)
            with tf.control_dependencies([inserted]):
                return tf.reduce_sum(vals)

        info = None
        if impl == "static_gather":
            rows = 8_000_000 if regime == "large" else 1_000_000
            v = tf1.get_variable("static", [rows, dim])
            train = read = tf.reduce_sum(tf.gather(v, ph % rows))
        elif impl.startswith("graphmod_"):
            import graphmod
            layout, _, form = impl[len("graphmod_"):].partition("_")
            table = graphmod.create_table("bench", dim, layout=layout,
                                          storage_dtype=form or "float32")
            train = tf.reduce_sum(graphmod.sparse_lookup(table, ph, is_training=True))
            read = tf.reduce_sum(graphmod.sparse_lookup(table, ph, is_training=False))
            i = table.info()
            info = (i["size"], i["memory_bytes"])
        elif impl == "tf_dense_hash_table":
            t = tf.lookup.experimental.DenseHashTable(
                tf.int64, tf.float32, default_value=tf.zeros([dim]), empty_key=-1, deleted_key=-2)
            train, read = read_then_insert(t.lookup, t.insert), tf.reduce_sum(t.lookup(ph))
        else:
            import tensorflow_recommenders_addons as tfra
            dv = tfra.dynamic_embedding.get_variable(
                "tfra", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                initializer=tf1.random_normal_initializer(), init_size=1 << 20)
            train, read = read_then_insert(dv.lookup, dv.upsert), tf.reduce_sum(dv.lookup(ph))
        init = tf1.global_variables_initializer()
    return graph, ph, train, read, info, init


def one_round(impl, args, fill, batches):
    graph, ph, train, read, info, init = build(impl, args.regime, args.dim)
    cfg = tf1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    with tf1.Session(graph=graph, config=cfg) as sess:
        sess.run(init)
        with Meter() as m_fill:
            for b in fill:
                sess.run(train, {ph: b})
        out = dict(fill=sum(len(b) for b in fill) / m_fill.wall / 1e6)
        for name, fetch in (("train", train), ("read", read)):
            sess.run(fetch, {ph: batches[0]})  # first run of a fetch builds its executor
            with Meter() as m:
                for i in range(STEPS):
                    sess.run(fetch, {ph: batches[i % len(batches)]})
            out[name] = B * STEPS / m.wall / 1e6
            out[f"{name}_cpu"] = m.cpu / (B * STEPS / 1e6)
        if info is not None:
            size, memory = sess.run(info)
            out["bytes_per_key"], out["rows"] = memory / size, int(size)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regime", choices=["small", "large"], default="small")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--skip", default="", help="comma-separated impls to leave out")
    ap.add_argument("--forms", default="", help="comma-separated storage dtypes to run graphmod "
                    "with too, in both layouts (float16, bfloat16, int8)")
    args = ap.parse_args()
    tf1.disable_eager_execution()
    tf1.logging.set_verbosity(tf1.logging.ERROR)
    fill, batches = make_batches(args.regime, np.random.default_rng(0))
    skip = set(filter(None, args.skip.split(",")))
    forms = [f"graphmod_{layout}_{form}" for form in filter(None, args.forms.split(","))
             for layout in ("buckets", "arena")]
    impls = [i for i in ("static_gather", "graphmod_buckets", "graphmod_arena", *forms,
                         "tf_dense_hash_table", "tfra_cuckoo")
             if i not in skip]
    runs = {i: [] for i in impls}
    for r in range(args.rounds):
        for impl in impls:
            runs[impl].append(one_round(impl, args, fill, batches))
            f = runs[impl][-1]
            print(f"  round {r + 1} {impl:20s} train {f['train']:6.2f} read {f['read']:6.2f}"
                  + (f" fill {f['fill']:6.2f}" if args.regime == "large" else "")
                  + " Mkeys/s", flush=True)
    large = args.regime == "large"
    print(f"\n{args.regime} regime, dim {args.dim}, B={B}, {args.rounds} interleaved rounds "
          f"of {STEPS} batches: median (min-max), M keys/s; CPU-s per M keys of train")
    results = []
    for impl in impls:
        col = {k: [x[k] for x in runs[impl]] for k in runs[impl][0]}
        row = dict(impl=impl, regime=args.regime, dim=args.dim,
                   **{f"{k}_median": float(np.median(v)) for k, v in col.items()}, runs=col)
        results.append(row)
        print(f"  {impl:20s} train {spread(col['train'])}  read {spread(col['read'])}"
              + (f"  fill {spread(col['fill'])}" if large else "")
              + f"  cpu-s/Mkeys {spread(col['train_cpu'], '{:.4f}')}"
              + (f"  {row['bytes_per_key_median']:.1f} B/key" if "bytes_per_key" in col else ""))
    if "static_gather" in runs:
        base = {k: [x[k] for x in runs["static_gather"]] for k in ("train", "read", "fill")}
        print("ratios to static_gather (median of per-round ratios):")
        for impl in impls[1:]:
            mine = {k: [x[k] for x in runs[impl]] for k in ("train", "read", "fill")}
            parts = [f"{k} {np.median(ratio_per_round(mine[k], base[k])):.2f}x"
                     for k in (("train", "read", "fill") if large else ("train", "read"))]
            print(f"  {impl:20s} " + ", ".join(parts))
    if args.json:
        for r in results:
            r["machine"], r["date"] = machine(), time.strftime("%Y-%m-%d")
        write_json(args.json, results)


if __name__ == "__main__":
    main()
