"""graphmod: dynamic hash-table embeddings for TensorFlow Estimator models.

>>> import graphmod
>>> opt = graphmod.optimizers.Adagrad(0.05)
>>> table = graphmod.create_table("user", dim=16, optimizer=opt)
>>> emb = graphmod.sparse_lookup(table, features["user_id"], is_training=True)
"""
import os as _os

# From a checkout, graphmod.hooks and graphmod.rewrite_rules live in the
# top-level hooks/ and rewrite_rules/ folders (an installed wheel puts them
# inside graphmod/): extending __path__ makes both import the same way.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "hooks")) and \
        _os.path.isfile(_os.path.join(_checkout, "hooks", "__init__.py")):
    __path__.append(_checkout)  # noqa: F821 (a package's __path__)

from graphmod import optimizers  # noqa: E402
from graphmod.initializers import TableInitializer  # noqa: E402
from graphmod.lookup import fused_lookup, sparse_lookup  # noqa: E402
from graphmod.table import Lookup, Table, create_table, tables, training_lookups  # noqa: E402

from graphmod.features import FeatureSpec, use_feature_specs  # noqa: E402
from graphmod.settings import TableSettings  # noqa: E402
from graphmod.export import export_saved_model  # noqa: E402
from graphmod.hooks.evict import EvictHook  # noqa: E402
from graphmod.hooks.incremental_save import IncrementalSaveHook  # noqa: E402
from graphmod.hooks.graph_modifier import GraphModifierHook
from graphmod.rewrite.report import RewriteReport  # noqa: E402
from graphmod.warm_start import WarmStartSettings  # noqa: E402

__version__ = "0.1.0"
__all__ = ["GraphModifierHook", "EvictHook", "IncrementalSaveHook", "export_saved_model", "RewriteReport",
           "TableSettings", "WarmStartSettings", "FeatureSpec", "use_feature_specs", "create_table",
           "sparse_lookup", "fused_lookup", "optimizers", "Table", "Lookup", "TableInitializer", "tables",
           "training_lookups"]
