"""Sparse optimizers for graphmod tables.

Each optimizer updates only the rows a step looked up, with the formulas of the
tf.compat.v1.train optimizer of the same name; gradients of an id that occurs
several times in a batch are summed first. Hyper-parameters may be numbers,
tensors (decayed learning rates) or zero-argument callables.

Two ways to use one, as in mxRec:

>>> opt = graphmod.optimizers.Adagrad(0.05)
>>> table = graphmod.create_table("user", dim=16, optimizer=opt)
>>> emb = graphmod.sparse_lookup(table, ids, is_training=True)
>>> train_sparse = opt.minimize(loss)           # every training lookup of opt's tables

or "by address", with the row handles a lookup returned:

>>> lookup = graphmod.training_lookups()[-1]
>>> grad, = tf.gradients(loss, [lookup.rows])
>>> train_sparse = opt.apply_gradients([(grad, lookup.handles)])
"""
import weakref
from typing import Any, Iterable, List, Sequence, Tuple

import tensorflow as tf

from graphmod import fused
from graphmod._ops import ops
from graphmod.state import Lookup, graph_state, training_lookups

tf1 = tf.compat.v1


# Every optimizer a table can be trained by: its hyper-parameters, in the
# order of the native apply's `hparams` input, and its slot rows, in the
# order the table keeps them. The one description of each for Python, the
# native kernels (native/table_resource.h's HparamFields, and the op's
# `optimizer` attribute) and `graphmod ckpt`; tests/test_optimizers.py checks
# that all of them agree. A new optimizer is an entry here, its class below,
# its math in native/, and the TF update it translates (rewrite_rules.
# optimizer_updates).
SPECS = {
    "sgd": (("lr",), ()),
    "adagrad": (("lr", "epsilon"), ("accum",)),
    "momentum": (("lr", "momentum"), ("accum",)),
    "adam": (("lr", "beta1", "beta2", "epsilon", "beta1_power", "beta2_power"), ("m", "v")),
    "ftrl": (("lr", "l1", "l2", "l2_shrinkage", "lr_power"), ("accum", "linear")),
    "rmsprop": (("lr", "rho", "momentum", "epsilon"), ("ms", "mom")),
}


def _value(h: Any) -> tf.Tensor:
    return tf.cast(h() if callable(h) else h, tf.float32)


def _check(cond: bool, opt: str, what: str) -> None:
    if not cond:
        raise ValueError(f"graphmod.optimizers.{opt}: {what}")


