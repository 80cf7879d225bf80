"""Serving benchmark: one model's SavedModel four ways, exported and loaded side by side.

The model: one int64 feature `ids` [batch, 1] -> a dim-16 embedding of N keys
-> a dense layer to one logit -> sigmoid; serving signature input `ids`,
output `p`. The same N rows (float32, random) in four SavedModels:
  dense     the unmodified model: a [N, 16] variable, ids are row numbers,
            exported by Estimator.export_saved_model (stock TensorFlow)
  graphmod  graphmod.create_table + sparse_lookup, N random 63-bit keys,
            exported by graphmod.export_saved_model (graphmod's own ops)
  portable  the same Estimator, graphmod.export_saved_model(portable=True)
            (stock ops only: HashTableV2 key -> row filled by the restore)
  tfra      TFRA 0.7.2's dynamic_embedding variable (cuckoo table), the same
            keys, inference mode, exported by Estimator.export_saved_model
Each model_dir is a real Estimator model_dir: a one-off
session (its own subprocess) imports the rows into the table (graphmod's
Table.import_rows, TFRA's upsert) or assigns the dense variable, and a
tf.compat.v1.train.Saver writes the checkpoint there; the exports then go
through each library's real export path, untouched.

Measured, per key count, in interleaved rounds (dense, graphmod, portable,
tfra, paired, dense, ...; each variant exported afresh and loaded in every
round: the exports are cheap enough, 7 s at most for 10M keys; the
model_dirs are made once per key count):
  export s     wall time of the export call, in a fresh subprocess (its
               process CPU-seconds and peak RSS above its start: in the JSON)
  MB           SavedModel bytes: `du -sb` of its directory
  peak/final   VmHWM and VmRSS after tf.compat.v1.saved_model.load, in a
               FRESH subprocess per load, above a baseline taken in that
               process after its imports and a throwaway session, with
               `echo 5 > /proc/self/clear_refs` (resets VmHWM) just before
               the load (as docs/notes/serving_facts.md measured)
  latency      p50 / p99 of one session.run of the serving signature through
               a tf.compat.v1.Session (as TF Serving runs it), at batch 1
               (3000 requests) and batch 256 (1000), after 100 warm-up
               requests each, ids drawn
               from the stored keys; for the hashed variants again with ~10%
               unseen ids ("unseen")
  cpu-s/1k     process CPU-seconds (all threads) per 1000 requests
  paired       dense and portable loaded together in one more stock process
               per round, their requests alternating in chunks (100 at batch
               1, 50 at batch 256): p50 of each and their ratio
The loading subprocess of graphmod imports graphmod (its op library); of
tfra imports tensorflow_recommenders_addons.dynamic_embedding (its ops); of
dense, portable and tfra runs `python -I` with a sys.meta_path blocker, so
graphmod can never be imported there (checked). Figures are medians over
rounds with their spread (min-max); ratios are taken within each round and
their median reported (benchmarks/rounds.py). Every load also answers a fixed
query; the answers are compared across variants.

Goals (marked PASS/FAIL): portable p50 latency <= 1.1x dense's (seen ids,
batch 1 and 256; judged on the paired runs, the separate load processes'
ratio printed beside it: they drift +-20% from process to process); load
peak <= 1.3x final RSS (above baseline); portable bytes <= (keys * 8 +
rows * dim * 4) * 1.1.

Usage: python benchmarks/serving.py [--keys 1000000,10000000] [--rounds 3]
                                    [--quick] [--skip tfra] [--json PATH]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rounds import machine, ratio_per_round, spread, write_json  # noqa: E402

DIM = 16
VARIANTS = ("dense", "graphmod", "portable", "tfra")
HASHED = ("graphmod", "portable", "tfra")
REQ_B1, REQ_B256, WARMUP = 3000, 1000, 100
UNSEEN_SHARE = 0.1
KERNEL = np.linspace(-1.0, 1.0, DIM).astype(np.float32)  # the dense layer, fixed
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serving.json")
WORKER_TIMEOUT = 900

# --- the model (built in the worker subprocesses only) -----------------------


def model_fn(features, labels, mode, params):
    del labels
    import tensorflow as tf
    tf1 = tf.compat.v1
    ids = features["ids"]  # [batch, 1] int64
    kind = params["kind"]
    if kind == "dense":
        emb = tf1.get_variable("emb", [params["rows"], DIM], initializer=tf1.zeros_initializer())
        e = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids), 1)
    elif kind == "graphmod":
        import graphmod
        table = graphmod.create_table("emb", DIM)  # unseen ids: the initial row of (key, seed)
        e = graphmod.sparse_lookup(table, ids, is_training=mode == tf.estimator.ModeKeys.TRAIN,
                                   combiner="sum")
    else:
        from tensorflow_recommenders_addons import dynamic_embedding as de
        de.enable_inference_mode()  # lookups read the table; no trainable wrapper copy
        var = de.get_variable("emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                              initializer=tf1.zeros_initializer(), init_size=params["rows"])
        params["_tfra_var"] = var
        e = tf.reduce_sum(de.embedding_lookup(var, ids, name="emb_lookup"), 1)
    logit = tf1.layers.dense(e, 1, kernel_initializer=tf1.constant_initializer(KERNEL),
                             name="logit")[:, 0]
    return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logit)})


def receiver_fn():
    import tensorflow as tf
    ph = tf.compat.v1.placeholder(tf.int64, [None, 1], name="ids")
    return tf.estimator.export.ServingInputReceiver({"ids": ph}, {"ids": ph})


def _status():
    """(VmHWM, VmRSS) of this process in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out["VmHWM"], out["VmRSS"]


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def worker_make(kind, model_dir, data_dir):
    """A model_dir whose checkpoint holds the rows: keys[i] -> rows[i] (dense:
    row i). One session imports them and a plain Saver writes the checkpoint."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    rows = np.load(os.path.join(data_dir, "rows.npy"))
    params = dict(kind=kind, rows=len(rows))
    with tf.Graph().as_default():
        ids = tf1.placeholder(tf.int64, [None, 1])
        model_fn({"ids": ids}, None, tf.estimator.ModeKeys.PREDICT, params)
        step = tf1.train.get_or_create_global_step()
        values = tf1.placeholder(tf.float32, [None, DIM])
        feed = {values: rows}
        if kind == "dense":
            emb = [v for v in tf1.global_variables() if v.op.name == "emb"][0]
            fill = emb.assign(values, read_value=False)
        else:
            keys = tf1.placeholder(tf.int64, [None])
            feed[keys] = np.load(os.path.join(data_dir, "keys.npy"))
            if kind == "graphmod":
                import graphmod
                fill = graphmod.tables()[0].import_rows(keys, values)
            else:
                fill = params["_tfra_var"].upsert(keys, values)
        saver = tf1.train.Saver(sharded=True)
        os.makedirs(model_dir, exist_ok=True)
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            sess.run(fill, feed)
            del feed, rows
            saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=step)
    return {}


def worker_export(variant, model_dir, export_base, n):
    import tensorflow as tf
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    kind = "graphmod" if variant == "portable" else variant
    if kind == "graphmod":
        import graphmod
    est = tf.estimator.Estimator(model_fn, model_dir, params=dict(kind=kind, rows=n))
    _reset_peak()
    base = _status()[1]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if kind == "graphmod":
        path = graphmod.export_saved_model(est, receiver_fn, export_base,
                                           portable=variant == "portable")
    else:
        path = est.export_saved_model(export_base, receiver_fn)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return dict(path=path.decode(), export_s=wall, export_cpu_s=cpu,
                export_peak_mb=(_status()[0] - base) / 1e6)


# --- the loading process: its own code, so `python -I -c` runs it -----------

BLOCK_GRAPHMOD = textwrap.dedent("""
    import importlib.abc, sys
    class NoGraphmod(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "graphmod":
                raise ImportError("graphmod is not available in this process")
    sys.meta_path.insert(0, NoGraphmod())
""")
LOAD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    variant, path, queries, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if variant == "graphmod":
        import graphmod  # loads graphmod's op library
    elif variant == "tfra":
        from tensorflow_recommenders_addons import dynamic_embedding  # loads TFRA's ops
        assert op_def_registry.get("TFRA>CuckooHashTableFind") is not None
    tf1 = tf.compat.v1

    def status():
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
        return out["VmHWM"], out["VmRSS"]

    q = dict(np.load(queries))
    with tf.Graph().as_default(), tf1.Session() as s:  # the runtime's one-off allocations
        s.run(tf.constant(1.0) + 1.0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = status()[1]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    graph = tf.Graph()
    sess = tf1.Session(graph=graph)
    with graph.as_default():
        meta = tf1.saved_model.load(sess, ["serve"], path)
    load_s, load_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    hwm, rss = status()
    out = dict(load_s=load_s, load_cpu_s=load_cpu, base_mb=base / 1e6,
               peak_mb=(hwm - base) / 1e6, final_mb=(rss - base) / 1e6)
    sig = meta.signature_def["serving_default"]
    feed_name, fetch = sig.inputs["ids"].name, sig.outputs["p"].name
    out["check"] = {k[6:]: sess.run(fetch, {feed_name: q[k]}).tolist()
                    for k in q if k.startswith("check_")}
    hwm, rss = status()
    out["first_run_peak_mb"] = (hwm - base) / 1e6
    for name in ("seen_b1", "seen_b256", "unseen_b1", "unseen_b256"):
        if name not in q:
            continue
        batches = q[name]
        for b in batches[:warmup]:
            sess.run(fetch, {feed_name: b})
        lat = np.empty(len(batches))
        cpu0 = time.process_time()
        for i, b in enumerate(batches):
            t = time.perf_counter()
            sess.run(fetch, {feed_name: b})
            lat[i] = time.perf_counter() - t
        cpu = time.process_time() - cpu0
        out[name] = dict(p50_us=float(np.percentile(lat, 50)) * 1e6,
                         p99_us=float(np.percentile(lat, 99)) * 1e6,
                         cpu_s_per_1k=cpu / len(batches) * 1000)
    hwm, rss = status()
    out["served_peak_mb"], out["served_final_mb"] = (hwm - base) / 1e6, (rss - base) / 1e6
    sess.close()
    out["graphmod_imported"] = "graphmod" in sys.modules
    out["graphmod_ops_registered"] = op_def_registry.get("GraphmodTable") is not None
    if variant != "graphmod":
        assert not out["graphmod_imported"] and not out["graphmod_ops_registered"]
    print("RESULT " + json.dumps(out))
""")

