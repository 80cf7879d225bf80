"""The graphmod command line on a real Estimator's model_dir: diff, rewrite
--dry-run, inspect, their formats, exit statuses and input errors."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod_cli import main
from screenshots import screenshot, share

tf1 = tf.compat.v1
FEATURES = {"user": 30_000, "item": 20_000}


def model_fn(features, labels, mode):
    embs = []
    for name, rows in FEATURES.items():
        var = tf1.get_variable(f"{name}_embedding", [rows, 4],
                               initializer=tf1.random_normal_initializer(stddev=0.1))
        embs.append(tf.nn.embedding_lookup(var, features[name]))
    small = tf1.get_variable("country_embedding", [50, 4])  # below min_rows: stays dense
    embs.append(tf.nn.embedding_lookup(small, features["country"]))
    # Read whole as well: it cannot be a table, and the report says why.
    score = tf1.get_variable("score_table", [20_000, 1])
    embs.append(tf.nn.embedding_lookup(score, features["item"]))
    logits = tf1.layers.dense(tf.concat(embs, 1), 1)[:, 0]
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    loss += 1e-3 * tf.reduce_mean(score)
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def input_fn(seed=0):
    rng = np.random.default_rng(seed)
    n = 64
    feats = {"user": rng.integers(0, 30_000, n), "item": rng.integers(0, 20_000, n),
             "country": rng.integers(0, 50, n)}
    return tf.data.Dataset.from_tensor_slices((feats, rng.integers(0, 2, n).astype(
        np.float32))).batch(16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model"))
    estimator = tf.estimator.Estimator(model_fn, path, config=tf.estimator.RunConfig(
        save_checkpoints_steps=2))
    estimator.train(input_fn, steps=3, hooks=[graphmod.GraphModifierHook(
        dump_graph=True, incremental_every_steps=1)])
    return path


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    """The same model trained without graphmod: what a dry run is for."""
    path = str(tmp_path_factory.mktemp("dense"))
    tf.estimator.Estimator(model_fn, path).train(input_fn, steps=1)
    return path


def run(capsys, *args):
    code = main(["graphmod", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_diff_names_every_converted_variable_its_table_and_rules_on_one_screen(
        model_dir, capsys):
    code, out, err = run(capsys, "diff", model_dir)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100  # one screen
    for name in FEATURES:
        (i,) = [i for i, l in enumerate(lines) if l.startswith(f"  {name}_embedding -> table")]
        entry = lines[i] + lines[i + 1]  # its rules: on its line, or the next
        assert "~0" not in lines[i]  # the ops that read its gathers now read the table
        for rule in ("gather_to_lookup", "optimizer_updates"):
            assert rule in entry, entry
    assert "country_embedding" not in out  # not converted, so not changed
    (dense,) = [l for l in lines if l.startswith("  left dense: score_table: read other")]
    summary = lines[0]
    assert "added" in summary and "rerouted" in summary


def test_diff_as_json_dot_and_html(model_dir, capsys, tmp_path):
    code, out, _ = run(capsys, "diff", "--format=json", model_dir)
    data = json.loads(out)
    groups = {g["variable"]: g for g in data["groups"] if g["variable"]}
    assert set(groups) == {f"{n}_embedding" for n in FEATURES}
    for g in groups.values():
        kinds = {c["kind"] for c in g["changes"]}
        assert {"added", "rerouted"} <= kinds
        # Every added op is attributed to the rule that built it.
        assert all(c["rule"] for c in g["changes"] if c["kind"] == "added")
        built = {c["type"]: c["rule"] for c in g["changes"] if c["kind"] == "added"}
        assert built["GraphmodTable"] == built["GraphmodTableFindOrInsert"] == \
            "gather_to_lookup"
        assert built["GraphmodTableApply"] == "optimizer_updates"
        assert built["GraphmodTableInfo"] == "table_counters"
    # Ops of several tables are shared, not one table's; every op is in a group.
    (shared,) = [g for g in data["groups"] if g["name"].startswith("(shared")]
    assert {"GraphmodFusedFindOrInsert", "GraphmodFusedApply"} <= \
        {c["type"] for c in shared["changes"]}
    assert [g["name"] for g in data["groups"] if g["name"] == "(other)"] == []
    code, out, _ = run(capsys, "diff", "--format=dot", model_dir)
    assert code == 0 and out.startswith("digraph graphmod_diff {") and out.count("{") == \
        out.count("}")
    page = tmp_path / "diff.html"
    code, _, _ = run(capsys, "diff", "--format=html", f"--output={page}", model_dir)
    html = page.read_text()
    assert code == 0 and "<svg" in html and "user_embedding" in html
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")  # self-contained


def test_the_keys_of_a_hash_bucket_column_are_grouped_with_their_table(tmp_path, capsys):
    """A canned estimator's hashed column: the ops that give its table the
    full fingerprints, and the id plumbing rerouted to them, are the
    table's changes (found by what they feed), not shared ones."""
    fc = tf1.feature_column
    item = fc.categorical_column_with_hash_bucket("item", 40_000, dtype=tf.int64)
    user = fc.categorical_column_with_identity("user", 30_000)

    def features_fn():
        rng = np.random.default_rng(0)
        feats = {"item": rng.integers(0, 10**9, 64), "user": rng.integers(0, 30_000, 64)}
        return tf.data.Dataset.from_tensor_slices((feats, rng.integers(0, 2, 64))).batch(16)

    model = str(tmp_path / "canned")
    tf.estimator.DNNClassifier([8], [fc.embedding_column(item, 4), fc.embedding_column(user, 4)],
                               model_dir=model).train(
        features_fn, steps=2, hooks=[graphmod.GraphModifierHook(dump_graph=True)])
    code, out, err = run(capsys, "diff", "--format=json", model)
    assert code == 0, err
    by_rule = {}
    for g in json.loads(out)["groups"]:
        for c in g["changes"]:
            by_rule.setdefault(c["rule"], set()).add(g["table"])
    assert by_rule["collisionless_keys"] == {
        "dnn/input_from_feature_columns/input_layer/item_embedding/embedding_weights"}
    assert by_rule["fuse_table_ops"] >= {None}  # the fused ops stay shared
    shared = [g for g in json.loads(out)["groups"] if g["table"] is None]
    assert [g["name"] for g in shared] == ["(shared: fused ops, exchanges, savers)"]


