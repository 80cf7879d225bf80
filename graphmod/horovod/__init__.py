"""Tables sharded by key across Horovod ranks.

Each key has one owner rank (graphmod.embeddings.partition). A training
step's lookups of all tables exchange ids and rows with their owners in
all-to-alls (graphmod.horovod.exchange), and the sparse optimizers apply
each key's gradient once, on its owner. Dense layers stay data-parallel
(Horovod's own DistributedOptimizer).

Two ways in:
- hook mode: GraphModifierHook() in a model that runs on several Horovod
  ranks shards its tables by itself (training and evaluation graphs; a
  prediction or export graph holds every key). The gradient the update
  consumed is taken before DistributedOptimizer's collective and sent to
  the keys' owners (exchanged_gradients), combined as that collective
  combines it (average or sum, as the user's DistributedOptimizer says);
  the converted variables leave Horovod's broadcast. See
  rewrite_rules.shard_exchange.
- the table API, opt-in (`enable()`): lookups exchange, and gradients come
  back through the exchange's autodiff, averaged over ranks.

Checkpoints of sharded tables are written by graphmod.checkpoint.saver.TableSaver on
every rank at the same steps (each rank its keys, full checkpoints and
deltas: graphmod.checkpoint.parts) and restore on any number of
ranks; another Saver's save or restore of a sharded table fails when it
runs, naming it. Every rank must run every fetch that reads a sharded table
(a lookup is a collective).

>>> import horovod.tensorflow as hvd, graphmod
>>> hvd.init(); graphmod.horovod.enable()
>>> rows = graphmod.sparse_lookup(table, ids)   # ids of this rank's batch
"""
from graphmod.horovod.exchange import (Exchange, active, enable, enabled, exchanged_find,
                                           exchanged_find_or_insert, exchanged_gradients,
                                           horovod_rank, horovod_ranks, returned_gradients,
                                           training_exchange)
from graphmod.embeddings.partition import owner_of

__all__ = ["Exchange", "active", "enable", "enabled", "exchanged_find",
           "exchanged_find_or_insert", "exchanged_gradients", "horovod_rank", "horovod_ranks",
           "owner_of",
           "returned_gradients", "training_exchange"]
