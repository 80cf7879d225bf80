"""The model's conversion plan, saved in model_dir and replayed in every mode.

Training decides which variables become tables, with which settings,
initializer, seed and keys (unsqueezed or not); evaluation, prediction,
export and every resume must read the same tables the same way, so the
decisions are written to <model_dir>/graphmod/plan.json (versioned) after a
training rewrite and read back by every later rewrite of that model.

>>> planned = read("/tmp/model")   # {variable name: Planned} or None
"""
import dataclasses
import json
import os
import uuid
from typing import Dict, List, Optional

import tensorflow as tf

from graphmod.embeddings.initializers import TableInitializer
from graphmod.settings import TableSettings

FORMAT = 1
FILE = os.path.join("graphmod", "plan.json")


@dataclasses.dataclass
class Planned:
    """One converted variable as training converted it."""
    variable: str
    table: str
    rows: int
    dim: int
    settings: TableSettings      # initializer resolved into `initializer`
    initializer: TableInitializer
    seed: Optional[int]
    # squeezing ops whose full keys feed the table; their types match when names differ
    unsqueezed: List[str] = dataclasses.field(default_factory=list)
    unsqueezed_types: List[str] = dataclasses.field(default_factory=list)
    # For `graphmod ckpt convert --to=dense`, which writes the variable back:
    # the optimizer's slot variables the table's slot rows stand for, in the
    # table's order, as checkpoints name them, with the value each started
    # from: [[name, value], ...]; and for a part of a partitioned variable,
    # [the whole's name in checkpoints, the part's first row, the whole's rows].
    slots: List[list] = dataclasses.field(default_factory=list)
    part_of: Optional[list] = None
    # Where its table was placed across Horovod ranks, why, and the
    # planner's estimates per placement (graphmod.horovod.placement)
    placement: str = ""
    placement_why: str = ""
    placement_estimates: dict = dataclasses.field(default_factory=dict)


def path(model_dir: str) -> str:
    return os.path.join(model_dir, FILE)


def read(model_dir: Optional[str]) -> Optional[Dict[str, Planned]]:
    """The plan saved in model_dir, or None when there is none."""
    if not model_dir or not tf.io.gfile.exists(path(model_dir)):
        return None
    try:
        with tf.io.gfile.GFile(path(model_dir)) as f:
            data = json.load(f)
        version = data["format"]
        if version > FORMAT:
            raise ValueError(f"it has format {version}, this graphmod reads up to {FORMAT}: "
                             "upgrade graphmod")
        known = {f.name for f in dataclasses.fields(Planned)}  # a newer writer's extras wait
        return {v["variable"]: Planned(**{k: x for k, x in v.items() if k in known} | dict(
            settings=TableSettings(**v["settings"]),
            initializer=TableInitializer(**v["initializer"]))) for v in data["variables"]}
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"graphmod: cannot read the conversion plan {path(model_dir)}: {e}"
                         ) from None


def write(model_dir: str, planned: Dict[str, Planned]) -> None:
    """Writes the plan aside and renames it, so a failed write keeps the old one."""
    variables = [dataclasses.asdict(p) for p in planned.values()]
    for v in variables:
        v["settings"]["initializer"] = None  # resolved: `initializer` holds it
    tf.io.gfile.makedirs(os.path.dirname(path(model_dir)))
    # A name of its own: workers of one model may write at the same time.
    tmp = f"{path(model_dir)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(dict(format=FORMAT, variables=variables), f, indent=1)
    tf.io.gfile.rename(tmp, path(model_dir), overwrite=True)