def test_rewrite_dry_run_of_a_canned_linear_models_saved_graph(tmp_path, capsys):
    """A canned linear model summarises its weights' fraction of zeros (a
    dense read, which the hook drops with the summary); its saved training
    graph also merges that summary, which the session built after the hook:
    the dry run leaves the merge out and converts the weights as the hook
    does (it failed validation)."""
    user = tf1.feature_column.categorical_column_with_identity("user", 30_000)
    model = str(tmp_path / "linear")
    tf.estimator.LinearClassifier([user], model_dir=model).train(
        lambda: input_fn().map(lambda f, l: ({"user": f["user"]}, l)), steps=1)
    code, out, err = run(capsys, "rewrite", "--dry-run", model)
    assert code == 0, err
    assert "linear/linear_model/user/weights [30000 x 1] -> table" in out


def test_two_graph_files_compare_and_a_before_graph_with_itself_has_no_changes(
        model_dir, capsys):
    dumps = os.path.join(model_dir, "graphmod")
    before = os.path.join(dumps, "graph_before_train.pbtxt")
    after = os.path.join(dumps, "graph_after_train.pbtxt")
    code, out, _ = run(capsys, "diff", "--format=json", before, after)
    data = json.loads(out)
    assert code == 0 and data["added"] > 0 and data["rerouted"] > 0
    assert all(c["rule"] is None for g in data["groups"] for c in g["changes"])  # no record
    # Without the report, the tables are found by their ops, and their
    # variables by name: every change is in a table's group or the shared one.
    assert [g["name"] for g in data["groups"]] == [
        "item_embedding -> table item_embedding", "user_embedding -> table user_embedding",
        "(shared: fused ops, exchanges, savers)"]
    code, out, _ = run(capsys, "diff", "--format=json", before, before)
    assert json.loads(out)["groups"] == []


def crafted_graph(path):
    """A GraphDef written by hand (TensorFlow would refuse these names):
    node names that are markup, quotes and line breaks."""
    x = 'x"<script>alert(1)</script>'
    before = tf1.GraphDef()
    before.versions.producer = 1645
    before.node.add(name=x, op="Placeholder")
    before.node.add(name="evil\nline'\"\\{}", op="Identity", input=[x])
    after = tf1.GraphDef()
    after.CopyFrom(before)
    after.node.add(name="<img src=x onerror=alert(2)>", op="AddV2", input=[x, x])
    after.node[1].input[0] = "<img src=x onerror=alert(2)>"
    (path / "before.pb").write_bytes(before.SerializeToString())
    (path / "after.pb").write_bytes(after.SerializeToString())
    return path / "before.pb", path / "after.pb"


