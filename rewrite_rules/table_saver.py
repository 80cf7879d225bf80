"""Rule: the graph's Saver becomes graphmod.checkpoint.saver.TableSaver, which restores a
table checkpoint with its incremental deltas and adopts dense checkpoints.

Matches every conversion: the deferred Saver an Estimator put in the SAVERS
collection (or, when there is none, the default Scaffold would create) is
replaced by a TableSaver with the same settings. A graph whose Saver is built
already, or that has several, or an Estimator model whose Scaffold brings its
own, keeps it (its checkpoints then have no deltas).

Adoption: the first thing an existing user does is add the hook to a
model_dir trained without it. A converted variable whose name is in the
latest checkpoint (and its table's entries are not) is adopted: the
TableSaver's restore imports its trained rows (row i as key i) and optimizer
slots into the table, and restores everything else as usual, so the model
right after adoption computes what the dense model did.
Ids squeezed by a hash bucket or modulo stay squeezed for an adopted
variable (the collisionless_keys rule keeps them): its table is keyed by
bucket, starting from the buckets' trained rows. (A plan saying the table
was trained on full ids, beside a checkpoint holding the variable densely,
is an error: a table keyed by full ids has no row for "bucket i".)
Refuses (the variable stays dense, as the checkpoint holds it):
- a part of a partitioned variable (its rows are a slice of the checkpoint's);
- a training graph whose checkpoint lacks one of the table's optimizer slots
  (the dense model could not restore it either);
- a graph whose Saver cannot become a TableSaver (see above), or an
  Estimator model whose Scaffold brings its own Saver.
"""
from typing import List, NamedTuple

from graphmod.checkpoint import saver as table_saver
from graphmod.rewrite.plan import Conversion, checkpoint_name
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Translation

NAME = "table_saver"
AFTER = ("gather_to_lookup",)
Adopted = NamedTuple("Adopted", [("adopted", list)])  # for the report


def _slot_names(conversion: Conversion, context: Context) -> List[str]:
    translation = context.built(Translation, conversion)
    slots = translation.slot_vars if translation is not None else []
    return [checkpoint_name(s) for s in slots]


def check(conversion: Conversion, context: Context) -> None:
    if not context.held_densely(conversion):
        return
    v = conversion.variable
    why = " (the checkpoint in model_dir holds it densely)"
    if getattr(v, "_save_slice_info", None) is not None:
        raise Refused("adopting a part of a partitioned variable is not built" + why)
    if conversion.planned_keys:
        raise Refused("its table was trained on the full ids of "
                      f"{', '.join(conversion.planned_keys)}, which no bucket row can be "
                      "adopted as" + why)
    missing = [n for n in _slot_names(conversion, context) if n not in context.checkpoint_names]
    if conversion.training and missing:
        raise Refused(f"its optimizer slots {', '.join(missing)} are not in the checkpoint" + why)
    if context.scaffold_saver:
        raise Refused("the model's Scaffold brings its own Saver, which cannot restore its "
                      "table from the checkpoint" + why)
    try:
        table_saver.replaceable_saver(context.graph)
    except table_saver.NotReplaceable as e:
        raise Refused(f"{e}, which cannot restore its table from the checkpoint" + why) from None


def rewrite(rw, conversions: List[Conversion], context: Context) -> None:
    if not conversions or context.scaffold_saver:
        return  # the model's own Saver saves the tables (no deltas, no adoption)
    try:
        table_saver.replaceable_saver(context.graph)
    except table_saver.NotReplaceable:
        return  # no conversion was adopted (check refused them): the graph's Saver stays
    adopted = [c for c in conversions if context.held_densely(c)]
    tables = {c.name: context.built(Lookups, c).table for c in adopted}
    with rw.rule(NAME):
        table_saver.install(rw, context.graph, [
            table_saver.Adoption(tables[c.name], checkpoint_name(c.variable),
                                 _slot_names(c, context) if tables[c.name].num_slots else [],
                                 c.rows)
            for c in adopted])
    context.build(Adopted([c.variable.op.name for c in adopted]))
