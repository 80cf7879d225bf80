"""The one place a rewrite mutates the graph.

Every change a rule makes goes through a Rewriter, which records it: the
record feeds the RewriteReport and `graphmod diff`, and lets a failed rewrite
be undone (reroutes, control inputs, the graph's collections and graphmod's
per-graph state (graphmod.state) are reverted; ops the rule had built stay in
the graph, unreachable and harmless). What library code a rule calls adds to
the graph's collections (a table's saveable, a variable, a Saver) is recorded
under the rule when the rule ends; undo() is the only rollback a rewrite needs.

>>> rw = Rewriter(graph)
>>> with rw.rule("gather_to_lookup"):
...     new = build_lookup(...)
...     rw.reroute(old_gather.outputs[0], new)
"""
import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from graphmod.rewrite.index import GraphIndex
from graphmod.state import graph_state


@dataclasses.dataclass
class Change:
    rule: str
    kind: str      # "reroute", "control", "collection_remove", "collection_add", "build", "state"
    detail: str


class Rewriter:
    def __init__(self, graph: tf.Graph, index: Optional[GraphIndex] = None):
        self.graph = graph
        # The graph's index, kept current: every edit passes through here.
        self.index = index if index is not None else GraphIndex(graph)
        self.changes: List[Change] = []
        self._undo: List[Callable[[], None]] = []
        self._rule = "(none)"
        # Which rule built each op and made each edge: `graphmod diff` names
        # the rule behind every change (see record()).
        self._built: Dict[str, str] = {}
        self._edges: List[dict] = []
        # What each replaced tensor (by ref) or op became: results that hold
        # the old one read the new one through current().
        self._replaced: Dict[Any, Any] = {}
        # The collections and per-graph state as the rewrite found them (undo
        # restores them), and the collections as last recorded (_sync).
        self._initial = {k: list(graph.get_collection_ref(k))
                         for k in graph.get_all_collection_keys()}
        self._state = graph_state(graph).snapshot()
        self._known = {k: list(v) for k, v in self._initial.items()}

    @contextlib.contextmanager
    def rule(self, name: str):
        """Attributes the changes (and the ops built) inside to rule `name`."""
        self._sync()  # edits made before the rule are not the rule's
        previous, self._rule = self._rule, name
        before = self.graph.version  # counts ops; O(1), unlike listing them
        try:
            with self.graph.as_default():
                yield self
        finally:
            self._sync()
            after = self.graph.version
            if after > before:
                self._record("build", f"{after - before} ops")
                nodes = self.graph._nodes_by_id  # pylint: disable=protected-access
                # An op's id is the graph's version just after it was added,
                # plus one (TF 2.15: the first op has id 2).
                for i in range(before + 2, after + 2):
                    if i in nodes:
                        self._built.setdefault(nodes[i].name, name)  # an inner rule first
                self.index.refresh()
            self._rule = previous

    def _record(self, kind: str, detail: str, undo: Optional[Callable[[], None]] = None):
        self.changes.append(Change(self._rule, kind, detail))
        if undo is not None:
            self._undo.append(undo)

    def reroute(self, old: tf.Tensor, new: tf.Tensor, consumers: Optional[List[tf.Operation]] = None,
                ignore: Optional[List[tf.Operation]] = None) -> int:
        """Makes consumers of `old` (default: all but `ignore`) read `new`; returns
        how many. Without `consumers`, new replaces old (see current())."""
        if old.dtype != new.dtype:
            raise TypeError(f"cannot reroute {old.name} ({old.dtype.name}) to {new.name} "
                            f"({new.dtype.name})")
        if consumers is None and not ignore:
            self._replaced[old.ref()] = new
        ignore = set(ignore or [])
        count = 0
        for op in list(consumers if consumers is not None else old.consumers()):
            if op in ignore:
                continue
            for i, t in enumerate(op.inputs):
                if t is old:
                    op._update_input(i, new)  # pylint: disable=protected-access
                    self._edges.append(dict(op=op.name, input=i, old=old.name, new=new.name,
                                            rule=self._rule))
                    self._record("reroute", f"{op.name}:{i} {old.name} -> {new.name}",
                                 lambda op=op, i=i: op._update_input(i, old))  # pylint: disable=protected-access
                    count += 1
        return count

    def replace_control_input(self, old: tf.Operation, new: Optional[tf.Operation]) -> int:
        """Ops that waited for `old` wait for `new` instead (or for nothing); a
        new op replaces old (see current())."""
        if new is not None:
            self._replaced[old] = new
        count = 0
        for op in self.index.control_consumers(old):
            before = list(op.control_inputs)
            self._set_control_inputs(op, [c for c in before if c is not old] +
                                     ([new] if new is not None else []))

            def undo(op=op, before=before):
                self._set_control_inputs(op, before)
            self._edges.append(dict(op=op.name, input="control", old=old.name,
                                    new=new.name if new is not None else None, rule=self._rule))
            self._record("control", f"{op.name}: ^{old.name} -> "
                         + (f"^{new.name}" if new is not None else "(none)"), undo)
            count += 1
        return count

    def _set_control_inputs(self, op: tf.Operation, inputs: List[tf.Operation]) -> None:
        before = list(op.control_inputs)
        op._remove_all_control_inputs()  # pylint: disable=protected-access
        op._add_control_inputs(inputs)  # pylint: disable=protected-access
        self.index.control_inputs_changed(op, before)

    def remove_from_collections(self, item: Any, keys: Optional[List[str]] = None,
                                label: Optional[str] = None) -> List[str]:
        """Removes item from the named collections (default: all); returns those it was in."""
        self._sync()
        removed = []
        for key in list(keys if keys is not None else self.graph.get_all_collection_keys()):
            coll = self.graph.get_collection_ref(key)
            if any(x is item for x in coll):
                del coll[next(i for i, x in enumerate(coll) if x is item)]
                removed.append(key)
                self._known[key] = list(coll)
                self._record("collection_remove", f"{label or _label(item)} from {key}")
        return removed

    def _sync(self) -> None:
        """Records what was added to (or removed from) the graph's collections
        since the last record, under the current rule. Cheap when nothing
        changed: a collection only grows at its end or loses items here."""
        for key in set(self.graph.get_all_collection_keys()) | set(self._known):
            coll = self.graph.get_collection_ref(key)
            known = self._known.get(key, [])
            if len(coll) == len(known) and (not coll or coll[-1] is known[-1]):
                continue
            now, before = {id(x) for x in coll}, {id(x) for x in known}
            for x in known:
                if id(x) not in now:
                    self._record("collection_remove", f"{_label(x)} from {key}")
            for x in coll:
                if id(x) not in before:
                    self._record("collection_add", f"{_label(x)} to {key}")
            self._known[key] = list(coll)

    def set_state(self, name: str, value: Any) -> None:
        """Sets a field of graphmod's per-graph state (graphmod.state); undo restores it."""
        if getattr(graph_state(self.graph), name) is not value:
            self._record("state", name)
        setattr(graph_state(self.graph), name, value)

    def current(self, item: Any) -> Any:
        """What replaced the op or tensor item, after every replacement so far
        (item itself when nothing did)."""
        for _ in range(len(self._replaced) + 1):
            new = self._replaced.get(item.ref() if isinstance(item, tf.Tensor) else item)
            if new is None:
                return item
            item = new
        raise ValueError(f"graphmod: replacements of {item.name} form a cycle")

    def undo(self) -> None:
        """Reverts every recorded change, newest first."""
        self._replaced.clear()
        while self._undo:
            self._undo.pop()()
        for key in set(self.graph.get_all_collection_keys()) | set(self._initial):
            self.graph.get_collection_ref(key)[:] = self._initial.get(key, [])
        graph_state(self.graph).restore(self._state)
        self._known = {k: list(v) for k, v in self._initial.items()}
        self.changes.append(Change("(rewriter)", "undo", "all changes reverted"))

    def record(self) -> dict:
        """What each rule did, by op: {"built": {op name: rule}, "edges":
        [{op, input (index or "control"), old, new, rule}]} (read by
        `graphmod diff`, written beside the graph dumps)."""
        return dict(built=dict(self._built), edges=list(self._edges))

    def summary(self) -> Dict[str, Dict[str, int]]:
        """Graph edits by rule and kind (state writes are not edits of the graph)."""
        out: Dict[str, Dict[str, int]] = {}
        for c in (c for c in self.changes if c.kind != "state"):
            out.setdefault(c.rule, {}).setdefault(c.kind, 0)
            out[c.rule][c.kind] += 1
        return out


def _label(item: Any) -> str:
    name = getattr(item, "name", None)
    return name if isinstance(name, str) else type(item).__name__
