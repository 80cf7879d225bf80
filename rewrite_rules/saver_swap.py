"""Rule: converted variables and their slots leave the init op and the Saver,
and summaries reading them densely leave the summaries.

Estimators build the init op, the ready checks and the Saver after hooks'
begin(), from the graph's collections; removing a converted variable and its
optimizer slots from every collection therefore drops them from all three,
while each table's saveable (added when the table was built) joins the
checkpoint. The same goes for summaries of the dense variable (the canned
linear models' fraction of zero weights): Estimators merge the SUMMARIES
collection after begin(). Matches every conversion; refuses nothing.
"""
from typing import NamedTuple

from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context

NAME = "saver_swap"
Freed = NamedTuple("Freed", [("dense_bytes_freed", int)])  # for the report


def rewrite(rw, conversions, context: Context) -> None:
    context.build(Freed(sum(_rewrite_one(rw, c) for c in conversions)))


def _rewrite_one(rw, conversion: Conversion) -> int:
    """Returns the dense bytes no longer allocated (variable and slots)."""
    freed = 0
    # Slots leave the Saver in every mode: eval and predict graphs restore a
    # table without its optimizer slots.
    slots = conversion.update.slots if conversion.update is not None else []
    with rw.rule(NAME):
        for v in [conversion.variable] + slots:
            if rw.remove_from_collections(v, label=v.op.name):
                freed += v.shape.num_elements() * v.dtype.size
        for summary in conversion.summaries:
            rw.remove_from_collections(summary.outputs[0], label=summary.name)
    return freed
