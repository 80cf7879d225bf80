"""The interface every rewrite rule implements, and the registry that orders them.

A rule is a module (one per rule in graphmod.rewrite_rules) defining
  NAME: str, the name the Rewriter records its changes under;
  AFTER: tuple of the NAMEs of rules whose results it reads (default none);
  check(conversion, context) -> result or None (optional; default: accepts):
    raises Refused(reason) when the rule cannot rewrite this variable
    faithfully (the variable then stays dense and the report says why); what
    it returns (its match) is filed as its result for the conversion;
  rewrite(rw, conversions, context) -> None: makes its changes for the
    conversions every rule accepted, only through rw (a Rewriter), and files
    what it built with context.build(result, conversion) (no conversion: for
    the whole graph); any rule reads a result by its class (each rule has its
    own), context.built(TheClass, conversion), and never changes it.
The pipeline (graphmod.rewrite.pipeline) runs every check, then every rewrite
in registry order, and reads every result alike, naming no rule: one filed
for the whole graph is a NamedTuple of RewriteReport fields; one filed for a
conversion may define table_entry() and plan_entry() (fields of its entries
in the report's tables and in the saved plan). Conversions (the planner's
facts) are frozen; when a later rule replaces an op or tensor a result holds
(fusing, sharding), reading the result gives the replacement (the Rewriter
records every replacement).
"""
import dataclasses
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from graphmod.rewrite.plan import checkpoint_name


class Refused(Exception):
    """A rule cannot convert a variable faithfully; the message says why."""


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    after: Tuple[str, ...]
    check: Optional[Callable]
    rewrite: Callable


def registry(*modules: types.ModuleType) -> Tuple[Rule, ...]:
    """The rules of modules, in this order; raises ValueError when a rule
    comes before one it declares it runs AFTER, or a name repeats."""
    rules: List[Rule] = []
    for m in modules:
        rule = Rule(m.NAME, tuple(getattr(m, "AFTER", ())), getattr(m, "check", None), m.rewrite)
        earlier = {r.name for r in rules}
        if rule.name in earlier:
            raise ValueError(f"graphmod: rewrite rule '{rule.name}' is listed twice")
        missing = [a for a in rule.after if a not in earlier]
        if missing:
            raise ValueError(f"graphmod: rewrite rule '{rule.name}' runs after "
                             f"{', '.join(missing)}, which the registry lists later or not at all")
        rules.append(rule)
    return tuple(rules)


@dataclasses.dataclass
class Context:
    """What rules share during one rewrite: facts every rule reads, the
    approximations they accept, and what each matched and built."""
    graph: tf.Graph
    training: bool
    collision_free: bool
    exact: bool
    # Horovod ranks the model runs on: above 1, tables are sharded across
    # them (rewrite_rules.shard_exchange).
    ranks: int = 1
    # ps tasks of the parameter-server cluster the model runs in: above 1,
    # tables of variables on ps tasks are sharded over them (rewrite_rules.ps_shards).
    ps_tasks: int = 0
    # Names in model_dir's latest checkpoint (empty: none), which the Saver
    # will restore instead of running initializers.
    checkpoint_names: frozenset = frozenset()
    # The model's Scaffold brings its own Saver (Estimator.train): graphmod's
    # TableSaver would never be used.
    scaffold_saver: bool = False
    # graphmod.WarmStartSettings of a fresh training start (rule warm_start_sources)
    warm_start: Any = None
    # Under Horovod, the next step's ids may go to their owners during this
    # step (rule shard_exchange; GraphModifierHook(ids_ahead=...))
    ids_ahead: bool = True
    # Follows a replaced op or tensor to its replacement (Rewriter.current).
    current: Callable[[Any], Any] = lambda x: x
    # variable -> the approximations rules accepted for it
    approximations: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    # conversion name (None: the whole graph) -> the results filed for it
    _results: Dict[Optional[str], List[Any]] = dataclasses.field(default_factory=dict)

    def held_densely(self, conversion) -> bool:
        """The latest checkpoint holds the variable densely (not as a table):
        its table adopts the trained rows (rewrite_rules.table_saver)."""
        names = self.checkpoint_names
        return (checkpoint_name(conversion.variable) in names
                and f"{conversion.table_name}-keys" not in names)

    def approximate(self, conversion, what: str) -> None:
        """Notes an approximation the report states for the conversion's variable."""
        notes = self.approximations.setdefault(conversion.name, [])
        if what not in notes:
            notes.append(what)

    def build(self, result: Any, conversion=None) -> None:
        """Files a rule's result (None: nothing) for the conversion, or for the whole graph."""
        if result is not None:
            self._results.setdefault(getattr(conversion, "name", None), []).append(result)

    def built(self, kind: type, conversion=None) -> Any:
        """The result of class kind filed for the conversion or the graph (None: none)."""
        return next(iter(self.results(conversion, kind)), None)

    def report_fields(self) -> Dict[str, Any]:
        """The RewriteReport fields that the results filed for the whole graph
        give (each a NamedTuple of such fields; no two give the same one)."""
        fields: Dict[str, Any] = {}
        for r in self.results():
            if fields.keys() & r._fields:
                raise ValueError(f"graphmod: two rule results give the report's "
                                 f"{sorted(fields.keys() & r._fields)}")
            fields.update(r._asdict())
        return fields

    def results(self, conversion=None, kind: type = object) -> List[Any]:
        """The results (of class kind) filed for the conversion or the whole
        graph, with every op and tensor in them that a later rule replaced
        followed to its replacement."""
        filed = self._results.get(getattr(conversion, "name", None), [])
        return [_follow(r, self.current) for r in filed if isinstance(r, kind)]


def _follow(value: Any, current: Callable[[Any], Any]) -> Any:
    if isinstance(value, (tf.Tensor, tf.Operation)):
        return current(value)
    if isinstance(value, list):
        return [_follow(v, current) for v in value]
    if isinstance(value, tuple):
        return type(value)(*(_follow(v, current) for v in value)) if hasattr(value, "_fields") \
            else tuple(_follow(v, current) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _follow(getattr(value, f.name), current)
                                             for f in dataclasses.fields(value) if f.init})
    return value
