"""Rule: under Horovod, tables are sharded by key across the ranks, or replicated.

When the model runs on several Horovod ranks, the placement planner
(graphmod.horovod.placement) places each table: sharded, each key's row
on one owner rank, or replicated, every row on every rank. A replicated
table's lookups stay local; the step's gradient rows and lookup counts of
all ranks are summed by an allreduce, and every rank counts and applies
them all (its copies stay equal).
For the sharded tables, this rule moves the table ops the earlier rules
built to the owners:
  - lookups: those of one dependency level become one exchange
    (graphmod.horovod.exchanged_find_or_insert, or exchanged_find in
    graphs that do not train): ids go to their owners, which look them up
    and send the rows back;
  - applies: each rank's gradient rows (optimizer_updates took them before
    Horovod's collective, as this rank's share of the combination) go to
    their keys' owners, where one fused apply sums the shares per key and
    steps each row once: in one all-to-all without their keys
    (returned_gradients) when one training exchange looked up exactly the
    applies' tables, each once (the owners know which keys they served);
    else keyed (exchanged_gradients, two all-to-alls).
Every rank builds the same graph, so the exchanges' collectives match by name.

Refuses, when the model runs on several ranks: a variable each rank trains
on its own (its gradient takes no Horovod collective, so the ranks' copies
differ and no one table can follow them), reads inside v1 control flow (a
lookup there is a collective every rank would have to run alike), and reads
of the whole variable.
"""
import collections
from typing import NamedTuple

import tensorflow as tf

from graphmod import horovod
from graphmod.embeddings import fused, stored_rows
from graphmod.horovod import ids_ahead, placement
from graphmod.horovod.exchange import BYTES_SENT
from graphmod.rewrite import input_keys
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.levels import levels_and_sources
from graphmod.rewrite.plan import Conversion
from graphmod.rewrite.rule import Context, Refused
from graphmod.rewrite_rules import collisionless_keys
from graphmod.rewrite_rules.gather_to_lookup import Lookups
from graphmod.rewrite_rules.optimizer_updates import Apply

NAME = "shard_exchange"
AFTER = ("optimizer_updates", "dense_reads")
_LOOKUPS = ("GraphmodTableFindOrInsert", "GraphmodTableFind")
# Iterators whose elements ids_ahead may take one step ahead.
_PLAIN_ITERATORS = ("IteratorV2", "Iterator", "OneShotIterator")
# For the report: table -> "" (its training lookups' ids are exchanged a step
# ahead, graphmod.horovod.ids_ahead) or why not.
IdsAhead = NamedTuple("IdsAhead", [("ids_ahead", dict)])


class Placed(NamedTuple):
    """A table's placement (graphmod.horovod.placement), for the report and
    the plan (the model's later graphs place it as training did)."""
    choice: placement.Choice

    def table_entry(self) -> dict:
        return self.choice.report()

    def plan_entry(self) -> dict:
        return self.choice.report()


def check(conversion: Conversion, context: Context) -> None:
    if context.ranks <= 1:
        return
    update = conversion.update
    if conversion.training and (update.combined is None or not update.combined.collective.runs):
        raise Refused(f"each of the {context.ranks} Horovod ranks trains its own copy of it "
                      "(its gradient goes through no Horovod collective): one table sharded "
                      "across the ranks cannot follow copies that differ")
    for g in conversion.gathers:
        if GraphIndex.in_control_flow(g.op):
            raise Refused(f"{g.op.name} reads it inside v1 control flow: its lookup would be a "
                          "collective every Horovod rank must run alike")
    if conversion.dense_reads:
        raise Refused("it is read whole, which tables sharded across Horovod ranks cannot serve")


