"""ps_shards: in a parameter-server cluster, each table is sharded by key over the ps tasks.

Runs the rewritten graph on an in-process cluster (a worker and two ps
servers on loopback ports in this process) against the same model rewritten
without ps tasks; tests/test_ps.py runs it as users launch it."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from graphmod.embeddings.partition import owner_of, owner_of_numpy
from graphmod.rewrite.rule import Refused
from graphmod.checkpoint.warm_start import WarmStartSettings
from graphmod.rewrite_rules import (dense_reads, fuse_table_ops, ps_shards, saver_swap,
                                    shard_exchange, warm_start, warm_start_sources)
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.state import graph_state

from .helpers import TRAINING_RULES, apply_rules, context_for, only_conversion, tiny_model

tf1 = tf.compat.v1
RULES = (TRAINING_RULES[:2] + (dense_reads,) + TRAINING_RULES[2:]
         + (shard_exchange, ps_shards, fuse_table_ops))
STEPS = [[1, 2, 1, 9], [2, 5, 40], [7, 7, 3, 1000]]


@pytest.fixture(scope="module")
def cluster():
    """A worker and two ps tasks, servers of this process; the worker's target."""
    ports = [_free_port() for _ in range(3)]
    spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{ports[0]}"],
                                 "ps": [f"127.0.0.1:{p}" for p in ports[1:]]})
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, start=True)
               for job, i in (("worker", 0), ("ps", 0), ("ps", 1))]
    return servers[0].target


def _free_port() -> int:
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_tables(on_ps: bool, tasks: int = 2):
    device = (tf1.train.replica_device_setter(ps_tasks=tasks, worker_device="/job:worker/task:0")
              if on_ps else None)
    with tf1.device(device):
        a = tiny_model(name="a", rows=2000, initializer=tf1.random_normal_initializer(seed=1))
        b = tiny_model(name="b", rows=2000, ids=a.ids,
                       initializer=tf1.random_normal_initializer(seed=2))
        train = tf1.train.AdagradOptimizer(0.1).minimize(a.loss + b.loss)
    return a, b, train


def _train(target, on_ps: bool, tasks: int = 2):
    """(rows read after training, {table: {key: row}}, {table: [keys of each shard]}, applied)."""
    with tf.Graph().as_default() as g:
        a, b, train = _two_tables(on_ps, tasks)
        applied = apply_rules(g, *RULES, ps_tasks=tasks if on_ps else 0)
        shards = graph_state(g).ps_parts
        if on_ps:  # the ps tasks' tables outlive a session: start from none
            tf1.Session.reset(target)
        with tf1.Session(target if on_ps else "") as sess:
            sess.run(tf1.global_variables_initializer())
            for ids in STEPS:
                sess.run(train, {a.ids: ids})
            read = sess.run([a.rows, b.rows], {a.ids: [5, 1, 40, 77]})
            tables, held = {}, {}
            for c in applied.conversions:
                table = applied.context.built(Lookups, c).table
                parts = [sess.run(t.export()) for t in shards.get(table.name, [table])]
                held[table.name] = [sorted(p["keys"].tolist()) for p in parts]
                tables[table.name] = {int(k): v for p in parts
                                      for k, v in zip(p["keys"], p["values"])}
        return read, tables, held, applied


