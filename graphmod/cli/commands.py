"""The `graphmod` commands' work (graphmod_cli parses their arguments)."""
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from typing import Optional

import tensorflow as tf
from google.protobuf import message
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow.python.framework import meta_graph as meta_graph_lib

from graphmod.checkpoint import deltas, merged
from graphmod.cli import graph_diff, render
from graphmod.cli.graphs import InputError, dumps, load_file, load_json, read_plan
from graphmod.embeddings import stored_rows
from graphmod.settings import MIN_ROWS

tf1 = tf.compat.v1
OK, FINDINGS = 0, 1


def _write(text: str, output: Optional[str]) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:  # aside, then renamed: a failed write leaves no half of a page
        with open(output + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(output + ".tmp", output)
    except OSError as e:
        raise InputError(f"{output}: cannot be written ({e.strerror})") from None
    print(f"graphmod: wrote {output}", file=sys.stderr)


def _rendered(d: graph_diff.GraphDiff, fv, title: str) -> str:
    if fv.format == "json":
        return render.to_json(d)
    if fv.format == "dot":
        return render.dot(d, fv.limit)
    if fv.format == "html":
        return render.page(d, title, fv.limit)
    return render.text(d, fv.verbose)


def diff(args, fv) -> int:
    """Exit status 0: the graphs differing is what a diff shows, not a finding."""
    record = report = None
    if len(args) == 1:
        found = dumps(args[0], fv.mode)
        before, after = load_file(found["before"]), load_file(found["after"])
        record, report = load_json(found["record"]), load_json(found["report"])
    else:
        graphs = []
        for path, which in zip(args, ("before", "after")):
            if tf.io.gfile.isdir(path):
                found = dumps(path, fv.mode)
                graphs.append(load_file(found[which]))
                if which == "after":
                    record, report = load_json(found["record"]), load_json(found["report"])
            else:
                graphs.append(load_file(path))
        before, after = graphs
    d = graph_diff.diff(before.graph_def, after.graph_def, record, report)
    _write(_rendered(d, fv, f"graphmod diff: {before.path} -> {after.path}"), fv.output)
    return OK


# --- rewrite --dry-run ------------------------------------------------------

def _meta_graph(model: str) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef a MODEL argument names (see `graphmod rewrite --help`)."""
    if tf.io.gfile.isdir(model):
        saved = os.path.join(model, "saved_model.pb")
        if tf.io.gfile.exists(saved):
            proto = saved_model_pb2.SavedModel()
            try:
                with tf.io.gfile.GFile(saved, "rb") as f:
                    proto.ParseFromString(f.read())
            except message.DecodeError as e:
                raise InputError(f"{saved}: not a SavedModel ({e})") from None
            if not proto.meta_graphs:
                raise InputError(f"{saved}: holds no MetaGraph")
            serving = [m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags]
            return (serving or list(proto.meta_graphs))[0]
        latest = merged.latest_checkpoint(model)
        if latest is None:
            raise InputError(f"{model}: holds no SavedModel and no checkpoint whose MetaGraph "
                             "to rewrite")
        model = latest + ".meta"
    loaded = load_file(model)
    if loaded.meta_graph is None:
        raise InputError(f"{model}: a GraphDef has no variables collections to plan from; "
                         "give a MetaGraphDef (.meta), a SavedModel or a model_dir")
    return loaded.meta_graph


def _as_the_hook_sees(meta: meta_graph_pb2.MetaGraphDef) -> meta_graph_pb2.MetaGraphDef:
    """meta without what a training session adds after the hook's rewrite:
    its Saver's ops (they read every variable whole) and the summaries'
    merge (a summary the rewrite drops would stay merged)."""
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta)
    dropped = {v.split(":")[0] for v in meta.collection_def["summary_op"].node_list.value} \
        if "summary_op" in meta.collection_def else set()
    scope = meta.saver_def.filename_tensor_name.split("/")[0] + "/" \
        if meta.HasField("saver_def") else None
    kept = [n for n in meta.graph_def.node
            if n.name not in dropped and not (scope and n.name.startswith(scope))]
    del out.graph_def.node[:]
    out.graph_def.node.extend(kept)
    out.ClearField("saver_def")
    for key in ("savers", "summary_op"):
        if key in out.collection_def:
            del out.collection_def[key]
    return out


def rewrite(model: str, fv) -> int:
    """Exit status 1 when a variable stays dense."""
    from graphmod.rewrite.pipeline import rewrite as run_rewrite  # pylint: disable=import-outside-toplevel
    from graphmod.rewrite.plan import PlanMismatch, RewriteSettings, trains_anything  # pylint: disable=import-outside-toplevel
    from graphmod.rewrite.validate import InvalidRewrite  # pylint: disable=import-outside-toplevel
    from graphmod.rewrite_rules import RULES  # pylint: disable=import-outside-toplevel
    meta = _as_the_hook_sees(_meta_graph(model))
    graph = tf.Graph()
    with graph.as_default():
        try:
            # Not tf1.train.import_meta_graph: it builds a Saver of its own.
            meta_graph_lib.import_scoped_meta_graph(meta, clear_devices=True)
        except (ValueError, KeyError, tf.errors.OpError) as e:
            raise InputError(f"{model}: its MetaGraph does not import "
                             f"({str(e).splitlines()[0][:300]})") from None
        before = graph.as_graph_def()
        mode = fv.mode or ("train" if trains_anything(graph) else "predict")
        # No model_dir: nothing is read or written (no plan replayed or saved).
        min_rows = MIN_ROWS if fv.min_rows is None else fv.min_rows
        try:
            report = run_rewrite(graph, RewriteSettings(min_rows, {}, fv.collision_free, fv.exact),
                                 mode, rules=RULES)
        except (InvalidRewrite, PlanMismatch) as e:
            print(f"graphmod rewrite: the hook's rewrite of {model} fails: "
                  f"{render.printable(str(e))}", file=sys.stderr)
            return FINDINGS
        after = graph.as_graph_def()
    data = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)
            if f.metadata.get("json", True)}
    d = graph_diff.diff(before, after, report.record, data)
    if fv.format == "json":
        _write(json.dumps(dict(report=data, diff=d.to_json()), indent=1) + "\n", fv.output)
    else:
        if fv.format == "text":
            print(_report_text(data, model), end="")
        _write(_rendered(d, fv, f"graphmod rewrite --dry-run {model}"), fv.output)
    return FINDINGS if report.skipped else OK


def _report_text(report: dict, model: str) -> str:
    lines = [f"rewrite of {model} ({report['graph']} graph) in {report['seconds']:.2f}s: "
             f"{len(report['tables'])} variable(s) -> tables, "
             f"{len(report['skipped'])} left dense"]
    for t in report["tables"]:
        lines.append(f"  {t['variable']} [{t['rows']} x {t['dim']}] -> table '{t['table']}' "
                     f"({t['lookups']} lookup(s), optimizer {t['optimizer']})")
    for a in report["approximations"]:
        lines.append(f"  approximation: {a['variable']}: {a['what']}")
    return "\n".join(render.printable(line) for line in lines) + "\n"


# --- inspect ----------------------------------------------------------------

def _table_entries(checkpoint: str) -> dict:
    """{table: {entry: shape}} of a checkpoint's tables (its parts' too)."""
    try:
        return merged.table_entries(checkpoint)
    except merged.StateError as e:
        raise InputError(str(e)) from None


def inspect(model_dir: str, fv) -> int:
    """Exit status 1 when a delta of the latest checkpoint is torn."""
    if not tf.io.gfile.isdir(model_dir):
        raise InputError(f"{model_dir}: no such directory")
    latest = merged.latest_checkpoint(model_dir)
    if latest is None:
        raise InputError(f"{model_dir}: holds no checkpoint")
    try:
        out = _inspected(model_dir, latest)
    except tf.errors.NotFoundError as e:
        if tf.io.gfile.exists(latest + ".index"):
            raise InputError(f"{latest}: {(str(e).splitlines() or ['not found'])[0]}") from None
        out = None
    torn = out is None or not all(c["verified"] for c in out["chain"] if c["kind"] == "delta")
    if torn and not tf.io.gfile.exists(latest + ".index"):
        # Files missing because the checkpoint is gone, not torn: a live model_dir.
        raise InputError(f"{latest}: deleted while it was read (the training keeps its newest "
                         "max_to_keep checkpoints); inspect the model_dir again")
    if fv.format == "json":
        print(json.dumps(out, indent=1))
    else:
        print(_inspect_text(out), end="")
    return FINDINGS if torn else OK


def _inspected(model_dir: str, latest: str) -> dict:
    """What inspect prints of model_dir's latest checkpoint."""
    plan = read_plan(model_dir) or {}
    by_table = {p.table: p for p in plan.values()}
    tables = []
    for name, e in sorted(_table_entries(latest).items()):
        rows, dim = e["values"][0], merged.table_dim(e)
        slots = e["slots"][1] if "slots" in e else 0
        forms = (e["values_form"], e.get("slots_form", e["values_form"]))
        planned = by_table.get(name)
        settings = dataclasses.asdict(planned.settings) if planned is not None else None
        if settings is not None:
            settings.pop("initializer", None)
        tables.append(dict(table=name, variable=planned.variable if planned else None,
                           dim=dim, rows=rows, slots=slots, stored=forms,
                           bytes=rows * (8 + stored_rows.row_bytes(forms[0], dim)
                                         + slots * stored_rows.row_bytes(forms[1], dim) + 8 * 3),
                           pending_ids=e.get("pending_keys", [0])[0], settings=settings,
                           placement=dict(placement=planned.placement, why=planned.placement_why,
                                          estimates=planned.placement_estimates)
                           if planned is not None and planned.placement else None))
    entries = deltas.read_manifest(latest)
    good = deltas.committed(latest, entries)
    chain = [dict(name=os.path.basename(latest), kind="full")] + [
        dict(name=d["name"], kind="delta", step=d["step"], files=len(d["files"]),
             verified=i < len(good)) for i, d in enumerate(entries)]
    from graphmod.checkpoint.parts import TableParts  # pylint: disable=import-outside-toplevel
    counters = _counters(model_dir)
    for t in tables:
        t["counters"] = counters.get(t["table"])
    return dict(model_dir=model_dir, checkpoint=latest, sharded=TableParts.in_parts(latest),
                tables=tables, plan={v: p.table for v, p in sorted(plan.items())}, chain=chain,
                exchange=counters.get("exchange"))