def rewrite(rw, conversions, context: Context) -> None:
    if context.ranks <= 1:
        return
    built = {c.name: context.built(Lookups, c) for c in conversions}
    replicated = [c for c in conversions if replicates(c, context)]
    sharded = [c for c in conversions if c not in replicated]
    rw.set_state("replicated", frozenset(c.table_name for c in replicated))
    with rw.rule(NAME):
        exchanges, aheads, why_not = _exchange_lookups(rw, [built[c.name] for c in sharded],
                                                       context.ids_ahead)
        advances = [a.advance for _, a in aheads]
        _exchange_applies(rw, [(built[c.name].table, context.built(Apply, c).op)
                               for c in sharded if c.training], exchanges, advances)
        _replicated_applies(rw, [(built[c.name], context.built(Apply, c).op, c.rows)
                                 for c in replicated if c.training], advances)
        if aheads:
            rw.set_state("primes", [a.prime for _, a in aheads])
            rw.set_state("step_inputs", {get_next.name: a.element for get_next, a in aheads})
    if context.training:
        context.build(IdsAhead(why_not))


def replicates(c: Conversion, context: Context) -> bool:
    """Whether every rank holds every row of c's table (else: each key's row
    is on its owner rank); the planner's choice (graphmod.horovod.placement),
    made once the keys are known, on the first call. Raises ValueError when
    TableSettings forces a table that cannot be replicated."""
    if context.ranks <= 1:
        return False
    placed = context.built(Placed, c)
    if placed is None:
        forced = c.settings.placement
        if not c.training and c.planned_placement:
            forced = c.planned_placement  # as training placed it
        placed = Placed(placement.place(_shape(c, context), context.ranks, forced))
        context.build(placed, c)
    return placed.choice.placement == "replicated"


def _shape(c: Conversion, context: Context) -> placement.TableShape:
    """What the planner knows of c's table (its training reads' ids: None
    when a batch size is not static)."""
    sizes = [g.ids.shape.num_elements() for g in c.gathers] if c.training else [None]
    settings = c.settings
    keys = context.built(collisionless_keys.Keys, c)
    why = ("it admits or evicts rows by their use, which each rank counts for its own copy"
           if settings.access_threshold >= 0 or settings.eviction_threshold >= 0 else
           "a full table (max_rows) evicts by the use of each rank's own copy"
           if settings.max_rows is not None else
           "each rank's copy would have a disk tier of its own"
           if settings.memory_budget is not None else
           "its keys are a hashed column's own values (collision-free), not the row numbers "
           "its dense gradient's allreduce carries"
           if keys is not None and keys.names else "")
    return placement.TableShape(
        c.table_name, settings.max_rows or c.rows, c.dim,
        len(c.update.slots) if c.update is not None else 0,
        None if None in sizes else sum(sizes), why,
        stored_rows.forms(settings.storage_dtype, settings.slot_storage_dtype))


def _exchange_lookups(rw, lookups, ahead_allowed: bool):
    """Each dependency level's lookups (of every table) become one exchange.
    Returns the training exchanges (horovod.Exchange), (the iterator's
    get_next, the ids_ahead.Ahead) of the one whose ids go a step ahead, and
    per table "" (its training lookups' ids go ahead) or why not."""
    reads = [(lk.table, keys, rows) for lk in lookups for keys, rows in lk.reads
             if rows.op.type in _LOOKUPS]
    exchanges, aheads, why_not = [], [], {}
    if not reads:
        return exchanges, aheads, why_not
    levels, _ = levels_and_sources([rows.op for _, _, rows in reads])
    groups = collections.defaultdict(list)
    for read in reads:
        op = read[2].op
        groups[(op.type, levels[op])].append(read)
    for (kind, _), group in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        tables = [table for table, _, _ in group]
        keys = [k for _, k, _ in group]
        if kind == "GraphmodTableFindOrInsert":
            try:
                if not ahead_allowed:
                    raise input_keys.NotFromInput("GraphModifierHook(ids_ahead=False)")
                if aheads:
                    raise input_keys.NotFromInput("another exchange's ids go ahead (one a step)")
                ahead, get_next = _ids_ahead(rw.index, tables, keys)
            except input_keys.NotFromInput as e:
                ahead = None
                for t in tables:
                    why_not[t.name] = str(e)
            # "sum": the hook's gradients do not flow back through the rows
            # (they travel by _exchange_applies), so no scaling is built.
            rows, exchange = horovod.training_exchange(tables, keys, combine="sum", ahead=ahead,
                                                       autodiff=False)
            exchanges.append(exchange)
            if ahead is not None:
                aheads.append((get_next, ahead))
                for t in tables:
                    why_not.setdefault(t.name, "")
                # The step reads its batch from the stash, not the iterator;
                # and a fetch of get_next's own outputs (which would take a
                # batch the step never sees) fails instead: its iterator is
                # one nothing initializes.
                for old, new in zip(get_next.outputs, ahead.element):
                    rw.reroute(old, new)
                rw.reroute(rw.index.data_input(get_next), ahead.unset_iterator,
                           consumers=[get_next])
        else:
            rows = horovod.exchanged_find(tables, keys)
        for (_, _, old), new in zip(group, rows):
            rw.reroute(old, new)
    return exchanges, aheads, why_not


