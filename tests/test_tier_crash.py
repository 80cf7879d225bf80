"""SIGKILL during a spill and during a compaction of the disk tier loses
nothing a committed checkpoint or delta holds, and a restart from it is exact.

The tier is scratch: checkpoints and deltas hold the rows, never its files.
examples/tier_train.py trains in a child process with the tier's test pause
(GRAPHMOD_TIER_TEST_PAUSE: a spill's records written but not indexed, or a
compaction's copies written but the index not switched) and small segments,
so both happen in a short run; the test SIGKILLs the child when it reports
the pause. Its model_dir's newest committed state (checkpoint + deltas) is
at some step K. A restart trains on from K with new batches; a reference
that never crashed trains K steps, then the same new batches. Both end in
the same state, bit for bit (last_seen, the wall clock, aside), and the
restart removed the killed process's tier files."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "tier_train.py")
sys.path.insert(0, HERE)
from test_tiers import assert_same_state, checkpoint_state  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 60


def run(model_dir, storage, steps, start, env=None):
    done = subprocess.run([sys.executable, TRAIN, model_dir, "--storage", storage,
                           "--steps", str(steps), "--start", str(start)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _committed_step(model_dir):
    from graphmod.checkpoint import merged
    try:
        return merged.latest(model_dir).step
    except (merged.StateError, OSError, tf.errors.OpError):
        return -1  # none yet, or being written


def kill_at_pause(model_dir, storage, pause):
    """Trains until the tier reports `pause`, then SIGKILLs the process."""
    env = dict(os.environ, GRAPHMOD_TIER_TEST_PAUSE=pause,
               GRAPHMOD_TIER_TEST_SEGMENT_BYTES=str(2 << 10))
    child = subprocess.Popen([sys.executable, TRAIN, model_dir, "--storage", storage,
                              "--steps", str(STEPS)], env=env, stderr=subprocess.PIPE,
                             text=True)
    try:
        tail = []
        for line in child.stderr:
            tail = (tail + [line])[-40:]
            # A pause once a state past step 0 is committed: the restart goes on from it.
            if line.startswith(f"graphmod tier test pause: {pause} ") and \
                    _committed_step(model_dir) >= 4:
                child.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail(f"no {pause} pause reported:\n{''.join(tail)}")
    finally:
        child.kill()
        child.wait()
    return child.returncode


@pytest.mark.parametrize("pause", ["spill", "compact"])
def test_sigkill_in_the_tier_loses_nothing_committed(tmp_path, pause):
    from graphmod.checkpoint import merged
    storage = str(tmp_path / "tier")
    crashed, reference = str(tmp_path / "crashed"), str(tmp_path / "reference")
    assert kill_at_pause(crashed, storage, pause) == -signal.SIGKILL
    left = [f for _, _, files in os.walk(storage) for f in files if f.startswith("seg-")]
    assert left  # the killed process's segment files are still there
    k = merged.latest(crashed).step
    assert 0 < k < STEPS

    run(crashed, storage, STEPS - k, start=1000)  # the restart, from the committed state
    run(reference, storage, k, start=0)           # never crashed: the same K steps ...
    run(reference, storage, STEPS - k, start=1000)  # ... and the same new batches
    assert merged.latest(crashed).step == merged.latest(reference).step == STEPS
    a, b = checkpoint_state(crashed), checkpoint_state(reference)
    assert len(a["input_layer/item_embedding/embedding_weights-keys"]) > 200
    assert_same_state(a, b)
    assert not [f for _, _, files in os.walk(storage) for f in files], \
        "the restart removes the killed process's tier"
    np.testing.assert_array_equal(a["global_step"], STEPS)
