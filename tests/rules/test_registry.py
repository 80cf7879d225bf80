"""The registry: rules load in an order that respects every AFTER, names are unique."""
import types

import pytest

from graphmod.rewrite.rule import registry
from graphmod.rewrite_rules import (RULES, collisionless_keys, gather_to_lookup,
                                    optimizer_updates, saver_swap)


def _rule(name, after=(), check=None):
    module = types.ModuleType(f"rule_{name}")
    module.NAME = name
    if after:
        module.AFTER = after
    if check is not None:
        module.check = check
    module.rewrite = lambda rw, conversions, context: None
    return module


def test_graphmods_rules_load_in_their_order():
    assert [r.name for r in RULES] == [
        "collisionless_keys", "gather_to_lookup", "dense_reads", "l2_penalties",
        "optimizer_updates", "shard_exchange", "ps_shards", "warm_start", "fuse_table_ops",
        "saver_swap", "horovod_broadcast", "table_saver", "table_counters", "tier_prefetch",
        "warm_start_sources"]
    # Only these rules can refuse a variable (the others have the default no-op check).
    assert [r.name for r in RULES if r.check is not None] == [
        "gather_to_lookup", "l2_penalties", "optimizer_updates", "shard_exchange", "ps_shards",
        "table_saver"]
    for i, rule in enumerate(RULES):
        assert set(rule.after) <= {r.name for r in RULES[:i]}, rule.name


def test_a_rule_listed_before_one_it_runs_after_is_refused():
    with pytest.raises(ValueError, match="'gather_to_lookup' runs after collisionless_keys, "
                                         "which the registry lists later or not at all"):
        registry(gather_to_lookup, collisionless_keys)
    with pytest.raises(ValueError, match="runs after collisionless_keys"):
        registry(gather_to_lookup)  # not listed at all
    with pytest.raises(ValueError, match="'optimizer_updates' runs after l2_penalties"):
        registry(collisionless_keys, gather_to_lookup, optimizer_updates)


def test_a_repeated_name_is_refused():
    with pytest.raises(ValueError, match="'saver_swap' is listed twice"):
        registry(saver_swap, saver_swap)
    with pytest.raises(ValueError, match="'a' is listed twice"):
        registry(_rule("a"), _rule("b"), _rule("a"))


def test_a_rule_module_becomes_a_rule():
    def check(conversion, context):
        return None
    a, b = registry(_rule("a"), _rule("b", after=("a",), check=check))
    assert (a.name, a.after, a.check) == ("a", (), None)  # no check: accepts everything
    assert (b.name, b.after, b.check) == ("b", ("a",), check)
