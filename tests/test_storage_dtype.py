"""Rows stored smaller (create_table / TableSettings storage_dtype):

- each form rounds exactly as stated: a table's rows after SGD steps equal,
  bit for bit, a numpy replay that updates the decoded row in float32 and
  rounds it back (float16 and bfloat16 to nearest even, int8 row-wise), and
  its slots likewise;
- a disk tier holds the stored records: the same rows as all in memory;
- graphmod's checkpoints keep the stored form (halves, bfloat16, uint8 rows
  of scale, bias and codes) and restore it bit for bit; a checkpoint of
  another form converts on restore;
- under the hook, the report states the approximation, graphmod.verify
  passes a float16 and an int8 model within their rounding and still
  catches a doubled gradient; exact=True keeps such a variable dense;
- the portable export serves the stored rows with stock ops only (a cast,
  or int8's scale and bias), answering what graphmod's predict answers;
  graphmod inspect reads the stored dims and forms.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod._ops import ops
from graphmod.embeddings import stored_rows

tf1 = tf.compat.v1
FORMS = ["float32", "float16", "bfloat16", "int8"]
DIM, LR = 6, 0.1  # (not a power of two: an SGD step on sum(rows^2) must round)
BF16 = tf.bfloat16.as_numpy_dtype


def encode_int8(rows):
    """native/row_codec.cc's int8 rows (scale, bias, codes): the range and
    the codes in double, scale and bias stored as float32."""
    rows = rows.astype(np.float64)
    lo, hi = rows.min(1, keepdims=True), rows.max(1, keepdims=True)
    step = (hi - lo) / 255.0
    codes = np.clip(np.floor((rows - lo) / np.where(step > 0, step, 1) + 0.5), 0, 255)
    codes = np.where(step > 0, codes, 0)
    return codes.astype(np.float32), step.astype(np.float32), lo.astype(np.float32)


def rounded(form, rows):
    """rows (float32) as a table of `form` stores and reads them back."""
    rows = np.asarray(rows, np.float32)
    if form == "float32":
        return rows
    if form == "float16":
        return rows.astype(np.float16).astype(np.float32)
    if form == "bfloat16":
        return rows.astype(BF16).astype(np.float32)
    codes, scale, lo = encode_int8(rows.reshape(-1, rows.shape[-1]))
    return (codes * scale + lo).reshape(rows.shape)


def sgd_graph(form, slot_form=None, optimizer=None, **settings):
    opt = optimizer or graphmod.optimizers.SGD(LR)
    table = graphmod.create_table("t", DIM, optimizer=opt, storage_dtype=form,
                                  slot_storage_dtype=slot_form, num_shards=2, **settings)
    ids = tf1.placeholder(tf.int64, [None])
    rows = graphmod.sparse_lookup(table, ids, is_training=True)
    train = opt.minimize(tf.reduce_sum(rows * rows))
    return table, ids, rows, train


BATCHES = [np.array([1, 2, 3, 2]), np.array([2, 5, 7, 1, 1]), np.array([3, 7, 9])]


@pytest.mark.parametrize("form", FORMS)
def test_sgd_rounds_each_update_as_stated(form):
    with tf.Graph().as_default():
        table, ids, rows, train = sgd_graph("float32")
        with tf1.Session() as sess:  # the float32 table's initial rows of each key
            initial = dict(zip(range(10), sess.run(rows, {ids: np.arange(10)})))
    with tf.Graph().as_default():
        table, ids, rows, train = sgd_graph(form)
        export = table.export()
        with tf1.Session() as sess:
            want, rounding_moved = {}, False
            for batch in BATCHES:
                for k in batch:
                    want.setdefault(int(k), rounded(form, initial[int(k)][None])[0])
                got = sess.run(rows, {ids: batch})
                np.testing.assert_array_equal(got, [want[int(k)] for k in batch])
                sess.run(train, {ids: batch})
                grads = {}
                for k in batch:  # d(sum rows^2) = 2 row, summed over repeats
                    grads[int(k)] = grads.get(int(k), 0) + np.float32(2) * want[int(k)]
                for k, g in grads.items():
                    step = want[k] - np.float32(LR) * g.astype(np.float32)
                    want[k] = rounded(form, step[None])[0]
                    rounding_moved |= not np.array_equal(want[k], step)
            e = sess.run(export)
    got = dict(zip(e["keys"].tolist(), e["values"]))
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{form}: key {k}")
    # The replay's rounding moved rows (else it would check nothing a float32
    # table would not pass too).
    assert rounding_moved == (form != "float32")


@pytest.mark.parametrize("slot_form", ["float16", "int8"])
def test_slots_round_as_their_own_form(slot_form):
    """Adagrad's accumulator stored as slot_form, values float32: the
    accumulator after a step is the rounded float32 sum of its stored value
    and g^2; the value's update reads the unrounded sum (rounding comes
    after the arithmetic)."""
    opt = graphmod.optimizers.Adagrad(LR, initial_accumulator_value=0.1)
    with tf.Graph().as_default():
        table, ids, rows, train = sgd_graph("float32", slot_form, optimizer=opt)
        export = table.export()
        with tf1.Session() as sess:
            r = sess.run(rows, {ids: [4, 8]})
            sess.run(train, {ids: [4, 8]})
            e = sess.run(export)
    order = np.argsort(e["keys"])
    # The initial accumulator is stored rounded too (0.1 is no float16).
    initial = rounded(slot_form, np.full_like(r, 0.1))
    assert slot_form == "int8" or not np.array_equal(initial, np.full_like(r, 0.1))
    acc = initial + (np.float32(2) * r) ** 2
    np.testing.assert_array_equal(e["slots"][order][:, 0], rounded(slot_form, acc))
    # The value moved by lr * g / sqrt(acc) with acc unrounded (float32 math).
    g = np.float32(2) * r
    np.testing.assert_allclose(e["values"][order], r - np.float32(LR) * g / np.sqrt(acc),
                               rtol=2e-7, atol=1e-7)


def test_a_disk_tier_holds_the_stored_records(tmp_path):
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 1000, 64) for _ in range(40)]  # spares the last 16 steps
    out = {}
    for tiered in (False, True):
        with tf.Graph().as_default():
            tier = dict(memory_budget=0.2, storage_path=str(tmp_path)) if tiered else {}
            table, ids, rows, train = sgd_graph(
                "float16", optimizer=graphmod.optimizers.Adagrad(LR), **tier)
            export = table.export()
            info = table.tier_info() if tiered else None
            with tf1.Session() as sess:
                for b in batches:
                    sess.run(train, {ids: b})
                out[tiered] = sess.run(export)
                if tiered:
                    assert sess.run(info)["disk_rows"] > 0  # rows really on disk
    a, b = out[False], out[True]
    oa, ob = np.argsort(a["keys"]), np.argsort(b["keys"])
    for field in ("keys", "values", "slots", "counts", "versions"):
        np.testing.assert_array_equal(a[field][oa], b[field][ob], err_msg=field)


@pytest.mark.parametrize("form,dtype,width", [("float16", np.float16, DIM),
                                              ("bfloat16", BF16, DIM),
                                              ("int8", np.uint8, DIM + 8)])
def test_checkpoints_keep_the_stored_form(tmp_path, form, dtype, width):
    from graphmod.checkpoint.saver import TableSaver
    batches = BATCHES + [np.arange(30)]

    def run(form_here, restore=None, save=None):
        if save:
            os.makedirs(os.path.dirname(save))
        with tf.Graph().as_default():
            table, ids, rows, train = sgd_graph(form_here,
                                                optimizer=graphmod.optimizers.Adagrad(LR))
            export = table.export()
            saver = TableSaver(sharded=True)
            saver.build()
            with tf1.Session() as sess:
                if restore:
                    saver.restore(sess, restore)
                else:
                    for b in batches:
                        sess.run(train, {ids: b})
                path = saver.save(sess, save, global_step=1) if save else None
                e = sess.run(export)
        order = np.argsort(e["keys"])
        return {k: v[order] for k, v in e.items()}, path

    trained, path = run(form, save=str(tmp_path / "a" / "model.ckpt"))
    reader = tf.train.load_checkpoint(path)
    values, slots = reader.get_tensor("t-values"), reader.get_tensor("t-slots")
    assert values.dtype == dtype and values.shape == (30, width), (values.dtype, values.shape)
    assert slots.dtype == dtype and slots.shape == (30, 1, width)
    keys = np.argsort(reader.get_tensor("t-keys"))
    np.testing.assert_array_equal(stored_rows.decode(values)[keys], trained["values"])
    np.testing.assert_array_equal(stored_rows.decode(slots)[keys], trained["slots"])
    # Restored into the same form: bit for bit, and a save of it writes the same rows.
    back, again = run(form, restore=path, save=str(tmp_path / "b" / "model.ckpt"))
    for field in trained:
        np.testing.assert_array_equal(back[field], trained[field], err_msg=field)
    resaved = tf.train.load_checkpoint(again)
    order = np.argsort(resaved.get_tensor("t-keys"))
    np.testing.assert_array_equal(resaved.get_tensor("t-values")[order], values[keys])
    # Into a float32 table: the decoded rows; a float32 checkpoint into this
    # form: those rows rounded (for int8, re-encoded: within rounding).
    wide, wide_path = run("float32", restore=path, save=str(tmp_path / "c" / "model.ckpt"))
    np.testing.assert_array_equal(wide["values"], trained["values"])
    assert tf.train.load_checkpoint(wide_path).get_tensor("t-values").dtype == np.float32
    narrow, _ = run(form, restore=wide_path)
    if form == "int8":
        np.testing.assert_allclose(narrow["values"], trained["values"], atol=1e-6)
    else:
        np.testing.assert_array_equal(narrow["values"], trained["values"])


def test_a_chain_of_two_forms_compacts_and_warm_starts_without_rounding(tmp_path):
    """A float16 table's checkpoint, restored into a float32 table that then
    writes a delta: the chain holds two forms. Its compaction stand-in keeps
    float32 (no row rounded on the way), and a warm start reads each
    checkpoint in its own form."""
    from graphmod.checkpoint import deltas, merged
    from graphmod.checkpoint.saver import TableSaver
    os.makedirs(tmp_path / "m")
    base = str(tmp_path / "m" / "model.ckpt")
    for form in ("float16", "float32"):
        with tf.Graph().as_default():
            table, ids, rows, train = sgd_graph(form, optimizer=graphmod.optimizers.Adagrad(LR))
            saver = TableSaver(sharded=True)
            saver.build()
            export = table.export()
            with tf1.Session() as sess:
                if form == "float16":
                    sess.run(train, {ids: np.arange(20)})
                    base = saver.save(sess, base, global_step=1)
                else:
                    saver.restore(sess, base)
                    saver.start_tracking(sess)
                    sess.run(train, {ids: np.arange(10, 30)})
                    saver.save_delta(sess, 2)
                    final = sess.run(export)
    chain = deltas.committed(base)
    assert len(chain) == 1
    assert tf.train.load_checkpoint(base).get_tensor("t-values").dtype == np.float16
    assert tf.train.load_checkpoint(chain[0]).get_tensor("t-values").dtype == np.float32
    with tf.Graph().as_default():
        (alone,), _ = merged.stand_in(base)
        assert alone.storage_dtype == "float16"
    with tf.Graph().as_default():
        (both,), _ = merged.stand_in(base, deltas=chain)
        assert both.storage_dtype == "float32"
    # A warm start from the chain: every row as the float32 table had it.
    with tf.Graph().as_default():
        est_dir = str(tmp_path / "warm")

        def model_fn(features, labels, mode):
            emb = tf1.get_variable("emb", [1000, DIM])
            e = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), 1)
            loss = tf.reduce_mean(e)
            return tf.estimator.EstimatorSpec(
                mode, loss=loss,
                train_op=tf1.train.AdagradOptimizer(0.0).minimize(loss,
                                                                  tf1.train.get_global_step()))
        hook = graphmod.GraphModifierHook(min_rows=100, warm_start=graphmod.WarmStartSettings(
            [base], {"emb": "t"}))
        est = tf.estimator.Estimator(model_fn, est_dir)
        est.train(lambda: tf.data.Dataset.from_tensors(({"ids": [[999]]}, [0.0])), steps=1,
                  hooks=[hook])
        reader = tf.train.load_checkpoint(est.latest_checkpoint())
        keys, values = reader.get_tensor("emb-keys"), reader.get_tensor("emb-values")
    got = dict(zip(keys.tolist(), values))
    for k, v in zip(final["keys"].tolist(), final["values"]):
        np.testing.assert_array_equal(got[k], v, err_msg=f"key {k}")


# --- under the hook ----------------------------------------------------------

VOCAB = 300


def input_fn():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(512, 3)).astype(np.int64)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(32)


def model_fn(features, labels, mode):
    emb = tf1.get_variable("emb", [VOCAB, 4],
                           initializer=tf1.truncated_normal_initializer(stddev=0.5))
    head = tf1.get_variable("head", [12, 1])
    e = tf.reshape(tf.nn.embedding_lookup(emb, features["ids"]), [-1, 12])
    logits = tf.squeeze(tf.matmul(e, head), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.AdagradOptimizer(0.3).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_int8_slots_are_refused_where_the_step_divides_by_them():
    with tf.Graph().as_default():
        for opt in (graphmod.optimizers.Adam(0.01), graphmod.optimizers.RMSProp(0.01)):
            with pytest.raises(ValueError, match="int8 storage cannot keep"):
                graphmod.create_table(f"t_{opt.kind}", 4, optimizer=opt, storage_dtype="int8")
        graphmod.create_table("t_ok", 4, optimizer=graphmod.optimizers.Adam(0.01),
                              storage_dtype="int8", slot_storage_dtype="bfloat16")


def verify(tmp_path, form, **hook_args):
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path / "model"),
                                       config=tf.estimator.RunConfig(tf_random_seed=7))
    hook = graphmod.GraphModifierHook(min_rows=100, tables={"emb*": {"storage_dtype": form}},
                                      **hook_args)
    return graphmod.verify(estimator, input_fn, steps=6, hook=hook,
                           work_dir=str(tmp_path / "verify")), hook


@pytest.mark.parametrize("form", ["float16", "int8"])
def test_verify_passes_within_the_rounding_the_report_states(tmp_path, form):
    result, hook = verify(tmp_path, form)
    assert result.ok, result.summary()
    (stated,) = [a["what"] for a in hook.report.approximations if a["variable"] == "emb"]
    assert f"stored as {form}" in stated
    (entry,) = hook.report.tables
    assert entry["storage_dtype"] == entry["slot_storage_dtype"] == form
    # The rewrite, checked exactly with the table stored as float32: rows,
    # loss and the dense variable all match.
    exact = result.findings["emb"]
    assert exact.first_step is None and exact.compared == f"{VOCAB} rows and 1 slot(s) at 6 steps"
    assert result.loss_first_step is None and result.dense["head"].first_step is None
    # Then as asked: rows differ (or the allowance was never needed), within it.
    finding = result.rounded.findings["emb"]
    assert f"within the rounding of rows stored as {form}" in finding.compared
    assert finding.largest_difference > result.rtol and finding.ok, finding
    assert "with the storage dtypes asked for" in result.summary()


@pytest.mark.parametrize("form", ["float16", "int8"])
def test_verify_still_catches_a_doubled_gradient(tmp_path, monkeypatch, form):
    table_apply, fused_apply = ops.graphmod_table_apply, ops.graphmod_fused_apply
    monkeypatch.setattr(ops, "graphmod_table_apply",
                        lambda h, k, g, *a, **kw: table_apply(h, k, 2 * g, *a, **kw))
    monkeypatch.setattr(ops, "graphmod_fused_apply", lambda h, k, g, *a, **kw: fused_apply(
        h, k, [2 * x for x in g], *a, **kw))
    result, _ = verify(tmp_path, form)
    assert not result.ok
    # Caught exactly, and beyond the rounding allowance of the stored rows too.
    for finding in (result.findings["emb"], result.rounded.findings["emb"]):
        assert finding.unexplained_step == 1, finding
        assert "a row the step looked up" in finding.unexplained, finding


def test_exact_keeps_a_smaller_form_dense(tmp_path):
    hook = graphmod.GraphModifierHook(min_rows=100, exact=True,
                                      tables={"emb": {"storage_dtype": "bfloat16"}})
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path / "model"))
    estimator.train(input_fn, steps=1, hooks=[hook])
    assert not hook.report.tables
    (skipped,) = hook.report.skipped
    assert "stored as bfloat16" in skipped["reason"] and "exact=True" in skipped["reason"]


# --- served on stock TensorFlow ---------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("form", ["float16", "int8"])
def test_the_portable_export_serves_the_stored_rows(tmp_path, capsys, form):
    import test_portable as p  # its model, query and stock-TensorFlow loader
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    ids[:4] = p.QUERY_IDS[:4]
    s = np.array(p.WORDS)[rng.integers(0, len(p.WORDS), 256)].astype(bytes)
    c = np.array([b"a", b"b", b"c"])[rng.integers(0, 3, 256)]
    labels = ((ids[:, 0] + (s == b"w5")) % 2).astype(np.float32)

    def hook():
        return graphmod.GraphModifierHook(tables={"*": {"storage_dtype": form}})
    est = tf.estimator.Estimator(p.model_fn, model_dir=str(tmp_path / "model"))
    est.train(lambda: tf.data.Dataset.from_tensor_slices(
        ({"ids": ids, "s": s, "c": c}, labels)).repeat().batch(64), steps=10, hooks=[hook()])
    expected = np.array([x["p"] for x in est.predict(
        lambda: tf.data.Dataset.from_tensor_slices(p.QUERY).batch(len(p.QUERY_S)),
        hooks=[hook()])])
    # graphmod inspect reads the tables' dims and forms from the checkpoint.
    from graphmod_cli import main
    main(["graphmod", "inspect", "--format=json", est.model_dir])
    (emb,) = [t for t in json.loads(capsys.readouterr().out)["tables"] if t["table"] == "emb"]
    assert emb["dim"] == 4 and emb["stored"] == [form, form], emb
    portable = graphmod.export_saved_model(est, p.receiver, str(tmp_path / "serving"),
                                           portable=True).decode()
    entries = dict(tf.train.list_variables(os.path.join(portable, "variables", "variables")))
    reader = tf.train.load_checkpoint(os.path.join(portable, "variables", "variables"))
    assert reader.get_variable_to_dtype_map()["emb-rows"] == stored_rows.dtype_of(form)
    assert entries["emb-rows"][1] == stored_rows.row_bytes(form, 4) // (
        2 if form == "float16" else 1)
    for name, value in p.QUERY.items():
        np.save(tmp_path / f"{name}.npy", value)
    served = json.loads(p._run(["-c", p.LOAD, portable, str(tmp_path)], tmp_path).splitlines()[-1])
    assert served["not_stock"] == []
    np.testing.assert_allclose(served["v2"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served["v1"], expected, rtol=1e-6, atol=1e-6)
