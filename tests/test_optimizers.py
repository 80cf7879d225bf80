"""graphmod.optimizers against the tf.compat.v1.train optimizers of the same name.

Each test builds one graph holding a graphmod table and a static tf.Variable V
whose rows start equal to the table's initial rows for the same ids. Every
step feeds a batch of ids with duplicates and a loss that weights each batch
position differently, so the gradients of a repeated id differ and must be
summed. The static model is trained by the TF1 optimizer (its sparse path:
tf.gather gives IndexedSlices), the table by the graphmod optimizer, and after
every step the rows (and optimizer slots) must agree.
"""
import numpy as np
import pytest
import tensorflow as tf

import graphmod
from graphmod import optimizers as gmo

tf1 = tf.compat.v1

DIM = 4
# Keys of the rows; V's row i is the table's row KEYS[i]. Not 0..n-1 on purpose.
KEYS = np.array([11, 7, 2**40 + 3, -5, 123456789], np.int64)
N = len(KEYS)
# Batches of positions into KEYS, with duplicates; some rows are not touched.
PARTIAL = [[3, 1, 3, 0, 3], [2, 2, 4], [0, 1, 3, 3, 1, 2], [4, 0, 4, 4]]
# Every batch touches every row (with duplicates), see the Adam note below.
FULL = [[3, 1, 3, 0, 3, 2, 4], [2, 2, 4, 0, 1, 3, 1], [4, 3, 2, 1, 0, 0, 0], [1, 4, 0, 2, 3, 4]]

RTOL, ATOL = 1e-5, 1e-6


def targets(step: int, n: int) -> np.ndarray:
    return np.random.RandomState(100 + step).uniform(-1.0, 1.0, (n, DIM)).astype(np.float32)


def make_loss(rows: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """sum_i (i + 1) * ||rows_i - target_i||^2 + sum(rows_i * target_i): position-weighted."""
    weight = tf.cast(tf.range(1, tf.shape(rows)[0] + 1), tf.float32)[:, None]
    return tf.reduce_sum(weight * tf.square(rows - target)) + tf.reduce_sum(rows * target)


def keras_adagrad(lr, initial_accumulator_value, epsilon):
    # tf.compat.v1.train.AdagradOptimizer has no epsilon: epsilon > 0 is the
    # Keras form var -= lr * g / (sqrt(acc) + epsilon) (ResourceSparseApplyAdagradV2).
    return tf.keras.optimizers.legacy.Adagrad(lr, initial_accumulator_value, epsilon)


# name -> (graphmod optimizer, reference optimizer, reference slot names in the
# order of graphmod's slot rows, batches)
#
# Adam: TF1's sparse Adam decays m and v of ALL rows each step (and moves rows
# whose m is non-zero even without a gradient), while graphmod's Adam is lazy:
# only the rows looked up are visited. The two agree exactly only when every
# step touches every row, hence FULL batches (laziness: test_adam_is_lazy).
CASES = {
    "sgd": (lambda: gmo.SGD(0.1),
            lambda: tf1.train.GradientDescentOptimizer(0.1), [], PARTIAL),
    "adagrad": (lambda: gmo.Adagrad(0.3, initial_accumulator_value=0.2),
                lambda: tf1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2),
                ["accumulator"], PARTIAL),
    "adagrad_epsilon": (lambda: gmo.Adagrad(0.3, initial_accumulator_value=0.1, epsilon=0.1),
                        lambda: keras_adagrad(0.3, 0.1, 0.1), ["accumulator"], PARTIAL),
    "momentum": (lambda: gmo.Momentum(0.05, momentum=0.9),
                 lambda: tf1.train.MomentumOptimizer(0.05, 0.9), ["momentum"], PARTIAL),
    "momentum_nesterov": (lambda: gmo.Momentum(0.05, momentum=0.8, use_nesterov=True),
                          lambda: tf1.train.MomentumOptimizer(0.05, 0.8, use_nesterov=True),
                          ["momentum"], PARTIAL),
    "adam": (lambda: gmo.Adam(0.05, beta1=0.8, beta2=0.95, epsilon=1e-3),
             lambda: tf1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-3),
             ["m", "v"], FULL),
    "lazy_adam": (lambda: gmo.LazyAdam(0.05, beta1=0.8, beta2=0.95, epsilon=1e-3),
                  lambda: tf1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-3),
                  ["m", "v"], FULL),
    "ftrl": (lambda: gmo.Ftrl(0.3, initial_accumulator_value=0.1),
             lambda: tf1.train.FtrlOptimizer(0.3, initial_accumulator_value=0.1),
             ["accum", "linear"], PARTIAL),
    "ftrl_regularized": (
        lambda: gmo.Ftrl(0.3, learning_rate_power=-0.7, initial_accumulator_value=0.2,
                         l1=0.05, l2=0.1, l2_shrinkage=0.2),
        lambda: tf1.train.FtrlOptimizer(0.3, learning_rate_power=-0.7,
                                        initial_accumulator_value=0.2,
                                        l1_regularization_strength=0.05,
                                        l2_regularization_strength=0.1,
                                        l2_shrinkage_regularization_strength=0.2),
        ["accum", "linear"], PARTIAL),
    "rmsprop": (lambda: gmo.RMSProp(0.01, decay=0.9),
                lambda: tf1.train.RMSPropOptimizer(0.01, decay=0.9),
                ["rms", "momentum"], PARTIAL),
    "rmsprop_momentum": (lambda: gmo.RMSProp(0.01, decay=0.8, momentum=0.6, epsilon=1e-4),
                         lambda: tf1.train.RMSPropOptimizer(0.01, decay=0.8, momentum=0.6,
                                                            epsilon=1e-4),
                         ["rms", "momentum"], PARTIAL),
}


