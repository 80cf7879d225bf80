"""The streaming example: an unchanged Estimator trained day by day on a
drifting stream with a timestamp feature. With admission and eviction its
tables stay bounded while next-day AUC matches the hook without them."""
import glob
import os
import sys
import tempfile

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import streaming_days  # noqa: E402

pytestmark = pytest.mark.slow


def test_admission_and_eviction_bound_the_tables_at_equal_auc(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's model_dirs
    plain = streaming_days.run(False, days=4, rows_per_day=24_000)
    bounded = streaming_days.run(True, days=4, rows_per_day=24_000)
    p, b = plain["history"], bounded["history"]
    print("rows per day, hook only:", [d["rows"] for d in p],
          "with admission and eviction:", [d["rows"] for d in b])
    print("next-day AUC, hook only:", [round(float(d["auc"]), 4) for d in p],
          "with admission and eviction:", [round(float(d["auc"]), 4) for d in b])
    # Without eviction the tables grow with every day; with it they level off
    # once rows older than two days start to leave.
    assert p[-1]["rows"] > 3 * p[0]["rows"]
    assert b[-1]["rows"] < 0.5 * p[-1]["rows"]
    assert b[-1]["rows"] < 1.25 * b[-2]["rows"]
    for day_p, day_b in zip(p, b):
        assert abs(day_p["auc"] - day_b["auc"]) < 0.01, (day_p, day_b)

    # Evicted rows are gone from the checkpoint: nothing older than the
    # threshold (plus the quarter day between evictions) is left.
    reader = tf.train.load_checkpoint(bounded["model_dir"])
    seen = reader.get_tensor("C1_embedding-last_seen")
    assert seen.min() >= seen.max() - 2.25 * streaming_days.DAY
    # Counters reach TensorBoard.
    tags = set()
    for path in glob.glob(os.path.join(bounded["model_dir"], "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    for counter in ("rows", "admitted", "rejected", "evicted", "pending"):
        assert f"graphmod/C1_embedding/{counter}" in tags, sorted(tags)
