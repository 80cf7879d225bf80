"""Two graphs compared as graphs: ops added, removed and rerouted.

Nodes are matched by name. A node in both graphs whose inputs differ is
rerouted (each changed input listed, data or control). Changes are grouped
per converted variable and its table (from the rewrite's report when it is
present, else from the `graphmod/<table>/` scopes the rewrite builds in),
and each is named with the rule that made it when the rewrite's record
(graphmod.rewrite.rewriter.Rewriter.record) is present.
"""
import dataclasses
from typing import Dict, List, Optional

from tensorflow.core.framework import graph_pb2, node_def_pb2

SHARED = "(shared: fused ops, exchanges, savers)"
OTHER = "(other)"


@dataclasses.dataclass
class Change:
    kind: str               # "added", "removed" or "rerouted"
    op: str                 # node name
    type: str               # op type
    rule: Optional[str]     # the rule that made it, when the record says
    detail: str = ""        # rerouted: which inputs changed

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Group:
    name: str                        # a variable and its table, SHARED or OTHER
    variable: Optional[str] = None
    table: Optional[str] = None
    changes: List[Change] = dataclasses.field(default_factory=list)

    @property
    def rules(self) -> List[str]:
        return sorted({c.rule for c in self.changes if c.rule})

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.changes)


@dataclasses.dataclass
class GraphDiff:
    before_ops: int
    after_ops: int
    groups: List[Group]
    skipped: List[dict]              # variables the report says stayed dense, with why
    # name -> NodeDef of both graphs, for the drawings (not in the JSON)
    before: Dict[str, node_def_pb2.NodeDef]
    after: Dict[str, node_def_pb2.NodeDef]

    @property
    def changes(self) -> List[Change]:
        return [c for g in self.groups for c in g.changes]

    def to_json(self) -> dict:
        return dict(before_ops=self.before_ops, after_ops=self.after_ops,
                    added=sum(g.count("added") for g in self.groups),
                    removed=sum(g.count("removed") for g in self.groups),
                    rerouted=sum(g.count("rerouted") for g in self.groups),
                    groups=[dict(name=g.name, variable=g.variable, table=g.table, rules=g.rules,
                                 changes=[c.to_json() for c in g.changes])
                            for g in self.groups],
                    left_dense=self.skipped)


def _source(name: str) -> str:
    """The node an input string names ("^a", "a:1" -> "a")."""
    return name.lstrip("^").split(":")[0]


def diff(before: graph_pb2.GraphDef, after: graph_pb2.GraphDef,
         record: Optional[dict] = None, report: Optional[dict] = None) -> GraphDiff:
    old = {n.name: n for n in before.node}
    new = {n.name: n for n in after.node}
    built = (record or {}).get("built", {})
    edge_rules = {(e["op"], str(e["input"])): e["rule"] for e in (record or {}).get("edges", [])}
    changes = [Change("added", n, node.op, built.get(n)) for n, node in new.items() if n not in old]
    changes += [Change("removed", n, node.op, None) for n, node in old.items() if n not in new]
    changes += [_rerouted(old[n], node, edge_rules) for n, node in new.items()
                if n in old and old[n].input != node.input]
    groups = _group(changes, old, new, report)
    skipped = list((report or {}).get("skipped", []))
    return GraphDiff(len(old), len(new), groups, skipped, old, new)


def _rerouted(old, new, edge_rules) -> Change:
    a, b = list(old.input), list(new.input)
    data_a = [x for x in a if not x.startswith("^")]
    data_b = [x for x in b if not x.startswith("^")]
    parts, rules = [], []
    for i in range(max(len(data_a), len(data_b))):
        x = data_a[i] if i < len(data_a) else None
        y = data_b[i] if i < len(data_b) else None
        if x != y:
            parts.append(f"input {i}: {x} -> {y}")
            rules.append(edge_rules.get((new.name, str(i))))
    control_a = {x for x in a if x.startswith("^")}
    control_b = {x for x in b if x.startswith("^")}
    parts += [f"waits no more for {x}" for x in sorted(control_a - control_b)]
    parts += [f"waits for {x}" for x in sorted(control_b - control_a)]
    if control_a != control_b:
        rules.append(edge_rules.get((new.name, "control")))
    rule = next((r for r in rules if r), None)
    return Change("rerouted", new.name, new.op, rule, "; ".join(parts))


