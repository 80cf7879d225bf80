"""table_counters: a training graph summarises its tables' counters in one summary op."""
import tensorflow as tf

from graphmod.horovod.exchange import BYTES_SENT
from graphmod.rewrite_rules import table_counters

from .helpers import READING_RULES, TRAINING_RULES, apply_rules, tiny_model

tf1 = tf.compat.v1


def test_a_training_graph_gets_one_summary_of_every_tables_counters():
    with tf.Graph().as_default() as g:
        a = tiny_model(tf1.train.AdagradOptimizer(0.1), name="a")
        b = tiny_model(name="b", ids=a.ids)
        tf1.train.AdagradOptimizer(0.1).minimize(b.loss)
        applied = apply_rules(g, *TRAINING_RULES, table_counters)
        assert len(applied.conversions) == 2
        counters = applied.reported("counters")
        assert sorted(counters) == ["a", "b"]
        assert {"size", "admitted", "rejected", "evicted", "pending"} <= set(counters["a"])
        (summary,) = [s for s in g.get_collection(tf1.GraphKeys.SUMMARIES)
                      if s.op.type == "ScalarSummary"]
        assert summary.op.name == "graphmod/counters"
        assert applied.built_by("table_counters").count("ScalarSummary") == 1
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(a.rows, {a.ids: [1, 2, 2, 7]})  # inserts 3 rows into a only
            size_a, size_b, proto = sess.run([counters["a"]["size"], counters["b"]["size"],
                                              summary])
        assert (size_a, size_b) == (3, 0)
        values = {v.tag: v.simple_value for v in tf1.Summary.FromString(proto).value}
        assert values["graphmod/a/rows"] == 3 and values["graphmod/a/admitted"] == 3
        assert values["graphmod/b/rows"] == 0


def test_a_graph_that_does_not_train_gets_none():
    with tf.Graph().as_default() as g:
        tiny_model()
        applied = apply_rules(g, *READING_RULES, table_counters, training=False)
        assert len(applied.conversions) == 1  # converted, refused nothing
        assert applied.reported("counters") == {}
        assert applied.built_by("table_counters") == []
        assert g.get_collection(tf1.GraphKeys.SUMMARIES) == []


def test_the_bytes_the_exchanges_send_are_summarised():
    """What shard_exchange counts in BYTES_SENT becomes one scalar,
    graphmod/exchange/bytes_sent (graphmod inspect prints it)."""
    with tf.Graph().as_default() as g:
        m = tiny_model(tf1.train.AdagradOptimizer(0.1))
        tf1.add_to_collection(BYTES_SENT, tf.size(m.ids, tf.int64) * 8)
        tf1.add_to_collection(BYTES_SENT, tf.constant(100, tf.int64))
        apply_rules(g, *TRAINING_RULES, table_counters)
        (sent,) = [s for s in g.get_collection(tf1.GraphKeys.SUMMARIES)
                   if s.op.name.startswith("graphmod/exchange/bytes_sent")]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            proto = sess.run(sent, {m.ids: [1, 2, 3]})
        assert tf1.Summary.FromString(proto).value[0].simple_value == 124