def test_crafted_names_are_data_in_html_and_dot(capsys, tmp_path):
    before, after = crafted_graph(tmp_path)
    code, html, _ = run(capsys, "diff", "--format=html", before, after)
    assert code == 0
    assert "<script" not in html and "<img" not in html  # escaped, not live
    assert "&lt;script&gt;" in html and "&lt;img src=x" in html
    code, dot, _ = run(capsys, "diff", "--format=dot", before, after)
    # Every quoted DOT string is closed on its line: no raw newline or quote
    # from a name breaks out of it.
    for line in dot.splitlines():
        unescaped = line.replace("\\\\", "").replace('\\"', "")
        assert unescaped.count('"') % 2 == 0, line
    assert 'evil\\nline\'\\"\\\\{}' in dot
    code, text, _ = run(capsys, "diff", before, after)
    assert "\x1b" not in text and all(l.isprintable() for l in text.splitlines())


@pytest.mark.parametrize("case", ["truncated", "empty_dir", "no_graphs", "missing",
                                  "bad_plan_inspect", "bad_plan_convert", "newline_in_name",
                                  "bad_state_file"])
def test_bad_inputs_exit_2_with_one_line_naming_the_path(case, capsys, tmp_path, model_dir):
    if case == "truncated":
        data = open(os.path.join(model_dir, "graph.pbtxt"), "rb").read()
        graph_def = tf1.GraphDef()
        from google.protobuf import text_format
        text_format.Parse(data.decode(), graph_def)
        path = tmp_path / "truncated.pb"
        path.write_bytes(graph_def.SerializeToString()[:-7])
        args = ["diff", path, path]
    elif case == "empty_dir":
        path = tmp_path / "empty"
        path.mkdir()
        args = ["diff", path]
    elif case == "no_graphs":  # a model_dir trained without dump_graph
        path = tmp_path / "plain"
        tf.estimator.Estimator(model_fn, str(path)).train(input_fn, steps=1)
        args = ["diff", path]
    elif case.startswith("bad_plan"):  # a model_dir whose plan.json is torn
        import shutil
        copy = tmp_path / "model"
        shutil.copytree(model_dir, copy)
        path = copy / "graphmod" / "plan.json"
        path.write_text(path.read_text()[:50])
        args = ["inspect", copy] if case == "bad_plan_inspect" else \
            ["ckpt", "convert", "--to=dense", copy, tmp_path / "out"]
    elif case == "newline_in_name":
        path = tmp_path / "two\nlines"
        args = ["inspect", path]
    elif case == "bad_state_file":  # TensorFlow would log its parse error, then say nothing
        import shutil
        copy = tmp_path / "model"
        shutil.copytree(model_dir, copy)
        path = copy / "checkpoint"
        path.write_text("model_checkpoint_path: [unterminated")
        args = ["inspect", copy]
    else:
        path = tmp_path / "nothing.pb"
        args = ["diff", path, path]
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(path).replace("\n", "\\n") in err, err
    if case == "bad_state_file":
        assert "cannot be read" in err, err


@pytest.mark.parametrize("args", [[], ["nonsense"], ["inspect"], ["diff"], ["rewrite", "m"],
                                  ["export", "a", "b"], ["export", "--watch", "--keep=0", "a", "b"],
                                  ["ckpt", "convert", "--to=tables", "a", "b"],
                                  ["inspect", "--format=xml", "m"], ["inspect", "--nope", "m"],
                                  ["--help"], ["inspect", "--help"], ["ckpt", "--help"]])
def test_help_and_usage_errors_answer_without_tensorflow(args):
    """--help and every usage error: without importing graphmod (so neither
    TensorFlow), help on stdout with stderr empty, an error in one line."""
    check = ("import sys, graphmod_cli\n"
             "code = graphmod_cli.main(['graphmod'] + sys.argv[1:])\n"
             "loaded = [m for m in ('tensorflow', 'graphmod') if m in sys.modules]\n"
             "assert not loaded, loaded\n"
             "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", check] + args, capture_output=True, text=True,
                          timeout=120)
    if "--help" in args:
        assert done.returncode == 0 and done.stderr == "" and "graphmod" in done.stdout, done
    else:
        assert done.returncode == 2, done
        assert len(done.stderr.strip().splitlines()) == 1 or not args, done.stderr
        assert done.stderr.startswith("graphmod") or not args, done.stderr


