"""GraphModifierHook(profile_every_steps=N) on the demo model
(examples/hook_demo.py, unchanged), and `graphmod profile`: the traced steps'
op time split into groups with the tables' share, the slowest ops named, the
tables' counters (rows, new keys per step, dedup ratio), and a page of
pictures that renders in headless Chromium."""
import json
import os
import sys

import tensorflow as tf
from absl import flags

import graphmod
from graphmod import charts, profiles
from graphmod_cli import main
from screenshots import screenshot, share

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import hook_demo  # noqa: E402
import synthetic  # noqa: E402

BATCH = 256


def test_the_demo_model_profiled_shows_where_the_step_time_goes(tmp_path, capsys):
    flags.FLAGS(["hook_demo"])  # the demo's model_fn reads its flags' defaults
    model_dir = str(tmp_path / "model")
    estimator = tf.estimator.Estimator(hook_demo.model_fn, model_dir)
    estimator.train(synthetic.input_fn(hook_demo.CFG, BATCH, 30 * BATCH),
                    hooks=[graphmod.GraphModifierHook(profile_every_steps=10)])
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
    assert any(o["type"].startswith("GraphmodFused") for o in s["top_ops"]), s["top_ops"]
    assert all(a["ms"] >= b["ms"] for a, b in zip(s["top_ops"], s["top_ops"][1:]))
    tables = s["tables"]
    assert set(tables) == {f"{n}_embedding" for n in hook_demo.CFG.categorical_names}
    final = tf.train.load_checkpoint(model_dir)
    for name, t in tables.items():
        # The rows at the last traced step are the table's rows then: at most
        # what the final checkpoint holds. A training lookup sees each id of
        # the batch: at least one per distinct id.
        assert 0 < t["size"] <= final.get_tensor(f"{name}-keys").size, (name, t)
        assert t["memory_bytes"] > 0 and t["dedup_ratio"] >= 1, (name, t)
        # Every id of every batch: the last record is the 30th run's, whose
        # counters were read before or after its own lookup.
        assert t["ids_looked_up"] in (29 * BATCH, 30 * BATCH), (name, t)
    # C8 draws from 50 ids: every one was seen by step 10 (no new keys after),
    # and a batch of 256 repeats each ~5 times or more. C1 draws from 300,000
    # ids under a power law: new keys every step, few repeats.
    c8, c1 = tables["C8_embedding"], tables["C1_embedding"]
    assert c8["size"] <= 50 and c8["new_keys_per_step"] == 0 and c8["rows_per_step"] == 0, c8
    assert c8["dedup_ratio"] >= BATCH / 50, c8
    assert c1["new_keys_per_step"] > 10 and c1["new_keys_per_step"] == c1["rows_per_step"], c1
    assert c1["dedup_ratio"] < c8["dedup_ratio"], (c1, c8)

    assert main(["graphmod", "profile", model_dir]) == 0
    text = capsys.readouterr().out
    assert "op time: input" in text and "tables " in text, text
    assert "table 'C8_embedding'" in text and "+0.0/step, 0.0 new keys/step" in text, text
    assert f"dedup ratio {c8['dedup_ratio']:.2f}" in text, text

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
