"""The Rewriter records every graph edit and undoes them all; GraphView indexes uses."""
import pytest
import tensorflow as tf

from graphmod.rewrite.index import GraphIndex as GraphView
from graphmod.rewrite.rewriter import Rewriter
from graphmod.state import graph_state

tf1 = tf.compat.v1


def test_reroute_control_and_collections_are_recorded_and_undone():
    with tf.Graph().as_default() as g:
        a = tf.constant(1.0, name="a")
        b = tf.constant(2.0, name="b")
        double = tf.multiply(a, 2.0, name="double")
        plus = tf.add(a, 1.0, name="plus")
        with tf.control_dependencies([double]):
            after = tf.identity(plus, name="after")
        v = tf1.Variable(3.0, name="v")
        view = GraphView(g)
        assert set(view.consumers(a)) == {double.op, plus.op}
        assert view.control_consumers(double.op) == [after.op]

        rw = Rewriter(g)
        with rw.rule("demo"):
            c = tf.constant(5.0, name="c")
            assert rw.reroute(a, c, ignore=[plus.op]) == 1
            assert rw.replace_control_input(double.op, plus.op) == 1
            assert set(rw.remove_from_collections(v)) == {tf1.GraphKeys.GLOBAL_VARIABLES,
                                                          tf1.GraphKeys.TRAINABLE_VARIABLES}
        assert double.op.inputs[0] is c and plus.op.inputs[0] is a
        assert after.op.control_inputs == [plus.op]
        assert v not in tf1.global_variables()
        summary = rw.summary()["demo"]
        assert summary == {"reroute": 1, "control": 1, "collection_remove": 2, "build": 1}
        with pytest.raises(TypeError, match="int32"):
            rw.reroute(b, tf.constant(1, name="i"))

        rw.undo()
        assert double.op.inputs[0] is a
        assert after.op.control_inputs == [double.op]
        assert tf1.global_variables() == [v] and tf1.trainable_variables() == [v]


def test_the_record_names_the_rule_that_built_each_op():
    """Exactly the ops built inside a rule are its (an inner rule's are the
    inner rule's); ops built before, between or after rules are no rule's."""
    with tf.Graph().as_default() as g:
        x = tf.constant(1.0, name="x")
        rw = Rewriter(g)
        with rw.rule("first"):
            tf.add(x, 1.0, name="one")
        tf.identity(x, name="between")
        with rw.rule("outer"):
            with rw.rule("inner"):
                tf.identity(x, name="two")
            tf.identity(x, name="three")
        tf.identity(x, name="after")
        assert rw.record()["built"] == {"one/y": "first", "one": "first", "two": "inner",
                                        "three": "outer"}


def test_per_graph_state_changes_through_the_rewriter_and_undo_restores_it():
    with tf.Graph().as_default() as g:
        rw = Rewriter(g)
        with rw.rule("demo"):
            rw.set_state("split_over_ranks", True)
            rw.set_state("reads_parts", False)  # as it was: no change to record
        assert graph_state(g).split_over_ranks is True
        assert [(c.rule, c.kind, c.detail) for c in rw.changes] == [
            ("demo", "state", "split_over_ranks")]
        assert rw.summary() == {}  # a report counts edits of the graph
        rw.undo()
        assert graph_state(g).split_over_ranks is None


def test_graph_view_networkx_index_matches_the_graph():
    with tf.Graph().as_default() as g:
        a = tf.constant(1.0, name="a")
        s = tf.add(a, a, name="s")
        with tf.control_dependencies([s]):
            tf.identity(a, name="i")
        view = GraphView(g)
        assert view.consumers(a) == [s.op, g.get_operation_by_name("i")]
        edges = view.nx.get_edge_data("a", "s")
        assert sorted(d["input"] for d in edges.values()) == [0, 1]
        assert [d["control"] for d in view.nx.get_edge_data("s", "i").values()] == [True]


def test_a_branch_output_nothing_reads_ends_no_path():
    """feeds_only: a cond_v2's unread output (its Identity, as the dense
    shape of Horovod's sparse allreduce) is a dead end, not a reader; an
    output something reads still is one."""
    with tf.Graph().as_default() as g:
        x = tf1.placeholder(tf.float32, [3])
        a, b = tf.cond(tf.reduce_sum(x) > 0, lambda: (x * 2, x + 1), lambda: (x, x))
        update = tf.identity(a, name="update")
        index = GraphView(g)
        cond = a.op.inputs[0].op
        assert cond.type in ("If", "StatelessIf") and not b.consumers()
        assert index.feeds_only(cond, {update.op.name})
        tf.identity(b, name="summary")
        assert not GraphView(g).feeds_only(cond, {update.op.name})
