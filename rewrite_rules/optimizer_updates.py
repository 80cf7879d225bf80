"""Rule: an optimizer's update of a converted variable becomes the table's apply.

Matches the per-variable update that tf.compat.v1.train optimizers (and the
Keras legacy Adagrad, Ftrl and plain SGD) build under '<optimizer>/update_<var>':
  - fused sparse ops: (Resource)SparseApply{Adagrad,AdagradV2,Ftrl,FtrlV2,
    Momentum,RMSProp}: hyper-parameters are the op's own inputs;
  - GradientDescent: a scatter of -lr * grad;
  - Adam: TF1's composite sparse update (m, v scatters and the bias-corrected
    step), whose learning rate, betas, epsilon and beta powers are read off
    its ops, so the table shares the dense variables' bias correction.
Builds one table apply per variable from the gradient the update consumes
(the IndexedSlices after everything the model did to it: clipping, loss
scaling, multipliers, tower averaging), keyed by its indices (the ids, or
the unsqueezed keys when collisionless_keys fed the table those), duplicates
summed; whatever waited for the old update waits for the apply. A gradient
Horovod combined across ranks is taken before the collective, as this
rank's share of the combination (rewrite_rules.shard_exchange sums the
shares at each key's owner).
Refuses (the variable then stays dense): centered RMSProp, Keras momentum and
Adam forms, TF1 Adam when exact=True (a table's Adam is lazy: rows outside
the batch keep their moments, which the report states otherwise), and
anything else it does not recognise. Its match (check) is the update's
Translation and the optimizer gather_to_lookup builds the table's slots
from; it builds the table's Apply per conversion.
"""
import dataclasses
from typing import List, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from graphmod import folding, optimizers
from graphmod._ops import ops
from graphmod.rewrite.plan import Combined, Conversion, Update, checkpoint_name
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules.gather_to_lookup import Lookups, SlotLayout
from graphmod.rewrite_rules.l2_penalties import PenaltyGrads

NAME = "optimizer_updates"
AFTER = ("gather_to_lookup", "l2_penalties")  # applies to the table, with the penalty's rows
LAZY_ADAM = ("Adam is lazy on a table: rows outside the batch keep their moments "
             "(TF's dense Adam decays every row's)")
UNREAD_ROWS = ("its gradient is dense, and the dense {} update moves rows the batch did not "
               "read; the table updates only the rows read")


class Untranslatable(Refused):
    pass


Apply = NamedTuple("Apply", [("op", tf.Operation)])  # the table's apply op

# op type -> (table optimizer kind, {hyper-parameter (optimizers.SPECS) or slot
# name: the op's input arg holding it, or a constant}). Keyed by the op type
# without "Resource" and "Sparse": a variable whose dense gradient the
# planner split into rows (an L2 penalty made it dense) has a dense Apply op
# with the same argument names.
_SAME = {n: n for n in ("lr", "epsilon", "l1", "l2", "l2_shrinkage", "lr_power", "momentum",
                        "rho", "beta1", "beta2", "beta1_power", "beta2_power", "accum",
                        "linear", "ms", "mom", "m", "v")}
_FUSED = {
    "ApplyAdagrad": ("adagrad", dict(_SAME, epsilon=0.0)),
    "ApplyAdagradV2": ("adagrad", _SAME),
    "ApplyFtrl": ("ftrl", dict(_SAME, l2_shrinkage=0.0)),
    "ApplyFtrlV2": ("ftrl", _SAME),
    "ApplyMomentum": ("momentum", _SAME),
    "ApplyRMSProp": ("rmsprop", _SAME),
    "ApplyGradientDescent": ("sgd", dict(_SAME, lr="alpha")),
    "ApplyAdam": ("adam", _SAME),
}


