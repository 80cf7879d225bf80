"""Step profiles: where a training step's time goes, and how the tables grow.

GraphModifierHook(profile_every_steps=N) traces every Nth training step
(TensorFlow's FULL_TRACE step stats) and writes one JSON line per traced
step to `<model_dir>/graphmod/profile/<process>.jsonl`: the step's wall time,
the op time of each group, the slowest ops, and the tables' counters. `graphmod
profile MODEL_DIR` reads them back (`read`, `summarize`).

Groups (of op time: ops run in parallel, so the groups' sum exceeds the
step's wall time on a multi-core machine):
- tables: graphmod's table ops, as lookup, apply, prefetch and other;
- communication: Horovod's collectives and the ps cluster's sends and receives;
- input: the tf.data iterator;
- saves: checkpoint saves and restores;
- model: every other op (the user's model and its optimizer's dense updates).
"""
import glob
import json
import os
from typing import Dict, List, Optional

GROUPS = ("input", "model", "tables", "communication", "saves")
TOP_OPS = 100  # the slowest ops kept per traced step


def group_of(op_type: str) -> str:
    """'tables:<kind>' for graphmod's table ops, else one of GROUPS."""
    if op_type in ("GraphmodTableSave", "GraphmodTableRestore", "SaveV2", "RestoreV2",
                   "MergeV2Checkpoints", "SaveSlices", "Save", "Restore", "RestoreSlice"):
        return "saves"
    if op_type.startswith("Graphmod"):
        for kind in ("Prefetch", "Apply", "Find"):
            if kind in op_type:
                return "tables:" + {"Find": "lookup"}.get(kind, kind.lower())
        return "tables:other"
    if op_type.startswith("Horovod") or op_type in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
        return "communication"
    if op_type.startswith("IteratorGetNext") or op_type in ("Iterator", "IteratorV2",
                                                            "MakeIterator", "AnonymousIteratorV3"):
        return "input"
    return "model"


def step_record(step: int, wall_ms: float, node_stats: List[tuple],
                counters: Dict[str, Dict[str, float]]) -> dict:
    """One traced step: node_stats as (op name, op type, microseconds)."""
    groups: Dict[str, float] = {}
    per_op: Dict[str, List] = {}
    for name, op_type, micros in node_stats:
        group = group_of(op_type)
        groups[group] = groups.get(group, 0.0) + micros / 1000
        entry = per_op.setdefault(name, [name, op_type, group, 0.0])
        entry[3] += micros / 1000
    ops = sorted(per_op.values(), key=lambda e: -e[3])[:TOP_OPS]
    return dict(step=step, wall_ms=wall_ms, groups_ms=groups,
                ops=[dict(name=n, type=t, group=g, ms=round(ms, 4)) for n, t, g, ms in ops],
                tables={t: {k: float(v) for k, v in c.items()} for t, c in counters.items()})


def json_line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def path_for(model_dir: str, process: str) -> str:
    return os.path.join(model_dir, "graphmod", "profile", f"{process}.jsonl")


def read(model_dir: str) -> Dict[str, List[dict]]:
    """Each process's traced steps, in order ({process: records}); a torn
    last line (a process killed while writing) is left out."""
    out = {}
    for path in sorted(glob.glob(path_for(model_dir, "*"))):
        records = []
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    break
        if records:
            out[os.path.basename(path)[:-len(".jsonl")]] = records
    return out


