"""Every setting of graphmod's tables and rewrite: its default and its
validation, written once. create_table, FeatureSpec, TableSettings and
GraphModifierHook all validate here, naming what they configure.

>>> graphmod.TableSettings(max_rows=1_000_000, when_full="lfu", access_threshold=3)
"""
import dataclasses
import fnmatch
from typing import Any, Callable, Dict, Optional

MIN_ROWS = 10_000  # identity-indexed variables this large convert (GraphModifierHook)
UNITS = ("seconds", "steps")
# How a table stores rows (native/row_codec.h): float32, or fewer bytes a row.
STORAGE_DTYPES = ("float32", "float16", "bfloat16", "int8")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A field of TableSettings, its default and what it must be (`valid`, in
    words `must`). With an `attr`, a create_table keyword kept as a `kind` in
    that attribute of the table op (native/ops.cc): None as `unset`, or as
    the bool attribute `none_attr` where no value of the kind is free."""
    name: str
    kind: Any
    default: Any = None
    must: str = ""
    valid: Optional[Callable[[Any], bool]] = None
    attr: Optional[str] = None
    unset: Any = None
    none_attr: Optional[str] = None

    def op_attrs(self, value) -> Dict[str, Any]:
        attrs = {self.none_attr: value is None} if self.none_attr else {}
        return {**attrs, self.attr: self.unset if value is None else self.kind(value)}

    def read(self, op) -> Any:
        value = op.get_attr(self.attr)
        value = value.decode() if isinstance(value, bytes) else value
        unset = op.get_attr(self.none_attr) if self.none_attr else value == self.unset
        return None if unset else value


# TableSettings' fields in its constructor's order; docs/extending.md (d)
# adds one, tests/test_settings_declaration.py holds the table op to them.
SETTINGS = (
    Setting("initializer", Any),
    Setting("default_value", float, attr="default_value", unset=0.0,
            none_attr="missing_is_initializer"),
    Setting("max_rows", int, None, "a positive integer or None",
            lambda v: v is None or _is_int(v) and v > 0, "max_rows", -1),
    Setting("when_full", str, "lru", "'lru', 'lfu' or 'refuse'",
            lambda v: v in ("lru", "lfu", "refuse"), "when_full"),
    Setting("num_shards", int, 16, "a power of two in [1, 4096]",
            lambda v: _is_int(v) and 1 <= v <= 4096 and not v & (v - 1), "num_shards"),
    *(Setting(name, int, -1, "an integer >= -1 (-1 disables)", lambda v: _is_int(v) and v >= -1)
      for name in ("access_threshold", "eviction_threshold")),
    Setting("eviction_unit", str, "seconds", f"one of {UNITS}", lambda v: v in UNITS),
    Setting("admission_sketch_width", int, None, "None or an integer in [1, 2**32]",
            lambda v: v is None or _is_int(v) and 0 < v <= 2**32, "sketch_width", 0),
    # Shard layouts (native/shard_storage.h): one memory miss a key, or fewer bytes.
    Setting("layout", str, "arena", "'buckets' or 'arena'", lambda v: v in ("buckets", "arena"),
            "layout"),
    Setting("memory_budget", float, None, "None (every row in memory), a fraction of rows in "
            "(0, 1] or a number of bytes (an integer > 1)",
            lambda v: v is None or _is_int(v) and v >= 1 or isinstance(v, float) and 0 < v <= 1,
            "memory_budget", 0.0),
    Setting("storage_path", str, None, "a directory path",
            lambda v: v is None or isinstance(v, str) and v != "", "storage_path", ""),
    # Rows stored smaller, on request: an approximation the report states.
    Setting("storage_dtype", str, "float32", f"one of {STORAGE_DTYPES}",
            lambda v: v in STORAGE_DTYPES, "storage_dtype"),
    Setting("slot_storage_dtype", str, None, f"None (as storage_dtype) or one of {STORAGE_DTYPES}",
            lambda v: v is None or v in STORAGE_DTYPES, "slot_storage_dtype", ""),
    Setting("prefetch", bool, True),
    Setting("placement", str, "auto", "'auto', 'sharded' or 'replicated'",
            lambda v: v in ("auto", "sharded", "replicated")),
    Setting("convert", bool, True),
)
TABLE_SETTINGS = tuple(s for s in SETTINGS if s.attr)


def check(owner: str, values: Dict[str, Any]) -> None:
    """Raises ValueError naming owner (a table, feature or pattern) for a bad setting."""
    for s in SETTINGS:
        if s.name in values and s.valid is not None and not s.valid(values[s.name]):
            raise ValueError(f"{owner}: {s.name} must be {s.must}, got {values[s.name]!r}")
    memory_budget, storage_path = values.get("memory_budget"), values.get("storage_path")
    if (memory_budget is None) != (storage_path is None):
        raise ValueError(f"{owner}: memory_budget and storage_path go together (what stays in "
                         f"memory, and the local directory for the rest), got memory_budget="
                         f"{memory_budget!r}, storage_path={storage_path!r}")
    if memory_budget is not None and values.get("max_rows") is not None:
        raise ValueError(f"{owner}: max_rows and a memory_budget together are not supported "
                         f"yet (a full table would evict among the rows in memory, the most "
                         f"recently used); bound the table by eviction_threshold instead")


def check_policy(owner: str, access_threshold, eviction_threshold, eviction_unit) -> None:
    check(owner, dict(access_threshold=access_threshold, eviction_threshold=eviction_threshold,
                      eviction_unit=eviction_unit))


def table_attrs(owner: str, given: Dict[str, Any]) -> Dict[str, Any]:
    """The table op's attributes for create_table's settings given and defaults, checked."""
    unknown = sorted(set(given) - {s.name for s in TABLE_SETTINGS})
    if unknown:
        raise TypeError(f"{owner}: create_table has no setting {', '.join(unknown)}")
    values = {s.name: given.get(s.name, s.default) for s in TABLE_SETTINGS}
    check(owner, values)
    return {a: v for s in TABLE_SETTINGS for a, v in s.op_attrs(values[s.name]).items()}


@dataclasses.dataclass(frozen=True)
class TablePolicy:
    """Admission and eviction settings of one table (-1 disables either)."""
    access_threshold: int = -1
    eviction_threshold: int = -1
    eviction_unit: str = "seconds"

    @property
    def evicts(self) -> bool:
        return self.eviction_threshold >= 0


NO_POLICY = TablePolicy()


@dataclasses.dataclass
class TableSettings(dataclasses.make_dataclass(
        "TableSettings", [(s.name, s.kind if s.default is not None else Optional[s.kind],
                           s.default) for s in SETTINGS])):
    """Per-table settings of the hook; None inherits from the variable / defaults.

    Training decides them; evaluation and prediction graphs of a model read
    its tables as training built them, except for default_value (what they
    read for ids the table has never seen), which they may set.

    initializer, default_value, max_rows, when_full, num_shards,
    admission_sketch_width, layout, memory_budget, storage_path, storage_dtype
    and slot_storage_dtype are those of graphmod.create_table; prefetch
    (with a memory_budget): the input pipeline brings up each step's rows
    from disk while the step before trains, where it can compute the step's
    keys (rewrite_rules.tier_prefetch; it costs a second pass over the
    keys, which pays where a core is free or reads wait on the disk);
    False: each step reads its own;
    access_threshold, eviction_threshold and eviction_unit those of
    graphmod.FeatureSpec; placement, on several Horovod ranks: "sharded"
    (each key's row on one rank), "replicated" (every row on every rank) or
    "auto" (graphmod.horovod.placement decides); convert=False keeps the
    variable dense.
    """
    def __post_init__(self):
        check("TableSettings", {s.name: getattr(self, s.name) for s in SETTINGS})

    @property
    def policy(self) -> TablePolicy:
        return TablePolicy(self.access_threshold, self.eviction_threshold, self.eviction_unit)

    def table_kwargs(self) -> Dict[str, Any]:
        return {s.name: getattr(self, s.name) for s in TABLE_SETTINGS}


@dataclasses.dataclass
class RewriteSettings:
    """What the rewrite converts; the GraphModifierHook's arguments of the
    same names (tables: {fnmatch pattern: TableSettings or a dict of its fields})."""
    min_rows: int = MIN_ROWS
    tables: Dict[str, TableSettings] = dataclasses.field(default_factory=dict)
    collision_free: bool = True
    exact: bool = False
    warm_start: Any = None  # a graphmod.WarmStartSettings (fresh training starts only)
    ids_ahead: bool = True  # under Horovod, exchange the next step's ids during this one

    def __post_init__(self):
        if not _is_int(self.min_rows) or self.min_rows < 0:
            raise ValueError(f"GraphModifierHook: min_rows must be an integer >= 0, "
                             f"got {self.min_rows!r}")
        tables = {}
        for pattern, settings in (self.tables or {}).items():
            if isinstance(settings, dict):
                try:
                    settings = TableSettings(**settings)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"GraphModifierHook: bad settings for tables pattern "
                                     f"'{pattern}': {e}") from None
            if not isinstance(settings, TableSettings):
                raise TypeError(f"GraphModifierHook: settings for '{pattern}' must be a dict "
                                f"or TableSettings, got {type(settings).__name__}")
            tables[pattern] = settings
        self.tables = tables
        self.collision_free, self.exact = bool(self.collision_free), bool(self.exact)
        self.ids_ahead = bool(self.ids_ahead)

    def table_settings(self, name: str) -> Optional[TableSettings]:
        return next((s for p, s in self.tables.items() if fnmatch.fnmatchcase(name, p)), None)