def test_rewrite_dry_run_of_a_model_dir_reports_and_diffs_without_writing(dense_dir, capsys):
    model_dir = dense_dir
    before = sorted(os.listdir(model_dir))
    code, out, err = run(capsys, "rewrite", "--dry-run", model_dir)
    assert code == 1, err  # score_table stays dense: a finding
    assert "2 variable(s) -> tables, 1 left dense" in out
    assert "user_embedding [30000 x 4] -> table 'user_embedding'" in out
    assert "user_embedding -> table user_embedding" in out  # the diff follows
    assert "left dense: score_table: read other than by gathers" in out
    assert sorted(os.listdir(model_dir)) == before  # nothing written
    code, out, _ = run(capsys, "rewrite", "--dry-run", "--format=json", "--min_rows=10",
                       model_dir)
    data = json.loads(out)
    assert code == 1
    assert {t["variable"] for t in data["report"]["tables"]} == {
        "user_embedding", "item_embedding", "country_embedding"}
    code, _, err = run(capsys, "rewrite", model_dir)
    assert code == 2 and "--dry-run" in err


def test_inspect_lists_tables_plan_and_verified_chain(model_dir, capsys):
    # As after a crash before the final save: the latest checkpoint is the
    # one of step 2, followed by the deltas of step 2 and 3.
    tf1.train.update_checkpoint_state(model_dir, os.path.join(model_dir, "model.ckpt-2"))
    code, out, err = run(capsys, "inspect", "--format=json", model_dir)
    assert code == 0, err
    data = json.loads(out)
    tables = {t["table"]: t for t in data["tables"]}
    assert set(tables) == {"user_embedding", "item_embedding"}
    assert tables["user_embedding"]["dim"] == 4 and tables["user_embedding"]["slots"] == 1
    assert 0 < tables["user_embedding"]["rows"] <= 48  # the ids the 3 steps read
    assert data["plan"] == {"item_embedding": "item_embedding",
                            "user_embedding": "user_embedding"}
    kinds = [c["kind"] for c in data["chain"]]
    assert kinds[0] == "full" and kinds.count("delta") >= 1
    assert all(c["verified"] for c in data["chain"] if c["kind"] == "delta")
    code, out, _ = run(capsys, "inspect", model_dir)
    assert "user_embedding: dim 4" in out and "checksums verified" in out
    # A torn delta is a finding.
    chain = [c for c in data["chain"] if c["kind"] == "delta"]
    folder = os.path.join(model_dir, "graphmod", "deltas",
                          os.path.basename(data["checkpoint"]))
    victim = next(f for f in os.listdir(folder) if f.startswith(chain[-1]["name"] + ".data"))
    with open(os.path.join(folder, victim), "ab") as f:
        f.write(b"torn")
    code, out, _ = run(capsys, "inspect", model_dir)
    assert code == 1 and "TORN" in out


def test_inspect_of_a_checkpoint_deleted_while_read_says_so(model_dir, tmp_path, capsys,
                                                            monkeypatch):
    """The training's Saver deletes the checkpoint inspect is reading, and
    its deltas (max_to_keep): one line saying so, exit 2, not a torn chain."""
    from graphmod.checkpoint import deltas
    copy = str(tmp_path / "copy")
    shutil.copytree(model_dir, copy)
    tf1.train.update_checkpoint_state(copy, os.path.join(copy, "model.ckpt-2"))  # has deltas
    real_committed = deltas.committed

    def saver_deletes_it(base, entries=None):
        for name in os.listdir(copy):
            if name.startswith(os.path.basename(base) + "."):
                os.remove(os.path.join(copy, name))
        shutil.rmtree(deltas.directory(base))
        return real_committed(base, entries)
    monkeypatch.setattr(deltas, "committed", saver_deletes_it)
    code, out, err = run(capsys, "inspect", copy)
    assert code == 2 and out == "", (code, out)
    assert "model.ckpt-2: deleted while it was read" in err and err.count("\n") == 1, err


def test_inspect_shows_the_bytes_last_sent_a_step(model_dir, tmp_path, capsys):
    """The newest graphmod/exchange/bytes_sent a training graph logged (what
    a rank sent the other Horovod ranks) is printed beside the tables."""
    copy = str(tmp_path / "copy")
    shutil.copytree(model_dir, copy)
    _, out, _ = run(capsys, "inspect", copy)  # (an earlier test may have torn a delta)
    assert "user_embedding: dim 4" in out and "measured:" not in out  # one process
    with tf.Graph().as_default():
        writer = tf1.summary.FileWriter(copy)
        for step, sent in ((2, 1024.0), (3, 2048.0)):
            writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
                tag="graphmod/exchange/bytes_sent", simple_value=sent)]), step)
        writer.close()
    code, out, _ = run(capsys, "inspect", copy)
    assert "measured: 2.0 KiB sent to other Horovod ranks a step" in out, out
    assert "(all tables, at step 3)" in out


