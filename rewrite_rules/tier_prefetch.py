"""Rule: the input pipeline brings up the next step's cold rows while a step trains.

Matches the training lookups of tables with a disk tier (memory_budget;
TableSettings(prefetch=False) turns it off) whose keys are a pure function of one tf.data iterator's elements: every op
between the iterator's IteratorGetNext and the keys is stateless, takes no
resource and is outside control flow, and the iterator is made (MakeIterator)
from a dataset in this graph, as Estimator.train makes it from an input_fn's
Dataset. Rewrites that dataset to
    dataset.map(prefetch the keys of the element).prefetch(1)
where the map recomputes the keys from the element (the same ops, copied
into the map's function) and runs Table.prefetch on them, and prefetch(1)
makes the map run for step t+1 while step t trains. Elements pass through
unchanged.

Prefetch only moves rows between the tiers (no row changes; a prefetched
row is spared by spills until its step), so training is exactly as without
it; it only takes disk reads off the step. Not matched, each with the reason
in the report: keys computed with state (a vocabulary table, a variable), a
one-shot iterator or feed_dict input, and tables sharded over Horovod ranks
or ps tasks (their next keys are known only after the exchange).
"""
from typing import Dict, List, NamedTuple, Tuple

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

from graphmod.rewrite import input_keys
from graphmod.rewrite.index import GraphIndex
from graphmod.rewrite.rule import Context
from graphmod.rewrite_rules.gather_to_lookup import Lookups

NAME = "tier_prefetch"
AFTER = ("gather_to_lookup",)
Prefetch = NamedTuple("Prefetch", [("prefetch", dict)])  # for the report: table -> "" or why not


class _NoPrefetch(Exception):
    """Why a table's next keys cannot be computed in the input pipeline."""


def rewrite(rw, conversions, context: Context) -> None:
    if not context.training:
        return
    why_not: Dict[str, str] = {}  # table -> why (one of) its lookups' keys are not prefetched
    wanted = {}
    for c in conversions:
        lookups = context.built(Lookups, c)
        if not c.training or not lookups.table.memory_budget:
            continue
        if not c.settings.prefetch:
            why_not[lookups.table.name] = "TableSettings(prefetch=False)"
            continue
        wanted.update({(lookups.table.name, keys.ref()): (lookups.table, keys)
                       for keys, _ in lookups.reads})
    plans: Dict[tf.Operation, List[Tuple["graphmod.Table", tf.Tensor, List[tf.Operation]]]] = {}
    prefetched = set()
    for table, keys in wanted.values():
        try:
            if context.ranks > 1 or context.ps_tasks > 0:
                raise _NoPrefetch("its table is sharded, and the next step's keys are known "
                                  "only after the exchange")
            get_next, ops = input_keys.pure_path(keys, rw.index)
            plans.setdefault(get_next, []).append((table, keys, ops))
        except (_NoPrefetch, input_keys.NotFromInput) as e:
            why_not.setdefault(table.name, str(e))
    for get_next, keyed in plans.items():
        try:
            make = _make_iterator(get_next, rw.index)
            with rw.rule(NAME):
                # Built before anything is rerouted: a failure leaves the graph as it was.
                ahead = _prefetching(rw.index, get_next, make, keyed)
        except (_NoPrefetch, ValueError, TypeError) as e:
            for table, _, _ in keyed:
                why_not.setdefault(table.name, str(e))
            continue
        with rw.rule(NAME):
            rw.reroute(rw.index.data_input(make), ahead, consumers=[make])
        prefetched.update(table.name for table, _, _ in keyed)
    reported = {name: f"some of its lookups: {why}" if name in prefetched else why
                for name, why in why_not.items()}
    context.build(Prefetch({**reported, **{name: "" for name in prefetched - set(why_not)}}))


def _make_iterator(get_next: tf.Operation, index: GraphIndex) -> tf.Operation:
    """The MakeIterator op that makes get_next's iterator from a dataset."""
    iterator = index.data_input(get_next)
    consumers = index.consumers(iterator)
    if any(op.type == "SerializeIterator" for op in consumers):
        # Its state is saved (CheckpointInputPipelineHook), and a map with a
        # table's op in it cannot be.
        raise _NoPrefetch(f"the state of its iterator ('{iterator.op.name}') is checkpointed")
    makes = [op for op in consumers if op.type == "MakeIterator"]
    if len(makes) != 1:
        raise _NoPrefetch(f"its iterator ('{iterator.op.name}') is made from "
                          f"{len(makes) or 'no'} dataset(s) of this graph, not one")
    return makes[0]


def _prefetching(index: GraphIndex, get_next: tf.Operation, make: tf.Operation,
                 keyed) -> tf.Tensor:
    """make's dataset, with each element's keys prefetched one element ahead."""
    spec = tuple(tf.TensorSpec(shape, dtype) for shape, dtype in
                 zip(index.attr(get_next, "output_shapes"), index.attr(get_next, "output_types")))
    keys_of = input_keys.recompute(index, get_next, [(keys, ops) for _, keys, ops in keyed])

    @tf.autograph.experimental.do_not_convert
    def prefetch_keys(*element):
        done = [table.prefetch(keys)
                for (table, _, _), keys in zip(keyed, keys_of(element))]
        with tf.control_dependencies(done):
            return tuple(tf.identity(t) for t in element)

    # pylint: disable=protected-access
    dataset = index.data_input(make)
    ahead = dataset_ops._VariantDataset(dataset, spec).map(prefetch_keys).prefetch(1)
    return ahead._variant_tensor