# Dense and portable in one stock process, requests alternating in chunks
# (ABAB... within the process): the latency goal's ratio without the
# process-to-process drift of a shared machine.
PAIRED = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    paths = {"dense": sys.argv[1], "portable": sys.argv[2]}
    q = {"dense": dict(np.load(sys.argv[3])), "portable": dict(np.load(sys.argv[4]))}
    chunk, warmup = json.loads(sys.argv[5]), int(sys.argv[6])
    models = {}
    for v, path in paths.items():
        graph = tf.Graph()
        sess = tf1.Session(graph=graph)
        with graph.as_default():
            meta = tf1.saved_model.load(sess, ["serve"], path)
        sig = meta.signature_def["serving_default"]
        models[v] = (sess, sig.inputs["ids"].name, sig.outputs["p"].name)
    out = {}
    for name in ("seen_b1", "seen_b256"):
        lat = {v: [] for v in models}
        for v, (sess, feed, fetch) in models.items():
            for b in q[v][name][:warmup]:
                sess.run(fetch, {feed: b})
        n = len(q["dense"][name])
        for c, start in enumerate(range(0, n, chunk[name])):
            for v in (list(models) if c % 2 == 0 else list(models)[::-1]):
                sess, feed, fetch = models[v]
                for b in q[v][name][start:start + chunk[name]]:
                    t = time.perf_counter()
                    sess.run(fetch, {feed: b})
                    lat[v].append(time.perf_counter() - t)
        out[name] = {v: dict(p50_us=float(np.percentile(x, 50)) * 1e6,
                             p99_us=float(np.percentile(x, 99)) * 1e6) for v, x in lat.items()}
        out[name]["ratio"] = out[name]["portable"]["p50_us"] / out[name]["dense"]["p50_us"]
    assert "graphmod" not in sys.modules
    print("RESULT " + json.dumps(out))
