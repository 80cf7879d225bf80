"""The first rule: a converted variable trains exactly as the unmodified model's
would, or stays dense and says why.

Each case trains one small model twice on the same batches, as written and
with GraphModifierHook, and compares the losses and every looked-up row after
three steps (relative 1e-5). The cases are what models do between
tf.gradients and the update (clipping, extra gradient calls, loss scaling,
multipliers, tower averaging), what they start from (Keras and stateless
initializers, frozen or warm-started embeddings, seeds), and which keys they
use (int32 casts of hashed ids, value reads of ids).
"""
import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
VOCAB, DIM, BATCH, STEPS = 50, 4, 16, 3


class ExportTables(tf1.train.SessionRunHook):
    def begin(self):
        self.exports = {t.name: t.export() for t in graphmod.tables()}


def batches(seed=0, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, vocab, size=(BATCH, 2)).astype(np.int64)
        ids[1] = ids[0]  # duplicates within the batch
        out.append((ids, rng.integers(0, 2, size=BATCH).astype(np.float32)))
    return out


def head(e):
    with tf1.variable_scope("head", reuse=tf1.AUTO_REUSE):
        w = tf1.get_variable("w", initializer=np.linspace(-0.5, 0.7, 2 * DIM, dtype=np.float32)
                             .reshape(2 * DIM, 1))
    return tf.squeeze(tf.matmul(tf.reshape(e, [-1, 2 * DIM]), w), 1)


def xent(labels, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def train(build, hook=None, data=None, seed=None):
    """Losses and {variable or table name: rows by key} after training."""
    data = data if data is not None else batches()
    with tf.Graph().as_default():
        if seed is not None:
            tf1.set_random_seed(seed)
        m = build()
        export = ExportTables()
        losses = []
        with tf1.train.MonitoredSession(hooks=([hook] if hook else []) + [export]) as sess:
            for ids, labels in data:
                _, loss = sess.run([m["train_op"], m["loss"]], {m["ids"]: ids, m["labels"]: labels})
                losses.append(loss)
            tables = sess.run(export.exports)
            dense = {v.op.name: sess.run(v) for v in tf1.global_variables()
                     if v.shape.ndims == 2 and v.op.name == "emb"}
    rows = {name: dict(zip(t["keys"].tolist(), t["values"])) for name, t in tables.items()}
    return np.array(losses), rows, dense


def assert_faithful(build, data=None, hook=None, table="emb"):
    hook = hook or graphmod.GraphModifierHook(min_rows=10)
    p_losses, _, p_dense = train(build, None, data)
    c_losses, c_rows, c_dense = train(build, hook, data)
    assert table in c_rows and not c_dense, (hook.report.skipped, c_rows.keys())
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-5, atol=1e-7)
    assert abs(p_losses[-1] - p_losses[0]) > 1e-5  # something trained
    for key, row in c_rows[table].items():
        np.testing.assert_allclose(row, p_dense["emb"][key], rtol=1e-5, atol=1e-7,
                                   err_msg=f"row {key}")
    return hook.report


def model(transform=None, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.1),
          scale=1.0, towers=1, init=tf1.constant_initializer(0.1), vocab=VOCAB):
    """An embedding model whose gradients pass through transform(grads_and_vars)
    before the update (the loss scaled by `scale` and divided back)."""
    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", [vocab, DIM], initializer=init)
        opt = optimizer()
        grads_and_vars, losses = [], []
        for t, (i, l) in enumerate(zip(tf.split(ids, towers), tf.split(labels, towers))):
            with tf1.name_scope(f"tower{t}"):
                loss = xent(l, head(tf.nn.embedding_lookup(emb, i)))
                grads_and_vars.append(opt.compute_gradients(loss * scale))
                losses.append(loss)
        if towers == 1:
            gv = grads_and_vars[0]
        else:  # average the towers' gradients: IndexedSlices concatenated
            gv = []
            for pairs in zip(*grads_and_vars):
                g = [p[0] for p in pairs]
                if isinstance(g[0], tf.IndexedSlices):
                    g = tf.IndexedSlices(tf.concat([x.values for x in g], 0) / towers,
                                         tf.concat([x.indices for x in g], 0), g[0].dense_shape)
                else:
                    g = tf.add_n(g) / towers
                gv.append((g, pairs[0][1]))
        if scale != 1.0:
            gv = [(tf.IndexedSlices(g.values / scale, g.indices, g.dense_shape)
                   if isinstance(g, tf.IndexedSlices) else g / scale, v) for g, v in gv]
        if transform is not None:
            gv = transform(gv)
        step = tf1.train.get_or_create_global_step()
        return dict(ids=ids, labels=labels, loss=tf.add_n(losses) / towers,
                    train_op=opt.apply_gradients(gv, global_step=step))
    return build