@dataclasses.dataclass(eq=False)
class Translation:
    """What the table's apply needs: kind, hyper-parameter tensors, slot layout."""
    kind: str
    hparams: List[Union[tf.Tensor, float]]
    slot_vars: List[tf.Variable]
    nesterov: bool = False
    dense: bool = False  # the update is a dense Apply op (every row, every step)
    layout: Optional[optimizers.SparseOptimizer] = None  # set by check()

    def slot_layout(self) -> optimizers.SparseOptimizer:
        """A graphmod optimizer whose slot rows start as the variable's slots did."""
        init = tuple(_constant(s.initial_value, s.op.name) for s in self.slot_vars)
        keeps = len(optimizers.SPECS[self.kind][1])
        if len(init) != keeps:
            raise Untranslatable(f"found {len(init)} slot variables, {self.kind} keeps {keeps}")
        return optimizers.with_slots(self.kind, init)

    def table_entry(self) -> dict:
        # The dense slots the table's slots stand for, in its slot order.
        return dict(slot_variables=[s.op.name for s in self.slot_vars], optimizer=self.kind)

    def plan_entry(self) -> dict:
        return dict(slots=[[checkpoint_name(v), float(init)]
                           for v, init in zip(self.slot_vars, self.layout.slot_init)])


def _constant(t: tf.Tensor, what: str) -> float:
    value = folding.scalar(t)
    if value is None:
        raise Untranslatable(f"slot {what} does not start from one constant value")
    return value


def translate(update: Update) -> Translation:
    """Raises Untranslatable with the reason when the update is not understood."""
    by_op = {s.op: s for s in update.slots}
    for op in update.writes:
        base = op.type[len("Resource"):] if op.type.startswith("Resource") else op.type
        base = base[len("Sparse"):] if base.startswith("Sparse") else base
        if base == "ApplyCenteredRMSProp":
            raise Untranslatable("centered RMSProp has no table equivalent")
        if base == "ApplyAdaMax" or base == "ApplyAdadelta" or base == "ApplyProximalAdagrad":
            raise Untranslatable(f"{base} has no table equivalent")
        if base == "ApplyKerasMomentum":
            raise Untranslatable("Keras momentum has no table equivalent (use tf.compat.v1 "
                                 "MomentumOptimizer)")
        if base in _FUSED:
            kind, arg_of = _FUSED[base]
            names, slot_names = optimizers.SPECS[kind]
            args = {a.name: op.inputs[i] for i, a in enumerate(op.op_def.input_arg)}
            hparams = [arg_of[n] if isinstance(arg_of[n], float) else args[arg_of[n]]
                       for n in names]
            slots = [by_op[args[arg_of[n]].op] for n in slot_names]
            nesterov = bool(op.get_attr("use_nesterov")) if "use_nesterov" in op.node_def.attr \
                else False
            return Translation(kind, hparams, slots, nesterov, dense="Sparse" not in op.type)
    types = {op.type for op in update.ops}
    if {"Unique", "UnsortedSegmentSum"} <= types and "Sqrt" in types:
        return _adam(update, by_op)
    scatters = [op for op in update.writes if op.type in ("ResourceScatterAdd", "ScatterSub")]
    if len(update.writes) == 1 and scatters:
        grads = [v for v, _ in update.gradients]
        return Translation("sgd", [_sgd_lr(scatters[0], grads)], [])
    raise Untranslatable("unrecognised update ops (" + ", ".join(sorted(types))[:200] + ")")


def _sgd_lr(scatter: tf.Operation, grads: List[tf.Tensor]) -> tf.Tensor:
    value = scatter.inputs[2]
    if value.op.type == "Neg":  # Keras: -(grad * lr)
        value = value.op.inputs[0]
    if value.op.type != "Mul":
        raise Untranslatable(f"gradient-descent scatter {scatter.name} is not lr * grad")

    def is_grad(t):  # the consumed gradient, or its negation (TF1: -grad * lr)
        return any(t is g or (t.op.type == "Neg" and t.op.inputs[0] is g) for g in grads)
    if not any(is_grad(t) for t in value.op.inputs):
        raise Untranslatable(f"gradient-descent scatter {scatter.name} does not scale the "
                             "gradient the update consumes")
    others = [t for t in value.op.inputs if not is_grad(t)]
    if len(others) != 1:
        raise Untranslatable(f"cannot tell the learning rate in {value.op.name}")
    return others[0]