def _counters(model_dir: str) -> dict:
    """{table: {counter: value, "step": step}}: the newest values of the
    graphmod/<table>/<counter> scalars the hook wrote to model_dir's
    TensorBoard events (training's, not evaluation's); {} without events."""
    newest = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag.startswith("graphmod/") and value.tag.count("/") >= 2:
                        table, counter = value.tag[len("graphmod/"):].rsplit("/", 1)
                        entry = newest.setdefault(table, {})
                        if event.step >= entry.get("step", -1):
                            entry[counter] = value.simple_value
                            entry["step"] = event.step
        except tf.errors.DataLossError:  # a file being written: what was read stands
            continue
    return newest


def _inspect_text(out: dict) -> str:
    lines = [f"model_dir {out['model_dir']}",
             f"latest checkpoint {out['checkpoint']}"
             + (" (tables in per-rank parts)" if out["sharded"] else "")]
    lines.append(f"tables ({len(out['tables'])}):")
    for t in out["tables"]:
        s = t["settings"] or {}
        policy = ", ".join(f"{k}={s[k]}" for k in ("access_threshold", "eviction_threshold",
                                                    "eviction_unit", "max_rows")
                           if k in s and s[k] not in (None, -1))
        lines.append(f"  {t['table']}: dim {t['dim']}, {t['rows']} rows, "
                     f"{t['bytes'] / 2**20:.1f} MiB, {t['slots']} slot(s), "
                     f"{t['pending_ids']} ids pending admission"
                     + (f", from variable {t['variable']}" if t["variable"] else "")
                     + (f" [{policy}]" if policy else ""))
        placed = t.get("placement")
        if placed:
            estimate = placed["estimates"].get(placed["placement"], {})
            sent = estimate.get("bytes_per_step")
            lines.append(f"    placed {placed['placement']} across Horovod ranks ({placed['why']}); "
                         f"estimated per rank: {estimate.get('memory_bytes', 0) / 2**20:.1f} "
                         f"MiB of rows, " + (f"{sent / 1024:.1f} KiB sent a step"
                                            if sent is not None else "bytes a step unknown"))
        c = t.get("counters")
        if c:
            line = (f"    at step {c['step']}: {c.get('admitted', 0):.0f} admitted, "
                    f"{c.get('evicted', 0):.0f} evicted, {c.get('rejected', 0):.0f} lookups "
                    f"given no row")
            if "disk_rows" in c:
                hits = 1 - c.get("promoted", 0) / max(c.get("lookups", 0), 1)
                line += (f"; {c['memory_rows']:.0f} rows in memory, {c['disk_rows']:.0f} on "
                         f"disk ({c.get('disk_file_bytes', 0) / 2**20:.1f} MiB of files), "
                         f"hit ratio {hits:.3f} ({c.get('prefetched', 0):.0f} rows "
                         f"prefetched), {c.get('disk_reads', 0):.0f} rows read from "
                         f"disk, {c.get('compaction_ms', 0):.0f} ms compacting")
            lines.append(line)
    sent = out.get("exchange")
    if sent:
        lines.append(f"measured: {sent['bytes_sent'] / 1024:.1f} KiB sent to other Horovod "
                     f"ranks a step by the rank that logged it (all tables, at step "
                     f"{sent['step']})")
    lines.append(f"conversion plan: {len(out['plan'])} variable(s)")
    for v, t in out["plan"].items():
        lines.append(f"  {v} -> table {t}")
    lines.append("checkpoint chain:")
    for c in out["chain"]:
        if c["kind"] == "full":
            lines.append(f"  {c['name']} (full)")
        else:
            lines.append(f"  {c['name']} (delta, step {c['step']}, {c['files']} files): "
                         + ("checksums verified" if c["verified"] else "TORN or after a torn "
                            "delta: a restore stops before it"))
    return "\n".join(render.printable(line) for line in lines) + "\n"