def test_the_sharded_tables_train_as_one_table_each(cluster):
    read, tables, held, applied = _train(cluster, on_ps=True)
    one_read, one_tables, _, _ = _train(None, on_ps=False)
    for x, y in zip(read, one_read):
        np.testing.assert_array_equal(x, y)
    assert tables.keys() == one_tables.keys() == {"a", "b"}
    for name, rows in one_tables.items():
        assert sorted(tables[name]) == sorted(rows) == [1, 2, 3, 5, 7, 9, 40, 77, 1000]  # (77: read last)
        for k, row in rows.items():
            np.testing.assert_array_equal(tables[name][k], row)
        # Each shard holds exactly the keys it owns, and both hold some.
        keys = sorted(rows)
        owners = owner_of(tf.constant(keys, tf.int64), 2).numpy().tolist()
        assert held[name] == [[k for k, o in zip(keys, owners) if o == i] for i in (0, 1)]
        assert all(held[name]), held[name]
    # One lookup and one apply per ps task and step, over both tables.
    built = applied.built_by("ps_shards")
    assert built.count("GraphmodFusedFindOrInsert") == 2
    assert built.count("GraphmodFusedApply") == 2
    assert built.count("GraphmodTable") == 2  # the other task's shard of each table
    devices = {op.device for op in applied.rw.graph.get_operations()
               if op.type in ("GraphmodFusedFindOrInsert", "GraphmodFusedApply")
               and applied.rw.index.used(op)}
    assert devices == {"/job:ps/task:0", "/job:ps/task:1"}
    # Each task's keys (and gradients) arrive as one tensor, cut apart on the
    # task: TensorFlow moves each tensor crossing tasks in an RPC of its own.
    # A lookup's keys are the task's plan of the distinct keys routed to it.
    for op in applied.rw.graph.get_operations():
        if op.type in ("GraphmodFusedFindOrInsert", "GraphmodFusedApply") and \
                applied.rw.index.used(op):
            sent = [t.op.inputs[0] if t.op.type == "Reshape" else t  # (gradient rows)
                    for t in op.inputs[2:4 if op.type == "GraphmodFusedFindOrInsert" else 6]]
            cut = "GraphmodExchangeServe" if op.type == "GraphmodFusedFindOrInsert" else "SplitV"
            assert {(t.op.type, t.op.device) for t in sent} == {(cut, op.device)}, op.name
            if cut == "GraphmodExchangeServe":  # from one tensor: the task's routed keys
                assert sent[0].op.inputs[0].op.type == "SplitV"


def test_refuses_a_variable_off_the_ps_tasks_and_whole_reads():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))  # no device
        with pytest.raises(Refused, match="^it is placed on 'no device', not on a ps task, "
                                          "while tables are sharded over the 2 ps tasks$"):
            ps_shards.check(only_conversion(g), context_for(g, ps_tasks=2))
        # With one ps task (or none) nothing is sharded, so nothing is refused.
        for tasks in (0, 1):
            assert ps_shards.check(only_conversion(g), context_for(g, ps_tasks=tasks)) is None
    with tf.Graph().as_default() as g:
        with tf.device("/job:ps/task:1"):
            m = tiny_model(tf1.train.AdagradOptimizer(0.1))
        c, context = only_conversion(g), context_for(g, ps_tasks=2)
        assert ps_shards.check(c, context) is None
        with pytest.raises(Refused, match="^it is read whole, which a table sharded over 2 ps "
                                          "tasks cannot serve$"):
            ps_shards.check(dataclasses.replace(c, dense_reads=[m.variable.value()]), context)
        assert ps_shards.check(dataclasses.replace(c, warm_start=tf.zeros([8, 2])), context) \
            is None  # (rewrite_rules/warm_start.py fills every shard)


