"""Where each table's rows live across Horovod ranks: the placement planner.

A table converted in a model that runs on R > 1 Horovod ranks is placed one
of two ways:
  - "sharded": each key's row lives on one owner rank
    (graphmod.embeddings.partition); a step's lookups send the distinct ids
    to their owners and get the rows back, its gradients go back to the
    owners (graphmod.horovod.exchange). Memory per rank: rows / R.
  - "replicated": every rank holds every row. Lookups are local, so the
    table takes no part in the rows' exchange the forward pass waits for.
    Its gradient is summed into a dense [rows, dim + 2] tensor (with how
    many gradient rows reached a row and how often the rank's lookups read
    it) and allreduced beside the step's dense gradients (Horovod fuses
    collectives ready in the same cycle); every rank then counts the other
    ranks' reads and applies every row a gradient reached, so the copies
    stay equal. Memory per rank: all rows.
For each table the planner estimates, per placement and rank, the bytes a
step sends, the bytes the forward pass waits for and the memory held, and
picks "replicated" for a tiny table that can be: its copy fits
`REPLICATE_MAX_BYTES`, its allreduce sends no more bytes than sharding it
would (its rows are about as many as the distinct ids a step reads; where
a dynamic batch size hides those, it has at most `REPLICATE_ROWS_UNKNOWN`
rows), its rows move the same on every rank's
copy (no admission, eviction, row bound or disk tier: each counts or
evicts by its own rank's use), and its keys are row numbers (not the
collision-free keys of a hashed column). Everything else is sharded.
TableSettings(placement="sharded" | "replicated") overrides the choice.

Not offered: a table whole on one rank (TorchRec's table-wise). In
graphmod's one all-to-all per step it sends the same bytes as sharding it
(every other rank's ids go to the one owner) while that rank holds all its
rows and serves all its lookups.

Checkpoints do not depend on the placement: every rank writes the keys it
owns (a replicated copy filters by owner when it saves), so a model trained
with one placement restores into any other, and onto any number of ranks.

>>> place(TableShape("country", rows=50, dim=8, slots=1, ids_per_step=4096), ranks=2).placement
'replicated'
"""
import dataclasses
import math
from typing import Dict, Optional, Tuple

from graphmod.embeddings import stored_rows

PLACEMENTS = ("auto", "sharded", "replicated")
# A table whose copy holds at most this many bytes is replicated (auto).
REPLICATE_MAX_BYTES = 1 << 20
# ... and, where the ids a step reads are unknown, at most this many rows
# (about a batch's distinct ids: its allreduce then sends about what one
# batch's exchange would).
REPLICATE_ROWS_UNKNOWN = 1024
# Bytes a row costs beside its floats (key, index, counters): measured
# 101.8 B/key for dim 16 and no slots (docs/benchmarks.md), 64 of them floats.
ROW_OVERHEAD_BYTES = 40
# What a training exchange sends per distinct id (graphmod.horovod.exchange):
# 3 int64 (id, count, table).
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
    forms: Tuple[str, str] = ("float32", "float32")  # how values and slots are stored


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per rank: bytes a training step sends other ranks, of them the bytes
    its forward pass waits for (the rows back), and bytes of rows held.
    Sharded, None where the ids a step reads are unknown."""
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
    values, slots = shape.forms
    return (stored_rows.row_bytes(values, shape.dim)
            + shape.slots * stored_rows.row_bytes(slots, shape.dim) + ROW_OVERHEAD_BYTES)


def estimate(shape: TableShape, placement: str, ranks: int) -> Estimate:
    """The placement's estimate for one rank of `ranks` (see Estimate)."""
    if placement == "replicated":
        # A ring allreduce of the [rows, dim + 2] gradient and counts sends
        # 2 (R - 1) / R of it from each rank; the forward pass waits for nothing.
        return Estimate(round(2 * (ranks - 1) / ranks * shape.rows * 4 * (shape.dim + 2)), 0,
                        row_bytes(shape) * shape.rows)
    memory = row_bytes(shape) * -(-shape.rows // ranks)
    if shape.ids_per_step is None:
        return Estimate(None, None, memory)
    # The distinct ids other ranks own go to them, their rows come back
    # (dim floats and the refused count: what the forward pass waits for),
    # and their gradient rows go to them (dim floats and whether a gradient
    # reached the row: graphmod.horovod.exchange.returned_gradients).
    owned_by_others = distinct_ids(shape.ids_per_step, shape.rows) * (ranks - 1) / ranks
    waited = owned_by_others * 4 * (shape.dim + 1)
    sent = owned_by_others * _ID_BYTES + 2 * waited
    return Estimate(round(sent), round(waited), memory)


def place(shape: TableShape, ranks: int, forced: str = "auto") -> Choice:
    """The table's placement on `ranks` ranks: forced ("sharded" or
    "replicated", TableSettings.placement) where given, else the planner's
    (see the module docstring). Raises ValueError, naming the table, when it
    is forced to be replicated and cannot be."""
    estimates = {p: estimate(shape, p, ranks) for p in ("sharded", "replicated")}
    copy = estimates["replicated"].memory_bytes
    sharded = estimates["sharded"].bytes_per_step
    allreduced = estimates["replicated"].bytes_per_step
    if forced == "replicated" and shape.not_replicable:
        raise ValueError(f"graphmod: table '{shape.name}' cannot be replicated "
                         f"(TableSettings(placement='replicated')): {shape.not_replicable}")
    if forced != "auto":
        placement, why = forced, "TableSettings(placement=...)"
    elif shape.not_replicable:
        placement, why = "sharded", f"not replicable: {shape.not_replicable}"
    elif copy > REPLICATE_MAX_BYTES:
        placement, why = "sharded", (f"a copy ({_mib(copy)}) is over "
                                     f"{_mib(REPLICATE_MAX_BYTES)} per rank")
    elif sharded is not None and allreduced > sharded:
        placement, why = "sharded", (f"its allreduce ({allreduced:,} B a step) would send more "
                                     f"than its exchange ({sharded:,} B)")
    elif sharded is None and shape.rows > REPLICATE_ROWS_UNKNOWN:
        placement, why = "sharded", (f"the ids a step reads are unknown (a dynamic batch size) "
                                     f"and it has over {REPLICATE_ROWS_UNKNOWN} rows")
    else:
        placement, why = "replicated", (f"its copy ({_mib(copy)}) fits "
                                        f"{_mib(REPLICATE_MAX_BYTES)} on every rank" +
                                        (f", its allreduce ({allreduced:,} B a step) sends no "
                                         f"more than its exchange ({sharded:,} B)"
                                         if sharded is not None else ""))
    return Choice(placement, why, estimates)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"
