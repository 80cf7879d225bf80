"""graphmod.verify on an ordinary Estimator: it passes the faithful rewrite,
and catches, naming the variable and the step, a gradient doubled in the
table's update, a wrong initializer, an optimizer hyper-parameter the table
ignores and lazy Adam without its stated approximation (each fault injected
into graphmod for the test); its picture renders in headless Chromium."""
import os

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod._ops import ops
from graphmod import charts
from graphmod.embeddings import initializers
from screenshots import screenshot, share

tf1 = tf.compat.v1
VOCAB, DIM = 300, 4


def input_fn():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(512, 3)).astype(np.int64)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(32)


def model_fn(features, labels, mode, params):
    fold = params.get("fold")  # ids % fold, into a variable of fold rows
    emb = tf1.get_variable("emb", [fold or VOCAB, DIM],
                           initializer=tf1.truncated_normal_initializer(stddev=0.5))
    head = tf1.get_variable("head", [3 * DIM, 1])
    ids = features["ids"] % fold if fold else features["ids"]
    e = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 3 * DIM])
    logits = tf.squeeze(tf.matmul(e, head), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer = {"adagrad": lambda: tf1.train.AdagradOptimizer(0.3),
                 "adam": lambda: tf1.train.AdamOptimizer(0.05)}[params["optimizer"]]()
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def check(tmp_path, optimizer="adagrad", steps=6, hook=None, **params):
    estimator = tf.estimator.Estimator(
        model_fn, str(tmp_path / "model"), params=dict(optimizer=optimizer, **params),
        config=tf.estimator.RunConfig(tf_random_seed=7))
    return graphmod.verify(estimator, input_fn, steps=steps,
                           hook=hook or graphmod.GraphModifierHook(min_rows=100),
                           work_dir=str(tmp_path / "verify"))


def test_a_faithful_rewrite_passes(tmp_path):
    result = check(tmp_path)
    assert result.ok, result.summary()
    (finding,) = result.findings.values()
    assert finding.variable == "emb" and finding.first_step is None
    assert finding.compared == f"{VOCAB} rows and 1 slot(s) at 6 steps", finding
    # The dense variables both runs train match too, step by step.
    assert {"head", "head/Adagrad"} <= set(result.dense), result.dense
    assert all(f.first_step is None for f in result.dense.values())
    assert len(result.losses) == 6 and len({round(a, 6) for a, _ in result.losses}) > 1
    np.testing.assert_allclose([b for _, b in result.losses], [a for a, _ in result.losses],
                               rtol=1e-5)
    assert "PASS" in result.summary()


def test_folded_ids_are_compared_on_their_adopted_rows_with_a_note(tmp_path):
    """`ids % 1000`: a fresh training would key the table by the full ids (a
    different model); verify's hooked run adopts the variable's rows, so the
    keys stay folded and the rows compare, and the summary says what was not
    verified."""
    result = check(tmp_path, fold=1000)
    assert result.ok, result.summary()
    assert result.findings["emb"].compared == "1000 rows and 1 slot(s) at 6 steps"
    (note,) = result.notes
    assert note.startswith("'mod' keeps its squeezed keys here ('emb' is adopted"), note
    assert "collision_free=True keys the full ids" in note, note
    assert f"note: {note}" in result.summary()


class SilentHook(graphmod.GraphModifierHook):
    """The hook, with the approximations it states dropped from its report."""

    def begin(self):
        super().begin()
        self.report.approximations.clear()


@pytest.mark.parametrize("silent", [False, True])
def test_lazy_adam_passes_as_stated_and_fails_when_silent(tmp_path, silent):
    """A table's Adam is lazy, as the report states: the rows differ (from
    step 2, where rows outside the batch keep their moments) and the loss
    after them, explained. With the statement gone, the same run fails."""
    hook = (SilentHook if silent else graphmod.GraphModifierHook)(min_rows=100)
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path / "model"),
                                       params={"optimizer": "adam"})
    result = graphmod.verify(estimator, input_fn, steps=6, hook=hook)
    finding = result.findings["emb"]
    assert finding.first_step == 2 and finding.compared == f"{VOCAB} rows and 2 slot(s) at 6 steps"
    assert "a row the step did not look up" in finding.what, finding
    assert result.loss_first_step is not None and result.loss_first_step >= 3
    if silent:
        assert not result.ok and finding.unexplained_step == 2, finding
        assert "DIFFERS" in result.summary()
    else:
        assert result.ok and "Adam is lazy" in finding.explained_by, result.summary()
        assert finding.unexplained_step is None
        assert "Adam is lazy" in result.loss_explained_by


