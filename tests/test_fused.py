"""Fused lookups and applies: one op for many tables, with the numbers of the
single-table ops, in the op library, the table API and the hook's rewrite."""
import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod.embeddings import fused

tf1 = tf.compat.v1


def make_tables(dims=(4, 8, 4)):
    opt = graphmod.optimizers.Adagrad(0.1)
    return [graphmod.create_table(f"t{i}", d, optimizer=opt, num_shards=4)
            for i, d in enumerate(dims)]


def rng_keys(seed, n):
    return np.random.default_rng(seed).integers(0, 40, n).astype(np.int64)


# Entries: tables 0, 1, 0 again (two features sharing table 0), 2.
ENTRIES = [(0, 30), (1, 25), (0, 17), (2, 3)]


def run_lookups(fuse_them):
    """Rows, handles and tables' contents after two training lookups of ENTRIES."""
    with tf.Graph().as_default():
        tables = make_tables()
        keys = [tf.constant(rng_keys(i, n)) for i, (_, n) in enumerate(ENTRIES)]
        chosen = [tables[t] for t, _ in ENTRIES]
        if fuse_them:
            rows, handles = fused.find_or_insert(chosen, keys)
        else:
            pairs = [graphmod.embeddings.lookup.find_or_insert(t, k) for t, k in zip(chosen, keys)]
            rows, handles = [r for r, _ in pairs], [h for _, h in pairs]
            # the single ops run one after another, entries in order
            for i in range(1, len(rows)):
                with tf.control_dependencies([rows[i - 1]]):
                    rows[i], handles[i] = graphmod.embeddings.lookup.find_or_insert(chosen[i], keys[i])
        exports = [t.export() for t in tables]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run([rows, handles])
            got = sess.run([rows, handles])  # keys now exist: a second step finds them
            tables_after = sess.run(exports)
    return got, tables_after


def test_fused_find_or_insert_equals_single_ops():
    (rows_f, handles_f), tables_f = run_lookups(True)
    (rows_s, handles_s), tables_s = run_lookups(False)
    for i, (r_f, r_s) in enumerate(zip(rows_f, rows_s)):
        np.testing.assert_array_equal(r_f, r_s, err_msg=f"entry {i}")
        assert r_f.shape == (ENTRIES[i][1], [4, 8, 4][ENTRIES[i][0]])
    for t_f, t_s in zip(tables_f, tables_s):
        order_f, order_s = np.argsort(t_f["keys"]), np.argsort(t_s["keys"])
        np.testing.assert_array_equal(t_f["keys"][order_f], t_s["keys"][order_s])
        np.testing.assert_array_equal(t_f["values"][order_f], t_s["values"][order_s])
        # each occurrence is one access, whichever entry it came through
        np.testing.assert_array_equal(t_f["counts"][order_f], t_s["counts"][order_s])
    # a shared table's two entries hand out the same handle for the same key
    k0, k2 = rng_keys(0, 30), rng_keys(2, 17)
    h0 = dict(zip(k0.tolist(), handles_f[0].tolist()))
    assert all(h0[k] == h for k, h in zip(k2.tolist(), handles_f[2].tolist()) if k in h0)


def adagrad_steps(dim, keys, grads, acc0=0.1, lr=0.1):
    """How much one step of TF's Adagrad moves each row read at keys: the
    gradients of a key summed first."""
    total = {k: np.zeros(dim, np.float32) for k in keys}
    for k, g in zip(keys, grads):
        total[k] += g
    return {k: lr * g / np.sqrt(acc0 + g * g) for k, g in total.items()}