# --------------------------------------------------------------------------
# What models do between tf.gradients and the update.

def densify(gv):
    """What Horovod's sparse_as_dense and others do: the gradient as a dense tensor."""
    return [(tf.convert_to_tensor(g), v) for g, v in gv]


def test_a_dense_gradient_converts_exactly_where_unread_rows_stay_still():
    """A dense gradient is zero for rows the batch did not read: Adagrad
    leaves them, so the table is exact (no approximation reported)."""
    report = assert_faithful(model(densify, lambda: tf1.train.AdagradOptimizer(0.3)))
    assert report.tables and not report.approximations


def test_a_dense_momentum_update_is_an_approximation_said_or_stays_dense_with_exact():
    """Momentum moves rows a dense gradient left at zero; a table moves only
    the rows read: converted, the report says so (and the losses, which read
    only rows of the batch before any unread row moved, still agree); with
    exact=True the variable stays dense, saying why."""
    build = model(densify, lambda: tf1.train.MomentumOptimizer(0.3, 0.9))
    hook = graphmod.GraphModifierHook(min_rows=10)
    losses, rows, _ = train(build, hook)
    assert rows["emb"]
    (approximation,) = hook.report.approximations
    assert approximation["variable"] == "emb" and \
        "dense momentum update moves rows the batch did not read" in approximation["what"]
    np.testing.assert_allclose(losses[:2], train(build)[0][:2], rtol=1e-5)

    exact = graphmod.GraphModifierHook(min_rows=10, exact=True)
    _, rows, dense = train(build, exact)
    assert not rows and "emb" in dense
    assert "moves rows the batch did not read (exact=True" in exact.report.skipped[0]["reason"]


def test_a_dense_ftrl_update_of_rows_not_starting_at_zero_is_an_approximation_said():
    """Dense FTRL recomputes every row from its linear slot, zero until the
    row is read: rows that started at zero stay there (exact), rows that did
    not become zero in the dense model but not in a table (said so)."""
    ftrl = lambda: tf1.train.FtrlOptimizer(1.0)  # noqa: E731
    report = assert_faithful(model(densify, ftrl, init=tf1.zeros_initializer()))
    assert report.tables and not report.approximations

    build = model(densify, ftrl)  # rows start at 0.1
    _, _, dense = train(build)
    unread = sorted(set(range(VOCAB)) - {int(i) for ids, _ in batches() for i in ids.ravel()})
    assert unread and not dense["emb"][unread].any()  # zeroed, never read
    hook = graphmod.GraphModifierHook(min_rows=10)
    _, rows, _ = train(build, hook)
    assert rows["emb"] and "dense ftrl update moves rows the batch did not read" in \
        hook.report.approximations[0]["what"]


def test_clipping_by_global_norm_is_applied():
    def clip(gv):
        grads, _ = tf.clip_by_global_norm([g for g, _ in gv], 1e-3)
        return list(zip(grads, [v for _, v in gv]))
    assert_faithful(model(clip))


