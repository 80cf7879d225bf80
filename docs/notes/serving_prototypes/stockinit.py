"""Stock-TF reproduction of native/initializer.cc InitialValues (int64-only ops)."""
import math
import numpy as np
import tensorflow as tf

M64 = (1 << 64) - 1
C1, C2 = 0xff51afd7ed558ccd, 0xc4ceb9fe1a85ec53
GOLDEN, SEEDMIX = 0x9e3779b97f4a7c15, 0x5851f42d4c957f2d
BINS = 4096

def s64(u):  # uint64 python int -> int64 python int (two's complement)
    u &= M64
    return u - (1 << 64) if u >> 63 else u

def mix_py(k):
    k &= M64
    k ^= k >> 33; k = (k * C1) & M64; k ^= k >> 33; k = (k * C2) & M64; k ^= k >> 33
    return k

def _srl(x, n):  # logical right shift of int64 via arithmetic shift + mask
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(n, tf.int64)),
                                  tf.constant((1 << (64 - n)) - 1, tf.int64))

def mix_tf(k):  # k: int64 tensor holding uint64 bits; Mul/AddV2 on int64 wrap mod 2^64
    k = tf.bitwise.bitwise_xor(k, _srl(k, 33)); k = k * tf.constant(s64(C1), tf.int64)
    k = tf.bitwise.bitwise_xor(k, _srl(k, 33)); k = k * tf.constant(s64(C2), tf.int64)
    return tf.bitwise.bitwise_xor(k, _srl(k, 33))

def _acklam(p):  # numpy float64, same arithmetic order as initializer.cc
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00]
    b = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    kT = 0.02425
    if p < kT or p > 1.0 - kT:
        q = math.sqrt(-2.0 * math.log(p if p < kT else 1.0 - p))
        x = (((((c[0]*q + c[1])*q + c[2])*q + c[3])*q + c[4])*q + c[5]) / ((((d[0]*q + d[1])*q + d[2])*q + d[3])*q + 1.0)
        return x if p < kT else -x
    q = p - 0.5; r = q * q
    return (((((a[0]*r + a[1])*r + a[2])*r + a[3])*r + a[4])*r + a[5])*q / (((((b[0]*r + b[1])*r + b[2])*r + b[3])*r + b[4])*r + 1.0)

def quantile_table(truncated):
    kLow = 0.022750131948179195
    t = np.zeros(BINS + 1, np.float32)
    for i in range(BINS + 1):
        u = i / BINS
        if truncated: t[i] = np.float32(_acklam(kLow + (1.0 - 2.0 * kLow) * u))
        elif i not in (0, BINS): t[i] = np.float32(_acklam(u))
    return t

def _acklam_tf(p):  # float64 tensor, used only for the normal's two outer bins
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    lower = p < 0.02425
    q = tf.sqrt(-2.0 * tf.math.log(tf.where(lower, p, 1.0 - p)))
    x = (((((c[0]*q + c[1])*q + c[2])*q + c[3])*q + c[4])*q + c[5]) / ((((d[0]*q + d[1])*q + d[2])*q + d[3])*q + 1.0)
    return tf.where(lower, x, -x)

def initial_rows(keys, kind, a, b, seed, dim, ab=None):
    """keys: int64 [N] -> float32 [N, dim], as graphmod's InitialValues.
    ab: optional float32 [2] tensor (a variable read) holding (a, b), so grappler
    cannot drop a *1 or +0 and reassociate the adds."""
    a32, b32 = np.float32(a), np.float32(b)
    if ab is not None:
        a32, b32 = ab[0], ab[1]
    n = tf.shape(keys)[0]
    if kind == "zeros": return tf.zeros([n, dim], tf.float32)
    if kind == "constant": return tf.fill([n, dim], a32)
    base = mix_tf(tf.bitwise.bitwise_xor(keys, tf.constant(s64(mix_py((seed & M64) ^ SEEDMIX)), tf.int64)))
    draws = dim if kind == "uniform" else (dim + 1) // 2
    steps = tf.constant([s64(GOLDEN * c) for c in range(1, draws + 1)], tf.int64)
    x = mix_tf(base[:, None] + steps[None, :])           # [N, draws]
    if kind == "uniform":
        u = (tf.cast(_srl(x, 40), tf.float32) + 0.5) * np.float32(1.0 / 16777216.0)
        return a32 + (b32 - a32) * u if ab is None else a32 + ab[2] * u
    # two 32-bit draws per 64-bit value: high half for even j, low half for odd j
    r = tf.reshape(tf.stack([_srl(x, 32), tf.bitwise.bitwise_and(x, 0xFFFFFFFF)], 2), [n, 2 * draws])[:, :dim]
    bin_ = _srl(r, 20)
    frac = (tf.cast(tf.bitwise.bitwise_and(r, 0xFFFFF), tf.float32) + 0.5) * np.float32(1.0 / 1048576.0)
    table = tf.constant(quantile_table(kind == "truncated_normal"))
    lo, hi = tf.gather(table, bin_), tf.gather(table, bin_ + 1)
    z = lo + frac * (hi - lo)
    if kind == "normal":
        outer = tf.logical_or(tf.equal(bin_, 0), tf.equal(bin_, BINS - 1))
        p = (tf.cast(bin_, tf.float64) + tf.cast(frac, tf.float64)) / BINS
        z = tf.where(outer, tf.cast(_acklam_tf(p), tf.float32), z)
    return a32 + b32 * z