class Pair:
    """A table and its static twin V in one graph, fed the same batch of positions."""

    def __init__(self, name: str, gm_opt, seed=None):
        self.pos = tf1.placeholder(tf.int32, [None], name=f"{name}_pos")
        self.target = tf1.placeholder(tf.float32, [None, DIM], name=f"{name}_target")
        self.table = graphmod.create_table(name, DIM, optimizer=gm_opt, seed=seed)
        self.keys = tf.gather(tf.constant(KEYS), self.pos)
        self.table_loss = make_loss(graphmod.sparse_lookup(self.table, self.keys), self.target)
        self.lookup = graphmod.training_lookups()[-1]
        # The initial rows: a read-only lookup returns the row an id would get.
        self.initial_rows = graphmod.sparse_lookup(self.table, tf.constant(KEYS),
                                                   is_training=False)
        self.V = tf1.Variable(tf.zeros([N, DIM]), name=f"{name}_static")
        self.static_loss = make_loss(tf.gather(self.V, self.pos), self.target)
        self.read_rows = graphmod.sparse_lookup(self.table, tf.constant(KEYS), is_training=False)
        self.exported = self.table.export()

    def init(self, sess):
        """Initializes every variable of the graph, then copies the table's rows to V."""
        sess.run(tf1.global_variables_initializer())
        sess.run(self.V.assign(self.initial_rows))

    def feed(self, step: int, batch):
        return {self.pos: batch, self.target: targets(step, len(batch))}

    def check_rows(self, sess, step):
        table_rows, V = sess.run([self.read_rows, self.V])
        np.testing.assert_allclose(table_rows, V, rtol=RTOL, atol=ATOL,
                                   err_msg=f"rows after step {step}")
        return table_rows

    def check_slots(self, sess, ref_opt, slot_names, step):
        """Table slots of the keys seen so far vs the reference's slot variables."""
        exported = sess.run(self.exported)
        order = np.argsort(exported["keys"])
        keys, slots = exported["keys"][order], exported["slots"][order]
        position = {k: i for i, k in enumerate(KEYS)}
        rows = [position[k] for k in keys]
        assert slots.shape == (len(keys), len(slot_names), DIM)
        for s, slot_name in enumerate(slot_names):
            ref = sess.run(ref_opt.get_slot(self.V, slot_name))
            np.testing.assert_allclose(slots[:, s], ref[rows], rtol=RTOL, atol=ATOL,
                                       err_msg=f"slot {slot_name} after step {step}")


