"""graphmod: dynamic hash-table embeddings for TensorFlow Estimator models.

>>> import graphmod
>>> opt = graphmod.optimizers.Adagrad(0.05)
>>> table = graphmod.create_table("user", dim=16, optimizer=opt)
>>> emb = graphmod.sparse_lookup(table, features["user_id"], is_training=True)

The library's core (the modules of this package) never imports the hooks
(graphmod.hooks, the top-level hooks/ folder) or the rewrite rules
(graphmod.rewrite_rules, rewrite_rules/), which import the core: the hooks'
public names resolve here on first use, and the rules' registry is handed to
the rewrite pipeline by its callers (the hook, export_saved_model below and
the `graphmod` command, graphmod.cli).
"""
import importlib

from graphmod import optimizers
from graphmod.checkpoint import export as _export
from graphmod.checkpoint.saver import TableSaver
from graphmod.checkpoint.serving_versions import ServingExport
from graphmod.checkpoint.warm_start import WarmStartSettings
from graphmod.embeddings.features import FeatureSpec, use_feature_specs
from graphmod.embeddings.initializers import TableInitializer
from graphmod.embeddings.lookup import fused_lookup, sparse_lookup
from graphmod.embeddings.table import Table, create_table
from graphmod.rewrite.report import RewriteReport
from graphmod.settings import TableSettings
from graphmod.state import Lookup, tables, training_lookups

# Names resolved on first use: the hooks, and verify, which runs the hook.
_LAZY = {"GraphModifierHook": "graphmod.hooks.graph_modifier",
         "EvictHook": "graphmod.hooks.evict",
         "IncrementalSaveHook": "graphmod.hooks.incremental_save",
         "verify": "graphmod.verification",
         "VerifyResult": "graphmod.verification"}


def export_saved_model(estimator, serving_input_receiver_fn, export_dir_base: str,
                       portable: bool = False, **kwargs) -> bytes:
    """A SavedModel of an Estimator trained with GraphModifierHook: its serving
    graph rewritten by graphmod's rules, restoring the tables (see
    graphmod.checkpoint.export). Extra keyword arguments go to
    Estimator.export_saved_model. Returns its path. portable=True writes one
    that serves on stock TensorFlow, without graphmod (each table a stock
    HashTableV2 plus its rows; see graphmod.checkpoint.portable).

    >>> path = graphmod.export_saved_model(estimator, serving_input_receiver_fn, "/tmp/export")
    """
    from graphmod.rewrite_rules import RULES  # pylint: disable=import-outside-toplevel
    return _export.export_saved_model(estimator, serving_input_receiver_fn, export_dir_base,
                                      rules=RULES, portable=portable, **kwargs)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphmod' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = ["GraphModifierHook", "EvictHook", "IncrementalSaveHook", "export_saved_model",
           "verify", "VerifyResult",
           "ServingExport", "RewriteReport",
           "TableSaver", "TableSettings", "WarmStartSettings", "FeatureSpec", "use_feature_specs",
           "create_table", "sparse_lookup", "fused_lookup", "optimizers", "Table", "Lookup",
           "TableInitializer", "tables", "training_lookups"]
