"""Rule: an L2 penalty over a whole converted variable becomes the same
penalty over the distinct rows the step reads (what sparse systems do).

Matches tf.nn.l2_loss(variable) (DeepCTR's l2_reg_linear, hand-written
regularizers): the L2Loss of the variable's whole value and, in a training
graph, its gradient term x * g inside the variable's dense gradient, which
the planner split off. The forward penalty becomes l2_loss of the distinct
rows this step's lookups read, and their gradient rows * g joins the
gradient the table's apply takes. Rows no lookup reads get no penalty
gradient (TF's dense update shrinks every row each step): an approximation,
stated in the report; GraphModifierHook(exact=True) keeps such variables
dense instead. Builds, per conversion trained under a penalty, the penalty's
gradient parts [(rows * g, keys)], which optimizer_updates adds to the
gradient the table's apply takes.
"""
from typing import NamedTuple

import tensorflow as tf

from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "l2_penalties"
AFTER = ("gather_to_lookup",)
APPROXIMATION = ("its L2 penalty covers the distinct rows each step reads, not the whole "
                 "variable: rows outside the batch get no update (a dense update would "
                 "shrink them and, with momentum or Adam, keep moving them)")
PenaltyGrads = NamedTuple("PenaltyGrads", [("parts", list)])  # [(rows * g, keys)]


def check(conversion: Conversion, context: Context) -> None:
    if not conversion.penalties:
        return
    if context.exact and conversion.training:
        raise Refused("an L2 penalty over the whole variable (tf.nn.l2_loss) would cover only "
                      "the rows each step reads (exact=True keeps it dense)")
    context.approximate(conversion, APPROXIMATION)


def distinct_rows(reads, dim: int):
    """(distinct keys, their rows) over the (keys, rows) of every lookup of a
    variable this step."""
    keys = tf.concat([tf.reshape(k, [-1]) for k, _ in reads], 0)
    rows = tf.concat([tf.reshape(r, [-1, dim]) for _, r in reads], 0)
    unique, index = tf.unique(keys)
    first = tf.math.unsorted_segment_min(tf.range(tf.size(keys)), index, tf.size(unique))
    return unique, tf.gather(rows, first)


def rewrite(rw, conversions, context: Context) -> None:
    for c in conversions:
        if not c.penalties:
            continue
        lookups = context.built(Lookups, c)
        with rw.rule(NAME), tf.compat.v1.name_scope(f"graphmod/{lookups.table.name}/l2_penalty"):
            if not lookups.reads:  # a graph that reads no rows of it: no penalty
                for penalty in c.penalties:
                    rw.reroute(penalty.outputs[0], tf.zeros([], penalty.outputs[0].dtype))
                continue
            keys, rows = distinct_rows(lookups.reads, c.dim)
            for penalty in c.penalties:
                rw.reroute(penalty.outputs[0], tf.nn.l2_loss(rows))
            if c.training and c.update is not None:
                context.build(PenaltyGrads([(rows * g, keys) for g in c.update.penalty_grads]), c)
