"""Every setting of graphmod's tables and rewrite: its default and its
validation, written once. create_table, FeatureSpec, TableSettings and
GraphModifierHook all validate here, naming what they configure.

>>> graphmod.TableSettings(max_rows=1_000_000, when_full="lfu", access_threshold=3)
"""
import dataclasses
import fnmatch
from typing import Any, Dict, Optional

MIN_ROWS = 10_000  # identity-indexed variables this large convert (GraphModifierHook)
NUM_SHARDS = 16
WHEN_FULL = ("lru", "lfu", "refuse")
# Shard layouts (native/shard_storage.h): one memory miss a key, or fewer bytes.
LAYOUTS = ("buckets", "arena")
UNITS = ("seconds", "steps")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_table(owner: str, num_shards, max_rows, when_full, admission_sketch_width,
                layout="arena", memory_budget=None, storage_path=None) -> None:
    """Raises ValueError naming owner (a table or pattern) for a bad table setting."""
    if not _is_int(num_shards) or not 1 <= num_shards <= 4096 or num_shards & (num_shards - 1):
        raise ValueError(f"{owner}: num_shards must be a power of two in [1, 4096], "
                         f"got {num_shards!r}")
    if max_rows is not None and (not _is_int(max_rows) or max_rows <= 0):
        raise ValueError(f"{owner}: max_rows must be a positive integer or None, "
                         f"got {max_rows!r}")
    if admission_sketch_width is not None and (not _is_int(admission_sketch_width) or
                                               not 0 < admission_sketch_width <= 2**32):
        raise ValueError(f"{owner}: admission_sketch_width must be None or an integer in "
                         f"[1, 2**32], got {admission_sketch_width!r}")
    if when_full not in WHEN_FULL:
        raise ValueError(f"{owner}: when_full must be 'lru', 'lfu' or 'refuse', "
                         f"got {when_full!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"{owner}: layout must be 'buckets' or 'arena', got {layout!r}")
    check_tier(owner, memory_budget, storage_path)
    if memory_budget is not None and max_rows is not None:
        raise ValueError(f"{owner}: max_rows and a memory_budget together are not supported "
                         f"yet (a full table would evict among the rows in memory, the most "
                         f"recently used); bound the table by eviction_threshold instead")


def check_tier(owner: str, memory_budget, storage_path) -> None:
    """A disk tier: memory_budget a fraction of rows in (0, 1] or bytes (an
    integer > 1), and a storage_path (a local directory) with it; or neither."""
    if memory_budget is not None and (isinstance(memory_budget, bool) or
                                      not isinstance(memory_budget, (int, float)) or
                                      not 0 < memory_budget <= 1 and not
                                      (_is_int(memory_budget) and memory_budget > 1)):
        raise ValueError(f"{owner}: memory_budget must be None (every row in memory), a "
                         f"fraction of rows in (0, 1] or a number of bytes (an integer > 1), "
                         f"got {memory_budget!r}")
    if storage_path is not None and (not isinstance(storage_path, str) or not storage_path):
        raise ValueError(f"{owner}: storage_path must be a directory path, got {storage_path!r}")
    if (memory_budget is None) != (storage_path is None):
        raise ValueError(f"{owner}: memory_budget and storage_path go together (what stays in "
                         f"memory, and the local directory for the rest), got memory_budget="
                         f"{memory_budget!r}, storage_path={storage_path!r}")


def check_policy(owner: str, access_threshold, eviction_threshold, eviction_unit) -> None:
    """Raises ValueError naming owner (a table, feature or pattern) for bad settings."""
    for what, value in (("access_threshold", access_threshold),
                        ("eviction_threshold", eviction_threshold)):
        if not _is_int(value) or value < -1:
            raise ValueError(f"{owner}: {what} must be an integer >= -1 (-1 disables), "
                             f"got {value!r}")
    if eviction_unit not in UNITS:
        raise ValueError(f"{owner}: eviction_unit must be one of {UNITS}, got {eviction_unit!r}")


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
class TableSettings:
    """Per-table settings of the hook; None inherits from the variable / defaults.

    Training decides them; evaluation and prediction graphs of a model read
    its tables as training built them, except for default_value (what they
    read for ids the table has never seen), which they may set.

    initializer, default_value, max_rows, when_full, num_shards,
    admission_sketch_width, layout, memory_budget and storage_path are those
    of graphmod.create_table; prefetch (with a memory_budget): the input
    pipeline brings up each step's rows from disk while the step before
    trains, where it can compute the step's keys (rewrite_rules.tier_prefetch;
    it costs a second pass over the keys, which pays where a core is free or
    reads wait on the disk); False: each step reads its own;
    access_threshold, eviction_threshold and eviction_unit those of
    graphmod.FeatureSpec; convert=False keeps the variable dense.
    """
    initializer: Any = None
    default_value: Optional[float] = None
    max_rows: Optional[int] = None
    when_full: str = "lru"
    num_shards: int = NUM_SHARDS
    access_threshold: int = -1
    eviction_threshold: int = -1
    eviction_unit: str = "seconds"
    admission_sketch_width: Optional[int] = None
    layout: str = "arena"
    memory_budget: Optional[float] = None
    storage_path: Optional[str] = None
    prefetch: bool = True
    convert: bool = True

    def __post_init__(self):
        check_policy("TableSettings", self.access_threshold, self.eviction_threshold,
                     self.eviction_unit)
        check_table("TableSettings", self.num_shards, self.max_rows, self.when_full,
                    self.admission_sketch_width, self.layout, self.memory_budget,
                    self.storage_path)

    @property
    def policy(self) -> TablePolicy:
        return TablePolicy(self.access_threshold, self.eviction_threshold, self.eviction_unit)


@dataclasses.dataclass
class RewriteSettings:
    """What the rewrite converts; the GraphModifierHook's arguments of the
    same names (tables: {fnmatch pattern: TableSettings or a dict of its fields})."""
    min_rows: int = MIN_ROWS
    tables: Dict[str, TableSettings] = dataclasses.field(default_factory=dict)
    collision_free: bool = True
    exact: bool = False
    warm_start: Any = None  # a graphmod.WarmStartSettings (fresh training starts only)

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

    def table_settings(self, name: str) -> Optional[TableSettings]:
        return next((s for p, s in self.tables.items() if fnmatch.fnmatchcase(name, p)), None)