def test_an_extra_gradient_call_does_not_apply_twice():
    def with_norm_summary(gv):
        graph = tf1.get_default_graph()
        emb = [v for _, v in gv if v.op.name == "emb"][0]
        # a second tf.gradients over the same lookup, for a summary only
        lookup = [op for op in graph.get_operations() if op.type == "ResourceGather"][0]
        extra = tf.gradients(tf.reduce_sum(lookup.outputs[0] ** 2), [emb])[0]
        tf1.summary.scalar("emb_grad_norm", tf.norm(extra.values))
        return gv
    assert_faithful(model(with_norm_summary))


def test_loss_scaling_is_divided_back():
    assert_faithful(model(scale=1024.0))


def test_gradient_multipliers():
    def halve_embedding(gv):
        return [(tf.IndexedSlices(g.values * 0.5, g.indices, g.dense_shape)
                 if v.op.name == "emb" else g, v) for g, v in gv]
    assert_faithful(model(halve_embedding))


@pytest.mark.parametrize("optimizer", [
    lambda: tf1.train.AdagradOptimizer(0.3),
    lambda: tf1.train.MomentumOptimizer(0.2, 0.9),
    lambda: tf1.train.FtrlOptimizer(0.3, l1_regularization_strength=0.01)])
def test_tower_averaging(optimizer):
    assert_faithful(model(optimizer=optimizer, towers=2))


def test_gradient_rows_no_lookup_read_keep_the_variable_dense():
    """An update whose indices come from elsewhere than the variable's lookups
    (here rows of a placeholder, as another worker's gradient would be) names
    rows a table would not have: the variable stays dense, numbers equal."""
    def add_peer_rows(gv):
        peer = tf1.placeholder_with_default(np.arange(40, 48, dtype=np.int64), [None])
        out = []
        for g, v in gv:
            if v.op.name == "emb":
                g = tf.IndexedSlices(tf.concat([g.values, tf.ones([8, DIM]) * 0.1], 0),
                                     tf.concat([g.indices, peer], 0), g.dense_shape)
            out.append((g, v))
        return out

    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, _ = train(model(add_peer_rows), hook)
    assert not rows and "do not all come from its lookups" in hook.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, train(model(add_peer_rows))[0], rtol=1e-6)


# --------------------------------------------------------------------------
# Values the tables start from.

def keras_model(initializer):
    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        layer = tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=initializer,
                                          name="kemb")
        loss = xent(labels, head(layer(ids)))
        opt = tf1.train.MomentumOptimizer(0.1, 0.9)
        return dict(ids=ids, labels=labels, loss=loss,
                    train_op=opt.minimize(loss, tf1.train.get_or_create_global_step()))
    return build


@pytest.mark.parametrize("initializer, kind, a, b", [
    ("uniform", "uniform", -0.05, 0.05),
    (tf.keras.initializers.RandomNormal(0.0, 0.3), "normal", 0.0, 0.3),
    (tf.keras.initializers.TruncatedNormal(0.1, 0.2), "truncated_normal", 0.1, 0.2),
    (tf.keras.initializers.GlorotUniform(), "uniform", -(6 / (VOCAB + DIM)) ** 0.5,
     (6 / (VOCAB + DIM)) ** 0.5),
])
def test_keras_initializers_give_the_same_distribution(initializer, kind, a, b):
    hook = graphmod.GraphModifierHook(min_rows=10)
    train(keras_model(initializer), hook)
    (t,) = hook.report.tables
    assert t["initializer"]["kind"] == kind
    np.testing.assert_allclose([t["initializer"]["a"], t["initializer"]["b"]], [a, b], rtol=1e-5)


def test_an_initializer_without_table_equivalent_keeps_the_variable_dense():
    hook = graphmod.GraphModifierHook(min_rows=10)
    _, rows, dense = train(keras_model(tf.keras.initializers.Orthogonal()), hook)
    assert not rows and not hook.report.tables
    (s,) = hook.report.skipped
    assert s["variable"].endswith("embeddings") and "no table equivalent" in s["reason"]


