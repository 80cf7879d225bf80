"""Every private or undocumented TensorFlow surface graphmod's hooks use.

A SessionRunHook is told neither the Estimator whose session it joins, nor
that Estimator's input batch, nor MonitoredTrainingSession's saving
arguments, and TF offers no public way to ask. Each use below says what it
relies on and the version it was checked on (tensorflow-cpu 2.15.1,
tensorflow-estimator 2.15.0, the last TF with tf.estimator);
tests/test_tf_private.py fails when TF changes any of it. (export_saved_model
needs none: it goes through the public Estimator.model_fn.)
"""
import inspect
from typing import Optional, Tuple

import tensorflow as tf
from tensorflow.python.training import training_util

tf1 = tf.compat.v1


def _callers():
    """The frames of the Python call stack, innermost first."""
    frame = inspect.currentframe()
    while frame is not None:
        yield frame
        frame = frame.f_back


def running_estimator() -> Optional[tf1.estimator.Estimator]:
    """The Estimator whose train/evaluate/predict is creating this session.

    Relies on (TF 2.15.1): those methods create their MonitoredSession, which
    calls every hook's begin(), inside their own call, so a frame whose `self`
    is the Estimator is on the stack. The innermost one is the Estimator
    whose session it is (an Estimator's method may call another's).
    """
    owners = (frame.f_locals.get("self") for frame in _callers())
    # tf.estimator.Estimator subclasses tf.compat.v1.estimator.Estimator.
    return next((o for o in owners if isinstance(o, tf1.estimator.Estimator)), None)


def estimator_trains(graph: tf.Graph) -> bool:
    """Whether graph was built by Estimator.train.

    Relies on (TF 2.15.1): both of Estimator.train's paths create the global
    step and, right after it (before input_fn and model_fn build anything),
    a read of it in its name scope, kept in the collection
    training_util.GLOBAL_STEP_READ_KEY. Evaluate, predict and export do not;
    a step-counting hook (StepCounterHook, CheckpointSaverHook, ...) whose
    begin() runs before GraphModifierHook's creates that read too, but after
    the model: so the read counts only when nothing but the global step's
    own ops precedes it since the global step.
    """
    reads = graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
    step = tf1.train.get_global_step(graph)
    if not reads or step is None:
        return False
    ops = graph.get_operations()
    first, read = ops.index(step.op), ops.index(reads[0].op)
    return all(op.name.startswith(step.op.name + "/") for op in ops[first + 1:read])


def global_step_read(graph: tf.Graph) -> Optional[tf.Tensor]:
    """The global step's value as TF's own step-counting hooks read it (one
    cached read per graph; None without a global step).

    Relies on (TF 2.15.1): training_util._get_or_create_global_step_read,
    which keeps it in the collection estimator_trains reads.
    """
    return training_util._get_or_create_global_step_read(graph)  # pylint: disable=protected-access


def session_saves() -> Optional[Tuple[Optional[str], Optional[float], Optional[int]]]:
    """(checkpoint_dir, save_checkpoint_secs, save_checkpoint_steps) of the
    MonitoredTrainingSession call creating this session, if any.

    Relies on (TF 2.15.1): the function's code is named
    MonitoredTrainingSession, has those parameters, and has replaced their
    defaults (USE_DEFAULT) by the values it saves with before hooks begin.
    """
    for frame in _callers():
        args = frame.f_locals
        if frame.f_code.co_name == "MonitoredTrainingSession" and "checkpoint_dir" in args:
            return args["checkpoint_dir"], args["save_checkpoint_secs"], args["save_checkpoint_steps"]
    return None


def input_feature(name: str) -> tf.Tensor:
    """The feature `name` of the batch the Estimator on the call stack feeds
    its model_fn.

    Relies on (TF 2.15.1): Estimator._train_model_default holds that batch
    in its local `features` (a dict for dict-of-features input_fns) while
    its session's hooks begin.
    """
    seen = None
    for frame in _callers():
        batch = frame.f_locals.get("features")
        if isinstance(batch, dict):
            if name in batch:
                return batch[name]
            seen = sorted(batch)
    raise ValueError(f"GraphModifierHook: timestamp_feature '{name}' is not in the input batch "
                     f"({'its features: ' + str(seen) if seen else 'no features dict found'}); "
                     "pass the timestamp tensor itself when not training an Estimator")


def beginning_session() -> Optional[Tuple[list, object]]:
    """(hooks, session_creator) of the MonitoredSession whose hooks' begin()
    is running (None outside one).

    Relies on (TF 2.15.1): _MonitoredSession.__init__(session_creator, hooks,
    ...) sets self._hooks and then calls every hook's begin() in its own
    frame, before it creates the session with session_creator (a
    ChiefSessionCreator under Estimators and MonitoredTrainingSession).
    """
    from tensorflow.python.training import monitored_session  # pylint: disable=import-outside-toplevel
    for frame in _callers():
        owner = frame.f_locals.get("self")
        if (isinstance(owner, monitored_session._MonitoredSession)  # pylint: disable=protected-access
                and frame.f_code.co_name == "__init__" and "session_creator" in frame.f_locals):
            return list(getattr(owner, "_hooks", [])), frame.f_locals["session_creator"]
    return None


def saver_hook_settings(hook) -> Tuple[Optional[str], Optional[float], Optional[int]]:
    """(checkpoint_dir, save_secs, save_steps) of a CheckpointSaverHook.

    Relies on (TF 2.15.1): it keeps checkpoint_dir in _checkpoint_dir and its
    schedule in _timer, a SecondOrStepTimer with _every_secs, _every_steps.
    """
    timer = hook._timer  # pylint: disable=protected-access
    return (hook._checkpoint_dir,  # pylint: disable=protected-access
            getattr(timer, "_every_secs", getattr(timer, "every_secs", None)),
            getattr(timer, "_every_steps", getattr(timer, "every_steps", None)))


def set_saver_hook_timer(hook, timer) -> None:
    """Makes a CheckpointSaverHook save when timer says.

    Relies on (TF 2.15.1): the hook asks only its _timer when to save
    (should_trigger_for_step, update_last_triggered_step,
    last_triggered_step) and saves unconditionally when its session is
    created and, unless it just did, when it ends.
    """
    hook._timer = timer  # pylint: disable=protected-access


def session_checkpoint(creator) -> Optional[str]:
    """The checkpoint a ChiefSessionCreator was given to restore (None: the
    latest of its checkpoint_dir, if any).

    Relies on (TF 2.15.1): ChiefSessionCreator keeps its arguments in
    _checkpoint_dir and _checkpoint_filename_with_path and reads them when it
    creates the session.
    """
    return getattr(creator, "_checkpoint_filename_with_path", None)


def set_session_checkpoint_dir(creator, checkpoint_dir: Optional[str]) -> None:
    """Makes a ChiefSessionCreator restore checkpoint_dir's latest checkpoint
    (see session_checkpoint); None: none (SessionManager restores nothing
    without a checkpoint_dir or path).
    """
    creator._checkpoint_dir = checkpoint_dir  # pylint: disable=protected-access


def set_session_checkpoint(creator, path: str) -> None:
    """Makes a ChiefSessionCreator restore the checkpoint path (see session_checkpoint)."""
    creator._checkpoint_filename_with_path = path  # pylint: disable=protected-access