def test_fused_apply_sums_a_shared_tables_entries_before_one_step():
    with tf.Graph().as_default():
        t0, t1 = make_tables(dims=(2, 3))
        keys_a, keys_b, keys_c = np.array([1, 2, 1]), np.array([2, 5]), np.array([7, 7, 9])
        grads_a = np.array([[1., 2.], [3., 4.], [0.5, 0.5]], np.float32)
        grads_b = np.array([[-1., 0.], [2., 2.]], np.float32)
        grads_c = np.arange(9, dtype=np.float32).reshape(3, 3)
        all_keys = [tf.constant(k) for k in (keys_a, keys_b, keys_c)]
        rows, _ = fused.find_or_insert([t0, t0, t1], all_keys)
        hp = tf.constant([0.1, 0.0])
        with tf.control_dependencies(rows):
            step = fused.apply([t0.handle, t0.handle, t1.handle], all_keys,
                               [tf.constant(g) for g in (grads_a, grads_b, grads_c)],
                               [hp] * 3, ["adagrad"] * 3, [False] * 3, by_address=False)
        before = [t.export() for t in (t0, t1)]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(rows)  # inserts the keys; the step's own lookup then finds them
            start = sess.run(before)
            sess.run(step)
            after = sess.run([t0.export(), t1.export()])
    for table, keys, grads in ((0, np.concatenate([keys_a, keys_b]),
                                np.concatenate([grads_a, grads_b])), (1, keys_c, grads_c)):
        old = dict(zip(start[table]["keys"].tolist(), start[table]["values"]))
        new = dict(zip(after[table]["keys"].tolist(), after[table]["values"]))
        acc = dict(zip(after[table]["keys"].tolist(), after[table]["slots"][:, 0]))
        steps = adagrad_steps(grads.shape[1], keys.tolist(), grads)
        for k, delta in steps.items():
            np.testing.assert_allclose(old[k] - new[k], delta, rtol=1e-5, err_msg=f"key {k}")
        # key 2 of table 0: one accumulator update with (3, 4) + (-1, 0) = (2, 4)
        if table == 0:
            np.testing.assert_allclose(acc[2], [0.1 + 4.0, 0.1 + 16.0], rtol=1e-6)


def test_a_bad_entry_changes_no_table():
    with tf.Graph().as_default():
        t0, t1 = make_tables(dims=(2, 2))
        keys = tf.constant([1, 2], tf.int64)
        rows, _ = fused.find_or_insert([t0, t1], [keys, keys])
        with tf.control_dependencies(rows):
            bad = fused.apply([t0.handle, t1.handle], [keys, keys],
                              [tf.ones([2, 2]), tf.ones([2, 2])],
                              [tf.constant([0.1, 0.0]), tf.constant([0.1])],  # t1's is short
                              ["adagrad"] * 2, [False] * 2, by_address=False)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(rows)
            before = sess.run([t0.export(), t1.export()])
            with pytest.raises(tf.errors.InvalidArgumentError, match="graphmod table 't1'.*"
                               r"hyper-parameters must be the vector \[lr, epsilon\]"):
                sess.run(bad)
            after = sess.run([t0.export(), t1.export()])
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b["values"], a["values"])
        np.testing.assert_array_equal(b["slots"], a["slots"])


def test_entries_of_one_table_must_agree_on_the_step():
    with tf.Graph().as_default():
        (t0,) = make_tables(dims=(2,))
        keys = tf.constant([1], tf.int64)
        rows, _ = fused.find_or_insert([t0], [keys])
        with tf.control_dependencies(rows):
            bad = fused.apply([t0.handle, t0.handle], [keys, keys], [tf.ones([1, 2])] * 2,
                              [tf.constant([0.1, 0.0]), tf.constant([0.2, 0.0])],
                              ["adagrad"] * 2, [False] * 2, by_address=False)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="graphmod table 't0'.*different optimizers or hyper"):
                sess.run(bad)


