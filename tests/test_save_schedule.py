"""graphmod.horovod.save_schedule pieces that need no Horovod ranks
(tests/test_horovod_layouts.py runs them on ranks)."""
import os

from graphmod.checkpoint.parts import absolute
from graphmod.horovod.save_schedule import SharedTimer


def test_urls_stay_as_they_are_and_local_paths_become_absolute():
    for url in ("gs://bucket/model", "hdfs://nn:8020/m", "s3://b/m"):
        assert absolute(url) == url
    assert absolute("model") == os.path.join(os.getcwd(), "model")
    assert absolute(None) is None


def test_a_time_decision_is_due_only_from_the_step_after_it_came():
    """Rank 0's decision comes with step N's results; every saver hook must
    save at step N + 1, whether its after_run() runs before or after the
    schedule's in step N."""
    timer = SharedTimer(every_steps=None, every_secs=600)
    timer.update_last_triggered_step(0)
    timer.pending = True  # what the schedule's after_run() of step N sets
    assert not timer.should_trigger_for_step(5)  # a saver hook after it, in step N
    timer.arm()  # the schedule's before_run() of step N + 1
    assert timer.should_trigger_for_step(6)
    timer.update_last_triggered_step(6)
    assert not timer.due and not timer.should_trigger_for_step(7)