def test_the_graph_seed_changes_the_tables_initial_rows():
    build = model(init=tf1.random_uniform_initializer(-0.1, 0.1))
    firsts = []
    for seed in (1, 1, 2):
        _, rows, _ = train(build, graphmod.GraphModifierHook(min_rows=10),
                           data=[(np.zeros((BATCH, 2), np.int64), np.zeros(BATCH, np.float32))]
                           * 1, seed=seed)
        firsts.append(rows["emb"][0])
    np.testing.assert_array_equal(firsts[0], firsts[1])  # same seed, same rows
    assert np.abs(firsts[0] - firsts[2]).max() > 1e-3     # another seed, other rows


def test_frozen_pretrained_embedding_stays_dense():
    pretrained = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)

    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", initializer=pretrained, trainable=False)
        loss = xent(labels, head(tf.nn.embedding_lookup(emb, ids)))
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(
            loss, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=loss, train_op=train_op)

    hook = graphmod.GraphModifierHook(min_rows=10)
    p_losses, _, p_dense = train(build)
    c_losses, rows, c_dense = train(build, hook)
    assert not rows and [s["variable"] for s in hook.report.skipped] == ["emb"]
    assert "not trained" in hook.report.skipped[0]["reason"]
    np.testing.assert_array_equal(c_dense["emb"], pretrained)
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-6)


def test_trainable_pretrained_matrix_stays_dense():
    pretrained = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)
    hook = graphmod.GraphModifierHook(min_rows=10)
    _, rows, dense = train(model(init=tf1.constant_initializer(pretrained)), hook)
    assert not rows and "pretrained" in hook.report.skipped[0]["reason"]


def test_warm_started_embedding_starts_from_the_checkpoint_rows(tmp_path):
    """init_from_checkpoint: each key's table row starts as its checkpoint
    row (values per key, not one shared vector), and trains as the variable."""
    source = np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)
    with tf.Graph().as_default():
        v = tf1.get_variable("emb", initializer=source)
        with tf1.Session() as sess:
            sess.run(v.initializer)
            ckpt = tf1.train.Saver([v]).save(sess, str(tmp_path / "src"))
    base = model(init=tf1.constant_initializer(0.1))

    def build():
        m = base()
        tf1.train.init_from_checkpoint(ckpt, {"emb": "emb"})
        return m

    report = assert_faithful(build)
    assert [t["variable"] for t in report.tables] == ["emb"]
    # Untouched keys hold their checkpoint rows.
    _, rows, _ = train(build, graphmod.GraphModifierHook(min_rows=10))
    touched = {int(k) for ids, _ in batches() for k in ids.ravel()}
    untouched = [k for k in range(VOCAB) if k not in touched]
    assert untouched and sorted(rows["emb"]) == list(range(VOCAB))
    for k in untouched:
        np.testing.assert_array_equal(rows["emb"][k], source[k])


# --------------------------------------------------------------------------
# Keys.

def hashed_model(cast_to_int32=False, reads_values=False):
    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        bucket = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids * 7919), VOCAB)
        if cast_to_int32:
            bucket = tf.cast(bucket, tf.int32)
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(0.1))
        loss = xent(labels, head(tf.nn.embedding_lookup(emb, bucket)))
        if reads_values:  # a value read of the ids: an auxiliary loss on the largest bucket
            loss = loss + 1e-3 * tf.cast(tf.reduce_max(bucket), tf.float32)
        train_op = tf1.train.AdagradOptimizer(0.2).minimize(
            loss, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=loss, train_op=train_op)
    return build


@pytest.mark.parametrize("cast_to_int32, reads_values", [(True, False), (False, True)])
def test_ids_read_as_values_keep_their_squeezed_keys(cast_to_int32, reads_values):
    hook = graphmod.GraphModifierHook(min_rows=10_000)  # hashed ids convert at any size
    report = assert_faithful(hashed_model(cast_to_int32, reads_values), hook=hook,
                             data=batches(vocab=10**6))
    (kept,) = report.squeezed_keys_kept
    assert ("int32" if cast_to_int32 else "Max") in kept["reason"]
    assert not report.unsqueezed_keys


