"""RewriteReport: what a rewrite converted, left dense (and why), approximated and changed."""
import dataclasses
import json
import os
import uuid
from typing import Dict, List

import tensorflow as tf
from absl import logging


@dataclasses.dataclass
class RewriteReport:
    graph: str                      # "train", "eval" or "predict"
    seconds: float
    phase_seconds: Dict[str, float]  # plan, rewrite, validate
    tables: List[dict]
    skipped: List[dict]             # variables left dense, with the reason
    approximations: List[dict]      # converted variables that do not train exactly as dense
    rules: Dict[str, Dict[str, int]]
    dense_bytes_freed: int = 0
    # hash-bucket / modulo ops whose full keys now feed tables; those kept ({op, reason})
    unsqueezed_keys: List[str] = dataclasses.field(default_factory=list)
    squeezed_keys_kept: List[dict] = dataclasses.field(default_factory=list)
    replayed_plan: bool = False     # the model's saved plan decided the conversions
    # single-table op type -> [ops, fused ops that replaced them]
    fused: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    # variables whose tables start from the dense checkpoint's trained rows
    adopted: List[str] = dataclasses.field(default_factory=list)
    # tables and variables graphmod.WarmStartSettings starts from other models
    warm_started: List[str] = dataclasses.field(default_factory=list)
    # tables with a disk tier -> "" (the input pipeline prefetches their next
    # step's rows) or why it cannot
    prefetch: Dict[str, str] = dataclasses.field(default_factory=dict)
    # tables sharded across Horovod ranks -> "" (their training lookups' ids
    # are exchanged a step ahead, in the previous step) or why not
    ids_ahead: Dict[str, str] = dataclasses.field(default_factory=dict)
    # Horovod ranks the tables are sharded across (1: not sharded)
    sharded_ranks: int = 1
    # {table: {counter: scalar tensor}} of a training graph's tables, for
    # logging; not part of the JSON report.
    counters: Dict[str, Dict[str, tf.Tensor]] = dataclasses.field(
        default_factory=dict, metadata={"json": False})
    # The Rewriter's record (which rule built each op and made each edge),
    # written as its own file beside the graph dumps (write_record).
    record: dict = dataclasses.field(default_factory=dict, metadata={"json": False})

    def log(self) -> None:
        logging.info("graphmod: %d embedding variable(s) -> tables in %.2fs (%s graph%s), "
                     "%.1f MB of dense variables and slots no longer allocated",
                     len(self.tables), self.seconds, self.graph,
                     ", as the model's plan says" if self.replayed_plan else "",
                     self.dense_bytes_freed / 1e6)
        if self.sharded_ranks > 1:
            logging.info("graphmod: tables sharded by key across %d Horovod ranks",
                         self.sharded_ranks)
        for t in self.tables:
            logging.info("graphmod:   %s [%d x %d] -> table '%s' (%d lookup(s), optimizer %s%s)",
                         t["variable"], t["rows"], t["dim"], t["table"], t["lookups"],
                         t["optimizer"], (f", gradients' {t['ranks_combine']} over ranks"
                                          if t.get("ranks_combine") else "")
                         + (f", sharded by key over {t['ps_shards']} ps tasks"
                            if t.get("ps_shards") else ""))
        for s in self.skipped:
            logging.warning("graphmod: '%s' stays a dense variable: %s", s["variable"],
                            s["reason"])
        for a in self.approximations:
            logging.warning("graphmod: '%s' is converted with an approximation: %s",
                            a["variable"], a["what"])
        for kind, (single, built) in sorted(self.fused.items()):
            logging.info("graphmod: %d %s op(s) run as %d fused op(s)", single, kind, built)
        for v in self.adopted:
            logging.info("graphmod: '%s' is adopted: its table restores the trained rows and "
                         "slots the checkpoint holds densely (row i as key i)", v)
        for table, why_not in sorted(self.prefetch.items()):
            logging.info("graphmod: table '%s': %s", table,
                         "the input pipeline prefetches each step's rows from disk while the "
                         "step before trains" if not why_not else
                         f"each step reads its rows from disk itself (no prefetch: {why_not})")
        if self.unsqueezed_keys:
            logging.info("graphmod: collision-free keys from %s", ", ".join(self.unsqueezed_keys))
        for k in self.squeezed_keys_kept:
            logging.warning("graphmod: ids of '%s' keep sharing rows: %s", k["op"], k["reason"])

    def write_record(self, directory: str) -> None:
        """The Rewriter's record as rewrite_record_<graph>.json."""
        _write_json(os.path.join(directory, f"rewrite_record_{self.graph}.json"), self.record)

    def write(self, directory: str) -> None:
        """As rewrite_report_<graph>.json, written aside and renamed, so a
        failed write never leaves half a report."""
        _write_json(os.path.join(directory, f"rewrite_report_{self.graph}.json"),
                    {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.metadata.get("json", True)})


def _write_json(path: str, data) -> None:
    """Written aside and renamed, so a failed write never leaves half a file."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # workers may share a dir
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(data, f, indent=1)
    tf.io.gfile.rename(tmp, path, overwrite=True)
