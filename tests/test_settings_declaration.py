"""graphmod/settings.py's SETTINGS is the one declaration of the table
settings: TableSettings, create_table, the Table handle and the GraphmodTable
op's attributes (native/ops.cc, which a ps shard copies) all follow it."""
import dataclasses
import inspect

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import graphmod
from graphmod.settings import SETTINGS, TABLE_SETTINGS

# The table op's attributes that hold no setting: create_table sets them from
# its name, dim, optimizer, initializer and seed.
OWN = {"container", "shared_name", "table_name", "dim", "num_slots", "slot_init",
       "initializer", "init_a", "init_b", "seed"}
KINDS = {int: "int", float: "float", str: "string", bool: "bool"}


def table_attrs():
    return {a.name: a for a in op_def_registry.get("GraphmodTable").attr}


def test_the_table_op_keeps_each_setting_with_its_type_and_default():
    attrs = table_attrs()
    for s in TABLE_SETTINGS:
        kept = s.op_attrs(s.default)
        for name, kind in ((s.attr, s.kind), (s.none_attr, bool)):
            if name is None:
                continue
            assert name in attrs, f"{s.name}: GraphmodTable has no attribute '{name}'"
            attr = attrs[name]
            assert attr.type == KINDS[kind], f"{s.name}: '{name}' is {attr.type}"
            default = getattr(attr.default_value, attr.default_value.WhichOneof("value"))
            default = default.decode() if isinstance(default, bytes) else default
            assert default == kept[name], f"{s.name}: '{name}' defaults to {default!r}"


def test_every_attribute_of_the_table_op_is_declared():
    declared = {a for s in TABLE_SETTINGS for a in s.op_attrs(s.default)}
    assert set(table_attrs()) - OWN == declared


def test_table_settings_and_create_table_take_the_declared_settings():
    fields = dataclasses.fields(graphmod.TableSettings)
    assert [(f.name, f.default) for f in fields] == [(s.name, s.default) for s in SETTINGS]
    params = inspect.signature(graphmod.create_table).parameters
    for s in TABLE_SETTINGS:
        assert params[s.name].kind == inspect.Parameter.KEYWORD_ONLY
        assert params[s.name].default == s.default
    assert list(graphmod.TableSettings(max_rows=7).table_kwargs()) == \
        [s.name for s in TABLE_SETTINGS]


@pytest.mark.parametrize("given", [
    {},
    dict(default_value=0.5, max_rows=4096, when_full="lfu", num_shards=4,
         admission_sketch_width=64, layout="buckets"),
    dict(default_value=0.0, memory_budget=0.5, storage_path="/tmp/graphmod-tier", num_shards=1),
])
def test_a_table_reads_back_the_settings_it_was_created_with(given):
    with tf.Graph().as_default():
        table = graphmod.create_table("t", 2, **given)
        again = graphmod.Table(table.handle)  # as from an imported MetaGraph
    for s in TABLE_SETTINGS:
        assert getattr(again, s.name) == given.get(s.name, s.default), s.name


@pytest.mark.parametrize("name,bad", [
    ("max_rows", 0), ("when_full", "fifo"), ("num_shards", 3), ("admission_sketch_width", 0),
    ("layout", "rows"), ("memory_budget", 1.5), ("storage_path", ""), ("access_threshold", -2),
    ("eviction_threshold", 1.0), ("eviction_unit", "days"),
])
def test_a_bad_setting_is_named_alike_everywhere(name, bad):
    tier = {"memory_budget": 0.5, "storage_path": "/tmp/x"} if name in ("memory_budget",
                                                                       "storage_path") else {}
    with pytest.raises(ValueError, match=f"^TableSettings: {name} must be .*, got {bad!r}$"):
        graphmod.TableSettings(**{**tier, name: bad})
    if name in {s.name for s in TABLE_SETTINGS}:
        with tf.Graph().as_default(), pytest.raises(
                ValueError, match=f"^graphmod table 't': {name} must be .*, got {bad!r}$"):
            graphmod.create_table("t", 2, **{**tier, name: bad})


def test_create_table_refuses_a_setting_it_does_not_have():
    with tf.Graph().as_default(), pytest.raises(TypeError, match="no setting access_threshold"):
        graphmod.create_table("t", 2, access_threshold=3)