def test_the_command_runs_as_a_module_and_as_the_installed_script():
    done = subprocess.run([sys.executable, "-m", "graphmod", "inspect", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage: graphmod inspect" in done.stdout
    script = os.path.join(os.path.dirname(sys.executable), "graphmod")
    done = subprocess.run([script, "nonsense"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no command 'nonsense'" in done.stderr
    # A command that runs prints none of TensorFlow's start-up lines.
    done = subprocess.run([script, "inspect", "/nonexistent/model_dir"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        "graphmod inspect: /nonexistent/model_dir: no such directory\n"), done.stderr


@pytest.mark.parametrize("args", [["--help"], ["export", "--help"], ["diff", "MODEL_DIR"]])
def test_a_reader_that_closes_early_ends_the_command_without_a_traceback(args, model_dir):
    """`graphmod --help | head -1`: the reader gone (here before the command
    writes at all), the command ends quietly, as a SIGPIPE ends other tools."""
    script = os.path.join(os.path.dirname(sys.executable), "graphmod")
    for command in ([script], [sys.executable, "-m", "graphmod"]):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(command + [model_dir if a == "MODEL_DIR" else a for a in args],
                                  stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write)
        assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr
        assert "Broken pipe" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_help_usage_errors_and_docs_spell_each_flag_one_way(capsys):
    """--min-count, never --min_count: in each command's usage and help, in
    absl's errors (a bad value, an unknown flag's suggestion) and in the docs."""
    import graphmod_cli
    underscored = set()
    for name, (define, _, usage, about) in graphmod_cli.COMMANDS.items():
        names = [f for f in graphmod_cli._flag_values(define) if "_" in f]
        underscored.update(f"--{f}" for f in names)
        code, out, _ = run(capsys, name, "--help")
        assert code == 0 and "usage: " + usage in out
        for f in names:
            assert f"--{f.replace('_', '-')}:" in out or \
                f"--[no]{f.replace('_', '-')}:" in out, (f, out)
    assert {"--min_count", "--seen_since", "--dry_run", "--poll_secs"} <= underscored
    docs = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
            for p in ("README.md", "docs/cli.md", "docs/serving.md")]
    for text in [run(capsys, n, "--help")[1] for n in graphmod_cli.COMMANDS] + \
            [graphmod_cli._usage()] + [open(p).read() for p in docs]:
        said = {w.split("=")[0].replace("[no]", "") for w in text.split() if w.startswith("--")}
        assert not {w.strip("`,.;:()[]'") for w in said} & underscored, text[:300]
    for args, dashed in [(["export", "--min_count=x", "a", "b"], "--min-count=x"),
                         (["export", "--poll-sec=1", "a", "b"], "--poll-secs?"),
                         (["rewrite", "--dry-runn", "m"], "--dry-run?")]:
        code, out, err = run(capsys, *args)
        assert code == 2 and dashed in err and "_" not in err.split(":", 1)[1], err


def receiver_fn():
    ids = {n: tf1.placeholder(tf.int64, [None], name=n) for n in ("user", "item", "country")}
    return tf.estimator.export.ServingInputReceiver(ids, ids)


def test_seen_since_takes_a_time_ago_where_the_tables_count_seconds(tmp_path, capsys):
    """--seen-since=7d: rows last seen in the last 7 days (now minus 7 days in
    the tables' clock, seconds); a bad value or a model whose tables count
    global steps: one line naming the flag, exit status 2."""
    for bad in ("7x", "d7", "7.5h", "-7d", ""):
        code, out, err = run(capsys, "export", "--portable", f"--seen-since={bad}", "a", "b")
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"graphmod export: --seen-since={bad}: neither a clock value"), err
    code, _, err = run(capsys, "export", "--watch", "--seen-since=7d", "a", "b")
    assert code == 2 and "--seen-since=7d: a time ago goes with --portable" in err, err
    code, _, err = run(capsys, "export", "--portable", "--seen-since=36h", "a", "b")
    assert code == 2 and "--seen-since=36h: a time ago needs --model-dir" in err, err
    model_dir = str(tmp_path / "model")
    estimator = tf.estimator.Estimator(model_fn, model_dir)
    estimator.train(input_fn, steps=2, hooks=[graphmod.GraphModifierHook()])
    trained = time.time()
    source = graphmod.export_saved_model(estimator, receiver_fn, str(tmp_path / "src")).decode()
    reports = {}
    for since in ("7d", "36h", "90m", "1s"):
        if since == "1s":
            time.sleep(max(0.0, trained + 2.1 - time.time()))  # every row stamped >= 2 s ago
        code, out, err = run(capsys, "export", "--portable", f"--model-dir={model_dir}",
                             f"--seen-since={since}", source, tmp_path / since)
        assert code == 0, err
        reports[since] = {t["table"]: (t["rows_kept"], t["rows"]) for t in
                          json.loads(out)["tables"]}
    assert set(reports["7d"]) == {"user_embedding", "item_embedding"}
    for since in ("7d", "36h", "90m"):
        assert all(0 < kept == rows for kept, rows in reports[since].values()), reports
    assert all(kept == 0 < rows for kept, rows in reports["1s"].values()), reports
    # Tables stamping rows with global steps: a time ago means nothing.
    steps_dir = str(tmp_path / "steps")
    tf.estimator.Estimator(model_fn, steps_dir).train(input_fn, steps=1, hooks=[
        graphmod.GraphModifierHook(tables={"user_embedding": dict(
            eviction_threshold=100, eviction_unit="steps")})])
    code, out, err = run(capsys, "export", "--portable", f"--model-dir={steps_dir}",
                         "--seen-since=7d", source, tmp_path / "never")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("graphmod export: --seen-since=7d: ") and "global steps" in err, err
    assert not os.path.exists(tmp_path / "never")
    code, out, err = run(capsys, "export", "--portable", f"--model-dir={steps_dir}",
                         "--seen-since=1", source, tmp_path / "steps_out")
    assert code == 0, err  # a clock value (a step) it takes


def table_entries(checkpoint, table):
    reader = tf.train.load_checkpoint(checkpoint)
    keys = reader.get_tensor(f"{table}-keys")
    order = np.argsort(keys)
    return keys[order], reader.get_tensor(f"{table}-values")[order]


def test_ckpt_compact_then_convert_to_dense_and_back(tmp_path, capsys):
    """A chain of a full checkpoint and 3 deltas compacts into the state the
    uninterrupted run saved; that converts to plain variables (trained rows
    and, for ids never seen, the tables' initial rows) and back to tables."""
    model = str(tmp_path / "model")
    tf.estimator.Estimator(model_fn, model, config=tf.estimator.RunConfig(
        save_checkpoints_steps=100)).train(input_fn, steps=3, hooks=[
            graphmod.GraphModifierHook(incremental_every_steps=1)])
    final = {t: table_entries(os.path.join(model, "model.ckpt-3"), t)
             for t in ("user_embedding", "item_embedding")}
    # As after a crash before the last full save: model.ckpt-0 and 3 deltas.
    tf1.train.update_checkpoint_state(model, os.path.join(model, "model.ckpt-0"))
    for name in os.listdir(model):
        if name.startswith("model.ckpt-3"):
            os.remove(os.path.join(model, name))
    code, out, err = run(capsys, "ckpt", "compact", model)
    assert code == 0, err
    assert out.strip() == os.path.join(model, "model.ckpt-3")
    assert tf.train.latest_checkpoint(model).endswith("model.ckpt-3")
    # The chain compacted stays; the new checkpoint's graph is the model's.
    assert os.path.exists(os.path.join(model, "model.ckpt-0.index"))
    assert open(os.path.join(model, "model.ckpt-3.meta"), "rb").read() == \
        open(os.path.join(model, "model.ckpt-0.meta"), "rb").read()
    # A checkpoint of the compacted name that the state no longer lists is
    # not overwritten.
    written = open(os.path.join(model, "model.ckpt-3.index"), "rb").read()
    tf1.train.update_checkpoint_state(model, os.path.join(model, "model.ckpt-0"))
    code, _, err = run(capsys, "ckpt", "compact", model)
    assert code == 2 and "model.ckpt-3: exists already" in err, err
    assert open(os.path.join(model, "model.ckpt-3.index"), "rb").read() == written
    tf1.train.update_checkpoint_state(model, os.path.join(model, "model.ckpt-3"))
    for t, (keys, values) in final.items():
        got_keys, got_values = table_entries(out.strip(), t)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_allclose(got_values, values, rtol=1e-6)

    dense = str(tmp_path / "dense")
    code, out, err = run(capsys, "ckpt", "convert", "--to=dense", model, dense)
    assert code == 0, err
    reader = tf.train.load_checkpoint(out.strip())
    user = reader.get_tensor("user_embedding")
    assert user.shape == (30_000, 4)
    keys, values = final["user_embedding"]
    np.testing.assert_allclose(user[keys], values, rtol=1e-6)
    unseen = np.setdiff1d(np.arange(30_000), keys)
    assert 0.08 < user[unseen].std() < 0.12  # initial rows: stddev 0.1, as the variable's
    assert reader.get_tensor("global_step") == 3
    assert not [n for n in os.listdir(dense) if n.endswith(".meta")]  # no stand-in graph
    code, _, err = run(capsys, "ckpt", "convert", "--to=dense", model, dense)
    assert code == 2 and f"{dense}: is not empty" in err  # nothing written over

    back = str(tmp_path / "back")
    code, out, err = run(capsys, "ckpt", "convert", "--to=tables",
                         "--variables=user_embedding,item_embedding", out.strip(), back)
    assert code == 0, err
    keys, values = table_entries(out.strip(), "user_embedding")
    np.testing.assert_array_equal(keys, np.arange(30_000))
    np.testing.assert_allclose(values, user, rtol=1e-6)
    code, _, err = run(capsys, "ckpt", "convert", "--to=tables", dense, back)
    assert code == 2 and "--variables" in err


def leaving_model_fn(features, labels, mode, params):
    """The user embedding in 2 parts (read by `mod`), the item embedding
    whole; params["optimizer"]: Adagrad (1 slot) or FTRL (2 slots)."""
    user = tf1.get_variable("user_embedding", [30_000, 4], partitioner=tf1.fixed_size_partitioner(2),
                            initializer=tf1.random_normal_initializer(stddev=0.1))
    item = tf1.get_variable("item_embedding", [20_000, 4],
                            initializer=tf1.random_normal_initializer(stddev=0.1))
    embs = [tf1.nn.embedding_lookup(user, features["user"]),
            tf.nn.embedding_lookup(item, features["item"])]
    logits = tf1.layers.dense(tf.concat(embs, 1), 1)[:, 0]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    opt = tf1.train.AdagradOptimizer(0.1) if params["optimizer"] == "Adagrad" else \
        tf1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.001)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))


