"""GraphModifierHook(profile_every_steps=N) on an ordinary Estimator, and
`graphmod profile`: the traced steps' op time split into groups with the
tables' share, the slowest ops named, the tables' counters, and a page of
pictures that renders in headless Chromium."""
import json
import os
import sys

import tensorflow as tf

import graphmod
from graphmod import charts, profiles
from graphmod_cli import main
from screenshots import screenshot, share

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from verify_model import input_fn, model_fn  # noqa: E402


def test_a_profiled_training_shows_where_the_step_time_goes(tmp_path, capsys):
    model_dir = str(tmp_path / "model")
    estimator = tf.estimator.Estimator(model_fn, model_dir)
    estimator.train(input_fn, steps=30, hooks=[graphmod.GraphModifierHook(
        min_rows=1000, profile_every_steps=10)])
    records = profiles.read(model_dir)["train"]
    assert len(records) == 3  # runs 10, 20 and 30
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and 9 <= steps[0] <= 10 and 29 <= steps[-1] <= 30, steps

    assert main(["graphmod", "profile", "--format=json", model_dir]) == 0
    s = json.loads(capsys.readouterr().out)["train"]
    assert abs(sum(s["split"].values()) - 1) < 1e-6
    assert s["split"]["tables"] > 0 and s["split"]["model"] > 0, s["split"]
    assert s["groups_ms"]["tables:lookup"] > 0 and s["groups_ms"]["tables:apply"] > 0
    assert s["wall_ms"] > 0 and len(s["top_ops"]) == 15
    assert any(o["type"].startswith("Graphmod") for o in s["top_ops"]), s["top_ops"]
    assert all(a["ms"] >= b["ms"] for a, b in zip(s["top_ops"], s["top_ops"][1:]))
    assert set(s["tables"]) == {"user_embedding", "item_embedding"}
    for t in s["tables"].values():
        assert t["size"] > 100 and t["memory_bytes"] > 0 and t["rows_per_step"] > 0, t
    # The rows at the last traced step are the table's rows then: at most
    # what the final checkpoint holds.
    final = tf.train.load_checkpoint(model_dir)
    assert s["tables"]["user_embedding"]["size"] <= final.get_tensor(
        "user_embedding-keys").size

    assert main(["graphmod", "profile", model_dir]) == 0
    text = capsys.readouterr().out
    assert "op time: input" in text and "tables " in text and "table 'user_embedding'" in text

    page = tmp_path / "profile.html"
    assert main(["graphmod", "profile", "--format=html", f"--output={page}", model_dir]) == 0
    pixels = screenshot(page, tmp_path / "profile.png")
    for color in charts.COLORS[:3]:  # the bars of input, model and tables; the rows' lines
        assert share(pixels, color) > 0.0003, color
    assert share(pixels, "#ffffff") > 0.3


def test_a_model_dir_without_a_profile_is_one_line(tmp_path, capsys):
    model_dir = tmp_path / "plain"
    model_dir.mkdir()
    assert main(["graphmod", "profile", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "holds no profile" in err, err