def _tables(report: Optional[dict], added, old) -> List[tuple]:
    """(variable, table) pairs: the report's, else those of the table ops
    (`graphmod/<table>/table`) among the added ops, each with the variable
    of its name when the graph before had one (the hook names a table after
    its variable)."""
    if report and report.get("tables"):
        return [(t["variable"], t["table"]) for t in report["tables"]]
    found = sorted(n.name[len("graphmod/"):-len("/table")] for n in added
                   if n.op == "GraphmodTable" and n.name.startswith("graphmod/")
                   and n.name.endswith("/table"))
    return [(t if t in old else None, t) for t in found]


def _group(changes: List[Change], old, new, report) -> List[Group]:
    pairs = _tables(report, [new[c.op] for c in changes if c.kind == "added"], old)
    groups = [Group(f"{v} -> table {t}" if v else f"table {t}", v, t) for v, t in pairs]
    shared, other = Group(SHARED), Group(OTHER)

    def owner(name: str, node) -> Group:
        for g in groups:
            if g.table and (name.startswith(f"graphmod/{g.table}/") or
                            name.startswith(f"{g.table}/graphmod")):
                return g
            v = g.variable
            if v and (name == v or name.startswith(v + "/") or f"/update_{v}/" in name
                      or name.startswith(f"update_{v}/")):
                return g
        if name in new and name not in old:  # added: by the table it reads
            read = {id(g): g for source in map(_source, new[name].input) for g in groups
                    if g.table and source.startswith(f"graphmod/{g.table}/")}
            if len(read) == 1:
                return next(iter(read.values()))
            if read:
                return shared  # a fused op of several tables
        if name in new and name in old:  # rerouted: by the variable it read
            forward = name.split("/")[1][:-len("_grad")] if name.startswith("gradients/") and \
                name.count("/") > 1 and name.split("/")[1].endswith("_grad") else None
            for candidate in [name] + ([forward] if forward else []):
                g = reader(candidate)
                if g is not None:
                    return g
            for source in set(map(_source, old[name].input)) - set(map(_source, new[name].input)):
                g = reader(source)
                if g is not None:
                    return g
            for source in map(_source, new[name].input):
                for g in groups:
                    if g.table and source.startswith(f"graphmod/{g.table}/"):
                        return g
        if name.startswith("save"):
            return shared
        g = feeds(name)
        if g is not None:
            return g
        if name.startswith(("graphmod", "graphmod_")):
            return shared
        return other

    consumers: Dict[str, List[str]] = {}  # data edges only
    for node in new.values():
        for x in node.input:
            if not x.startswith("^"):
                consumers.setdefault(_source(x), []).append(node.name)
    by_table = {g.table: g for g in groups if g.table}

    def scope_of(name: str):
        """The group whose `graphmod/<table>/` scope holds op `name`."""
        parts = name.split("/")
        if parts[0] != "graphmod":
            return None
        for end in range(2, len(parts)):  # a table's name may hold "/"
            g = by_table.get("/".join(parts[1:end]))
            if g is not None:
                return g
        return None

    def feeds(name: str, limit: int = 2000):
        """The table whose ops are the nearest the op `name` (of the new
        graph) feeds by data, when one table's alone, not through a fused op
        of several tables (the unsqueezed keys of a table's ids, the id
        plumbing rerouted to them); None past `limit` ops."""
        frontier, seen = [name], {name}
        while frontier and len(seen) < limit:
            step, found = [], {}
            for n in frontier:
                for c in consumers.get(n, []):
                    if c in seen or c.startswith("graphmod/fused_"):
                        continue
                    seen.add(c)
                    g = scope_of(c)
                    if g is not None:
                        found[id(g)] = g
                    step.append(c)
            if found:
                return next(iter(found.values())) if len(found) == 1 else None
            frontier = step
        return None

    def reader(name: str, depth: int = 3):
        """The group whose variable the op `name` (of the old graph) reads,
        directly or through a few ops (a gather reads the variable's value)."""
        node = old.get(name)
        if node is None or depth == 0:
            return None
        for g in groups:
            v = g.variable
            if v and any(_source(x) == v or _source(x).startswith(v + "/") for x in node.input):
                return g
        for x in node.input:
            g = reader(_source(x), depth - 1)
            if g is not None:
                return g
        return None

    for c in changes:
        owner(c.op, new.get(c.op) or old.get(c.op)).changes.append(c)
    return [g for g in groups + [shared, other] if g.changes]