def test_exact_keeps_hashed_ids_squeezed():
    """exact=True: the table is keyed by the bucket numbers, collisions and
    all, and trains exactly as the variable."""
    hook = graphmod.GraphModifierHook(exact=True)
    report = assert_faithful(hashed_model(), hook=hook, data=batches(vocab=10**6))
    assert not report.unsqueezed_keys and not report.approximations


def test_hashed_ids_get_collision_free_keys_at_any_size():
    hook = graphmod.GraphModifierHook()
    _, rows, dense = train(hashed_model(), hook, data=batches(vocab=10**6))
    assert not dense and hook.report.unsqueezed_keys
    assert max(rows["emb"]) >= VOCAB  # full fingerprints, not bucket numbers
    assert "full ids" in hook.report.approximations[0]["what"]  # said so


# --------------------------------------------------------------------------
# Adam: lazy on a table, said so; exact=True keeps it dense.

def test_adam_is_reported_lazy_and_exact_keeps_it_dense():
    build = model(optimizer=lambda: tf1.train.AdamOptimizer(0.05))
    hook = graphmod.GraphModifierHook(min_rows=10)
    _, rows, _ = train(build, hook)
    assert rows["emb"] and "lazy" in hook.report.approximations[0]["what"]
    exact = graphmod.GraphModifierHook(min_rows=10, exact=True)
    p_losses, _, _ = train(build)
    c_losses, rows, _ = train(build, exact)
    assert not rows and "exact=True" in exact.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-6)


def test_adam_rows_in_every_batch_match_dense_adam():
    """Rows the batches touch every step get exactly TF's Adam update; lazy
    Adam differs only for rows a step does not touch. (A fixed head and
    examples that pair "always" ids together keep the two sets independent.)"""
    rng = np.random.default_rng(3)
    data = []
    for _ in range(STEPS):
        always = rng.permutation(np.repeat(np.arange(8), 2)).reshape(8, 2)
        sometimes = rng.integers(8, VOCAB, size=(BATCH - 8, 2))
        data.append((np.concatenate([always, sometimes]).astype(np.int64),
                     rng.integers(0, 2, size=BATCH).astype(np.float32)))

    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(0.1))
        w = tf.constant(np.linspace(-0.5, 0.7, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1))
        e = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, 2 * DIM])
        logits = tf.squeeze(tf.matmul(e, w), 1)
        loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                     logits=logits))
        train_op = tf1.train.AdamOptimizer(0.05).minimize(
            loss, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=loss, train_op=train_op)

    _, _, p_dense = train(build, None, data)
    _, rows, _ = train(build, graphmod.GraphModifierHook(min_rows=10), data)
    for key in range(8):
        np.testing.assert_allclose(rows["emb"][key], p_dense["emb"][key], rtol=1e-5)
    occasional = [k for k in rows["emb"] if k >= 8]
    assert any(np.abs(rows["emb"][k] - p_dense["emb"][k]).max() > 1e-6 for k in occasional)


# --------------------------------------------------------------------------
# Control flow: reads the rewrite does not see through stay dense, said so.

@pytest.mark.parametrize("v2", [False, True])
def test_lookup_inside_cond_stays_dense_or_matches(v2, monkeypatch):
    from tensorflow.python.ops import control_flow_util
    monkeypatch.setattr(control_flow_util, "ENABLE_CONTROL_FLOW_V2", v2)

    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(0.1))
        flag = tf.reduce_sum(labels) >= 0
        e = tf.cond(flag, lambda: tf.nn.embedding_lookup(emb, ids),
                    lambda: tf.zeros([tf.shape(ids)[0], 2, DIM]))
        loss = xent(labels, head(e))
        train_op = tf1.train.AdagradOptimizer(0.2).minimize(
            loss, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=loss, train_op=train_op)

    hook = graphmod.GraphModifierHook(min_rows=10)
    p_losses, _, _ = train(build)
    c_losses, rows, _ = train(build, hook)
    # The gather sits inside the branch (v1: behind a Switch; v2: in the If's
    # function): the rewrite does not see it, so the variable stays dense.
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-6)
    assert not rows
    (s,) = hook.report.skipped
    assert s["variable"] == "emb" and ("If" if v2 else "Switch") in s["reason"]


