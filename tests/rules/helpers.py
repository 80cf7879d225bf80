"""Helpers shared by the per-rule tests: a tiny embedding model, the planner's
conversions of a graph, and a run of a few rules exactly as the pipeline
runs them (every check of every rule, then every rewrite, through one
Rewriter), keeping the Context so a test can read each rule's match and
results.

A rule's test runs only the rules the rule under test reads results from
(its AFTER, and gather_to_lookup's use of optimizer_updates' match in a
training graph) plus the rule itself.
"""
import dataclasses
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

import graphmod
from graphmod.embeddings import features
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.plan import Conversion, RewriteSettings, plan
from graphmod.rewrite.report import RewriteReport
from graphmod.rewrite.rewriter import Rewriter
from graphmod.rewrite.rule import Context, Refused, registry
from graphmod.rewrite_rules import (collisionless_keys, gather_to_lookup, l2_penalties,
                                    optimizer_updates)

tf1 = tf.compat.v1

# The smallest registry a training graph's tables need: keys, lookups (whose
# table slots come from optimizer_updates' match) and the update, which runs
# AFTER l2_penalties. Outside training the first two suffice.
TRAINING_RULES = (collisionless_keys, gather_to_lookup, l2_penalties, optimizer_updates)
READING_RULES = (collisionless_keys, gather_to_lookup)


@dataclasses.dataclass
class Model:
    ids: tf.Tensor        # int64 placeholder [None]
    variable: tf.Variable
    rows: tf.Tensor       # the embedding_lookup's output
    loss: tf.Tensor
    train: Optional[tf.Operation]


def tiny_model(optimizer=None, rows: int = 8, dim: int = 2, init: float = 0.5,
               resource: bool = True, name: str = "emb", ids=None, initializer=None) -> Model:
    """emb [rows, dim] (constant init, or initializer), one embedding_lookup
    of ids, a loss whose gradient differs per looked-up position, and
    optimizer's step."""
    if ids is None:
        ids = tf1.placeholder(tf.int64, [None], name=f"{name}_ids")
    emb = tf1.get_variable(name, [rows, dim],
                           initializer=initializer or tf1.constant_initializer(init),
                           use_resource=resource)
    looked_up = tf.nn.embedding_lookup(emb, ids)
    # weight k+1 for the k-th value read: every row's gradient is its own
    weights = tf.reshape(tf.cast(tf.range(tf.size(ids) * dim) + 1, tf.float32), [-1, dim])
    loss = tf.reduce_sum(looked_up * weights)
    train = optimizer.minimize(loss) if optimizer is not None else None
    return Model(ids, emb, looked_up, loss, train)


def settings(min_rows: int = 4, **kw) -> RewriteSettings:
    return RewriteSettings(min_rows=min_rows, **kw)


def plan_graph(graph: tf.Graph, training: bool = True, replay=None, **kw):
    """(conversions, skipped) the planner decides for graph."""
    return plan(GraphIndex(graph), settings(**kw), training, replay)


def only_conversion(graph: tf.Graph, training: bool = True, **kw) -> Conversion:
    conversions, skipped = plan_graph(graph, training, **kw)
    assert len(conversions) == 1, (conversions, skipped)
    return conversions[0]


def context_for(graph: tf.Graph, training: bool = True, exact: bool = False,
                collision_free: bool = True, **fields) -> Context:
    """A Context as the pipeline makes it (collision_free is off under exact)."""
    return Context(graph, training, collision_free and not exact, exact, **fields)


@dataclasses.dataclass
class Applied:
    conversions: List[Conversion]   # accepted by every check
    refused: Dict[str, str]         # variable -> the check's reason
    skipped: list                   # the planner's (variable, reason)
    context: Context
    rw: Rewriter

    def built_by(self, rule: str) -> List[str]:
        """Types of the ops rule built (the Rewriter's record), sorted."""
        graph = self.rw.graph
        return sorted(graph.get_operation_by_name(name).type
                      for name, r in self.rw.record()["built"].items() if r == rule)

    def reported(self, field: str):
        """A field of the RewriteReport as the rules' results for the whole
        graph give it (its default when none does), as the pipeline reads them."""
        return getattr(RewriteReport("train", 0.0, {}, [], [], [], {},
                                     **self.context.report_fields()), field)

    def only(self) -> Conversion:
        assert len(self.conversions) == 1, (self.conversions, self.refused, self.skipped)
        return self.conversions[0]


def apply_rules(graph: tf.Graph, *modules, training: bool = True, replay=None,
                rewrite_settings: Optional[RewriteSettings] = None, **fields) -> Applied:
    """Plans graph and runs the rules of modules on it as the pipeline does
    (graphmod.rewrite.pipeline.rewrite): every check of every conversion,
    a refusal keeping the variable dense, then every rewrite in order.
    fields set Context fields (ranks, checkpoint_names, ...)."""
    s = rewrite_settings or settings()
    index = GraphIndex(graph)
    conversions, skipped = plan(index, s, training, replay)
    rw = Rewriter(graph, index)
    context = Context(graph, training, s.collision_free and not s.exact, s.exact,
                      current=rw.current, **fields)
    rules = registry(*modules)
    ready, refused = [], {}
    for c in conversions:
        try:
            for rule in rules:
                if rule.check is not None:
                    context.build(rule.check(c, context), c)
        except Refused as e:
            refused[c.name] = str(e)
            continue
        ready.append(c)
    for c in ready:
        features.set_policy(c.table_name, c.settings.policy, graph)
    for rule in rules:
        rule.rewrite(rw, ready, context)
    return Applied(ready, refused, skipped, context, rw)


def exported(sess: tf1.Session, table) -> Dict[int, np.ndarray]:
    """{key: row} the table holds."""
    out = sess.run(table.export())
    return {int(k): v for k, v in zip(out["keys"], out["values"])}


def exported_slots(sess: tf1.Session, table) -> Dict[int, np.ndarray]:
    out = sess.run(table.export())
    return {int(k): s for k, s in zip(out["keys"], out["slots"])}


def the_table(graph: tf.Graph):
    (table,) = graphmod.tables(graph)
    return table