# --- export --portable / --watch ---------------------------------------------

def export_portable(source: str, out: str, fv) -> int:
    from graphmod.checkpoint import serving_versions  # pylint: disable=import-outside-toplevel
    from graphmod.checkpoint.portable import portable_saved_model  # pylint: disable=import-outside-toplevel
    keep = dict(min_count=fv.min_count, seen_since=_seen_since(fv.seen_since, fv.model_dir))
    with _export_errors(out):
        if fv.model_dir is None:
            report = portable_saved_model(source, out, **keep)
        else:
            report = serving_versions.export_state(source, fv.model_dir, out, **keep)
    print(json.dumps(report, indent=1))
    return OK


def _seen_since(value: Optional[str], model_dir: Optional[str]) -> Optional[int]:
    """--seen-since as the tables' clock value: T, or now minus T ago (7d, 36h,
    90m, 45s) where model_dir's training graph stamps rows with seconds."""
    if value is None or not value[-1].isalpha():
        return None if value is None else int(value)
    latest = merged.latest_checkpoint(model_dir) if model_dir else None
    if latest is None:
        raise InputError(f"--seen-since={value}: a time ago needs --model-dir with a checkpoint, "
                         "whose training graph (its .meta) tells seconds from global steps")
    if not tf.io.gfile.exists(latest + ".meta"):
        raise InputError(f"--seen-since={value}: {latest} has no .meta (a converted checkpoint?) "
                         "to tell seconds from global steps: give a clock value")
    if any(n.name.startswith("graphmod/clock_steps") for n in
           load_file(latest + ".meta").graph_def.node):
        raise InputError(f"--seen-since={value}: {latest}.meta stamps rows with global steps "
                         "(eviction_unit='steps'), where a time ago means nothing: give a step")
    return int(time.time()) - int(value[:-1]) * dict(d=86400, h=3600, m=60, s=1)[value[-1]]


