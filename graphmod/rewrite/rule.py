"""The interface every rewrite rule implements (one module per rule in
graphmod.rewrite_rules, listed in graphmod.rewrite_rules.RULES).

A rule module defines
  NAME: str, the name the Rewriter records its changes under;
  check(conversion, context) -> None: raises Refused(reason) when the rule
    cannot rewrite this variable faithfully (the variable then stays dense and
    the report says why); it may note what it matched on the conversion;
  rewrite(rw, conversions, context) -> None: makes its changes for all the
    conversions that every rule accepted, only through rw (a Rewriter).
The pipeline (graphmod.rewrite.pipeline) runs every check, then every rewrite
in RULES order.
"""
import dataclasses
from typing import Dict, List, Tuple

import tensorflow as tf


class Refused(Exception):
    """A rule cannot convert a variable faithfully; the message says why."""


@dataclasses.dataclass
class Context:
    """What rules share during one rewrite, and what they report back."""
    graph: tf.Graph
    training: bool
    collision_free: bool
    exact: bool
    # Horovod ranks the model runs on: above 1, tables are sharded across
    # them (rewrite_rules.shard_exchange).
    ranks: int = 1
    unsqueezed: List[str] = dataclasses.field(default_factory=list)
    squeezed_kept: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    # Names in model_dir's latest checkpoint (empty: none), which the Saver
    # will restore instead of running initializers.
    checkpoint_names: frozenset = frozenset()
    # The model's Scaffold brings its own Saver (Estimator.train): graphmod's
    # TableSaver would never be used.
    scaffold_saver: bool = False
    dense_bytes_freed: int = 0
    # single-table op type -> [ops fused, fused ops built] (fuse_table_ops)
    fused: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    # variables whose tables adopt their rows from a dense checkpoint (table_saver)
    adopted: List[str] = dataclasses.field(default_factory=list)
    counters: Dict[str, Dict[str, tf.Tensor]] = dataclasses.field(default_factory=dict)