def _input_of_type(op: tf.Operation, op_type: str) -> Tuple[tf.Tensor, tf.Tensor]:
    """(input of type op_type, the other input) of a binary op."""
    a, b = op.inputs[0], op.inputs[1]
    if a.op.type == op_type:
        return a, b
    if b.op.type == op_type:
        return b, a
    raise Untranslatable(f"{op.name} has no {op_type} input")


def _one_minus(t: tf.Tensor) -> tf.Tensor:
    """x of a `1 - x` Sub."""
    if t.op.type != "Sub" or folding.scalar(t.op.inputs[0]) != 1:
        raise Untranslatable(f"{t.op.name} is not 1 - x")
    return t.op.inputs[1]


def _adam(update: Update, by_op) -> Translation:
    """TF1 AdamOptimizer._apply_sparse_shared:
         lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)   (a RealDiv)
         m += (1 - beta1) * g  and  v += (1 - beta2) * g * g      (two scatter-adds)
         var -= lr_t * m / (sqrt(v) + epsilon)                    (an AddV2 of epsilon)"""
    try:
        lr_t = next(op for op in update.ops if op.type == "RealDiv"
                    and op.inputs[0].op.type == "Mul" and any(
                        t.op.type == "Sqrt" for t in op.inputs[0].op.inputs))
        sqrt, lr = _input_of_type(lr_t.inputs[0].op, "Sqrt")
        beta2_power = _one_minus(sqrt.op.inputs[0])
        beta1_power = _one_minus(lr_t.inputs[1])
        scatters = sorted((op for op in update.writes if op.type in
                           ("ResourceScatterAdd", "ScatterAdd")), key=lambda op: op.name)
        m_scatter, v_scatter = scatters
        beta1 = _one_minus(_input_of_type(m_scatter.inputs[2].op, "Sub")[0])
        beta2 = _one_minus(_input_of_type(v_scatter.inputs[2].op, "Sub")[0])
        add = next(op for op in update.ops if op.type in ("AddV2", "Add")
                   and any(t.op.type == "Sqrt" for t in op.inputs))
        epsilon = _input_of_type(add, "Sqrt")[1]
        slots = [by_op[m_scatter.inputs[0].op], by_op[v_scatter.inputs[0].op]]
    except (StopIteration, ValueError, KeyError) as e:
        raise Untranslatable(f"Adam update not in the tf.compat.v1 form ({e!r})") from None
    return Translation("adam", [lr, beta1, beta2, epsilon, beta1_power, beta2_power], slots)


def _concat(tensors: List[tf.Tensor]) -> tf.Tensor:
    return tensors[0] if len(tensors) == 1 else tf.concat(tensors, 0)


def check(conversion: Conversion, context: Context) -> Optional[Translation]:
    """Translates the update of a variable the graph trains; Adam is an
    approximation (lazy)."""
    if not conversion.training:
        return None
    translation = translate(conversion.update)
    if translation.kind == "adam":
        if context.exact:
            raise Untranslatable("its Adam update would become lazy Adam on a table "
                                 "(exact=True keeps it dense)")
        context.approximate(conversion, LAZY_ADAM)
    if translation.dense and not conversion.penalties and _moves_unread_rows(
            translation, conversion.initializer):
        # A dense gradient (e.g. Horovod's sparse_as_dense) is zero for rows
        # the batch did not read, but the dense update still moves them.
        if context.exact:
            raise Untranslatable(f"its dense {translation.kind} update moves rows the batch did "
                                 "not read (exact=True keeps it dense)")
        context.approximate(conversion, UNREAD_ROWS.format(translation.kind))
    translation.layout = translation.slot_layout()  # refuses slots a table cannot start as
    context.build(SlotLayout(translation.layout), conversion)
    return translation