@pytest.mark.parametrize("optimizer", ["Adagrad", "Ftrl"])
def test_the_unmodified_model_resumes_from_a_dense_conversion(tmp_path, capsys, optimizer):
    """Leaving graphmod: the unmodified model, restored from `ckpt convert
    --to=dense`, trains on exactly as the hooked model trains on from the
    checkpoint converted: the same rows (also those of ids first seen after
    the conversion), optimizer slots (in their order) and every other
    variable; a partitioned variable's part tables become the whole again."""
    def estimator(path):
        return tf.estimator.Estimator(leaving_model_fn, path, params=dict(optimizer=optimizer),
                                      config=tf.estimator.RunConfig(save_checkpoints_steps=100))

    def later_input_fn():  # mostly ids the tables have not seen
        return input_fn(seed=1)

    hooked, dense = str(tmp_path / "hooked"), str(tmp_path / "dense")
    hook = graphmod.GraphModifierHook()
    estimator(hooked).train(input_fn, steps=3, hooks=[hook])
    code, _, err = run(capsys, "ckpt", "convert", "--to=dense", hooked, dense)
    assert code == 0, err
    estimator(dense).train(later_input_fn, steps=2)
    estimator(hooked).train(later_input_fn, steps=2, hooks=[graphmod.GraphModifierHook()])

    got = tf.train.load_checkpoint(os.path.join(dense, "model.ckpt-5"))
    want = tf.train.load_checkpoint(os.path.join(hooked, "model.ckpt-5"))
    slots = [optimizer] + (["Ftrl_1"] if optimizer == "Ftrl" else [])
    converted = {t["variable"]: t["table"] for t in hook.report.tables}
    assert set(converted) == {"user_embedding/part_0", "user_embedding/part_1", "item_embedding"}
    for var, table in converted.items():
        whole, _, part = var.partition("/part_")
        first = int(part or 0) * 15_000  # rows 0..14999 are part 0
        order = np.argsort(want.get_tensor(f"{table}-keys"))
        rows = want.get_tensor(f"{table}-keys")[order] + first
        assert len(rows) > 25  # ids seen before and after the conversion
        np.testing.assert_allclose(got.get_tensor(whole)[rows],
                                   want.get_tensor(f"{table}-values")[order], rtol=1e-5)
        for i, slot in enumerate(slots):
            np.testing.assert_allclose(got.get_tensor(f"{whole}/{slot}")[rows],
                                       want.get_tensor(f"{table}-slots")[order][:, i],
                                       rtol=1e-5, err_msg=f"{whole}/{slot}")
    others = [n for n in want.get_variable_to_shape_map()
              if "embedding" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert f"dense/kernel/{optimizer}" in others
    for name in others:
        np.testing.assert_allclose(got.get_tensor(name), want.get_tensor(name), rtol=1e-5,
                                   err_msg=name)


def test_a_dense_conversion_of_collision_free_keys_reports_the_rows_they_share(tmp_path, capsys):
    """A table fed the full ids of `ids % N` holds keys that share a row of
    the variable: the conversion puts each key at its row, reports how many
    share (exit status 1), and each shared row holds one of its keys' rows."""
    def model_fn_(features, labels, mode):
        emb = tf1.get_variable("emb", [1000, 4])
        logits = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["user"] % 1000), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf1.train.AdagradOptimizer(
            0.1).minimize(loss, tf1.train.get_global_step()))

    def shared_input_fn():  # 5 and 1005 share row 5, 7 and 2007 row 7
        users = np.array([5, 1005, 7, 2007, 11, 13], np.int64)
        return tf.data.Dataset.from_tensor_slices(
            ({"user": users}, np.ones(6, np.float32))).batch(6)

    model, dense = str(tmp_path / "model"), str(tmp_path / "dense")
    tf.estimator.Estimator(model_fn_, model).train(
        shared_input_fn, steps=1, hooks=[graphmod.GraphModifierHook(min_rows=100)])
    code, out, err = run(capsys, "ckpt", "convert", "--to=dense", model, dense)
    assert code == 1 and "emb: its table holds the full ids of mod" in err and \
        "its 6 keys fill 4 rows, a shared row holding its most recently seen key's" in err, err
    table = dict(zip(*table_entries(os.path.join(model, "model.ckpt-1"), "emb")))
    rows = tf.train.load_checkpoint(out.strip()).get_tensor("emb")
    for row, keys in {5: (5, 1005), 7: (7, 2007), 11: (11,), 13: (13,)}.items():
        assert any(np.allclose(rows[row], table[k]) for k in keys), row


