"""Where each table's rows live across Horovod ranks: the placement planner.

A table converted in a model that runs on R > 1 Horovod ranks is placed one
of two ways:
  - "sharded": each key's row lives on one owner rank
    (graphmod.embeddings.partition); a step's lookups send the distinct ids
    to their owners and get the rows back, its gradients go back to the
    owners (graphmod.horovod.exchange). Memory per rank: rows / R.
  - "replicated": every rank holds every row. Lookups are local, so the
    table takes no part in the rows' exchange the forward pass waits for;
    each rank's distinct gradient rows are gathered by every rank beside the
    step's allreduces, and every rank applies them all, so the copies stay
    equal. Memory per rank: all rows.
For each table the planner estimates, per placement and rank, the bytes a
step sends, the bytes the forward pass waits for and the memory held, and
picks "replicated" for a tiny table (its copy fits `REPLICATE_MAX_BYTES`)
that can be: one whose rows move the same on every rank's copy, that is,
without admission, eviction, a row bound or a disk tier (each counts or
evicts by its own rank's use). Everything else is sharded.
TableSettings(placement="sharded" | "replicated") overrides the choice.

Not offered: a table whole on one rank (TorchRec's table-wise). In
graphmod's one all-to-all per step it sends the same bytes as sharding it
(every other rank's ids go to the one owner) while that rank holds all its
rows and serves all its lookups.

Checkpoints do not depend on the placement: every rank writes the keys it
owns (a replicated copy filters by owner when it saves), so a model trained
with one placement restores into any other, and onto any number of ranks.

>>> place(TableShape("user", rows=50, dim=8, slots=1, ids_per_step=4096), ranks=2).placement
'replicated'
"""
import dataclasses
import math
from typing import Dict, Optional

PLACEMENTS = ("auto", "sharded", "replicated")
# A table whose copy holds at most this many bytes is replicated (auto).
REPLICATE_MAX_BYTES = 1 << 20
# Bytes a row costs beside its floats (key, index, counters): measured
# 101.8 B/key for dim 16 and no slots (docs/benchmarks.md), 64 of them floats.
ROW_OVERHEAD_BYTES = 40
# What a training exchange sends (graphmod.horovod.exchange): per distinct id
# 3 int64 (id, count, table), per row back its floats and the refused
# count, per gradient row its floats.
_ID_BYTES = 24


@dataclasses.dataclass(frozen=True)
class TableShape:
    """What the planner knows of a table: its rows (the variable's, or
    max_rows), dim, optimizer slots, ids a rank's training step reads (None:
    unknown, as a dynamic batch size), and "" or why it cannot be replicated."""
    name: str
    rows: int
    dim: int
    slots: int = 0
    ids_per_step: Optional[int] = None
    not_replicable: str = ""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per rank: bytes a training step sends other ranks, of them the bytes
    its forward pass waits for (the rows back), and bytes of rows held.
    None where the ids per step are unknown."""
    bytes_per_step: Optional[int]
    waited_bytes: Optional[int]
    memory_bytes: int


@dataclasses.dataclass(frozen=True)
class Choice:
    placement: str
    why: str
    estimates: Dict[str, Estimate]

    def report(self) -> dict:
        return dict(placement=self.placement, placement_why=self.why,
                    placement_estimates={p: dataclasses.asdict(e)
                                         for p, e in self.estimates.items()})


def distinct_ids(ids: int, rows: int) -> float:
    """Expected distinct ids among `ids` drawn uniformly from `rows` (an
    upper bound for skewed ids, whose repeats are more)."""
    if rows <= 0 or ids <= 0:
        return 0.0
    return rows * -math.expm1(ids * math.log1p(-1.0 / rows)) if rows > 1 else 1.0


def row_bytes(shape: TableShape) -> int:
    return 4 * shape.dim * (1 + shape.slots) + ROW_OVERHEAD_BYTES


def estimate(shape: TableShape, placement: str, ranks: int) -> Estimate:
    """The placement's estimate for one rank of `ranks` (see Estimate)."""
    if placement == "sharded":
        memory = row_bytes(shape) * -(-shape.rows // ranks)
    else:
        memory = row_bytes(shape) * shape.rows
    if shape.ids_per_step is None:
        return Estimate(None, None, memory)
    d = distinct_ids(shape.ids_per_step, shape.rows)
    others = (ranks - 1) / ranks  # the share of a rank's ids other ranks own
    if placement == "sharded":
        # Ids to their owners, rows back (dim floats and the refused count),
        # gradient rows to the owners (graphmod.horovod.exchange).
        waited = d * others * 4 * (shape.dim + 1)
        sent = d * others * (_ID_BYTES + 4 * shape.dim) + waited
        return Estimate(round(sent), round(waited), memory)
    # Each rank's distinct keys and gradient rows, to every other rank.
    return Estimate(round(d * (ranks - 1) * (8 + 4 * shape.dim)), 0, memory)


def place(shape: TableShape, ranks: int, forced: str = "auto") -> Choice:
    """The table's placement on `ranks` ranks: forced ("sharded" or
    "replicated", TableSettings.placement) where given, else the planner's
    (see the module docstring). Raises ValueError, naming the table, when it
    is forced to be replicated and cannot be."""
    estimates = {p: estimate(shape, p, ranks) for p in ("sharded", "replicated")}
    copy = estimates["replicated"].memory_bytes
    if forced == "replicated" and shape.not_replicable:
        raise ValueError(f"graphmod: table '{shape.name}' cannot be replicated "
                         f"(TableSettings(placement='replicated')): {shape.not_replicable}")
    if forced != "auto":
        placement, why = forced, "TableSettings(placement=...)"
    elif shape.not_replicable:
        placement, why = "sharded", f"not replicable: {shape.not_replicable}"
    elif copy <= REPLICATE_MAX_BYTES:
        placement, why = "replicated", (f"its copy ({_mib(copy)}) fits "
                                        f"{_mib(REPLICATE_MAX_BYTES)} on every rank")
    else:
        placement, why = "sharded", (f"a copy ({_mib(copy)}) is over "
                                     f"{_mib(REPLICATE_MAX_BYTES)} per rank")
    return Choice(placement, why, estimates)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"