def _moves_unread_rows(translation: Translation, initializer) -> bool:
    """Whether a step with a zero gradient still changes a row: momentum and
    RMSProp carry their slots on; FTRL recomputes a row from its linear slot
    (zero until the row is read, so a row that did not start at zero becomes
    zero), and with an L2 shrinkage shrinks it."""
    if translation.kind in ("momentum", "rmsprop"):
        return True
    if translation.kind != "ftrl":
        return False
    starts_at_zero = initializer.kind == "zeros" or (initializer.kind == "constant" and
                                                    initializer.a == 0.0)
    return not starts_at_zero or (isinstance(translation.hparams[3], tf.Tensor) and
                                  folding.scalar(translation.hparams[3]) != 0.0)


def rewrite(rw, conversions, context: Context) -> None:
    hparams = {}  # one stacked vector per distinct set of hyper-parameters
    for c in conversions:
        if c.training:
            context.build(Apply(_rewrite_one(
                rw, context.built(Lookups, c).table, c.update, context.built(Translation, c),
                (context.built(PenaltyGrads, c) or PenaltyGrads([])).parts, hparams)), c)


def _as_rows(t: tf.Tensor, shape: List[int], dtype: tf.DType) -> tf.Tensor:
    """t cast to dtype and reshaped to shape, building only the ops needed."""
    if t.dtype != dtype:
        t = tf.cast(t, dtype)
    if t.shape.rank != len(shape) or any(
            want != -1 and have != want for have, want in zip(t.shape.as_list(), shape)):
        t = tf.reshape(t, shape)
    return t


def _hparam_vector(translation: Translation, cache: dict) -> tf.Tensor:
    """The apply's float32 hyper-parameter vector, shared by every variable
    whose optimizer passes the same tensors and constants (one per optimizer
    in a model, not one per variable: a 200-feature model builds 200 fewer
    stacks)."""
    key = tuple(("constant", h) if isinstance(h, float) else ("tensor", h.name)
                for h in translation.hparams)
    if key not in cache:
        with tf.compat.v1.name_scope("graphmod/hparams"):
            cache[key] = tf.stack([tf.constant(h, tf.float32) if isinstance(h, float) else
                                   h if h.dtype == tf.float32 else tf.cast(h, tf.float32)
                                   for h in translation.hparams])
    return cache[key]


def _as_combined(grads: tf.Tensor, combined: Combined) -> tf.Tensor:
    """This rank's gradient rows as Horovod's combination counts them (times
    1/size for an average) and as the model then scaled the combination, so
    that their sum over ranks at each key's owner (rewrite_rules.shard_exchange)
    is the gradient the dense variable's update consumed."""
    factor = combined.collective.factor if combined.collective.runs else 1.0
    if factor != 1.0:
        grads = grads * factor
    for scalar, divides in combined.scales:
        scalar = tf.cast(scalar, tf.float32)
        grads = grads / scalar if divides else grads * scalar
    return grads


def _rewrite_one(rw, table, update: Update, translation: Translation,
                 penalty_parts: List[Tuple[tf.Tensor, tf.Tensor]], hparams: dict) -> tf.Operation:
    """The table apply of the gradient the update consumes (and of the rows'
    L2 penalty, when l2_penalties built one); swapped in for the update."""
    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/{table.name}/apply"):
        parts = list(update.local_gradients) + penalty_parts
        keys = _concat([_as_rows(i, [-1], tf.int64) for _, i in parts])
        grads = _concat([_as_rows(v, [-1, table.dim], tf.float32) for v, _ in parts])
        if update.combined is not None:
            grads = _as_combined(grads, update.combined)
        apply = ops.graphmod_table_apply(table.handle, keys, grads,
                                         _hparam_vector(translation, hparams),
                                         optimizer=translation.kind, by_address=False,
                                         nesterov=translation.nesterov)
        rw.replace_control_input(update.update_op, apply)
    return apply
