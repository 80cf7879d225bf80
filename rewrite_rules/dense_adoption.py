"""Rule: a variable the model_dir's checkpoint holds densely is adopted by its table.

The first thing an existing user does is add the hook to a model_dir trained
without it. Matches a converted variable whose name is in the latest
checkpoint (and its table's entries are not): the graph's Saver becomes
graphmod.saver.TableSaver, with the settings of the Saver it replaces, which
restores that checkpoint by importing the variable's trained rows (row i as
key i) and optimizer slots into the table, and everything else as usual. The
model right after adoption therefore computes what the dense model did.

Refuses (the variable stays dense, as the checkpoint holds it):
- ids squeezed by a hash bucket or modulo while keys are collision-free: a
  table keyed by full ids has no row for "bucket i" (collision_free=False
  adopts it, keyed by bucket);
- a part of a partitioned variable (its rows are a slice of the checkpoint's);
- a training graph whose checkpoint lacks one of the table's optimizer slots
  (the dense model could not restore it either);
- a graph whose Saver is already built or is not the one the session will
  build (several Savers in the SAVERS collection).
"""
from typing import List

import tensorflow as tf

from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused
from graphmod.saver import Adoption, TableSaver

NAME = "dense_adoption"
tf1 = tf.compat.v1


def checkpoint_name(v: tf.Variable) -> str:
    """A variable's name in checkpoints (a partitioned variable's parts are
    saved as slices of the whole)."""
    info = getattr(v, "_save_slice_info", None)
    return info.full_name if info is not None else v.op.name


def held_densely(conversion: Conversion, context: Context) -> bool:
    names = context.checkpoint_names
    return (checkpoint_name(conversion.variable) in names
            and f"{conversion.table_name}-keys" not in names)


def _slot_names(conversion: Conversion) -> List[str]:
    slots = conversion.translation.slot_vars if conversion.translation is not None else []
    return [checkpoint_name(s) for s in slots]


def _replaceable_saver(graph: tf.Graph):
    """(the Saver the session will build, or None when it will create the
    default one) or Refused."""
    savers = graph.get_collection(tf1.GraphKeys.SAVERS)
    if len(savers) > 1:
        raise Refused("the graph has several Savers, so graphmod cannot tell which restores "
                      "the checkpoint that holds it densely")
    if savers and (type(savers[0]) is not tf1.train.Saver or savers[0].saver_def is not None):
        if isinstance(savers[0], TableSaver) and savers[0].saver_def is None:
            return savers[0]
        raise Refused("the graph's Saver is already built or not a tf.compat.v1.train.Saver, "
                      "so it cannot restore the table from the checkpoint that holds the "
                      "variable densely")
    return savers[0] if savers else None


def check(conversion: Conversion, context: Context) -> None:
    if not held_densely(conversion, context):
        return
    v = conversion.variable
    why = " (the checkpoint in model_dir holds it densely)"
    if getattr(v, "_save_slice_info", None) is not None:
        raise Refused("adopting a part of a partitioned variable is not built" + why)
    if context.collision_free and _squeezed(conversion):
        raise Refused("its ids are squeezed into hash buckets and its table would hold full "
                      "ids, which no bucket row can be adopted as (collision_free=False "
                      "adopts it, keyed by bucket)" + why)
    missing = [n for n in _slot_names(conversion) if n not in context.checkpoint_names]
    if conversion.training and missing:
        raise Refused(f"its optimizer slots {', '.join(missing)} are not in the checkpoint" + why)
    _replaceable_saver(context.graph)


def _squeezed(conversion: Conversion) -> bool:
    if conversion.unsqueezed is not None:  # a replayed plan says
        return bool(conversion.unsqueezed)
    from graphmod.rewrite_rules.collisionless_keys import sources
    return bool(sources([g.ids for g in conversion.gathers]))


def rewrite(rw, conversions: List[Conversion], context: Context) -> None:
    adopted = [c for c in conversions if held_densely(c, context)]
    if not adopted:
        return
    with rw.rule(NAME):
        old = _replaceable_saver(context.graph)
        adoptions = [Adoption(c.table, checkpoint_name(c.variable),
                              _slot_names(c) if c.table.num_slots else [], c.rows)
                     for c in adopted]
        if isinstance(old, TableSaver):
            adoptions = old.adoptions + adoptions
        # The settings of the Saver it replaces (an Estimator's: sharded, its
        # RunConfig's keep_checkpoint_max...; none: Scaffold's default).
        settings = dict(sharded=True, allow_empty=True)
        if old is not None:
            settings = dict(
                var_list=old._var_list, reshape=old._reshape, sharded=old._sharded,  # pylint: disable=protected-access
                max_to_keep=old._max_to_keep,  # pylint: disable=protected-access
                keep_checkpoint_every_n_hours=old._keep_checkpoint_every_n_hours,  # pylint: disable=protected-access
                name=old._name, restore_sequentially=old._restore_sequentially,  # pylint: disable=protected-access
                allow_empty=old._allow_empty, write_version=old._write_version,  # pylint: disable=protected-access
                pad_step_number=old._pad_step_number,  # pylint: disable=protected-access
                save_relative_paths=old._save_relative_paths, filename=old._filename)  # pylint: disable=protected-access
            rw.remove_from_collections(old, [tf1.GraphKeys.SAVERS], label="the graph's Saver")
        saver = TableSaver(adoptions, **settings)
        context.graph.add_to_collection(tf1.GraphKeys.SAVERS, saver)
        rw.track_added(tf1.GraphKeys.SAVERS, saver, label="graphmod.saver.TableSaver")
        context.adopted.extend(c.variable.op.name for c in adopted)