def test_fused_lookup_api_equals_sparse_lookup_and_trains_the_same():
    """graphmod.fused_lookup gives sparse_lookup's results for every id form,
    and minimize trains the tables to the same rows."""
    def build(use_fused):
        tables = make_tables(dims=(3, 3, 2))
        dense = tf.constant([[1, 2], [2, 3]], tf.int64)
        sparse = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([4, 5, 4], tf.int64),
                                 [2, 2])
        ragged = tf.RaggedTensor.from_row_lengths(tf.constant([7, 8, 9], tf.int64), [1, 2])
        ids, combiners = [dense, sparse, ragged], [None, "sum", "mean"]
        if use_fused:
            out = graphmod.fused_lookup(tables, ids, combiners=combiners)
        else:
            out = [graphmod.sparse_lookup(t, i, combiner=c)
                   for t, i, c in zip(tables, ids, combiners)]
        loss = tf.reduce_sum(tf.square(tf.reshape(out[0], [2, -1]))) + \
            tf.reduce_sum(out[1] * 2.0) + tf.reduce_sum(tf.square(out[2]))
        train = tables[0].optimizer.minimize(loss)
        return out, train, [t.export() for t in tables]

    results = []
    for use_fused in (True, False):
        with tf.Graph().as_default():
            out, train, exports = build(use_fused)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                first = sess.run(out)
                for _ in range(3):
                    sess.run(train)
                results.append((first, sess.run(exports)))
    (first_f, tables_f), (first_s, tables_s) = results
    for a, b in zip(first_f, first_s):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    for a, b in zip(tables_f, tables_s):
        assert sorted(a["keys"].tolist()) == sorted(b["keys"].tolist())
        va = dict(zip(a["keys"].tolist(), a["values"]))
        vb = dict(zip(b["keys"].tolist(), b["values"]))
        for k in va:
            np.testing.assert_allclose(va[k], vb[k], rtol=1e-6, err_msg=f"key {k}")
        assert not np.allclose(a["slots"][:, 0], 0.1)  # the step reached every table


def many_feature_model(features_n=6, chained=False, two_optimizers=False):
    """A model_fn-style graph with one embedding variable per feature; with
    `chained`, the last feature's ids are computed from the first's rows."""
    ids = tf1.placeholder(tf.int64, [None, features_n])
    labels = tf1.placeholder(tf.float32, [None])
    embs = []
    for f in range(features_n):
        # constant rows: a table starts from exactly the variable's values
        var = tf1.get_variable(f"emb{f}", [300, 4],
                               initializer=tf1.constant_initializer(0.02 * (f + 1)))
        fid = ids[:, f]
        if chained and f == features_n - 1:
            fid = tf.cast(tf.argmax(embs[0], axis=1), tf.int64) + fid
        embs.append(tf.nn.embedding_lookup(var, fid))
    w = tf.constant(np.linspace(-1.0, 1.2, 4 * features_n, dtype=np.float32)[:, None])
    logits = tf.squeeze(tf.matmul(tf.concat(embs, 1), w), 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf1.train.get_or_create_global_step()
    if not two_optimizers:
        return ids, labels, loss, tf1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
    # DeepCTR's split: Ftrl for the first half of the features, Adagrad for the rest
    variables = tf1.trainable_variables()
    half = len(variables) // 2
    train = tf.group(tf1.train.FtrlOptimizer(0.3).minimize(loss, var_list=variables[:half]),
                     tf1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step,
                                                              var_list=variables[half:]))
    return ids, labels, loss, train


class ExportTables(tf1.train.SessionRunHook):
    def begin(self):
        self.exports = {t.name: t.export() for t in graphmod.tables()}


def train_many(hook, chained=False, steps=4, two_optimizers=False):
    """Losses, the ops the train op runs, and {variable: {id: row}} after
    training (the tables' rows when hooked, else the variables' rows)."""
    rng = np.random.default_rng(3)
    data = [(rng.integers(0, 250, (32, 6)), rng.integers(0, 2, 32).astype(np.float32))
            for _ in range(steps)]
    with tf.Graph().as_default():
        ids, labels, loss, train = many_feature_model(chained=chained,
                                                      two_optimizers=two_optimizers)
        export = ExportTables()
        losses = []
        with tf1.train.MonitoredSession(hooks=([hook] if hook else []) + [export]) as sess:
            for x, y in data:
                losses.append(sess.run([train, loss], {ids: x, labels: y})[1])
            reachable = _ops_reaching(sess.graph, [train])
            if hook:
                rows = {name: dict(zip(t["keys"].tolist(), t["values"]))
                        for name, t in sess.run(export.exports).items()}
            else:
                rows = {v.op.name: dict(enumerate(sess.run(v))) for v in tf1.global_variables()
                        if v.op.name.startswith("emb") and "/" not in v.op.name}
    return np.array(losses), reachable, rows