def export_watch(model_dir: str, base: str, fv) -> int:
    from graphmod.checkpoint import serving_versions  # pylint: disable=import-outside-toplevel
    template = fv.template or os.path.join(base, ".template")
    if not os.path.isfile(os.path.join(template, "saved_model.pb")):
        raise InputError(f"{template}: no SavedModel to take the serving graph from (give "
                         "--template=a SavedModel graphmod.export_saved_model wrote of this "
                         "model, or train with GraphModifierHook(serving_export=...))")
    newest = []

    def report(version):
        newest[:] = [version["step"]]
        print(json.dumps(dict(version=os.path.join(base, str(version["step"])),
                              step=version["step"], deltas=version["deltas"],
                              seconds_from_commit=version["seconds_from_commit"],
                              rows={t["table"]: t["rows_kept"] for t in version["tables"]})),
              flush=True)

    signals = []

    def stop_after_this_version(signum, frame):
        # A flag, not an exception: raised inside a TensorFlow call (a stat
        # that is raising NotFoundError itself) it comes out as pybind11's
        # RuntimeError instead. A second signal stops at once: a version half
        # written is a .tmp- folder TF Serving skips, the next watcher removes.
        if signals:
            raise KeyboardInterrupt
        signals.append(signum)
        # os.write: a print here could land inside one the loop is making.
        os.write(2, b"graphmod: stopping after the version being written\n")

    def stop():
        return bool(signals) or (fv.until_step is not None and bool(newest)
                                 and newest[0] >= fv.until_step)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_after_this_version)
    with _export_errors(base):
        try:
            serving_versions.watch(template, model_dir, base, keep=fv.keep,
                                   poll_secs=fv.poll_secs, min_count=fv.min_count,
                                   seen_since=_seen_since(fv.seen_since, None), stop=stop,
                                   on_version=report)
        except KeyboardInterrupt:
            pass
    return OK