""")
PAIRED_CHUNK = dict(seen_b1=100, seen_b256=50)


# --- the driver --------------------------------------------------------------

class WorkerFailed(RuntimeError):
    pass


def _last_lines(text, n=1):
    lines = [ln for ln in text.strip().splitlines()
             if ln.strip() and not ln.startswith((" ", "WARNING", "W0", "I0"))]
    return " | ".join(lines[-n:])[-400:]


def _run(cmd, env):
    """Runs a subprocess to its end (killed on timeout or on any exception in
    this process: subprocess.run kills it) and returns its RESULT json."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=WORKER_TIMEOUT, cwd=tempfile.gettempdir())
    results = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        raise WorkerFailed(_last_lines(done.stderr) or f"exit status {done.returncode}")
    return json.loads(results[-1][7:])


def _env(stock):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    if stock:
        for k in ("PYTHONPATH", "GRAPHMOD_OPS_LIBRARY"):
            env.pop(k, None)
    return env


def worker(cmd, *args):
    return _run([sys.executable, os.path.abspath(__file__), "--worker", cmd, *args],
                _env(stock=False))


def load(variant, path, queries):
    if variant == "graphmod":
        cmd = [sys.executable, "-c", LOAD]
    else:  # isolated: no PYTHONPATH, no user site; and graphmod blocked
        cmd = [sys.executable, "-I", "-c", BLOCK_GRAPHMOD + LOAD]
    return _run(cmd + [variant, path, queries, str(WARMUP)], _env(stock=variant != "graphmod"))