def assert_same_rows(hooked, plain):
    """Every row a table holds equals the variable's row of that id, and
    training moved them (rows start constant; a step makes their columns
    differ, as the head's weights do)."""
    assert set(hooked) == set(plain) and hooked, (set(hooked), set(plain))
    assert all(any(np.ptp(row) > 1e-6 for row in table.values()) for table in hooked.values())
    for name, table in hooked.items():
        assert table, name
        for key, row in table.items():
            np.testing.assert_allclose(row, plain[name][key], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{name} id {key}")


def _ops_reaching(graph, fetches):
    seen, stack = set(), [f if isinstance(f, tf.Operation) else f.op for f in fetches]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return [op.type for op in seen]


@pytest.mark.parametrize("chained", [False, True])
def test_hook_fuses_every_lookup_and_apply_and_changes_no_number(chained):
    plain, _, plain_rows = train_many(None, chained)
    hook = graphmod.GraphModifierHook(min_rows=10)
    hooked, types, hooked_rows = train_many(hook, chained)
    assert len(hook.report.tables) == 6, hook.report.skipped
    np.testing.assert_allclose(hooked, plain, rtol=1e-5)
    assert_same_rows(hooked_rows, plain_rows)
    assert abs(plain[-1] - plain[0]) > 1e-4  # it trained
    # what the train op runs: one fused apply, one fused lookup; a lookup
    # whose ids come from another lookup's rows cannot join it and runs alone
    assert "GraphmodTableApply" not in types
    assert types.count("GraphmodFusedApply") == 1
    assert types.count("GraphmodFusedFindOrInsert") == 1
    assert types.count("GraphmodTableFindOrInsert") == (1 if chained else 0)
    fused_counts = hook.report.fused
    assert fused_counts["GraphmodTableApply"] == [6, 1]
    assert fused_counts["GraphmodTableFindOrInsert"] == ([6, 1] if not chained else [5, 1])


def test_two_optimizers_get_a_fused_apply_each_and_train_as_unmodified():
    """Ftrl for half the features and Adagrad for the rest (DeepCTR's linear /
    DNN split): one fused apply per optimizer, rows as the variables'."""
    plain, _, plain_rows = train_many(None, two_optimizers=True)
    hook = graphmod.GraphModifierHook(min_rows=10)
    hooked, types, hooked_rows = train_many(hook, two_optimizers=True)
    assert len(hook.report.tables) == 6, hook.report.skipped
    assert {t["optimizer"] for t in hook.report.tables} == {"ftrl", "adagrad"}
    np.testing.assert_allclose(hooked, plain, rtol=1e-5)
    assert abs(plain[-1] - plain[0]) > 1e-4  # it trained
    assert_same_rows(hooked_rows, plain_rows)
    assert types.count("GraphmodFusedApply") == 2 and "GraphmodTableApply" not in types
    assert types.count("GraphmodFusedFindOrInsert") == 1


def run_policy_lookups(fuse_them):
    """Training lookups under admission (table 0, shared by entries 0 and 2,
    admits a key on its 3rd sighting) and a full refusing table (table 1):
    (handles == -1 per entry, admission counters per table), two steps."""
    from graphmod.embeddings import features
    with tf.Graph().as_default():
        tables = make_tables()
        t1 = graphmod.create_table("bounded", 8, num_shards=4, max_rows=6, when_full="refuse")
        tables[1] = t1
        features.set_policy("t0", features.TablePolicy(access_threshold=3))
        rng = np.random.default_rng(7)
        keys = [tf.constant(rng.integers(0, 12, n).astype(np.int64)) for _, n in ENTRIES]
        chosen = [tables[t] for t, _ in ENTRIES]
        if fuse_them:
            _, handles = fused.find_or_insert(chosen, keys)
        else:
            handles, after = [], []
            for t, k in zip(chosen, keys):
                with tf.control_dependencies(after):
                    _, h = graphmod.embeddings.lookup.find_or_insert(t, k)
                handles.append(h)
                after = [h]
        infos = [t.info() for t in tables]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            steps = [[h < 0 for h in sess.run(handles)] for _ in range(2)]
            counters = sess.run([{k: i[k] for k in ("size", "admitted", "rejected", "pending")}
                                 for i in infos])
    return steps, counters


def test_fused_lookup_admits_and_refuses_as_the_single_ops_do():
    steps_f, counters_f = run_policy_lookups(True)
    steps_s, counters_s = run_policy_lookups(False)
    for step_f, step_s in zip(steps_f, steps_s):
        for i, (f, s) in enumerate(zip(step_f, step_s)):
            np.testing.assert_array_equal(f, s, err_msg=f"entry {i}")
    assert counters_f == counters_s
    # both policies acted: ids waited for admission, and the bounded table refused some
    assert counters_f[0]["rejected"] > 0 and counters_f[0]["admitted"] > 0
    assert counters_f[1]["size"] == 6 and counters_f[1]["rejected"] > 0


def two_tower_model():
    """Two embedding variables read from two placeholders (a user and an item
    tower), trained by one optimizer."""
    users = tf1.placeholder(tf.int64, [None], name="users")
    items = tf1.placeholder(tf.int64, [None], name="items")
    labels = tf1.placeholder(tf.float32, [None])
    u = tf.nn.embedding_lookup(tf1.get_variable(
        "user_emb", [300, 4], initializer=tf1.constant_initializer(0.1)), users)
    v = tf.nn.embedding_lookup(tf1.get_variable(
        "item_emb", [300, 4], initializer=tf1.constant_initializer(0.2)), items)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=tf.reduce_sum(u * v, 1)))
    train = tf1.train.AdagradOptimizer(0.3).minimize(
        loss, global_step=tf1.train.get_or_create_global_step())
    return users, items, labels, u, train


