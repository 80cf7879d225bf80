"""Two real Horovod ranks over loopback (Gloo) drive graphmod tables.

This proves the pinned Horovod build runs beside graphmod's ops; sharding
tables across ranks builds on it.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import numpy as np, tensorflow as tf, horovod.tensorflow as hvd, graphmod
    tf.compat.v1.disable_eager_execution()
    hvd.init()
    opt = graphmod.optimizers.Adagrad(0.1)
    table = graphmod.create_table("emb", 4, optimizer=opt)
    ids = tf.constant(np.arange(10) + 100 * hvd.rank(), tf.int64)   # disjoint per rank
    rows = graphmod.sparse_lookup(table, ids)
    train = opt.minimize(tf.reduce_sum(rows * rows))
    total = hvd.allreduce(tf.cast(table.size(), tf.float32), op=hvd.Sum)
    first = hvd.allgather(tf.reshape(rows[0], [1, 4]))
    with tf.compat.v1.Session() as sess:
        sess.run(hvd.broadcast_global_variables(0))
        sess.run(train)
        t, f = sess.run([total, first])
        print(f"rank {hvd.rank()} of {hvd.size()}: rows {int(t)} firstdiff {float(np.abs(f[0] - f[1]).sum()):.3f}",
              flush=True)
""")


def test_two_gloo_ranks_use_tables_and_collectives(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    out = subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
                          sys.executable, str(script)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if "rows " in l]
    assert len(lines) == 2, out.stdout[-3000:]
    for line in lines:
        assert "of 2: rows 20 " in line  # 10 distinct ids on each rank
        # Different ids on the two ranks have different initial rows.
        assert float(line.split("firstdiff ")[1]) > 0