def paired(dense_path, portable_path, queries):
    return _run([sys.executable, "-I", "-c", BLOCK_GRAPHMOD + PAIRED, dense_path, portable_path,
                 queries["dense"], queries["hashed"], json.dumps(PAIRED_CHUNK), str(WARMUP)],
                _env(stock=True))


def du_bytes(path):
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def make_data(n, data_dir, rng):
    """keys (N distinct random non-negative 63-bit ints), rows, and the
    queries: npz for dense (row numbers) and for the hashed variants (keys)."""
    keys = np.unique(rng.integers(1, 2**63 - 1, int(n * 1.001) + 16, dtype=np.int64))
    keys = rng.permutation(keys)[:n]
    assert len(keys) == n
    np.save(os.path.join(data_dir, "keys.npy"), keys)
    rows = (rng.standard_normal((n, DIM), dtype=np.float32) * np.float32(0.1))
    np.save(os.path.join(data_dir, "rows.npy"), rows)
    del rows
    sorted_keys = np.sort(keys)

    def fresh(count):
        out = rng.integers(1, 2**63 - 1, count, dtype=np.int64)
        hit = np.isin(out, sorted_keys, assume_unique=False)
        out[hit] = -out[hit] - 1  # negative: never a stored key
        return out

    idx = dict(seen_b1=rng.integers(0, n, (REQ_B1, 1, 1)),
               seen_b256=rng.integers(0, n, (REQ_B256, 256, 1)))
    dense = dict(idx, check_seen=idx["seen_b256"][0, :8])
    hashed = {k: keys[v] for k, v in idx.items()}
    for b in ("b1", "b256"):
        ids = hashed[f"seen_{b}"].copy()
        unseen = rng.random(ids.shape) < UNSEEN_SHARE
        ids[unseen] = fresh(int(unseen.sum()))
        hashed[f"unseen_{b}"] = ids
    hashed["check_seen"] = hashed["seen_b256"][0, :8]
    hashed["check_unseen"] = fresh(8)[:, None]
    paths = {}
    for name, q in (("dense", dense), ("hashed", hashed)):
        paths[name] = os.path.join(data_dir, f"queries_{name}.npz")
        np.savez(paths[name], **q)
    return paths


