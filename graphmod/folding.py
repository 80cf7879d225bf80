"""The constant value of the small arithmetic graphs initializers build.

tensor_util.constant_value knows Const and shape ops but not arithmetic;
initializers compute e.g. RandomUniform * (maxval - minval) + minval and
slot initializers Fill(shape, value) or ones * value.
"""
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

_BINARY = {"Mul": np.multiply, "Sub": np.subtract, "Add": np.add, "AddV2": np.add,
           "RealDiv": np.divide}


def fold(t: tf.Tensor) -> Optional[np.ndarray]:
    """t's value if it is computed from constants only, else None."""
    op = t.op
    if op.type in ("Identity", "Cast"):
        value = fold(op.inputs[0])
        return None if value is None else value.astype(t.dtype.as_numpy_dtype)
    if op.type == "Fill":
        return fold(op.inputs[1])  # the shape may be computed; one value fills it
    if op.type == "Neg":
        value = fold(op.inputs[0])
        return None if value is None else -value
    if op.type in _BINARY:
        a, b = fold(op.inputs[0]), fold(op.inputs[1])
        return None if a is None or b is None else _BINARY[op.type](a, b)
    value = tensor_util.constant_value(t)
    return None if value is None else np.asarray(value)


def scalar(t: tf.Tensor) -> Optional[float]:
    """The one value a constant-valued t holds everywhere, else None."""
    value = fold(t)
    if value is None or value.size == 0 or not (value == value.flat[0]).all():
        return None
    return float(value.flat[0])