def test_a_doubled_gradient_is_caught_at_the_first_step(tmp_path, monkeypatch):
    table_apply, fused_apply = ops.graphmod_table_apply, ops.graphmod_fused_apply
    monkeypatch.setattr(ops, "graphmod_table_apply",
                        lambda h, k, g, *a, **kw: table_apply(h, k, 2 * g, *a, **kw))
    monkeypatch.setattr(ops, "graphmod_fused_apply", lambda h, k, g, *a, **kw: fused_apply(
        h, k, [2 * x for x in g], *a, **kw))
    result = check(tmp_path)
    assert not result.ok
    finding = result.findings["emb"]
    assert finding.first_step == 1 and finding.what.startswith("rows of key"), finding
    assert "emb" in result.summary() and "DIFFERS" in result.summary()
    # The picture: both loss curves and the rows' difference over the tolerance.
    assert len(finding.by_step) == 6 and min(finding.by_step) > result.rtol
    page = tmp_path / "verify.html"
    page.write_text(result.html())
    pixels = screenshot(page, tmp_path / "verify.png")
    for color in charts.COLORS[:2]:  # unmodified and hooked losses; the table's line
        assert share(pixels, color) > 0.0005, color
    assert share(pixels, "#ffffff") > 0.3  # a page, not a blank or an error screen


def test_a_wrong_initializer_is_caught_before_the_first_step(tmp_path, monkeypatch):
    def doubled_stddev(*args, **kwargs):
        init = convert(*args, **kwargs)
        return initializers.TableInitializer(init.kind, init.a, 2 * init.b)
    from graphmod.rewrite import plan
    convert = plan.from_variable  # what the hook draws a converted variable's new rows from
    monkeypatch.setattr(plan, "from_variable", doubled_stddev)
    result = check(tmp_path)
    finding = result.findings["emb"]
    assert not result.ok and finding.first_step == 0, finding
    # stddev 1 truncated at 2 sigma draws with std 0.88; the variable's 0.5, 0.44.
    assert "initial rows" in finding.what and "std 0.879626" in finding.what, finding


def test_an_ignored_learning_rate_is_caught(tmp_path, monkeypatch):
    """The table applies Adagrad with a learning rate of its own (0.01), not
    the model's 0.3."""
    table_apply, fused_apply = ops.graphmod_table_apply, ops.graphmod_fused_apply

    def own_rate(hparams):
        return tf.concat([[0.01], hparams[1:]], 0)
    monkeypatch.setattr(ops, "graphmod_table_apply",
                        lambda h, k, g, p, **kw: table_apply(h, k, g, own_rate(p), **kw))
    monkeypatch.setattr(ops, "graphmod_fused_apply", lambda h, k, g, p, **kw: fused_apply(
        h, k, g, [own_rate(x) for x in p], **kw))
    result = check(tmp_path, steps=3)
    finding = result.findings["emb"]
    assert not result.ok and finding.first_step == 1, finding
    # With Adam, whose laziness the report states, the same fault is caught:
    # the approximation explains no difference in a row the step looked up.
    result = check(tmp_path / "adam", "adam", steps=3)
    finding = result.findings["emb"]
    assert not result.ok and finding.unexplained_step == 1, finding
    assert "a row the step looked up" in finding.unexplained, finding


def test_different_batches_are_refused(tmp_path):
    def unseeded():
        ids = tf.random.uniform([64, 3], 0, VOCAB, tf.int64)
        return tf.data.Dataset.from_tensors(({"ids": ids}, tf.ones([64]))).repeat()
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path / "m"),
                                       params={"optimizer": "adagrad"})
    with pytest.raises(ValueError, match="different batches"):
        graphmod.verify(estimator, unseeded, steps=2,
                        hook=graphmod.GraphModifierHook(min_rows=100))


def test_the_command_verifies_the_example_model(tmp_path, capsys):
    """`graphmod verify` on examples/verify_model.py:model passes (exit 0) and
    writes its picture; a target it cannot use is one line, exit 2."""
    from graphmod_cli import main
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "verify_model.py")
    page = tmp_path / "verify.html"
    assert main(["graphmod", "verify", "--steps=4", f"--html={page}", f"{example}:model"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graphmod.verify: PASS over 4 steps"), out
    assert "user_embedding -> table" in out and "item_embedding -> table" in out
    assert "rows and 1 slot(s) at 4 steps" in out and "<svg" in page.read_text()
    for target in (f"{example}:nothing", "no_such_module:model", f"{tmp_path}/x.py:model"):
        assert main(["graphmod", "verify", target]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("graphmod verify:"), err