def test_lookups_reading_different_inputs_stay_apart():
    """A fused op needs every entry's inputs: lookups of different
    placeholders (two towers, served by two signatures) are not fused, so one
    tower still runs with only its own input fed; their updates, which one
    optimizer runs together, are."""
    with tf.Graph().as_default():
        users, items, labels, u, train = two_tower_model()
        hook = graphmod.GraphModifierHook(min_rows=10)
        with tf1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train, {users: [1, 2], items: [3, 3], labels: [1.0, 0.0]})
            user_rows = sess.run(u, {users: [1, 2]})  # the user tower alone
            types = _ops_reaching(sess.graph, [train])
    assert len(hook.report.tables) == 2, hook.report.skipped
    assert user_rows.shape == (2, 4)
    assert types.count("GraphmodTableFindOrInsert") == 2
    assert types.count("GraphmodFusedApply") == 1 and "GraphmodTableApply" not in types


def test_a_lookup_fed_through_a_v1_loop_runs_after_its_source():
    """Keys computed from another lookup's rows through a v1 while loop (the
    rows reach the loop's exit only through its body): the two lookups are
    at different levels, so fusing them cannot make a cycle."""
    tf1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            ids = tf1.placeholder(tf.int64, [None, 2])
            labels = tf1.placeholder(tf.float32, [None])
            a = tf.nn.embedding_lookup(tf1.get_variable(
                "emb_a", [300, 4], initializer=tf1.constant_initializer(0.1)), ids[:, 0])
            _, total = tf1.while_loop(lambda i, acc: i < 3,
                                      lambda i, acc: (i + 1, acc + tf.reduce_sum(a)),
                                      [tf.constant(0), tf.constant(0.0)])
            b_ids = ids[:, 1] + tf.cast(tf.abs(total) > 1e9, tf.int64)
            b = tf.nn.embedding_lookup(tf1.get_variable(
                "emb_b", [300, 4], initializer=tf1.constant_initializer(0.2)), b_ids)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=tf.reduce_sum(a * b, 1)))
            train = tf1.train.AdagradOptimizer(0.3).minimize(loss)
            hook = graphmod.GraphModifierHook(min_rows=10)
            with tf1.train.MonitoredSession(hooks=[hook]) as sess:
                assert len(hook.report.tables) == 2, hook.report.skipped
                types = _ops_reaching(sess.graph, [train])
                assert types.count("GraphmodTableFindOrInsert") == 2, types
                for _ in range(2):
                    sess.run(train, {ids: [[1, 2], [3, 4]], labels: [1.0, 0.0]})
    finally:
        tf1.enable_control_flow_v2()