class SparseOptimizer:
    """Base class: `kind` names the native update, `slot_init` the slot rows."""
    kind = ""
    slot_init: Tuple[float, ...] = ()

    def __init__(self, learning_rate: Any, name: str):
        if isinstance(learning_rate, (int, float)):
            _check(learning_rate >= 0, type(self).__name__,
                   f"learning_rate must be >= 0, got {learning_rate}")
        self.learning_rate = learning_rate
        self.name = name

    def hparams(self) -> List[Any]:
        """Hyper-parameters in the order of the native op's `hparams` input."""
        raise NotImplementedError

    def _before_step(self) -> None:
        """Hook for per-step state read by hparams() (Adam's beta powers)."""

    def _after_step(self, applied: List[tf.Operation]) -> List[tf.Operation]:
        """Ops that advance per-step state once every table was updated."""
        return []

    def _check_table(self, table: "graphmod.Table") -> None:
        own = table.optimizer
        if own is None and self.slot_init:
            raise ValueError(f"graphmod table '{table.name}' keeps no optimizer slots (created "
                             f"with optimizer=None) but {type(self).__name__} needs "
                             f"{len(self.slot_init)}; pass optimizer= to create_table")
        if own is not None and (own.kind != self.kind or own.slot_init != self.slot_init):
            raise ValueError(f"graphmod table '{table.name}' was created for "
                             f"{type(own).__name__}, cannot be trained by {type(self).__name__}")

    def _apply_op(self, table: "graphmod.Table", ids: tf.Tensor, grads: Any, by_address: bool):
        self._check_table(table)
        grads = tf.convert_to_tensor(grads, tf.float32)  # IndexedSlices become dense
        return ops.graphmod_table_apply(
            table.handle, ids, grads, tf.stack([_value(h) for h in self.hparams()]),
            optimizer=self.kind, by_address=by_address,
            nesterov=bool(getattr(self, "use_nesterov", False)))

    def apply(self, table: "graphmod.Table", ids: Any, grads: Any, by_address: bool = False) -> tf.Operation:
        """One update of table's rows: ids are keys, or row handles when by_address."""
        self._before_step()
        op = self._apply_op(table, tf.convert_to_tensor(ids, tf.int64), grads, by_address)
        return tf.group(op, *self._after_step([op]))

    def apply_gradients(self, grads_and_targets: Iterable[Tuple[Any, Any]],
                        name: str = None) -> tf.Operation:
        """Applies (gradient, target) pairs; a target is a graphmod Lookup or the
        row handles tensor of one (by address). None gradients are skipped."""
        pairs = []
        by_handles = {id(l.handles): l for l in graph_state().lookups}
        for grad, target in grads_and_targets:
            if grad is None:
                continue
            lookup = target if isinstance(target, Lookup) else by_handles.get(id(target))
            if lookup is None:
                raise ValueError(f"{type(self).__name__}.apply_gradients: {target!r} is not the "
                                 "row handles of a graphmod training lookup in this graph")
            pairs.append((grad, lookup))
        # One fused apply for every table of the step (per device the tables
        # live on); lookups of one table (features sharing it) become one
        # update with their duplicates summed, as TF updates a variable
        # gathered twice (two applies would be unordered stateful updates).
        with tf1.name_scope(name, f"graphmod_{self.name}"):
            self._before_step()
            for table in {id(l.table): l.table for _, l in pairs}.values():
                self._check_table(table)
            hparams = tf.stack([_value(h) for h in self.hparams()]) if pairs else None
            nesterov = bool(getattr(self, "use_nesterov", False))
            by_device = {}
            for g, l in pairs:
                by_device.setdefault(l.table.handle.device, []).append((g, l))
            applied = []
            for device, group in by_device.items():
                with tf.device(device):
                    applied.append(fused.apply(
                        [l.table.handle for _, l in group],
                        [tf.reshape(l.handles, [-1]) for _, l in group],
                        [tf.reshape(tf.convert_to_tensor(g, tf.float32), [-1, l.table.dim])
                         for g, l in group],
                        [hparams] * len(group), [self.kind] * len(group),
                        [nesterov] * len(group), by_address=True))
            return tf.group(*applied, *self._after_step(applied))

    def minimize(self, loss: tf.Tensor, name: str = None) -> tf.Operation:
        """Trains every table created with this optimizer through its training lookups.

        Raises ValueError when the graph has training lookups but none of them
        belongs to this optimizer (a table created with another optimizer, or
        none, would otherwise silently never train).
        """
        everything = training_lookups()
        lookups = [l for l in everything if l.table.optimizer is self]
        if everything and not lookups:
            owners = sorted({f"'{l.table.name}' ({type(l.table.optimizer).__name__})"
                             for l in everything})
            raise ValueError(f"{type(self).__name__}.minimize: no table in this graph was created "
                             f"with this optimizer; tables looked up: {', '.join(owners)}. Pass "
                             "the optimizer instance as create_table(..., optimizer=...)")
        grads = tf.gradients(loss, [l.rows for l in lookups]) if lookups else []
        return self.apply_gradients(zip(grads, lookups), name=name)


def with_slots(kind: str, slot_init: Sequence[float]) -> SparseOptimizer:
    """An optimizer of `kind` whose slot rows start at slot_init, for what it
    gives a table (its slots), not to train with (its hyper-parameters are
    unset). kind "" (no optimizer): any number of slot rows, for tools that
    restore or convert checkpoints."""
    opt = BY_KIND[kind](0.0) if kind else SparseOptimizer(0.0, "slots")
    if kind and len(slot_init) != len(SPECS[kind][1]):
        raise ValueError(f"graphmod.optimizers: {kind} keeps {len(SPECS[kind][1])} slot rows, "
                         f"got {len(slot_init)} start values")
    opt.slot_init = tuple(float(x) for x in slot_init)
    return opt


class SGD(SparseOptimizer):
    """Plain gradient descent: row -= lr * grad."""
    kind = "sgd"

    def __init__(self, learning_rate: Any, name: str = "SGD"):
        super().__init__(learning_rate, name)

    def hparams(self):
        return [self.learning_rate]


class Adagrad(SparseOptimizer):
    """tf.compat.v1.train.AdagradOptimizer (epsilon > 0 gives the Keras form)."""
    kind = "adagrad"

    def __init__(self, learning_rate: Any, initial_accumulator_value: float = 0.1,
                 epsilon: float = 0.0, name: str = "Adagrad"):
        super().__init__(learning_rate, name)
        _check(initial_accumulator_value > 0 or epsilon > 0, "Adagrad",
               "initial_accumulator_value must be > 0 (or epsilon > 0)")
        self.slot_init = (float(initial_accumulator_value),)
        self.epsilon = epsilon

    def hparams(self):
        return [self.learning_rate, self.epsilon]