def one_key_count(n, args, tmp, rng):
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    t0 = time.perf_counter()
    queries = make_data(n, data_dir, rng)
    print(f"{n:,} keys: data in {time.perf_counter() - t0:.1f} s", flush=True)
    model_dirs, failed = {}, {}
    for kind in ("dense", "graphmod", "tfra"):
        if kind in args.skip or (kind == "graphmod" and {"graphmod", "portable"} <= args.skip):
            continue
        model_dirs[kind] = os.path.join(tmp, f"model_{kind}")
        t0 = time.perf_counter()
        try:
            worker("make", kind, model_dirs[kind], data_dir)
            print(f"  model_dir {kind}: {time.perf_counter() - t0:.1f} s "
                  f"({du_bytes(model_dirs[kind]) / 1e6:.0f} MB)", flush=True)
        except WorkerFailed as e:
            failed[kind] = f"model_dir: {e}"
            print(f"  model_dir {kind}: FAILED: {e}", flush=True)
    os.remove(os.path.join(data_dir, "rows.npy"))
    os.remove(os.path.join(data_dir, "keys.npy"))
    variants = [v for v in VARIANTS if v not in args.skip]
    runs = {v: [] for v in variants}
    errors, exported, paired_runs = {}, {}, []
    for r in range(args.rounds):
        for v in variants:
            kind = "graphmod" if v == "portable" else v
            if kind in failed:
                errors[v] = failed[kind]
                continue
            base = os.path.join(tmp, "export", f"{v}-{r}")
            try:
                ex = worker("export", v, model_dirs[kind], base, str(n))
                res = dict(ex, bytes=du_bytes(ex["path"]))
                del res["path"]  # a temp dir
                res.update(load(v, ex["path"], queries["dense" if v == "dense" else "hashed"]))
                runs[v].append(res)
                exported[v] = ex["path"]
                print(f"  round {r + 1} {v:9s} export {res['export_s']:6.1f} s  "
                      f"{res['bytes'] / 1e6:7.1f} MB  load {res['load_s']:5.2f} s  "
                      f"peak {res['peak_mb']:7.1f} final {res['final_mb']:7.1f} MB  "
                      f"b1 p50 {res['seen_b1']['p50_us']:6.0f} us  "
                      f"b256 p50 {res['seen_b256']['p50_us']:6.0f} us", flush=True)
            except WorkerFailed as e:
                errors[v] = str(e)
                print(f"  round {r + 1} {v:9s} FAILED: {e}", flush=True)
        if "dense" in exported and "portable" in exported:
            try:
                res = paired(exported["dense"], exported["portable"], queries)
                paired_runs.append(res)
                print(f"  round {r + 1} paired    portable/dense p50 "
                      f"b1 {res['seen_b1']['ratio']:.2f}x  "
                      f"b256 {res['seen_b256']['ratio']:.2f}x", flush=True)
            except WorkerFailed as e:
                errors["paired"] = str(e)
                print(f"  round {r + 1} paired    FAILED: {e}", flush=True)
        exported.clear()
        shutil.rmtree(os.path.join(tmp, "export"), ignore_errors=True)
    for d in list(model_dirs.values()) + [data_dir]:
        shutil.rmtree(d, ignore_errors=True)
    return summarize(n, runs, errors, paired_runs)


def _col(runs, *path):
    out = []
    for run in runs:
        x = run
        for p in path:
            x = x[p]
        out.append(x)
    return out