@pytest.mark.parametrize("how", ["init_from_checkpoint", "graphmod.WarmStartSettings"])
def test_a_warm_start_fills_each_ps_tasks_shard_with_the_keys_it_owns(cluster, tmp_path, how):
    """A warm start into a table split over 2 ps tasks, the Estimator's
    (init_from_checkpoint, as WarmStartSettings does) or graphmod's
    (GraphModifierHook(warm_start=...)): the variables' initialization
    imports into each task's shard the rows of the keys it owns, each its
    own checkpoint row; the flag that runs the import lives on a ps task,
    where every worker sees it."""
    source = np.arange(4000, dtype=np.float32).reshape(2000, 2) / 1000
    with tf.Graph().as_default():
        tf1.get_variable("a", initializer=source, use_resource=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            path = tf1.train.Saver().save(sess, str(tmp_path / "source.ckpt"))
    with tf.Graph().as_default() as g:
        with tf1.device(tf1.train.replica_device_setter(ps_tasks=2)):
            tf1.train.create_global_step()
        a, _, _ = _two_tables(on_ps=True)
        if how == "init_from_checkpoint":
            tf1.train.init_from_checkpoint(path, {"a": "a"})
            applied = apply_rules(g, *RULES, warm_start, ps_tasks=2)
            assert "GraphmodTableImport" in applied.built_by("warm_start")
        else:
            settings = WarmStartSettings([path], mapping={"a": "a"})
            applied = apply_rules(g, *RULES, saver_swap, warm_start_sources, ps_tasks=2,
                                  warm_start=settings)
            # (its imports are in loops, one stored slice at a time)
            assert "GraphmodCheckpointRowSlices" in applied.built_by("warm_start_sources")
        flag = next(v for v in tf1.global_variables() if "warm_start" in v.op.name)
        assert flag.device.startswith("/job:ps/"), flag.device
        table = applied.context.built(Lookups, applied.conversions[0]).table
        tf1.Session.reset(cluster)
        with tf1.Session(cluster) as sess:
            sess.run(tf1.global_variables_initializer())
            parts = [sess.run(t.export()) for t in graph_state(g).ps_parts[table.name]]
            read = sess.run(a.rows, {a.ids: [3, 1999, 3]})
    owners = owner_of_numpy(np.arange(2000), 2)
    for task, part in enumerate(parts):
        keys = np.sort(part["keys"])
        np.testing.assert_array_equal(keys, np.flatnonzero(owners == task))
        order = np.argsort(part["keys"])
        np.testing.assert_array_equal(part["values"][order], source[keys])
    np.testing.assert_array_equal(read, source[[3, 1999, 3]])


def test_a_warm_start_before_the_split_fails_naming_the_table(tmp_path):
    """Rule sets that run warm_start before ps_shards would import every
    key into one shard: the rewrite fails instead."""
    with tf.Graph().as_default():
        tf1.get_variable("a", initializer=np.ones([2000, 2], np.float32), use_resource=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            path = tf1.train.Saver().save(sess, str(tmp_path / "source.ckpt"))
    with tf.Graph().as_default() as g:
        _two_tables(on_ps=True)
        tf1.train.init_from_checkpoint(path, {"a": "a"})
        with pytest.raises(ValueError, match="ran before ps_shards split table 'a' over the 2"):
            apply_rules(g, *TRAINING_RULES, warm_start, ps_tasks=2)


def test_with_one_ps_task_the_tables_stay_whole_and_the_gradient_rows_cross_once(cluster):
    read, tables, held, applied = _train(cluster, on_ps=True, tasks=1)
    one_read, one_tables, _, _ = _train(None, on_ps=False)
    for x, y in zip(read, one_read):
        np.testing.assert_array_equal(x, y)
    for name, rows in one_tables.items():
        assert len(held[name]) == 1  # no shards
        for k, row in rows.items():
            np.testing.assert_array_equal(tables[name][k], row)
    assert not graph_state(applied.rw.graph).ps_parts
    # Only the applies change: one apply, of each key's summed gradient row.
    assert applied.built_by("ps_shards").count("GraphmodFusedApply") == 1
    assert applied.built_by("ps_shards").count("UniqueV2") + \
        applied.built_by("ps_shards").count("Unique") == 2
    assert "GraphmodTable" not in applied.built_by("ps_shards")


def test_a_train_op_never_runs_another_train_ops_updates(cluster):
    """Two train ops, and a group of both (built, not run): running one
    steps its table only, as in one process."""
    with tf.Graph().as_default() as g:
        with tf1.device(tf1.train.replica_device_setter(ps_tasks=2,
                                                        worker_device="/job:worker/task:0")):
            a = tiny_model(name="a", rows=2000, initializer=tf1.random_normal_initializer(seed=1))
            b = tiny_model(name="b", rows=2000, ids=a.ids,
                           initializer=tf1.random_normal_initializer(seed=2))
            train_a = tf1.train.AdagradOptimizer(0.1).minimize(a.loss)
            train_b = tf1.train.AdagradOptimizer(0.1).minimize(b.loss)
            tf.group(train_a, train_b, name="both")
        applied = apply_rules(g, *RULES, ps_tasks=2)
        tf1.Session.reset(cluster)
        with tf1.Session(cluster) as sess:
            sess.run(tf1.global_variables_initializer())
            before = sess.run([a.rows, b.rows], {a.ids: [1, 2, 3]})
            sess.run(train_a, {a.ids: [1, 2, 3]})
            after = sess.run([a.rows, b.rows], {a.ids: [1, 2, 3]})
    assert not np.array_equal(before[0], after[0])  # a stepped
    np.testing.assert_array_equal(before[1], after[1])  # b did not
    # One fused apply per ps task and train op.
    assert applied.built_by("ps_shards").count("GraphmodFusedApply") == 4
