"""Loads graphmod's native op library and exposes its ops.

The library is built by `pip install -e .` into graphmod/_graphmod_ops.so, or by
`bazel build //native:_graphmod_ops.so` (which Bazel's Python targets find at
native/ in their runfiles); GRAPHMOD_OPS_LIBRARY selects another build (CI runs
the op tests against both). A pip build records beside the library which
TensorFlow it was compiled against; loading it into another TensorFlow fails
here with that said, not later with an undefined symbol or a crash.
"""
import json
import os

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

LIBRARY_ENV = "GRAPHMOD_OPS_LIBRARY"


def _library_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get(LIBRARY_ENV) or os.path.join(here, "_graphmod_ops.so")
    bazel = os.path.join(os.path.dirname(here), "native", "_graphmod_ops.so")
    if not os.environ.get(LIBRARY_ENV) and not os.path.exists(path) and os.path.exists(bazel):
        path = bazel  # Bazel's runfiles: //native:_graphmod_ops.so beside the package
    if not os.path.exists(path):
        raise ImportError(
            f"graphmod's op library is missing at {path}: build it with `pip install -e .` "
            f"(or `make build`), or point {LIBRARY_ENV} at a Bazel build.")
    return path


def _check_built_against(path: str) -> None:
    record = os.path.splitext(path)[0] + ".json"
    if not os.path.exists(record):
        return  # Bazel builds against the TensorFlow it is configured with
    try:
        with open(record) as f:
            built = json.load(f)["tensorflow"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ImportError(f"graphmod: {record}, the record of which TensorFlow the op library "
                          f"was built against, is unreadable ({e!r}): reinstall graphmod") \
            from None
    if built != tf.__version__:
        raise ImportError(
            f"graphmod's op library {path} was built against TensorFlow {built}, but this "
            f"process runs TensorFlow {tf.__version__}: reinstall graphmod from source in "
            f"this environment (`pip install --force-reinstall --no-deps .` in a checkout), "
            f"so that it compiles against this TensorFlow.")


library_path = _library_path()
_check_built_against(library_path)
ops = tf.load_op_library(library_path)

# None of the table ops is differentiable: gradients flow to the looked-up rows
# and reach the table through the sparse optimizers.
for _op in ("GraphmodTable", "GraphmodTableFindOrInsert", "GraphmodTableFind",
            "GraphmodFusedFindOrInsert", "GraphmodFusedFind",
            "GraphmodTableExport", "GraphmodTableInfo", "GraphmodTableRemove",
            "GraphmodTableEvict", "GraphmodTableExportPending",
            # the exchange's plans (graphmod/embeddings/routing.py registers
            # the gradients of the rows' moves, Pack and Unpack)
            "GraphmodExchangeRoute", "GraphmodExchangeServe",
            "GraphmodExchangeScatterGradients", "GraphmodExchangeGatherGradients"):
    tf_ops.no_gradient(_op)