def reference_train_op(ref_opt, loss, var):
    if isinstance(ref_opt, tf1.train.Optimizer):
        return ref_opt.minimize(loss, var_list=[var])
    grads = tf.gradients(loss, [var])  # Keras (legacy) optimizers take gradients
    assert isinstance(grads[0], tf.IndexedSlices)  # the sparse path
    return ref_opt.apply_gradients(zip(grads, [var]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_tf1_optimizer(case):
    make_gm, make_ref, slot_names, batches = CASES[case]
    with tf.Graph().as_default() as graph:
        opt = make_gm()
        pair = Pair("emb", opt)
        ref = make_ref()
        train_static = reference_train_op(ref, pair.static_loss, pair.V)
        train_table = opt.minimize(pair.table_loss)
        with tf1.Session(graph=graph) as sess:
            pair.init(sess)
            before = pair.check_rows(sess, 0)
            seen = set()
            for step, batch in enumerate(batches, 1):
                sess.run([train_static, train_table], pair.feed(step, batch))
                rows = pair.check_rows(sess, step)
                pair.check_slots(sess, ref, slot_names, step)
                seen.update(batch)
            # The comparison is not vacuous: every touched row moved.
            moved = np.abs(rows - before).max(axis=1) > 1e-3
            assert moved[sorted(seen)].all(), moved


@pytest.mark.parametrize("form", ["handles", "lookup"])
def test_apply_gradients_by_address_equals_minimize(form):
    """apply_gradients([(grad, lookup.handles)]) == minimize == TF1, on twin tables."""
    with tf.Graph().as_default() as graph:
        opt_min = gmo.Adagrad(0.3, initial_accumulator_value=0.2)
        opt_addr = gmo.Adagrad(0.3, initial_accumulator_value=0.2)
        by_min = Pair("by_minimize", opt_min, seed=42)
        by_addr = Pair("by_address", opt_addr, seed=42)  # same seed: same initial rows
        lookup = by_addr.lookup
        assert lookup.table is by_addr.table
        assert graphmod.training_lookups() == [by_min.lookup, by_addr.lookup]
        grad, = tf.gradients(by_addr.table_loss, [lookup.rows])
        target = lookup.handles if form == "handles" else lookup
        train_addr = opt_addr.apply_gradients([(grad, target)])
        train_min = opt_min.minimize(by_min.table_loss)
        ref = tf1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2)
        train_static = ref.minimize(by_min.static_loss, var_list=[by_min.V])
        with tf1.Session(graph=graph) as sess:
            by_min.init(sess)
            sess.run(by_addr.V.assign(by_addr.initial_rows))
            for step, batch in enumerate(PARTIAL, 1):
                feed = {**by_min.feed(step, batch), **by_addr.feed(step, batch)}
                sess.run([train_addr, train_min, train_static], feed)
                rows = by_min.check_rows(sess, step)
                np.testing.assert_allclose(sess.run(by_addr.read_rows), rows,
                                           rtol=RTOL, atol=ATOL)
                a, b = sess.run([by_min.exported, by_addr.exported])
                np.testing.assert_array_equal(np.sort(a["keys"]), np.sort(b["keys"]))
                np.testing.assert_allclose(b["slots"][np.argsort(b["keys"])],
                                           a["slots"][np.argsort(a["keys"])],
                                           rtol=RTOL, atol=ATOL)


def test_none_gradients_are_skipped():
    with tf.Graph().as_default() as graph:
        opt = gmo.SGD(0.1)
        pair = Pair("emb", opt)
        train = opt.apply_gradients([(None, pair.lookup.handles)])
        with tf1.Session(graph=graph) as sess:
            pair.init(sess)
            sess.run(train, pair.feed(1, PARTIAL[0]))
            pair.check_rows(sess, 1)  # V was not trained either


# ------------------------------------------------------------------ learning rates


def _check_lr_schedule(make_opts, steps_feed):
    """make_opts() -> (graphmod opt, TF1 opt, op run after each step or None)."""
    with tf.Graph().as_default() as graph:
        opt, ref, after_step = make_opts()
        pair = Pair("emb", opt)
        train_static = ref.minimize(pair.static_loss, var_list=[pair.V])
        train_table = opt.minimize(pair.table_loss)
        with tf1.Session(graph=graph) as sess:
            pair.init(sess)
            previous = sess.run(pair.V)
            deltas = []
            for step, batch in enumerate(PARTIAL, 1):
                sess.run([train_static, train_table], pair.feed(step, batch))
                rows = pair.check_rows(sess, step)
                deltas.append(np.abs(rows - previous).max())
                previous = rows
                if after_step is not None:
                    sess.run(after_step)
            return deltas


def test_decayed_learning_rate_tensor():
    def make():
        global_step = tf1.train.get_or_create_global_step()
        lr = tf1.train.exponential_decay(0.5, global_step, decay_steps=1, decay_rate=0.1)
        return gmo.SGD(lr), tf1.train.GradientDescentOptimizer(lr), \
            tf1.assign_add(global_step, 1)
    deltas = _check_lr_schedule(make, PARTIAL)
    # The rate really decays (by 10x a step) in both models.
    assert deltas[0] > 10 * deltas[-1]


def test_callable_learning_rate():
    def make():
        lr_var = tf1.Variable(0.1, trainable=False, name="lr")

        def lr():
            return lr_var * 2.0
        return gmo.Momentum(lr, momentum=0.5), tf1.train.MomentumOptimizer(lr, 0.5), \
            lr_var.assign(lr_var * 0.5)
    _check_lr_schedule(make, PARTIAL)


def test_tensor_momentum_hyperparameter():
    def make():
        momentum = tf.constant(0.7)
        return gmo.Momentum(0.05, momentum), tf1.train.MomentumOptimizer(0.05, momentum), None
    _check_lr_schedule(make, PARTIAL)


# ------------------------------------------------------------------ lazy Adam


def test_adam_is_lazy():
    """Rows without a gradient keep their value and moments; bias correction
    uses the optimizer's step count (the TF-Addons LazyAdam update)."""
    lr, b1, b2, eps = 0.05, 0.8, 0.95, 1e-3
    with tf.Graph().as_default() as graph:
        opt = gmo.LazyAdam(lr, b1, b2, eps)
        pair = Pair("emb", opt)
        grad, = tf.gradients(pair.table_loss, [pair.lookup.rows])
        train = opt.minimize(pair.table_loss)
        with tf1.Session(graph=graph) as sess:
            pair.init(sess)
            var = sess.run(pair.initial_rows).astype(np.float64)
            m, v = np.zeros_like(var), np.zeros_like(var)
            for t, batch in enumerate(PARTIAL, 1):
                g_rows, _ = sess.run([grad, train], pair.feed(t, batch))
                g = np.zeros_like(var)
                np.add.at(g, batch, g_rows)
                hit = np.unique(batch)
                m[hit] = b1 * m[hit] + (1 - b1) * g[hit]
                v[hit] = b2 * v[hit] + (1 - b2) * g[hit] ** 2
                lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
                var[hit] -= lr_t * m[hit] / (np.sqrt(v[hit]) + eps)
                np.testing.assert_allclose(sess.run(pair.read_rows), var, rtol=RTOL, atol=ATOL)
                exported = sess.run(pair.exported)
                rows = [list(KEYS).index(k) for k in exported["keys"]]
                np.testing.assert_allclose(exported["slots"][:, 0], m[rows], rtol=RTOL, atol=ATOL)
                np.testing.assert_allclose(exported["slots"][:, 1], v[rows], rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ errors


def _lookup_of(table_name, table_optimizer):
    table = graphmod.create_table(table_name, DIM, optimizer=table_optimizer)
    graphmod.sparse_lookup(table, tf.constant([1, 2, 1], tf.int64))
    return graphmod.training_lookups()[-1]


def test_table_without_slots_trained_by_adagrad():
    with tf.Graph().as_default():
        lookup = _lookup_of("no_slots_table", None)
        with pytest.raises(ValueError, match=r"'no_slots_table'.*optimizer=None.*Adagrad"):
            gmo.Adagrad(0.1).apply_gradients([(tf.ones_like(lookup.rows), lookup.handles)])
        # SGD needs no slots: fine on such a table.
        gmo.SGD(0.1).apply_gradients([(tf.ones_like(lookup.rows), lookup.handles)])


def test_table_for_adagrad_trained_by_adam():
    with tf.Graph().as_default():
        lookup = _lookup_of("adagrad_table", gmo.Adagrad(0.1))
        with pytest.raises(ValueError, match=r"'adagrad_table'.*Adagrad.*Adam"):
            gmo.Adam(0.1).apply_gradients([(tf.ones_like(lookup.rows), lookup)])


def test_table_for_adagrad_trained_by_adagrad_with_other_accumulator():
    with tf.Graph().as_default():
        lookup = _lookup_of("adagrad_table", gmo.Adagrad(0.1, initial_accumulator_value=0.1))
        with pytest.raises(ValueError, match=r"'adagrad_table'"):
            gmo.Adagrad(0.1, initial_accumulator_value=0.5).apply_gradients(
                [(tf.ones_like(lookup.rows), lookup)])


@pytest.mark.parametrize("target", ["keys", "other_tensor", "variable"])
def test_apply_gradients_target_must_be_lookup_handles(target):
    with tf.Graph().as_default():
        lookup = _lookup_of("t", gmo.SGD(0.1))
        bad = {"keys": lambda: lookup.keys,
               "other_tensor": lambda: tf.identity(lookup.handles),
               "variable": lambda: tf1.Variable(tf.zeros([3], tf.int64))}[target]()
        with pytest.raises(ValueError, match="not the row handles of a graphmod training lookup"):
            gmo.SGD(0.1).apply_gradients([(tf.ones_like(lookup.rows), bad)])


@pytest.mark.parametrize("make, what", [
    (lambda: gmo.Adam(beta1=1.5), "beta1"),
    (lambda: gmo.Adam(beta2=1.0), "beta2"),
    (lambda: gmo.LazyAdam(beta1=-0.1), "beta1"),
    (lambda: gmo.SGD(-0.1), "learning_rate"),
    (lambda: gmo.Adagrad(0.1, initial_accumulator_value=0.0), "initial_accumulator_value"),
    (lambda: gmo.Ftrl(0.1, learning_rate_power=0.5), "learning_rate_power"),
    (lambda: gmo.Ftrl(0.1, initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (lambda: gmo.Ftrl(0.1, l1=-0.1), "l1"),
    (lambda: gmo.Ftrl(0.1, l2_shrinkage=-0.1), "l2_shrinkage"),
])
def test_invalid_hyperparameters(make, what):
    with pytest.raises(ValueError, match=what):
        make()


def test_minimize_refuses_a_graph_whose_tables_belong_to_other_optimizers():
    with tf.Graph().as_default():
        table = graphmod.create_table("owned", 2, optimizer=gmo.Adagrad(0.1))
        rows = graphmod.sparse_lookup(table, tf.constant([1, 2], tf.int64))
        with pytest.raises(ValueError, match="'owned' \\(Adagrad\\)"):
            gmo.Adam(0.1).minimize(tf.reduce_sum(rows))


def test_lookups_sharing_a_table_are_one_update():
    """Two features sharing one table (FeatureSpec(table=...)): a key in both
    gets one Adagrad update with its gradients summed, as TF updates a
    variable gathered twice: accumulator 0.1 + (3 + 0.5)^2, not 0.1 + 3^2 + 0.5^2,
    and the same in every run."""
    results = []
    for _ in range(2):
        with tf.Graph().as_default():
            opt = gmo.Adagrad(1.0, initial_accumulator_value=0.1)
            table = graphmod.create_table("shared", 1, initializer=0.0, optimizer=opt)
            a = graphmod.sparse_lookup(table, tf.constant([5], tf.int64))
            b = graphmod.sparse_lookup(table, tf.constant([5], tf.int64))
            loss = 3.0 * tf.reduce_sum(a) + 0.5 * tf.reduce_sum(b)
            train = opt.minimize(loss)
            assert len([op for op in tf1.get_default_graph().get_operations()
                        if op.type == "GraphmodFusedApply"]) == 1
            export = table.export()
            with tf1.Session() as sess:
                sess.run(train)
                results.append(sess.run(export))
    for out in results:
        np.testing.assert_allclose(out["slots"][0, 0, 0], 0.1 + 3.5 ** 2, rtol=1e-6)
        np.testing.assert_allclose(out["values"][0, 0], -3.5 / np.sqrt(0.1 + 3.5 ** 2), rtol=1e-6)


def test_one_table_describes_every_optimizer_for_python_and_the_kernels():
    """graphmod.optimizers.SPECS is what the classes, the native op and its
    kernels take: the kernel knows exactly its kinds, each class gives its
    hyper-parameters and slot rows in its counts, and the kernel asks for the
    hyper-parameters by the same names, in the same order."""
    from graphmod._ops import ops
    assert sorted(gmo.BY_KIND) == sorted(gmo.SPECS)
    with tf.Graph().as_default():
        table = graphmod.create_table("t", DIM)
        apply = ops.graphmod_table_apply(table.handle, tf.constant([1], tf.int64),
                                         tf.zeros([1, DIM]), tf.zeros([1]), optimizer="lamb")
        with tf1.Session() as sess, pytest.raises(tf.errors.InvalidArgumentError) as e:
            sess.run(apply)
    assert f"unknown optimizer 'lamb' (known: {', '.join(gmo.SPECS)})" in str(e.value)
    for kind, (hparams, slots) in gmo.SPECS.items():
        with tf.Graph().as_default():
            opt = gmo.BY_KIND[kind](0.1)
            assert len(opt.hparams()) == len(hparams), kind
            assert len(opt.slot_init) == len(slots), kind
            table = graphmod.create_table(f"t_{kind}", DIM, optimizer=opt)
            apply = ops.graphmod_table_apply(
                table.handle, tf.constant([1], tf.int64), tf.zeros([1, DIM]), tf.zeros([0]),
                optimizer=kind, by_address=False, nesterov=False)
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                with pytest.raises(tf.errors.InvalidArgumentError) as e:
                    sess.run(apply)
            assert f"hyper-parameters must be the vector [{', '.join(hparams)}]" in str(e.value)


def test_with_slots_gives_a_table_any_number_of_slot_rows():
    """What checkpoint tools need (graphmod ckpt): a table of n slot rows, for
    any n; a kind must keep its own count."""
    with tf.Graph().as_default():
        for n in (1, 3):
            table = graphmod.create_table(f"t{n}", DIM, optimizer=gmo.with_slots("", [0.5] * n))
            assert table.num_slots == n and table.slot_init == (0.5,) * n
        assert gmo.with_slots("ftrl", [0.1, 0.0]).slot_init == (0.1, 0.0)
        with pytest.raises(ValueError, match="ftrl keeps 2 slot rows, got 1"):
            gmo.with_slots("ftrl", [0.1])
