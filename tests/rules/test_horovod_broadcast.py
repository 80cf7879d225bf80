"""horovod_broadcast: converted variables and their slots leave Horovod's broadcast."""
import horovod.tensorflow as hvd
import pytest
import tensorflow as tf

from graphmod.rewrite_rules import horovod_broadcast

from .helpers import TRAINING_RULES, apply_rules, only_conversion, tiny_model

tf1 = tf.compat.v1


@pytest.fixture
def horovod():
    """Horovod on one rank (no horovodrun): enough to run a broadcast."""
    hvd.init()
    assert hvd.size() == 1
    yield hvd
    hvd.shutdown()


def _model():
    """The tiny model (emb, converted) and w (dense), trained by Adagrad, and
    hvd.broadcast_global_variables(0) built after them (as
    BroadcastGlobalVariablesHook listed before GraphModifierHook does)."""
    m = tiny_model(tf1.train.AdagradOptimizer(0.1))
    w = tf1.get_variable("w", [3, 1], use_resource=True)
    broadcast = hvd.broadcast_global_variables(0)
    return m, w, broadcast


def _assigned(group: tf.Operation):
    """{variable name: assign} the broadcast group waits for."""
    return {op.inputs[0].op.name: op for op in group.control_inputs
            if op.type == "AssignVariableOp" and op.inputs[1].op.type == "HorovodBroadcast"}


def test_the_broadcast_skips_converted_variables_and_their_slots(horovod):
    with tf.Graph().as_default() as g:
        m, w, broadcast = _model()
        assert sorted(_assigned(broadcast)) == ["emb", "emb/Adagrad", "w"]
        # The planner sees the broadcast's assign and read as the broadcast's, not as dense uses.
        assert only_conversion(g).name == "emb"
        applied = apply_rules(g, *TRAINING_RULES, horovod_broadcast)
        assert sorted(_assigned(broadcast)) == ["w"]
        edges = [e for e in applied.rw.record()["edges"] if e["rule"] == "horovod_broadcast"]
        # The group and each assign's own read stop waiting for emb's and its slot's assigns.
        assert sorted((e["op"], e["old"]) for e in edges) == [
            ("ReadVariableOp", "AssignVariableOp"), ("ReadVariableOp_1", "AssignVariableOp_1"),
            (broadcast.name, "AssignVariableOp"), (broadcast.name, "AssignVariableOp_1")]
        assert all(e["input"] == "control" and e["new"] is None for e in edges)
        assert applied.built_by("horovod_broadcast") == []
        # It runs without emb or its slot ever initialized (which nothing does now).
        with tf1.Session() as sess:
            sess.run(w.initializer)
            sess.run(broadcast)
        del m


def test_the_broadcast_fails_on_the_dense_graph(horovod):
    """What the rule prevents: unrewritten, the broadcast reads emb, which a
    rewritten graph never initializes."""
    with tf.Graph().as_default():
        _, w, broadcast = _model()
        with tf1.Session() as sess:
            sess.run(w.initializer)
            with pytest.raises(tf.errors.FailedPreconditionError, match="emb"):
                sess.run(broadcast)


def test_without_a_broadcast_it_changes_nothing():
    with tf.Graph().as_default() as g:
        tiny_model(tf1.train.AdagradOptimizer(0.1))
        applied = apply_rules(g, *TRAINING_RULES, horovod_broadcast)
        assert len(applied.conversions) == 1 and "horovod_broadcast" not in applied.rw.summary()