def summarize(records: List[dict], top: int = 15) -> dict:
    """Averages over traced steps: the step's wall time, each group's op time
    and share, the slowest ops, and each table's counters at the last traced
    step with their growth per step: rows, new keys (rows admitted), the
    dedup ratio (ids looked up per distinct id in a call) and, with a disk
    tier, the memory hit ratio."""
    n = len(records)
    groups: Dict[str, float] = {}
    for r in records:
        for g, ms in r["groups_ms"].items():
            groups[g] = groups.get(g, 0.0) + ms / n
    total = sum(groups.values()) or 1.0
    split = {g: sum(ms for k, ms in groups.items() if k.split(":")[0] == g) / total
             for g in GROUPS}
    ops: Dict[str, dict] = {}
    for r in records:
        for op in r["ops"]:
            o = ops.setdefault(op["name"], dict(op, ms=0.0))
            o["ms"] += op["ms"] / n
    ranked = sorted(ops.values(), key=lambda o: -o["ms"])[:top]
    for o in ranked:
        o["share"] = o["ms"] / total
    first, last = records[0], records[-1]
    steps = max(last["step"] - first["step"], 1)
    tables = {}
    for name, c in last["tables"].items():
        before = first["tables"].get(name, {})
        t = dict(c)
        grew = {k: c.get(k, 0) - before.get(k, 0) for k in c}
        if n > 1:  # growth needs two traced steps
            t["rows_per_step"] = grew.get("size", 0) / steps
            t["new_keys_per_step"] = grew.get("admitted", 0) / steps
        # Over the traced steps' span; since the table was created where the
        # profile holds one traced step.
        seen = grew if grew.get("lookups") else c
        if seen.get("lookups"):
            if "ids_looked_up" in c:  # (profiles written before it was counted lack it)
                t["dedup_ratio"] = seen["ids_looked_up"] / seen["lookups"]
            if "promoted" in c:  # a table with a disk tier
                t["hit_ratio"] = 1 - seen.get("promoted", 0) / seen["lookups"]
        tables[name] = t
    return dict(traced_steps=[r["step"] for r in records],
                wall_ms=sum(r["wall_ms"] for r in records) / n, op_ms=total,
                groups_ms=groups, split=split, top_ops=ranked, tables=tables)


def table_growth(records: List[dict]) -> Dict[str, List[float]]:
    """Each table's rows at each traced step."""
    names = sorted({t for r in records for t in r["tables"]})
    return {t: [r["tables"].get(t, {}).get("size", 0.0) for r in records] for t in names}


def text(process: str, s: dict, model_dir: Optional[str] = None) -> str:
    steps = s["traced_steps"]
    where = f"{model_dir} ({process})" if model_dir else process
    lines = [f"graphmod profile: {where}: {len(steps)} traced steps "
             f"({steps[0]}..{steps[-1]}), {s['wall_ms']:.2f} ms wall a step, "
             f"{s['op_ms']:.2f} ms of op time",
             "op time: " + ", ".join(f"{g} {100 * s['split'][g]:.1f}%" for g in GROUPS)]
    kinds = {g.split(":")[1]: ms for g, ms in s["groups_ms"].items() if g.startswith("tables:")}
    if kinds:
        lines.append("  tables: " + ", ".join(f"{k} {ms:.3f} ms" for k, ms in sorted(kinds.items())))
    lines.append("slowest ops (ms a traced step, share of op time):")
    for i, o in enumerate(s["top_ops"], 1):
        lines.append(f"  {i:2d}. {o['ms']:8.3f} ms {100 * o['share']:5.1f}%  {o['name']} "
                     f"[{o['type']}, {o['group']}]")
    for name, t in s["tables"].items():
        growth = (f" ({t['rows_per_step']:+.1f}/step, {t['new_keys_per_step']:.1f} new keys/step)"
                  if "rows_per_step" in t else "")
        parts = [f"{int(t.get('size', 0)):,} rows{growth}",
                 f"{t.get('memory_bytes', 0) / 2**20:.2f} MiB",
                 f"{int(t.get('admitted', 0)):,} admitted", f"{int(t.get('rejected', 0)):,} "
                 "lookups given no row", f"{int(t.get('evicted', 0)):,} evicted"]
        if "dedup_ratio" in t:
            parts.append(f"dedup ratio {t['dedup_ratio']:.2f}")
        if "hit_ratio" in t:
            parts.append(f"memory hit ratio {t['hit_ratio']:.3f}")
        lines.append(f"table '{name}': " + ", ".join(parts))
    return "\n".join(lines)


def page(process: str, s: dict, records: List[dict]) -> str:
    """The profile as a self-contained HTML page: the time split and the
    tables' growth, drawn."""
    import html  # pylint: disable=import-outside-toplevel
    from graphmod import charts  # pylint: disable=import-outside-toplevel
    parts = [f"<pre>{html.escape(text(process, s))}</pre>",
             charts.bar_chart("op time a traced step by group (ms)",
                              {g: sum(ms for k, ms in s["groups_ms"].items()
                                      if k.split(":")[0] == g) for g in GROUPS}),
             charts.line_chart("table rows by traced step", table_growth(records),
                               x_label="traced step")]
    return charts.page("graphmod profile", parts)
