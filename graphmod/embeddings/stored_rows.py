"""Rows as a table stores them (create_table's storage_dtype;
native/row_codec.h), read back as float32.

A checkpoint holds a table's `-values` and `-slots` in the table's form,
told by the entry's dtype: float32, float16 or bfloat16 rows of dim values,
or int8 rows as uint8 rows of dim + 8 bytes: the row's scale and bias
(float32, little-endian) then its dim codes, a value being
code * scale + bias.

>>> rows = decode(reader.get_tensor("item-values"))     # numpy, float32
>>> rows = decode_tf(tf.gather(stored, index))          # in a graph, stock ops
"""
import numpy as np
import tensorflow as tf

INT8_PARAMS = 8  # bytes of an int8 row's scale and bias, ahead of its codes
_FORMS = {tf.float32: "float32", tf.float16: "float16", tf.bfloat16: "bfloat16",
          tf.uint8: "int8"}


def form_of(dtype) -> str:
    """The storage_dtype rows of this tensor dtype are in."""
    dtype = tf.as_dtype(dtype)
    if dtype not in _FORMS:
        raise ValueError(f"graphmod: rows stored as {dtype.name} are in no table form "
                         f"(float32, float16, bfloat16, or uint8 for int8 rows)")
    return _FORMS[dtype]


def dtype_of(form: str) -> tf.DType:
    """The tensor dtype rows stored as `form` are held in."""
    return next(dtype for dtype, f in _FORMS.items() if f == form)


def dim_of(dtype, width: int) -> int:
    """A row's dim, from its stored dtype and last dimension."""
    return int(width) - INT8_PARAMS if form_of(dtype) == "int8" else int(width)


def decode(rows: np.ndarray) -> np.ndarray:
    """Stored rows (any leading shape) as float32, as the table reads them."""
    rows = np.asarray(rows)
    if form_of(rows.dtype) != "int8":
        return rows.astype(np.float32)
    params = np.ascontiguousarray(rows[..., :INT8_PARAMS]).view("<f4")
    codes = rows[..., INT8_PARAMS:].astype(np.float32)
    # A product, then a sum, each rounded to float32: the table's bits.
    return codes * params[..., :1] + params[..., 1:2]


def decode_tf(rows: tf.Tensor) -> tf.Tensor:
    """decode in stock TensorFlow ops (a portable SavedModel serves with them)."""
    if form_of(rows.dtype) != "int8":
        return tf.cast(rows, tf.float32)
    params = tf.bitcast(tf.reshape(rows[..., :INT8_PARAMS],
                                   tf.concat([tf.shape(rows)[:-1], [2, 4]], 0)), tf.float32)
    codes = tf.cast(rows[..., INT8_PARAMS:], tf.float32)
    return codes * params[..., :1] + params[..., 1:2]


def forms(values: str, slots) -> tuple:
    """(values' form, slots' form) of a table's storage_dtype and
    slot_storage_dtype (None: as the values)."""
    return values, slots or values


def approximation(values: str, slots: str) -> str:
    """What the rewrite report states for a table storing rows smaller
    (graphmod.verify tells it by this text), or "" for float32 rows."""
    if values == slots == "float32":
        return ""
    stored = (f"its rows are stored as {values}" if values == slots else
              f"its rows are stored as {values} and its optimizer slots as {slots}")
    return (f"{stored} (storage_dtype): lookups read the stored rows, and each update "
            "computes in float32 then rounds the row back to nearest"
            + (" (int8: one of 256 levels between the row's minimum and maximum)"
               if "int8" in (values, slots) else "")
            + ", so rows drift from the dense variable's by rounding")


def row_bytes(form: str, dim: int) -> int:
    """Bytes of one row of dim values stored as `form`."""
    return {"float32": 4 * dim, "float16": 2 * dim, "bfloat16": 2 * dim,
            "int8": INT8_PARAMS + dim}[form]
