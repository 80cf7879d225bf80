"""The interface every rewrite rule implements, and the registry that orders them.

A rule is a module (one per rule in graphmod.rewrite_rules) defining
  NAME: str, the name the Rewriter records its changes under;
  AFTER: tuple of the NAMEs of rules whose results it reads (default none);
  check(conversion, context) -> result or None (optional; default: accepts):
    raises Refused(reason) when the rule cannot rewrite this variable
    faithfully (the variable then stays dense and the report says why); what
    it returns is its match, which any rule's rewrite may read with
    context.match(NAME, conversion);
  rewrite(rw, conversions, context) -> None: makes its changes for the
    conversions every rule accepted, only through rw (a Rewriter), and files
    what it built for a variable with context.build(NAME, conversion, result);
    later rules read it with context.built(NAME, conversion) and never
    change it.
The pipeline (graphmod.rewrite.pipeline) runs every check, then every rewrite
in registry order. Conversions (the planner's facts) are frozen; when a later
rule replaces an op or tensor a result holds (fusing, sharding), reading the
result gives the replacement (the Rewriter records every replacement).
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
    """What rules share during one rewrite (facts every rule reads, each
    rule's match and results), and what they report back."""
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
    # Follows a replaced op or tensor to its replacement (Rewriter.current).
    current: Callable[[Any], Any] = lambda x: x
    # What the rules report (see graphmod.rewrite.report).
    unsqueezed: List[str] = dataclasses.field(default_factory=list)
    squeezed_kept: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    dense_bytes_freed: int = 0
    # single-table op type -> [ops fused, fused ops built] (fuse_table_ops)
    fused: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    # variables whose tables adopt their rows from a dense checkpoint (table_saver)
    adopted: List[str] = dataclasses.field(default_factory=list)
    counters: Dict[str, Dict[str, tf.Tensor]] = dataclasses.field(default_factory=dict)
    warm_started: List[str] = dataclasses.field(default_factory=list)  # warm_start_sources
    # tiered table -> "" (the input pipeline prefetches its rows) or why not (tier_prefetch)
    prefetch: Dict[str, str] = dataclasses.field(default_factory=dict)
    # variable -> the approximations rules accepted for it
    approximations: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    _matches: Dict[Tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    _built: Dict[Tuple[str, str], Any] = dataclasses.field(default_factory=dict)

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

    def matched(self, rule: str, conversion, value: Any) -> None:
        self._matches[(rule, conversion.name)] = value

    def match(self, rule: str, conversion) -> Any:
        """What rule's check returned for the conversion (None: nothing)."""
        return self._matches.get((rule, conversion.name))

    def build(self, rule: str, conversion, result: Any) -> None:
        """Files what rule built for the conversion."""
        self._built[(rule, conversion.name)] = result

    def built(self, rule: str, conversion, default: Any = None) -> Any:
        """What rule built for the conversion, with every op and tensor in it
        that a later rule replaced followed to its replacement."""
        return _follow(self._built.get((rule, conversion.name), default), self.current)


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