def _ids_ahead(index, tables, keys):
    """The tables' exchange of keys, done a step ahead, and the iterator's
    get_next whose batches the step then reads from its stash; raises
    input_keys.NotFromInput when the keys are not a pure function of one
    iterator's element."""
    paths = [input_keys.pure_path(k, index) for k in keys]
    get_nexts = {get_next for get_next, _ in paths}
    if len(get_nexts) != 1:
        raise input_keys.NotFromInput("its exchange's keys come from more than one tf.data "
                                      "iterator")
    get_next = get_nexts.pop()
    iterator = index.data_input(get_next)
    if iterator.op.type not in _PLAIN_ITERATORS:
        raise input_keys.NotFromInput(f"its iterator is a {iterator.op.type} "
                                      f"('{iterator.op.name}'), not one made from one dataset")
    users = [op for op in index.consumers(iterator) if op is not get_next
             and (op.type == "MakeIterator" or index.used(op))]
    makes = [op for op in users if op.type == "MakeIterator"]
    for op in users:
        # One element a step, from one dataset: re-initializing it from another
        # (a reinitializable iterator), a handle to feed it by, saving its
        # state or reading it twice would not meet the stash. (Ops nothing
        # reads, as the handle an Estimator's iterator makes, are no use.)
        if not (op.type == "MakeIterator" and len(makes) == 1):
            raise input_keys.NotFromInput(f"its iterator ('{iterator.op.name}') is also used by "
                                          f"{op.type} '{op.name}'")
    keys_of = input_keys.recompute(index, get_next,
                                   [(k, ops) for k, (_, ops) in zip(keys, paths)])
    return ids_ahead.build(get_next, keys_of, [t.dim + 1 for t in tables]), get_next


def _exchange_applies(rw, applies, exchanges, advances) -> None:
    """The applies one set of ops waits for (one optimizer's step) exchange
    their gradients with the keys' owners, which apply them in one fused op;
    each waits for the advances (every training run moves its input on)."""
    for group in _by_optimizer_step(rw, applies):
        exchange = _the_exchange_of(group, exchanges)
        if exchange is not None:
            order = [t.name for t in exchange.tables]
            group = sorted(group, key=lambda pair: order.index(pair[0].name))
        tables = [table for table, _ in group]
        old = [op for _, op in group]
        keys = [rw.index.data_input(op, 1) for op in old]
        grads = [rw.index.data_input(op, 2) for op in old]
        if exchange is not None:
            owned = horovod.returned_gradients(exchange, keys, grads)
        else:
            owned = horovod.exchanged_gradients(tables, keys, grads)
        with tf.compat.v1.name_scope("graphmod/owner_apply"), tf.control_dependencies(advances):
            apply = fused.apply([t.handle for t in tables], [k for k, _ in owned],
                                [g for _, g in owned], [rw.index.data_input(op, 3) for op in old],
                                [rw.index.attr(op, "optimizer").decode() for op in old],
                                [rw.index.attr(op, "nesterov") for op in old], by_address=False)
        for op in old:
            rw.replace_control_input(op, apply)