def summarize(n, runs, errors, paired_runs):
    out = dict(keys=n, dim=DIM, variants={}, errors=errors, paired=paired_runs)
    for v, rs in runs.items():
        if not rs:
            continue
        row = dict(rounds=len(rs), runs=rs, medians={})
        for key in ("export_s", "export_cpu_s", "export_peak_mb", "bytes", "load_s", "peak_mb",
                    "final_mb", "first_run_peak_mb", "served_final_mb"):
            row["medians"][key] = float(np.median(_col(rs, key)))
        row["medians"]["peak_over_final"] = float(np.median(
            [x["peak_mb"] / x["final_mb"] for x in rs]))
        for q in ("seen_b1", "seen_b256", "unseen_b1", "unseen_b256"):
            if q in rs[0]:
                for m in ("p50_us", "p99_us", "cpu_s_per_1k"):
                    row["medians"][f"{q}_{m}"] = float(np.median(_col(rs, q, m)))
        out["variants"][v] = row
    # The same answers: seen ids everywhere, unseen ids graphmod vs portable.
    first = {v: r["runs"][0]["check"] for v, r in out["variants"].items()}
    agree = {}
    ref = first.get("dense") or first.get("graphmod")
    for v, c in first.items():
        agree[f"{v}_seen"] = bool(ref is not None and np.allclose(c["seen"], ref["seen"],
                                                                 rtol=1e-5, atol=1e-6))
    if "graphmod" in first and "portable" in first:
        agree["portable_unseen_equals_graphmod"] = bool(np.array_equal(
            first["portable"]["unseen"], first["graphmod"]["unseen"]))
    out["answers_agree"] = agree
    out["goals"] = goals(n, out["variants"], paired_runs)
    return out


def goals(n, variants, paired_runs):
    """The latency goal is judged on the paired runs (one process, requests
    alternating) when there are any; the ratio of the separate load
    processes' p50s (per round, then the median) is shown beside it."""
    g = {}
    if "dense" in variants and "portable" in variants:
        d, p = variants["dense"]["runs"], variants["portable"]["runs"]
        k = min(len(d), len(p))
        for b in ("b1", "b256"):
            separate = float(np.median(ratio_per_round(_col(p[:k], f"seen_{b}", "p50_us"),
                                                       _col(d[:k], f"seen_{b}", "p50_us"))))
            ratio = (float(np.median(_col(paired_runs, f"seen_{b}", "ratio")))
                     if paired_runs else separate)
            g[f"portable_latency_{b}"] = dict(
                value=ratio, limit=1.1, passed=ratio <= 1.1, separate_processes=separate,
                paired_rounds=_col(paired_runs, f"seen_{b}", "ratio"))
    for v, row in variants.items():
        ratio = row["medians"]["peak_over_final"]
        g[f"load_peak_over_final_{v}"] = dict(value=ratio, limit=1.3, passed=ratio <= 1.3)
    if "portable" in variants:
        limit = (n * 8 + n * DIM * 4) * 1.1
        b = variants["portable"]["medians"]["bytes"]
        g["portable_bytes"] = dict(value=b, limit=limit, passed=b <= limit)
    return g