@contextlib.contextmanager
def _export_errors(out: str):
    """An export's failures as one line (exit status 2)."""
    from graphmod.checkpoint.portable import NotPortable  # pylint: disable=import-outside-toplevel
    try:
        yield
    except (NotPortable, merged.StateError) as e:
        raise InputError(render.printable(str(e))) from None
    except BrokenPipeError:
        raise  # stdout's reader left (graphmod_cli.run ends quietly), not OUT unwritable
    except OSError as e:
        raise InputError(f"{e.filename or out}: cannot be written ({e.strerror})") from None


def verify(target: str, fv) -> int:
    """graphmod.verify of the model FUNCTION() in MODULE builds (target
    'MODULE:FUNCTION'); exit status 1 when it fails."""
    import graphmod  # pylint: disable=import-outside-toplevel
    made = _call(target)
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise InputError(f"{target}: returned {type(made).__name__}, not (estimator, input_fn) "
                         "or (estimator, input_fn, hook)")
    estimator, input_fn, hook = (made + (None,))[:3]
    try:
        result = graphmod.verify(estimator, input_fn, steps=fv.steps, hook=hook, rtol=fv.rtol,
                                 atol=fv.atol)
    except (ValueError, RuntimeError) as e:  # different batches, a failed rewrite
        raise InputError(f"{target}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    print(result.summary())
    if fv.html:
        _write(result.html(), fv.html)
    return OK if result.ok else FINDINGS


def _call(target: str):
    """FUNCTION() of MODULE (an importable name or a .py file, whose folder
    its own imports are found in)."""
    import importlib  # pylint: disable=import-outside-toplevel
    import importlib.util  # pylint: disable=import-outside-toplevel
    module_name, _, function = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise InputError(f"{module_name}: no such file")
            sys.path.insert(0, os.path.dirname(os.path.abspath(module_name)))
            spec = importlib.util.spec_from_file_location("graphmod_verified_model", module_name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except InputError:
        raise
    except Exception as e:  # pylint: disable=broad-except  (ImportError, SyntaxError, ...)
        raise InputError(f"{module_name}: cannot be imported ({type(e).__name__}: {e})") from None
    if not callable(getattr(module, function, None)):
        raise InputError(f"{target}: {module_name} has no function '{function}'")
    return getattr(module, function)()


def profile(model_dir: str, fv) -> int:
    """The profiles GraphModifierHook(profile_every_steps=N) wrote in model_dir."""
    from graphmod import profiles  # pylint: disable=import-outside-toplevel
    if not tf.io.gfile.isdir(model_dir):
        raise InputError(f"{model_dir}: no such directory")
    by_process = profiles.read(model_dir)
    if not by_process:
        raise InputError(f"{model_dir}: holds no profile (train with "
                         "GraphModifierHook(profile_every_steps=N))")
    summaries = {p: profiles.summarize(r, top=fv.top) for p, r in by_process.items()}
    if fv.format == "json":
        out = json.dumps(summaries, indent=1) + "\n"
    elif fv.format == "html":
        process = sorted(by_process)[0]  # one page: the first process (rank0, chief0, train)
        out = profiles.page(process, summaries[process], by_process[process])
    else:
        out = "\n\n".join(profiles.text(p, s, model_dir) for p, s in summaries.items()) + "\n"
    _write(out, fv.output)
    return OK
