"""Rule: an optimizer's update of a converted variable becomes the table's apply.

Matches the per-variable update that tf.compat.v1.train optimizers (and the
Keras legacy Adagrad, Ftrl and plain SGD) build under '<optimizer>/update_<var>':
  - fused sparse ops: (Resource)SparseApply{Adagrad,AdagradV2,Ftrl,FtrlV2,
    Momentum,RMSProp}: hyper-parameters are the op's own inputs;
  - GradientDescent: a scatter of -lr * grad;
  - Adam: TF1's composite sparse update (m, v scatters and the bias-corrected
    step), whose learning rate, betas, epsilon and beta powers are read off
    its ops, so the table shares the dense variables' bias correction.
Builds one by-address table apply per variable from the gradients of its
lookups, and makes whatever waited for the old update wait for the apply.
Refuses (the variable then stays dense): centered RMSProp, Keras momentum and
Adam forms, and anything else it does not recognise.
"""
from typing import List, Optional, Tuple

import tensorflow as tf

from graphmod import folding, optimizers
from graphmod._ops import ops
from graphmod.conversion import Conversion, Update

NAME = "optimizer_updates"


class Untranslatable(Exception):
    pass


# op type -> (table optimizer kind, names of our hparams in the op's input args
# (a float stands for a constant), names of the slot args in our slot order)
_FUSED = {
    "SparseApplyAdagrad": ("adagrad", ["lr", 0.0], ["accum"]),
    "SparseApplyAdagradV2": ("adagrad", ["lr", "epsilon"], ["accum"]),
    "SparseApplyFtrl": ("ftrl", ["lr", "l1", "l2", 0.0, "lr_power"], ["accum", "linear"]),
    "SparseApplyFtrlV2": ("ftrl", ["lr", "l1", "l2", "l2_shrinkage", "lr_power"],
                          ["accum", "linear"]),
    "SparseApplyMomentum": ("momentum", ["lr", "momentum"], ["accum"]),
    "SparseApplyRMSProp": ("rmsprop", ["lr", "rho", "momentum", "epsilon"], ["ms", "mom"]),
}


class Translation:
    """What the table's apply needs: kind, hyper-parameter tensors, slot layout."""

    def __init__(self, kind: str, hparams: List[tf.Tensor], slot_vars: List[tf.Variable],
                 nesterov: bool = False):
        self.kind = kind
        self.hparams = hparams
        self.slot_vars = slot_vars
        self.nesterov = nesterov

    def slot_layout(self) -> optimizers.SparseOptimizer:
        """A graphmod optimizer whose slot rows start as the variable's slots did."""
        init = tuple(_constant(s.initial_value, s.op.name) for s in self.slot_vars)
        opt = {"sgd": optimizers.SGD, "adagrad": optimizers.Adagrad,
               "momentum": optimizers.Momentum, "adam": optimizers.Adam,
               "ftrl": optimizers.Ftrl, "rmsprop": optimizers.RMSProp}[self.kind](0.0)
        if len(init) != len(opt.slot_init):
            raise Untranslatable(f"found {len(init)} slot variables, {self.kind} keeps "
                                 f"{len(opt.slot_init)}")
        opt.slot_init = init
        return opt


def _constant(t: tf.Tensor, what: str) -> float:
    value = folding.scalar(t)
    if value is None:
        raise Untranslatable(f"slot {what} does not start from one constant value")
    return value


def _variables_by_handle(graph: tf.Graph):
    return {v.op: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}


def translate(update: Update, variables_by_op: Optional[dict] = None) -> Translation:
    """Raises Untranslatable with the reason when the update is not understood.
    variables_by_op ({variable op: variable}) saves rebuilding it per update."""
    by_op = variables_by_op if variables_by_op is not None else (
        _variables_by_handle(update.ops[0].graph) if update.ops else {})
    for op in update.writes:
        base = op.type[len("Resource"):] if op.type.startswith("Resource") else op.type
        if base == "SparseApplyCenteredRMSProp":
            raise Untranslatable("centered RMSProp has no table equivalent")
        if base == "SparseApplyKerasMomentum":
            raise Untranslatable("Keras momentum has no table equivalent (use tf.compat.v1 "
                                 "MomentumOptimizer)")
        if base in _FUSED:
            kind, names, slot_args = _FUSED[base]
            args = {a.name: op.inputs[i] for i, a in enumerate(op.op_def.input_arg)}
            hparams = [tf.constant(n, tf.float32) if isinstance(n, float) else args[n]
                       for n in names]
            slots = [by_op[args[a].op] for a in slot_args]
            nesterov = bool(op.get_attr("use_nesterov")) if "use_nesterov" in op.node_def.attr \
                else False
            return Translation(kind, hparams, slots, nesterov)
    types = {op.type for op in update.ops}
    if {"Unique", "UnsortedSegmentSum"} <= types and "Sqrt" in types:
        return _adam(update, by_op)
    scatters = [op for op in update.writes if op.type in ("ResourceScatterAdd", "ScatterSub")]
    if len(update.writes) == 1 and scatters:
        return Translation("sgd", [_sgd_lr(scatters[0])], [])
    raise Untranslatable("unrecognised update ops (" + ", ".join(sorted(types))[:200] + ")")


def _is_gradient(t: tf.Tensor) -> bool:
    return "gradients" in t.name.split("/")[0]


def _sgd_lr(scatter: tf.Operation) -> tf.Tensor:
    value = scatter.inputs[2]
    if value.op.type == "Neg":  # Keras: -(grad * lr)
        value = value.op.inputs[0]
    if value.op.type != "Mul":
        raise Untranslatable(f"gradient-descent scatter {scatter.name} is not lr * grad")
    others = [t for t in value.op.inputs if t.op.type != "Neg" and not _is_gradient(t)]
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


def _concat(tensors: List[tf.Tensor], dim: Optional[int] = None) -> tf.Tensor:
    """One tensor of all rows: flattened to [N] (or [N, dim]) and concatenated,
    unless there is just one (the apply takes any ids shape)."""
    if len(tensors) == 1:
        return tensors[0]
    shape = [-1] if dim is None else [-1, dim]
    return tf.concat([tf.reshape(t, shape) for t in tensors], 0)


def rewrite(rw, conversion: Conversion, translation: Translation) -> Optional[tf.Operation]:
    """Builds the table apply for conversion's recorded lookups; swaps it in."""
    if not conversion.lookups:
        return None
    table = conversion.table
    with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/{table.name}/apply"):
        handles = _concat([h for h, _ in conversion.lookups])
        grads = _concat([g for _, g in conversion.lookups], table.dim)
        hparams = tf.stack([h if h.dtype == tf.float32 else tf.cast(h, tf.float32)
                            for h in translation.hparams])
        apply = ops.graphmod_table_apply(table.handle, handles, grads, hparams,
                                         optimizer=translation.kind, by_address=True,
                                         nesterov=translation.nesterov)
        rw.replace_control_input(conversion.update.update_op, apply)
    conversion.apply = apply
    return apply