# --------------------------------------------------------------------------
# L2 over a whole variable: the penalty of the rows each step reads, reported.

def l2_model(whole: bool, optimizer=lambda: tf1.train.FtrlOptimizer(0.3)):
    """whole: loss + 0.01 * l2_loss(emb) (a dense read, as DeepCTR's
    l2_reg_linear); else the same penalty over the distinct rows the batch reads."""
    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(0.1))
        loss = xent(labels, head(tf.nn.embedding_lookup(emb, ids)))
        read = emb if whole else tf.gather(emb, tf.unique(tf.reshape(ids, [-1]))[0])
        total = loss + 0.01 * tf.nn.l2_loss(read)
        train_op = optimizer().minimize(total, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=total, train_op=train_op)
    return build


@pytest.mark.parametrize("optimizer", [lambda: tf1.train.FtrlOptimizer(0.3),
                                       lambda: tf1.train.AdagradOptimizer(0.3),
                                       lambda: tf1.train.GradientDescentOptimizer(0.3)])
def test_l2_over_the_whole_variable_becomes_the_penalty_of_the_rows_read(optimizer):
    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, c_dense = train(l2_model(True, optimizer), hook)
    assert rows["emb"] and not c_dense
    assert "L2 penalty" in hook.report.approximations[0]["what"]
    # Exactly the model whose penalty covers the rows each batch reads.
    p_losses, _, p_dense = train(l2_model(False, optimizer))
    np.testing.assert_allclose(c_losses, p_losses, rtol=1e-5)
    for key, row in rows["emb"].items():
        np.testing.assert_allclose(row, p_dense["emb"][key], rtol=1e-5, atol=1e-7)
    # exact=True keeps it dense, training exactly as written.
    exact = graphmod.GraphModifierHook(min_rows=10, exact=True)
    e_losses, rows, _ = train(l2_model(True, optimizer), exact)
    assert not rows and "exact=True" in exact.report.skipped[0]["reason"]
    np.testing.assert_allclose(e_losses, train(l2_model(True, optimizer))[0], rtol=1e-6)


def test_a_dense_read_in_training_keeps_the_variable_dense():
    """Anything but gathers and L2 penalties reading the whole variable (here a
    mean of all rows in the loss) keeps it dense, with the op named."""
    def build():
        ids = tf1.placeholder(tf.int64, [None, 2])
        labels = tf1.placeholder(tf.float32, [None])
        emb = tf1.get_variable("emb", [VOCAB, DIM], initializer=tf1.constant_initializer(0.1))
        loss = xent(labels, head(tf.nn.embedding_lookup(emb, ids))) + tf.reduce_mean(emb)
        # The mean's gradient needs no value of emb, so nothing else orders
        # the apply after the loss's read: without this the fetched loss is
        # sometimes taken after the update (in both models, at random).
        with tf.control_dependencies([loss]):
            train_op = tf1.train.AdagradOptimizer(0.3).minimize(
                loss, tf1.train.get_or_create_global_step())
        return dict(ids=ids, labels=labels, loss=loss, train_op=train_op)

    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, _ = train(build, hook)
    assert not rows and "read other than by gathers (Mean" in hook.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, train(build)[0], rtol=1e-6)


def test_a_summary_the_model_merges_itself_keeps_the_variable_dense():
    """A summary reading the whole variable is dropped with it, unless the
    model merged it (a Scaffold(summary_op=...) would still run the merge):
    then the variable stays dense, instead of the rewrite failing."""
    base = model(optimizer=lambda: tf1.train.AdagradOptimizer(0.3))

    def build():
        m = base()
        emb = [v for v in tf1.global_variables() if v.op.name == "emb"][0]
        tf1.summary.scalar("emb_mean", tf.reduce_mean(emb))
        m["merged"] = tf1.summary.merge_all()
        return m

    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, _ = train(build, hook)
    assert not rows and "read other than by gathers" in hook.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, train(build)[0], rtol=1e-6)


