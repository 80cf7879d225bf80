"""A table bigger than the machine's memory, trained through the disk tier
(issue 35). benchmarks/tiers.py runs this plan when its all-in-memory arm
would not fit the machine (python benchmarks/tiers.py --keys 200M).

One table, dim 16, Adagrad (152-byte records), memory_budget --budget bytes,
its other rows in segment files under --storage. Two processes:
  train    fills the table with KEYS keys (batches of 65,536 new ids: a
           lookup that inserts, then an Adagrad apply), trains STEPS steps of
           B ids drawn Zipf(a) over the keys from a tf.data pipeline, for
           a = 1.05 then 1.2, then saves a full checkpoint (TableSaver).
  restart  a fresh process builds the same graph, restores the checkpoint
           and trains one step: the time to its first step.
Printed: fill rate, examples/s per Zipf (process CPU-seconds beside),
hit ratio (ids found in memory), bytes on disk, the checkpoint's time and
size, the restart's restore and first-step times, and each process's peak
RSS. The disk space the run needs is checked first (the tier and the
checkpoint are both on disk while the restart runs).
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

from tiers import B, DIM, STEPS, ZIPFS, zipf_batches

WARM = 5
FILL_B = 65536  # x 16 spared steps stays far under any budget of a GB
RECORD_BYTES = 152  # key, last_seen, count, version, 16 values, 16 Adagrad slots
DISK_BYTES = 160  # a record on disk: crc and padding
CHECKPOINT_BYTES = 172  # a row in a checkpoint (key, values, slots, count, last_seen, version; measured)


def disk_needed(keys):
    """Bytes the run needs on the storage's disk: the tier (and a little
    garbage) beside the full checkpoint, plus 2 GiB of room."""
    return int(keys * (DISK_BYTES * 1.02 + CHECKPOINT_BYTES)) + (2 << 30)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def log(message):
    print(f"[tier_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build(keys, budget, storage):
    """The graph both processes run: (table, ids placeholder, train op,
    per-Zipf pipelines {a: (iterator, next)}, saver, counters)."""
    import tensorflow as tf
    import graphmod
    from graphmod.checkpoint.saver import TableSaver
    tf1 = tf.compat.v1
    step = tf1.train.get_or_create_global_step()
    opt = graphmod.optimizers.Adagrad(0.1)
    table = graphmod.create_table("bench", DIM, optimizer=opt, memory_budget=budget,
                                  storage_path=storage)
    pipelines = {}
    for a in ZIPFS:
        data = tf.data.Dataset.from_tensor_slices(zipf_batches(keys, a, WARM + STEPS, int(a * 100)))
        it = tf1.data.make_initializable_iterator(data.prefetch(1))
        pipelines[a] = it
    which = tf1.placeholder_with_default(tf.constant(0), [])
    from_pipeline = tf.switch_case(which, [pipelines[a].get_next for a in ZIPFS])
    ids = tf1.placeholder_with_default(tf.cast(from_pipeline, tf.int64), [None])
    rows = graphmod.sparse_lookup(table, ids, is_training=True)
    train = tf.group(opt.minimize(tf.reduce_sum(rows * rows)), step.assign_add(1))
    saver = TableSaver(sharded=True, max_to_keep=None)
    saver.build()
    counters = dict(table.info(), **table.tier_info())
    return dict(ids=ids, which=which, train=train, pipelines=pipelines, saver=saver,
                counters=counters)


def session():
    import tensorflow as tf
    tf1 = tf.compat.v1
    return tf1.Session(config=tf1.ConfigProto(intra_op_parallelism_threads=2,
                                              inter_op_parallelism_threads=2))


def files_bytes(prefix):
    folder, name = os.path.split(prefix)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.startswith(name + "."))


def run_train(keys, budget, storage, checkpoint_dir):
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = build(keys, budget, storage)
    out = {}
    with session() as sess:
        sess.run(tf1.global_variables_initializer())
        wall0, cpu0, last = time.perf_counter(), time.process_time(), time.perf_counter()
        for start in range(0, keys, FILL_B):
            sess.run(g["train"], {g["ids"]: np.arange(start, min(start + FILL_B, keys))})
            if time.perf_counter() - last > 30 or start + FILL_B >= keys:
                last = time.perf_counter()
                c = sess.run(g["counters"])
                done = min(start + FILL_B, keys)
                log(f"fill {done:,}/{keys:,} keys ({done / (last - wall0) / 1e3:.0f}k keys/s), "
                    f"{int(c['disk_rows']):,} on disk, RSS peak {peak_rss_mib():.0f} MiB")
        out["fill_s"] = time.perf_counter() - wall0
        out["fill_cpu_s"] = time.process_time() - cpu0
        for i, a in enumerate(ZIPFS):
            sess.run(g["pipelines"][a].initializer)
            for _ in range(WARM):
                sess.run(g["train"], {g["which"]: i})
            before = sess.run(g["counters"])
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(STEPS):
                sess.run(g["train"], {g["which"]: i})
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            after = sess.run(g["counters"])
            d = {k: int(after[k] - before[k]) for k in after}
            out[f"zipf_{a}"] = dict(
                examples_s=B * STEPS / wall, cpu_s_per_1k=cpu / (B * STEPS / 1e3),
                hit_ratio=1 - d["promoted"] / max(d["lookups"], 1),
                disk_rows_per_step=d["disk_reads"] / STEPS)
            log(f"zipf {a}: {B * STEPS / wall / 1e3:.0f}k examples/s, hit ratio "
                f"{out[f'zipf_{a}']['hit_ratio']:.3f}")
        c = sess.run(g["counters"])
        out.update(rows=int(c["size"]), memory_rows=int(c["memory_rows"]),
                   disk_rows=int(c["disk_rows"]),
                   disk_file_bytes=int(c["disk_file_bytes"]),
                   memory_bytes=int(c["memory_bytes"]))
        log(f"saving a full checkpoint of {int(c['size']):,} rows")
        t = time.perf_counter()
        path = g["saver"].save(sess, os.path.join(checkpoint_dir, "model.ckpt"), global_step=0)
        out["checkpoint_s"] = time.perf_counter() - t
        out["checkpoint_bytes"] = files_bytes(path)
        out["checkpoint"] = path
        log(f"saved in {out['checkpoint_s']:.0f} s, {out['checkpoint_bytes'] / 2**30:.1f} GiB")
    out["train_peak_rss_mib"] = peak_rss_mib()
    return out


def run_restart(keys, budget, storage, checkpoint):
    import tensorflow as tf
    tf1 = tf.compat.v1
    start = time.perf_counter()
    g = build(keys, budget, storage)
    with session() as sess:
        sess.run(tf1.global_variables_initializer())
        t = time.perf_counter()
        g["saver"].restore(sess, checkpoint)
        restore_s = time.perf_counter() - t
        log(f"restored in {restore_s:.0f} s")
        sess.run(g["pipelines"][ZIPFS[0]].initializer)
        t = time.perf_counter()
        sess.run(g["train"])
        first_step_s = time.perf_counter() - t
        size = int(sess.run(g["counters"]["size"]))
    return dict(restore_s=restore_s, first_step_s=first_step_s,
                to_first_step_s=time.perf_counter() - start, restored_rows=size,
                restart_peak_rss_mib=peak_rss_mib())


def run(keys, budget, storage):
    """The whole plan (parent): checks the disk, runs both processes, prints
    the figures and returns them."""
    parent = os.path.dirname(os.path.abspath(storage))
    need, free = disk_needed(keys), shutil.disk_usage(parent).free
    log(f"{keys:,} keys need ~{need / 2**30:.0f} GiB on disk under {parent} "
        f"(tier ~{keys * DISK_BYTES / 2**30:.0f} GiB, checkpoint ~"
        f"{keys * CHECKPOINT_BYTES / 2**30:.0f} GiB); {free / 2**30:.0f} GiB are free")
    if free < need:
        sys.exit(f"tiers: not enough disk space for {keys:,} keys: ~{need / 2**30:.0f} GiB "
                 f"needed under {parent}, {free / 2**30:.0f} GiB free")
    checkpoint_dir = storage.rstrip("/") + "-checkpoint"
    shutil.rmtree(storage, ignore_errors=True)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    os.makedirs(checkpoint_dir)
    me = os.path.abspath(__file__)
    try:
        def phase(*argv):
            done = subprocess.run([sys.executable, me, *argv, str(keys), str(budget), storage],
                                  stdout=subprocess.PIPE, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"tiers: the {argv[0]} process failed (exit {done.returncode})")
            return json.loads(done.stdout.strip().splitlines()[-1])
        result = dict(keys=keys, budget=budget, dim=DIM, batch=B, steps=STEPS)
        result.update(phase("train", checkpoint_dir))
        result.update(phase("restart", result["checkpoint"]))
        if result["restored_rows"] != result["rows"]:
            sys.exit(f"tiers: the restart restored {result['restored_rows']:,} rows of "
                     f"{result['rows']:,}")
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    gib = 2**30
    print(f"\n{keys:,} keys (all in memory: ~{keys * RECORD_BYTES / gib:.0f} GiB of records "
          f"alone), dim {DIM}, Adagrad, memory_budget {budget / gib:.1f} GiB")
    print(f"  fill            {keys / result['fill_s'] / 1e3:.0f}k keys/s "
          f"({result['fill_s']:.0f} s, {result['fill_cpu_s']:.0f} CPU-s)")
    for a in ZIPFS:
        z = result[f"zipf_{a}"]
        print(f"  train zipf {a:4}  {z['examples_s'] / 1e3:.0f}k examples/s, "
              f"{z['cpu_s_per_1k']:.4f} CPU-s/1k, hit ratio {z['hit_ratio']:.3f}, "
              f"{z['disk_rows_per_step']:.0f} rows read from disk a step")
    print(f"  on disk         {result['disk_rows']:,} rows, "
          f"{result['disk_file_bytes'] / gib:.1f} GiB of segment files; in memory "
          f"{result['memory_rows']:,} rows, {result['memory_bytes'] / gib:.2f} GiB by the "
          f"table's counter")
    print(f"  peak RSS        train {result['train_peak_rss_mib'] / 1024:.2f} GiB, "
          f"restart {result['restart_peak_rss_mib'] / 1024:.2f} GiB")
    print(f"  full checkpoint {result['checkpoint_s']:.0f} s, "
          f"{result['checkpoint_bytes'] / gib:.1f} GiB")
    print(f"  restart         restore {result['restore_s']:.0f} s, first step "
          f"{result['first_step_s']:.2f} s, {result['to_first_step_s']:.0f} s from the "
          f"process's graph to its first step ({result['restored_rows']:,} rows)")
    return result


if __name__ == "__main__":
    # Internal: python tier_scale.py {train CHECKPOINT_DIR | restart CHECKPOINT}
    #           KEYS BUDGET STORAGE; prints one JSON line.
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    what, where, keys, budget, storage = sys.argv[1:6]
    fn = run_train if what == "train" else run_restart
    print(json.dumps(fn(int(keys), int(budget), storage, where)))
