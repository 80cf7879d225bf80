"""Translates TensorFlow initializers into a table's row initializer.

A table initializes each new row from (key, seed) alone, with one of five
distributions; this module maps what users (and the variables the hook
converts) already use onto them.

>>> to_table_initializer(tf.compat.v1.truncated_normal_initializer(stddev=0.01), "t", dim=8)
TableInitializer(kind='truncated_normal', a=0.0, b=0.01)
"""
import dataclasses
import math
from typing import Any, Optional, Sequence

from graphmod import folding
from graphmod.rewrite.index import strip_identity

KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class TableInitializer:
    """kind with a = constant | uniform low | mean, b = uniform high | stddev."""
    kind: str
    a: float = 0.0
    b: float = 0.0


def default_initializer(dim: int) -> TableInitializer:
    # What tf.feature_column.embedding_column uses: truncated normal, 1/sqrt(dim).
    return TableInitializer("truncated_normal", 0.0, 1.0 / math.sqrt(dim))


def to_table_initializer(init: Any, table: str, dim: int,
                         shape: Optional[Sequence[int]] = None) -> TableInitializer:
    """Maps None, a number, a TableInitializer or a tf/keras initializer object.

    shape ([rows, dim]) is needed only by fan-based initializers (Glorot, He,
    VarianceScaling), which the hook inherits from the variable it converts.
    """
    if init is None:
        return default_initializer(dim)
    if isinstance(init, TableInitializer):
        if init.kind not in KINDS:
            raise ValueError(f"graphmod table '{table}': unknown initializer kind '{init.kind}', "
                             f"expected one of {KINDS}")
        return init
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return TableInitializer("constant", float(init))
    if not hasattr(init, "get_config"):
        raise TypeError(f"graphmod table '{table}': cannot use {init!r} as an initializer; "
                        "pass a number, a TableInitializer or a tf initializer object")
    kind = type(init).__name__
    cfg = init.get_config()
    if kind in ("Zeros", "zeros_initializer"):
        return TableInitializer("zeros")
    if kind in ("Ones", "ones_initializer"):
        return TableInitializer("constant", 1.0)
    if kind == "Constant":
        value = cfg.get("value")
        try:
            return TableInitializer("constant", float(value))
        except (TypeError, ValueError):
            raise ValueError(f"graphmod table '{table}': a Constant initializer must hold one "
                             f"number, got {value!r}") from None
    if kind == "RandomNormal":
        return TableInitializer("normal", float(cfg["mean"]), float(cfg["stddev"]))
    if kind == "TruncatedNormal":
        return TableInitializer("truncated_normal", float(cfg["mean"]), float(cfg["stddev"]))
    if kind == "RandomUniform":
        return TableInitializer("uniform", float(cfg["minval"]), float(cfg["maxval"]))
    if {"scale", "mode", "distribution"} <= set(cfg):
        return _variance_scaling(cfg, table, shape)
    raise TypeError(f"graphmod table '{table}': initializer {kind} has no table equivalent; "
                    "use zeros, constant, uniform, (truncated) normal or a VarianceScaling family one")


def _variance_scaling(cfg: dict, table: str, shape: Optional[Sequence[int]]) -> TableInitializer:
    if shape is None or len(shape) != 2:
        raise ValueError(f"graphmod table '{table}': {cfg['distribution']} variance scaling needs "
                         "the variable's [rows, dim] shape to compute its fans")
    fan_in, fan_out = float(shape[0]), float(shape[1])
    fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[cfg["mode"]]
    scale = float(cfg["scale"]) / max(1.0, fan)
    dist = cfg["distribution"]
    if dist == "uniform":
        limit = math.sqrt(3.0 * scale)
        return TableInitializer("uniform", -limit, limit)
    if dist in ("normal", "untruncated_normal"):
        return TableInitializer("normal", 0.0, math.sqrt(scale))
    # TF's constant: the stddev of a unit normal truncated to [-2, 2].
    return TableInitializer("truncated_normal", 0.0, math.sqrt(scale) / 0.87962566103423978)


class Unreadable(ValueError):
    """A variable's initial value has no table equivalent."""


# Random ops initializers build (tf.compat.v1 stateful, Keras stateless).
_RANDOM_KINDS = {
    "TruncatedNormal": "truncated_normal", "StatelessTruncatedNormal": "truncated_normal",
    "StatelessTruncatedNormalV2": "truncated_normal",
    "RandomStandardNormal": "normal", "StatelessRandomNormal": "normal",
    "StatelessRandomNormalV2": "normal",
    "RandomUniform": "uniform", "StatelessRandomUniform": "uniform",
    "StatelessRandomUniformV2": "uniform",
}


def from_variable(variable) -> TableInitializer:
    """The initializer a variable's initial-value graph computes, as a TableInitializer.

    Recognises what tf and Keras initializers build: Add(Mul(<random op>,
    scale), shift) over a truncated normal, normal or uniform op, stateful or
    stateless (Glorot and the other fan-based initializers arrive here already
    scaled), and one constant filling the variable. Raises Unreadable for
    anything else (a matrix of different values, e.g. pretrained rows): a
    table must never start from another distribution than the variable.
    """
    t = strip_identity(variable.initial_value)
    v = folding.scalar(t)
    if v is not None:
        return TableInitializer("zeros") if v == 0 else TableInitializer("constant", v)
    if folding.fold(t) is not None:
        raise Unreadable("its initial value is a matrix of different values (e.g. pretrained "
                         "rows), which a table cannot start from")
    shift, scale = 0.0, 1.0
    if t.op.type in ("Add", "AddV2"):
        shift, t = _constant_and_other(t.op)
    if t is not None and t.op.type == "Mul":
        scale, t = _constant_and_other(t.op)
    kind = _RANDOM_KINDS.get(t.op.type if t is not None else "")
    if kind is None or shift is None or scale is None:
        raise Unreadable(f"its initializer ({t.op.type if t is not None else '?'} in "
                         f"{variable.initial_value.op.name}) has no table equivalent")
    if kind == "uniform":
        return TableInitializer("uniform", shift, shift + scale)
    return TableInitializer(kind, shift, scale)


def _constant_and_other(op):
    """(constant scalar input, other input) of a binary op, or (None, None)."""
    for c, other in ((op.inputs[0], op.inputs[1]), (op.inputs[1], op.inputs[0])):
        value = folding.fold(c)
        if value is not None and value.size == 1:
            return float(value.reshape(-1)[0]), other
    return None, None