def _replicated_applies(rw, applies, advances) -> None:
    """The applies of replicated tables (each rank's copy of every row) that
    one set of ops waits for. Per table, this rank sums into a dense
    [rows, dim + 2] tensor its gradient rows (its share of the combination,
    as optimizer_updates took them), how many reached each row, and how
    often its lookups read each row; one allreduce (a sum) gives every rank
    the step's totals. Every copy then counts the other ranks' lookups
    (inserting the rows it lacks), and steps each row a gradient reached
    once, with the sum of all ranks' shares: every copy holds, counts and
    moves its rows as one table read by every rank would."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    for group in _by_optimizer_step(rw, applies):
        tables, old = [lk.table for lk, _, _ in group], [op for _, op, _ in group]
        others_read, keys, grads = [], [], []
        with tf.compat.v1.name_scope("graphmod/replicated_apply"):
            for lookups, op, rows in group:
                table, dim = lookups.table, lookups.table.dim
                grad_keys, grad = rw.index.data_input(op, 1), rw.index.data_input(op, 2)
                # (the keys as they are now: the ids a step ahead may have
                # replaced the iterator's outputs they were)
                read = tf.concat([tf.zeros([0], tf.int64)] + [
                    tf.reshape(rw.current(k), [-1]) for k, r in lookups.reads
                    if r.op.type == "GraphmodTableFindOrInsert"], 0)
                in_rows = tf.debugging.Assert(
                    tf.reduce_all((read >= 0) & (read < rows)),
                    [f"graphmod: replicated table '{table.name}' read a key outside its "
                     f"{rows} rows"])
                with tf.control_dependencies([in_rows]):
                    mine = tf.concat([
                        tf.math.unsorted_segment_sum(
                            tf.concat([grad, tf.ones_like(grad[:, :1])], 1), grad_keys, rows),
                        tf.math.unsorted_segment_sum(tf.ones_like(read, tf.float32)[:, None],
                                                     read, rows)], 1)
                total = hvd.allreduce(mine, op=hvd.Sum, name=f"graphmod_replicated_{table.name}")
                # (counts are exact in float32 up to 2^24 reads of a row a step)
                others = tf.cast(total[:, dim + 1] - mine[:, dim + 1], tf.int64)
                elsewhere = tf.where(others > 0)[:, 0]
                others_read.append(tf.repeat(elsewhere, tf.gather(others, elsewhere)))
                stepped = tf.where(total[:, dim] > 0)[:, 0]
                keys.append(stepped)
                grads.append(tf.gather(total[:, :dim], stepped))
                tf.compat.v1.add_to_collection(BYTES_SENT, tf.constant(
                    2 * (hvd.size() - 1) * rows * 4 * (dim + 2) // hvd.size(), tf.int64))
            _, handles = fused.find_or_insert(tables, others_read)
            with tf.control_dependencies(handles + advances):
                apply = fused.apply([t.handle for t in tables], keys, grads,
                                    [rw.index.data_input(op, 3) for op in old],
                                    [rw.index.attr(op, "optimizer").decode() for op in old],
                                    [rw.index.attr(op, "nesterov") for op in old],
                                    by_address=False)
        for op in old:
            rw.replace_control_input(op, apply)


def _by_optimizer_step(rw, applies: list) -> list:
    """applies (tuples whose second item is an apply op) in groups, one per
    set of ops that waits for them (one optimizer's step), in a fixed order."""
    groups = collections.defaultdict(list)
    for entry in applies:
        waiting = frozenset(op.name for op in rw.index.control_consumers(entry[1]))
        groups[waiting].append(entry)
    return [group for _, group in sorted(groups.items(), key=lambda g: sorted(g[0]))]


def _the_exchange_of(group, exchanges):
    """The training exchange that looked up exactly group's tables, each
    once, when no other exchange looked any of them up (the gradients' keys
    are then that exchange's ids): their gradients can return by it."""
    looked_up = collections.Counter(t.name for e in exchanges for t in e.tables)
    names = sorted(t.name for t, _ in group)
    for e in exchanges:
        if sorted(t.name for t in e.tables) == names and all(looked_up[n] == 1 for n in names):
            return e
    return None
