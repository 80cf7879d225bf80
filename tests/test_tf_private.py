"""graphmod.tf_private: each private TensorFlow surface the hook relies on
still behaves as it did on TF 2.15.1 / tensorflow-estimator 2.15.0.

A failure here means TF changed what graphmod.tf_private reads: the hook
would no longer find the Estimator, tell training from prediction, find the
timestamp feature or check Horovod saves.
"""
import numpy as np
import pytest
import tensorflow as tf

from graphmod import tf_private
from tensorflow.python.training.training_util import GLOBAL_STEP_READ_KEY

tf1 = tf.compat.v1


class Probe(tf1.train.SessionRunHook):
    """Records, in begin(), what graphmod.tf_private finds."""

    def __init__(self):
        self.seen = []

    def begin(self):
        graph = tf1.get_default_graph()
        try:
            feature = tf_private.input_feature("ids")
        except ValueError:
            feature = None
        self.seen.append(dict(estimator=tf_private.running_estimator(),
                              trains=tf_private.estimator_trains(graph),
                              feature=feature, saves=tf_private.session_saves(),
                              reads=bool(graph.get_collection(GLOBAL_STEP_READ_KEY))))


def test_the_estimator_its_training_and_its_batch_are_found_in_every_mode(tmp_path):
    batches = []

    def model_fn(features, labels, mode):
        batches.append(features["ids"])
        w = tf1.get_variable("w", [3, 1])
        logits = tf.squeeze(tf.matmul(tf.cast(features["ids"], tf.float32), w), 1)
        # The optimizer in every mode: its TRAIN_OP and ops are no sign of training.
        loss = tf.reduce_mean(tf.square(logits - (labels if labels is not None else 0.0)))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                          predictions={"p": logits})

    def input_fn(labelled=True):
        ids = np.arange(12, dtype=np.int64).reshape(4, 3)
        data = ({"ids": ids}, np.ones(4, np.float32)) if labelled else {"ids": ids}
        return lambda: tf.data.Dataset.from_tensor_slices(data).batch(4)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
    probe = Probe()
    est.train(input_fn(), steps=1, hooks=[probe])
    est.evaluate(input_fn(), steps=1, hooks=[probe])
    list(est.predict(input_fn(labelled=False), hooks=[probe]))
    train, evaluate, predict = probe.seen
    assert all(s["estimator"] is est for s in probe.seen), probe.seen
    assert [s["trains"] for s in probe.seen] == [True, False, False]
    # A step-counting hook that begins first creates the step's read after the
    # model: prediction stays prediction.
    counting = Probe()
    list(est.predict(input_fn(labelled=False),
                     hooks=[tf1.train.StepCounterHook(every_n_steps=1), counting]))
    assert [(s["trains"], s["reads"]) for s in counting.seen] == [(False, True)]
    # Only Estimator.train's batch is looked up (timestamp_feature trains only).
    assert train["feature"] is batches[0]
    # Estimator.train runs a MonitoredTrainingSession of its own; the others none.
    assert train["saves"][0] == est.model_dir
    assert evaluate["saves"] is None and predict["saves"] is None


@pytest.mark.parametrize("args, saves", [
    ({}, (600, None)),  # its defaults
    (dict(save_checkpoint_steps=5), (None, 5)),
    (dict(save_checkpoint_secs=30), (30, None)),
])
def test_monitored_training_session_saving_arguments_are_found(tmp_path, args, saves):
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        probe = Probe()
        with tf1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=[probe],
                                                **args):
            pass
    (seen,) = probe.seen
    assert seen["saves"] == (str(tmp_path),) + saves
    assert seen["estimator"] is None and seen["feature"] is None


def test_the_global_step_read_is_cached_in_the_collection_estimator_trains_reads():
    with tf.Graph().as_default() as graph:
        assert tf_private.global_step_read(graph) is None  # no global step yet
        step = tf1.train.get_or_create_global_step()
        assert not tf_private.estimator_trains(graph)
        read = tf_private.global_step_read(graph)
        assert tf_private.global_step_read(graph) is read and tf_private.estimator_trains(graph)
        with tf1.Session() as sess:
            sess.run(step.initializer)
            sess.run(step.assign(7))
            assert sess.run(read) == 7


class SessionProbe(tf1.train.SessionRunHook):
    """In begin(): the beginning session's saver hooks (their settings) and
    creator (its checkpoint); optionally redirects them."""

    def __init__(self, timer=None, restore_dir=None, restore=None, restore_nothing=False):
        self.timer, self.restore_dir, self.restore = timer, restore_dir, restore
        self.restore_nothing = restore_nothing
        self.seen = []

    def begin(self):
        hooks, creator = tf_private.beginning_session()
        savers = [h for h in hooks if isinstance(h, tf1.train.CheckpointSaverHook)]
        self.seen.append(dict(savers=[tf_private.saver_hook_settings(h) for h in savers],
                              checkpoint=tf_private.session_checkpoint(creator)))
        for h in savers:
            if self.timer is not None:
                tf_private.set_saver_hook_timer(h, self.timer)
        if self.restore_dir is not None or self.restore_nothing:
            tf_private.set_session_checkpoint_dir(creator, self.restore_dir)
        if self.restore is not None:
            tf_private.set_session_checkpoint(creator, self.restore)