class Momentum(SparseOptimizer):
    """tf.compat.v1.train.MomentumOptimizer."""
    kind = "momentum"
    slot_init = (0.0,)

    def __init__(self, learning_rate: Any, momentum: Any = 0.9, use_nesterov: bool = False,
                 name: str = "Momentum"):
        super().__init__(learning_rate, name)
        self.momentum = momentum
        self.use_nesterov = use_nesterov

    def hparams(self):
        return [self.learning_rate, self.momentum]


class Adam(SparseOptimizer):
    """tf.compat.v1.train.AdamOptimizer's update, on the rows looked up.

    On a table every Adam is lazy: a row's moments decay only when the row gets
    a gradient (rows not in the batch are not visited). Bias correction uses
    the optimizer's own step count, kept in two variables saved with the model.
    """
    kind = "adam"
    slot_init = (0.0, 0.0)

    def __init__(self, learning_rate: Any = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, name: str = "Adam"):
        super().__init__(learning_rate, name)
        for k, v in (("beta1", beta1), ("beta2", beta2)):
            _check(0.0 <= v < 1.0, type(self).__name__, f"{k} must be in [0, 1), got {v}")
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self._powers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def _power_vars(self):
        graph = tf1.get_default_graph()
        if graph not in self._powers:
            with graph.control_dependencies(None), tf1.name_scope(None):
                self._powers[graph] = tuple(
                    tf1.Variable(b, trainable=False, dtype=tf.float32,
                                 name=f"graphmod_optimizers/{self.name}/{k}_power")
                    for k, b in (("beta1", self.beta1), ("beta2", self.beta2)))
        return self._powers[graph]

    def _before_step(self):
        self._power_vars()

    def hparams(self):
        b1p, b2p = self._power_vars()
        return [self.learning_rate, self.beta1, self.beta2, self.epsilon,
                b1p.read_value(), b2p.read_value()]

    def _after_step(self, applied):
        b1p, b2p = self._power_vars()
        with tf.control_dependencies(applied):
            return [b1p.assign(b1p * self.beta1), b2p.assign(b2p * self.beta2)]


class LazyAdam(Adam):
    """Adam under the name mxRec and TF-Addons users know; the same update."""

    def __init__(self, learning_rate: Any = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, name: str = "LazyAdam"):
        super().__init__(learning_rate, beta1, beta2, epsilon, name)


class Ftrl(SparseOptimizer):
    """tf.compat.v1.train.FtrlOptimizer (with l2_shrinkage_regularization_strength)."""
    kind = "ftrl"

    def __init__(self, learning_rate: Any, learning_rate_power: float = -0.5,
                 initial_accumulator_value: float = 0.1, l1: float = 0.0, l2: float = 0.0,
                 l2_shrinkage: float = 0.0, name: str = "Ftrl"):
        super().__init__(learning_rate, name)
        _check(learning_rate_power <= 0, "Ftrl",
               f"learning_rate_power must be <= 0, got {learning_rate_power}")
        _check(initial_accumulator_value >= 0, "Ftrl",
               f"initial_accumulator_value must be >= 0, got {initial_accumulator_value}")
        for k, v in (("l1", l1), ("l2", l2), ("l2_shrinkage", l2_shrinkage)):
            _check(v >= 0, "Ftrl", f"{k} must be >= 0, got {v}")
        self.slot_init = (float(initial_accumulator_value), 0.0)
        self.lr_power, self.l1, self.l2, self.l2_shrinkage = (
            learning_rate_power, l1, l2, l2_shrinkage)

    def hparams(self):
        return [self.learning_rate, self.l1, self.l2, self.l2_shrinkage, self.lr_power]


class RMSProp(SparseOptimizer):
    """tf.compat.v1.train.RMSPropOptimizer (not centered; mean square starts at 1)."""
    kind = "rmsprop"
    slot_init = (1.0, 0.0)

    def __init__(self, learning_rate: Any, decay: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-10, name: str = "RMSProp"):
        super().__init__(learning_rate, name)
        self.decay, self.momentum, self.epsilon = decay, momentum, epsilon

    def hparams(self):
        return [self.learning_rate, self.decay, self.momentum, self.epsilon]


__all__: Sequence[str] = ("SparseOptimizer", "SGD", "Adagrad", "Momentum", "Adam", "LazyAdam",
                          "Ftrl", "RMSProp")


BY_KIND = {c.kind: c for c in (SGD, Adagrad, Momentum, Adam, Ftrl, RMSProp)}