def print_table(res, rounds):
    n = res["keys"]
    print(f"\n{n:,} keys, dim {DIM}: median (min-max) over {rounds} interleaved rounds; memory "
          "above the loading process's baseline")
    print(f"  {'variant':9s} {'export s':18s} {'MB':>7s} {'load s':>6s} "
          f"{'peak MB':18s} {'final MB':18s} {'peak/final':>10s}")
    for v in VARIANTS:
        if v not in res["variants"]:
            if v in res["errors"]:
                print(f"  {v:9s} NOT MEASURED: {res['errors'][v]}")
            continue
        rs, m = res["variants"][v]["runs"], res["variants"][v]["medians"]
        print(f"  {v:9s} {spread(_col(rs, 'export_s'), '{:.1f}'):18s} {m['bytes'] / 1e6:7.1f} "
              f"{m['load_s']:6.2f} {spread(_col(rs, 'peak_mb'), '{:.0f}'):18s} "
              f"{spread(_col(rs, 'final_mb'), '{:.0f}'):18s} {m['peak_over_final']:9.2f}x")
    print("  latency us per session.run, p50 (min-max) / p99 median; cpu-s per 1000 requests")
    print(f"  {'variant':9s} {'b1 p50':16s} {'p99':>5s} {'b256 p50':16s} {'p99':>5s} "
          f"{'unseen b1':>9s} {'p99':>5s} {'unseen b256':>11s} {'p99':>5s} "
          f"{'cpu b1':>6s} {'cpu b256':>8s}")
    for v in VARIANTS:
        if v not in res["variants"]:
            continue
        rs, m = res["variants"][v]["runs"], res["variants"][v]["medians"]

        def unseen(b):
            if f"unseen_{b}_p50_us" not in m:
                return f"{'-':>{9 if b == 'b1' else 11}s} {'-':>5s}"
            return (f"{m[f'unseen_{b}_p50_us']:{9 if b == 'b1' else 11}.0f} "
                    f"{m[f'unseen_{b}_p99_us']:5.0f}")
        print(f"  {v:9s} {spread(_col(rs, 'seen_b1', 'p50_us'), '{:.0f}'):16s} "
              f"{m['seen_b1_p99_us']:5.0f} {spread(_col(rs, 'seen_b256', 'p50_us'), '{:.0f}'):16s} "
              f"{m['seen_b256_p99_us']:5.0f} {unseen('b1')} {unseen('b256')} "
              f"{m['seen_b1_cpu_s_per_1k']:6.3f} {m['seen_b256_cpu_s_per_1k']:8.3f}")
    if res["paired"]:
        pr = res["paired"]
        print("  paired (dense and portable in one stock process, requests alternating in chunks): "
              "p50 us dense / portable: " + ", ".join(
                  f"{b} {np.median(_col(pr, f'seen_{b}', 'dense', 'p50_us')):.0f} / "
                  f"{np.median(_col(pr, f'seen_{b}', 'portable', 'p50_us')):.0f}"
                  for b in ("b1", "b256")))
    for v, e in res["errors"].items():
        if v in res["variants"] or v == "paired":
            print(f"  {v}: failed in some round: {e}")
    agree = res["answers_agree"]
    print("  answers: " + ", ".join(f"{k} {'ok' if v else 'DIFFER'}" for k, v in agree.items()))
    print("  goals:")
    for k, g in res["goals"].items():
        mark = "PASS" if g["passed"] else "FAIL"
        if k == "portable_bytes":
            text = f"{g['value'] / 1e6:.1f} MB <= {g['limit'] / 1e6:.1f} MB"
        elif k.startswith("portable_latency"):
            text = (f"p50 {g['value']:.2f}x <= {g['limit']}x (paired in one process, median of "
                    f"{spread(g['paired_rounds'])}; separate load processes "
                    f"{g['separate_processes']:.2f}x)" if g["paired_rounds"] else
                    f"p50 {g['value']:.2f}x <= {g['limit']}x (separate load processes)")
        else:
            text = f"{g['value']:.2f}x <= {g['limit']}x"
        print(f"    [{mark}] {k}: {text}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="1000000,10000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100k keys, 2 rounds (a smoke test)")
    ap.add_argument("--skip", default="", help="comma-separated variants to leave out")
    ap.add_argument("--json", default=None, help=f"default {RESULTS} (not written with --quick)")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        cmd, rest = args.worker[0], args.worker[1:]
        if cmd == "export":
            result = worker_export(rest[0], rest[1], rest[2], int(rest[3]))
        else:
            result = worker_make(*rest)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.keys, args.rounds = "100000", 2
    args.skip = set(filter(None, args.skip.split(",")))
    key_counts = [int(k) for k in args.keys.split(",")]
    # A SIGTERM unwinds like Ctrl-C: the running worker is killed, temp dirs removed.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.perf_counter()
    rng = np.random.default_rng(20261125)
    results = []
    tmp = tempfile.mkdtemp(prefix="graphmod-serving-bench-")
    try:
        for n in key_counts:
            sub = tempfile.mkdtemp(prefix=f"{n}-", dir=tmp)
            results.append(one_key_count(n, args, sub, rng))
            shutil.rmtree(sub, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.perf_counter() - started
    for res in results:
        print_table(res, args.rounds)
    print(f"\nrun took {took / 60:.1f} min ({machine()})")
    out = args.json or (None if args.quick else RESULTS)
    if out:
        write_json(out, dict(machine=machine(), date=time.strftime("%Y-%m-%d"),
                             rounds=args.rounds, requests=dict(b1=REQ_B1, b256=REQ_B256,
                                                               warmup=WARMUP),
                             unseen_share=UNSEEN_SHARE, run_minutes=took / 60,
                             results=results))
    # A measurement that failed for graphmod's own variants is an error; TFRA's is reported.
    return 1 if any(v != "tfra" for r in results for v in r["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