def test_the_demo_models_diff_fits_one_screen(tmp_path):
    """The DeepFM-style demo (8 embedding variables), briefly trained: its
    terminal diff names every converted variable, its table and the rules
    applied, in one screen."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # (TMPDIR: the demo's model_dirs go under the test's own directory.)
    done = subprocess.run([sys.executable, os.path.join(here, "examples", "hook_demo.py"),
                           "--train_steps=5", "--batch_size=64"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [l for l in done.stdout.splitlines() if l.startswith("what the hook changed:")]
    command = line.split(": ", 1)[1].split()
    script = os.path.join(os.path.dirname(sys.executable), "graphmod")
    diff = subprocess.run([script] + command[1:], capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0, diff.stderr[-2000:]
    lines = diff.stdout.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, diff.stdout
    for name in [f"C{i}" for i in range(1, 9)]:
        entry = [i for i, l in enumerate(lines) if l.startswith(f"  {name}_embedding -> table ")]
        assert len(entry) == 1, (name, diff.stdout)
        text = lines[entry[0]] + lines[entry[0] + 1]
        assert "gather_to_lookup" in text and "optimizer_updates" in text, text


def test_graphviz_parses_the_dot_of_a_real_and_a_crafted_graph(model_dir, capsys, tmp_path):
    before, after = crafted_graph(tmp_path)
    for args in (["diff", "--format=dot", model_dir], ["diff", "--format=dot", before, after]):
        code, dot, _ = run(capsys, *args)
        assert code == 0
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and "<svg" in done.stdout, done.stderr[-2000:]


def test_the_html_page_renders_in_headless_chromium_with_the_changes_drawn(
        model_dir, capsys, tmp_path):
    page = tmp_path / "diff.html"
    code, _, _ = run(capsys, "diff", "--format=html", f"--output={page}", model_dir)
    assert code == 0
    pixels = screenshot(page, tmp_path / "diff.png")
    from graphmod.cli.render import FILLS
    assert share(pixels, FILLS["added"]) > 0.002, "no added op drawn"
    assert share(pixels, FILLS["rerouted"]) > 0.002, "no rerouted op drawn"
    assert share(pixels, "#ffffff") > 0.3  # a page, not a blank or an error screen
