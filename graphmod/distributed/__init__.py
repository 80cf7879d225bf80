"""Tables sharded by key across Horovod ranks.

Each key has one owner rank (graphmod.distributed.partition). A training
step's lookups of all tables exchange ids and rows with their owners in
all-to-alls (graphmod.distributed.exchange); the sparse optimizers apply each
key's gradient once, on its owner, where autodiff brings it back through
the reverse all-to-all. Dense layers stay data-parallel (Horovod's own
DistributedOptimizer).

Sharding is opt-in for now (`enable()`). Checkpoints of sharded tables are
written by graphmod.saver.TableSaver on every rank at the same steps (each
rank its keys, graphmod.distributed.checkpoints) and restore on any number
of ranks; another Saver's save or restore of a sharded table fails when it
runs, naming it. Every rank must run every fetch that reads a sharded table
(a lookup is a collective).

>>> import horovod.tensorflow as hvd, graphmod
>>> hvd.init(); graphmod.distributed.enable()
>>> rows = graphmod.sparse_lookup(table, ids)   # ids of this rank's batch
"""
from graphmod.distributed.exchange import (active, enable, enabled, exchanged_find,
                                           exchanged_find_or_insert, exchanged_gradients,
                                           horovod_ranks)
from graphmod.distributed.partition import owner_of

__all__ = ["active", "enable", "enabled", "exchanged_find", "exchanged_find_or_insert",
           "exchanged_gradients", "horovod_ranks", "owner_of"]