def test_l2_gradient_read_elsewhere_keeps_the_variable_dense():
    """A gradient-norm summary over the (dense) gradient reads the penalty's
    x * g term, i.e. the whole variable: the variable stays dense instead of
    the rewrite failing."""
    base = l2_model(True)

    def build():
        m = base()
        emb = [v for v in tf1.global_variables() if v.op.name == "emb"][0]
        tf1.summary.scalar("emb_grad_norm", tf.norm(tf.gradients(m["loss"], [emb])[0]))
        return m

    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, _ = train(build, hook)
    assert not rows and "L2 penalty" in hook.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, train(build)[0], rtol=1e-6)


def test_values_loaded_by_an_assign_keep_the_variable_dense():
    """Pretrained rows loaded by an assign the user runs (Scaffold init_fn
    style) would bypass a table: the variable stays dense."""
    pretrained = np.random.default_rng(2).normal(size=(VOCAB, DIM)).astype(np.float32)
    base = model()

    def build():
        m = base()
        emb = [v for v in tf1.global_variables() if v.op.name == "emb"][0]
        m["load"] = emb.assign(pretrained)
        return m

    def run(hook):
        with tf.Graph().as_default():
            m = build()
            with tf1.train.MonitoredSession(hooks=[hook] if hook else []) as sess:
                sess.run(m["load"])
                return [sess.run([m["train_op"], m["loss"]], {m["ids"]: i, m["labels"]: l})[1]
                        for i, l in batches()]

    hook = graphmod.GraphModifierHook(min_rows=10)
    np.testing.assert_allclose(run(hook), run(None), rtol=1e-6)
    assert not hook.report.tables and hook.report.skipped[0]["variable"] == "emb"


def test_a_vocabulary_warm_start_keeps_the_variable_dense(tmp_path):
    """WarmStartSettings with a VocabInfo remaps rows by vocabulary: graphmod
    cannot tell which row each id starts from, so the variable stays dense."""
    words = [f"w{i}" for i in range(VOCAB)]
    (tmp_path / "old.txt").write_text("\n".join(words))
    (tmp_path / "new.txt").write_text("\n".join(reversed(words)))
    source = np.random.default_rng(3).normal(size=(VOCAB, DIM)).astype(np.float32)
    with tf.Graph().as_default():
        v = tf1.get_variable("emb", initializer=source)
        with tf1.Session() as sess:
            sess.run(v.initializer)
            ckpt = tf1.train.Saver([v]).save(sess, str(tmp_path / "src"))
    base = model()

    def build():
        m = base()
        tf1.train.warm_start(ckpt, ["emb"], var_name_to_vocab_info={
            "emb": tf.estimator.VocabInfo(str(tmp_path / "new.txt"), VOCAB, 0,
                                          str(tmp_path / "old.txt"))})
        return m

    hook = graphmod.GraphModifierHook(min_rows=10)
    c_losses, rows, _ = train(build, hook)
    assert not rows and "initializer was replaced" in hook.report.skipped[0]["reason"]
    np.testing.assert_allclose(c_losses, train(build)[0], rtol=1e-6)


def test_the_buckets_layout_trains_as_the_dense_model_through_its_rebuilds():
    """The buckets layout moves rows when it grows (before a lookup inserts);
    handles follow them. New ids keep arriving, so the table rebuilds while
    training, also between the two towers' lookups of one step: losses and
    rows still equal the dense model's."""
    vocab = 6000
    hook = graphmod.GraphModifierHook(
        min_rows=10, tables={"emb": graphmod.TableSettings(layout="buckets", num_shards=2)})
    rng = np.random.default_rng(0)
    data = [(rng.integers(0, 300 * (s + 1), (64, 2)), rng.integers(0, 2, 64).astype(np.float32))
            for s in range(20)]
    assert_faithful(model(optimizer=lambda: tf1.train.AdagradOptimizer(0.3), towers=2,
                          vocab=vocab), data=data, hook=hook)
