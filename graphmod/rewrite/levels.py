"""Dependency levels of a set of ops, and the input sources each reads.

Used to group table ops that may run as one (fuse_table_ops) or exchange
together across ranks (shard_exchange): ops of one level never depend on
each other, so joining them never makes a cycle.
"""
from typing import Dict, List

import tensorflow as tf

# Ops whose values come from outside the graph, step by step.
_SOURCES = ("Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "IteratorGetNextSync",
            "IteratorGetNextAsOptional", "QueueDequeueV2", "QueueDequeueManyV2",
            "QueueDequeueUpToV2")


def levels_and_sources(candidates: List[tf.Operation]):
    """Per candidate: its level, 1 + the highest level among the candidates
    it depends on (through data or control edges; 0 when none), and the set
    of input sources (placeholders, iterators) it reads. A v1 loop's back
    edge (NextIteration -> Merge) is followed until it closes the cycle, so
    a value that reaches a loop's exit only through the loop body still
    counts."""
    chosen = set(candidates)
    reach: Dict[tf.Operation, int] = {}  # highest candidate level at or above an op (-1: none)
    feeds: Dict[tf.Operation, frozenset] = {}
    levels: Dict[tf.Operation, int] = {}
    on_path = set()
    for root in candidates:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op in reach:
                continue
            parents = [t.op for t in op.inputs] + list(op.control_inputs)
            if not expanded:
                if op in on_path:
                    continue
                on_path.add(op)
                stack.append((op, True))
                # A parent still on the path closes a loop's cycle: not followed.
                stack.extend((p, False) for p in parents if p not in reach and p not in on_path)
                continue
            on_path.discard(op)
            done = [p for p in parents if p in reach]
            above = max((reach[p] for p in done), default=-1)
            feeds[op] = frozenset().union(*(feeds[p] for p in done)) | (
                {op.name} if op.type in _SOURCES else set())
            if op in chosen:
                levels[op] = above + 1
                reach[op] = levels[op]
            else:
                reach[op] = above
    return levels, {op: feeds[op] for op in candidates}
