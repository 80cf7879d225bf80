"""Translates TensorFlow initializers into a table's row initializer.

A table initializes each new row from (key, seed) alone, with one of five
distributions; this module maps what users (and the variables the hook
converts) already use onto them.

>>> to_table_initializer(tf.compat.v1.truncated_normal_initializer(stddev=0.01), "t", dim=8)
TableInitializer(kind='truncated_normal', a=0.0, b=0.01)
"""
import dataclasses
import functools
import math
import types
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

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


# --- the initial row of (key, seed): native/initializer.cc's formula, once ---
# Written against a tiny ops namespace, so one code runs on numpy and as
# stock TF ops (a portable SavedModel's unseen keys), bit for bit the native
# InitialValues (tests/test_initializer_formula.py). The C++ draws from a
# counter-based stream: base = Mix(key ^ Mix(seed ^ S)), draw c = Mix(base +
# GOLDEN * c), Mix being murmur3's fmix64 (native/bits.h). In int64 only
# (older servers lack uint64 kernels): Mul and Add wrap mod 2^64 like uint64,
# and a logical shift is an arithmetic one masked.
NUMPY_OPS = types.SimpleNamespace(
    const=np.asarray, cast=lambda x, dtype: np.asarray(x).astype(dtype), xor=np.bitwise_xor,
    and_=np.bitwise_and, shift=np.right_shift, gather=np.take, where=np.where, equal=np.equal,
    log=np.log, sqrt=np.sqrt, stack=np.stack, reshape=np.reshape, size=len,
    fill=lambda n, dim, value: np.full((n, dim), value, np.float32))
TF_OPS = types.SimpleNamespace(
    const=tf.constant, cast=tf.cast, xor=tf.bitwise.bitwise_xor, and_=tf.bitwise.bitwise_and,
    shift=tf.bitwise.right_shift, gather=tf.gather, where=tf.where, equal=tf.equal,
    log=tf.math.log, sqrt=tf.sqrt, stack=tf.stack, reshape=tf.reshape,
    size=lambda keys: tf.shape(keys)[0],
    fill=lambda n, dim, value: tf.fill(tf.stack([n, dim]), value))
_C1, _C2 = 0xff51afd7ed558ccd, 0xc4ceb9fe1a85ec53
_GOLDEN, _SEED_MIX = 0x9e3779b97f4a7c15, 0x5851f42d4c957f2d
_BINS = 4096
# Acklam's inverse normal CDF coefficients (initializer.cc NormalQuantile).
_A = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00]
_B = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01, 1.0]
_C = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00]
_D = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00, 1.0]
_TAIL = 0.02425


def initial_rows(keys, kind: str, seed: int, dim: int, ab, ops=TF_OPS):
    """keys int64 [n] -> float32 [n, dim], a table's initial rows, in numpy
    (ops=NUMPY_OPS) or stock TF ops. ab: float32 [3], (a, b, b - a); in TF,
    read from a variable, so Grappler cannot reassociate the float arithmetic."""
    if kind not in KINDS:
        raise ValueError(f"unknown initializer kind {kind!r}, expected one of {KINDS}")
    n = ops.size(keys)
    if kind in ("zeros", "constant"):
        return ops.fill(n, dim, ab[0] if kind == "constant" else np.float32(0))
    seed_mix = _mix(np.asarray([_s64(seed ^ _SEED_MIX)], np.int64), NUMPY_OPS)  # a constant
    base = _mix(ops.xor(keys, ops.const(seed_mix, np.int64)), ops)
    draws = dim if kind == "uniform" else (dim + 1) // 2
    steps = ops.const([_s64(_GOLDEN * c) for c in range(1, draws + 1)], np.int64)
    x = _mix(base[:, None] + steps[None, :], ops)  # [n, draws]
    if kind == "uniform":  # a + (b - a) * Uniform01: 24 bits
        u = (ops.cast(_srl(x, 40, ops), np.float32) + np.float32(0.5)) \
            * np.float32(1.0 / 16777216.0)
        return ab[0] + ab[2] * u
    # Two 32-bit draws per 64-bit one, the high half first; 12 bits pick the
    # quantile bin, 20 place the value inside it.
    r = ops.reshape(ops.stack([_srl(x, 32, ops), ops.and_(x, 0xFFFFFFFF)], 2),
                    [-1, 2 * draws])[:, :dim]
    bins = _srl(r, 20, ops)
    frac = (ops.cast(ops.and_(r, 0xFFFFF), np.float32) + np.float32(0.5)) \
        * np.float32(1.0 / 1048576.0)
    table = _quantile_table(kind == "truncated_normal")
    lo, hi = ops.gather(table, bins), ops.gather(table, bins + 1)
    z = lo + frac * (hi - lo)
    if kind == "normal":  # its outermost bins reach to infinity: invert exactly
        p = (ops.cast(bins, np.float64) + ops.cast(frac, np.float64)) / _BINS
        z = ops.where(ops.equal(bins, 0) | ops.equal(bins, _BINS - 1),
                      ops.cast(_quantile(p, ops), np.float32), z)
    return ab[0] + ab[1] * z


def _s64(u: int) -> int:
    """uint64 bits as the int64 of the same bits."""
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >> 63 else u


def _srl(x, n: int, ops):
    return ops.and_(ops.shift(x, n), (1 << (64 - n)) - 1)


def _mix(k, ops):
    for c in (_C1, _C2):
        k = ops.xor(k, _srl(k, 33, ops)) * ops.const(_s64(c), np.int64)
    return ops.xor(k, _srl(k, 33, ops))


def _horner(coefficients, x):
    out = coefficients[0]
    for c in coefficients[1:]:
        out = out * x + c
    return out


def _quantile(p, ops):
    """NormalQuantile on float64 values, in the C++'s order of operations."""
    lower = p < _TAIL
    q = ops.sqrt(-2.0 * ops.log(ops.where(lower, p, 1.0 - p)))
    tail = _horner(_C, q) / _horner(_D, q)
    c = p - 0.5
    return ops.where(lower | (p > 1.0 - _TAIL), ops.where(lower, tail, -tail),
                     _horner(_A, c * c) * c / _horner(_B, c * c))


@functools.lru_cache(maxsize=2)
def _quantile_table(truncated: bool) -> np.ndarray:
    """initializer.cc MakeQuantileTable: 4097 float32 quantiles (16 KB)."""
    low = 0.022750131948179195  # Phi(-2)
    u = np.arange(_BINS + 1) / _BINS
    if truncated:
        return _quantile(low + (1.0 - 2.0 * low) * u, NUMPY_OPS).astype(np.float32)
    t = np.zeros(_BINS + 1, np.float32)  # the normal's outer bins are inverted exactly
    t[1:-1] = _quantile(u[1:-1], NUMPY_OPS)
    return t