def test_the_beginning_session_s_saver_hooks_and_checkpoint_are_found_and_redirected(tmp_path):
    """What graphmod.horovod.save_schedule relies on: the session's
    CheckpointSaverHook saves when the timer it is given says, and its
    session creator restores the checkpoint (or the dir's latest) it is
    pointed at."""
    from graphmod.horovod.save_schedule import SharedTimer

    def model_fn(features, labels, mode):
        w = tf1.get_variable("w", [3, 1], initializer=tf1.zeros_initializer())
        logits = tf.squeeze(tf.matmul(tf.cast(features["ids"], tf.float32), w), 1)
        loss = tf.reduce_mean(tf.square(logits - 1.0))
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, tf1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                          predictions={"p": logits})

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(
            ({"ids": np.arange(12, dtype=np.int64).reshape(4, 3)}, np.ones(4, np.float32))).batch(1)

    first = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "first"))
    timer = SharedTimer(every_steps=None, every_secs=600)  # by time: never, unless due
    probe = SessionProbe(timer)

    class Due(tf1.train.SessionRunHook):  # as rank 0's broadcast decision at step 2
        def after_run(self, run_context, run_values):
            timer.due = timer.last_triggered_step() == 0 and not timer.due
    first.train(lambda: input_fn().repeat(), steps=4, hooks=[probe, Due()])
    (train,) = probe.seen
    assert train["savers"] == [(first.model_dir, 600, None)] and train["checkpoint"] is None
    # Saved when the session began, when `due` (after the next step) and at the end.
    steps = sorted(int(p.rsplit("-", 1)[1]) for p in tf.train.get_checkpoint_state(
        first.model_dir).all_model_checkpoint_paths)
    assert steps == [0, 2, 4], steps
    # Another Estimator's training and prediction restore first's checkpoints.
    second = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "second"))
    probe = SessionProbe(restore_dir=first.model_dir)
    second.train(input_fn, steps=1, hooks=[probe])
    assert second.get_variable_value("global_step") == 5
    # Pointed at no dir, it restores nothing: not even its own model_dir's
    # latest (a rank whose rank 0 has no checkpoint starts afresh).
    again = tf.estimator.Estimator(model_fn, model_dir=second.model_dir)
    again.train(input_fn, steps=1, hooks=[SessionProbe(restore_nothing=True)])
    assert again.get_variable_value("global_step") == 1
    probe = SessionProbe(restore=tf.train.latest_checkpoint(first.model_dir))
    fresh = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "fresh"))
    got = [p["p"] for p in fresh.predict(input_fn, hooks=[probe])]
    want = [p["p"] for p in first.predict(input_fn)]
    assert probe.seen[0]["checkpoint"] is None and probe.seen[0]["savers"] == []
    np.testing.assert_allclose(got, want)
    assert np.abs(want).max() > 0  # trained, not the zeros a fresh start predicts


def test_clearing_control_dependencies_also_leaves_a_v1_loop():
    """graphmod.embeddings.features.clock builds one clock per graph under
    control_dependencies(None), from inside a while loop's body, a
    control_dependencies block and a name scope, and every lookup of the step
    then reads it (a loop in a v2 FuncGraph is another graph: the clock's
    cache is per graph)."""
    with tf.Graph().as_default() as graph:
        x = tf.constant(1.0, name="x")
        built = []

        def body(i):
            with tf1.control_dependencies([x.op]), tf1.name_scope("inner"):
                with graph.control_dependencies(None), tf1.name_scope(None):
                    built.append(tf.constant(2, name="at_root"))
                built.append(tf.constant(3, name="inside"))
            return [i + built[-1]]

        tf1.disable_control_flow_v2()  # v1 loops keep a context on the graph
        try:
            tf1.while_loop(lambda i: i < 10, body, [tf.constant(0)])
        finally:
            tf1.enable_control_flow_v2()
        root, inside = built
        assert root.op.name == "at_root"
        assert root.op.control_inputs == []
        assert root.op._control_flow_context is None  # pylint: disable=protected-access
        # and the loop's own ops still are inside it: the context came back
        assert inside.op.name.endswith("inner/inside")
        assert inside.op._control_flow_context is not None  # pylint: disable=protected-access
        assert inside.op.control_inputs  # (x as the loop sees it, and the loop's pivot)
