"""The `graphmod` command: see what the hook does to a model before trusting it.

  graphmod diff BEFORE [AFTER]     two graphs compared as graphs
  graphmod rewrite --dry-run MODEL the hook's rewrite of a saved graph, without training
  graphmod inspect MODEL_DIR       tables, plan and checkpoint chain of a model_dir
  graphmod ckpt compact|convert    checkpoint tools: deltas folded in, tables <-> variables
  graphmod export --portable|--watch   SavedModels that serve on stock TensorFlow
  graphmod verify MODULE:FUNCTION  the hooked model trains as the unmodified one, step by step
  graphmod profile MODEL_DIR       where the traced training steps' time went, per table

`graphmod COMMAND --help` describes a command and its flags. Exit status: 0
ok, 1 findings (a variable the rewrite would leave dense, a torn delta), 2
usage or input error (the message names the file).
"""
# The command's front: it parses and answers --help and usage errors
# without importing graphmod (whose `import` loads TensorFlow and the op
# library, seconds), which is why it sits beside the package, not in it.
# A command imports graphmod.cli's modules once its arguments are good.
import os
import re
import sys
from typing import Callable, Dict, List, Optional

from absl import flags

OK, FINDINGS, USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments (exit status 2)."""


def _flag_values(define: Callable[[flags.FlagValues], None]) -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_boolean("help", False, "show this help", flag_values=fv, short_name="h")
    define(fv)
    return fv


def _diff_flags(fv):
    flags.DEFINE_enum("format", "text", ["text", "json", "dot", "html"],
                      "output format", flag_values=fv)
    flags.DEFINE_string("output", None, "write to this file instead of stdout", flag_values=fv)
    flags.DEFINE_enum("mode", None, ["train", "eval", "predict"],
                      "which graphs of a model_dir (default: the first of train, eval, "
                      "predict it holds)", flag_values=fv)
    flags.DEFINE_boolean("verbose", False, "text: list every change", flag_values=fv)
    flags.DEFINE_integer("limit", 40, "dot/html: changed ops drawn per group", flag_values=fv)


def _rewrite_flags(fv):
    _diff_flags(fv)
    flags.DEFINE_boolean("dry_run", False, "rewrite without training or writing anything "
                         "(required: the rewrite itself runs in GraphModifierHook)",
                         flag_values=fv)
    flags.DEFINE_integer("min_rows", None, "GraphModifierHook's min_rows (default: the "
                         "hook's)", flag_values=fv)
    flags.DEFINE_boolean("exact", False, "GraphModifierHook's exact", flag_values=fv)
    flags.DEFINE_boolean("collision_free", True, "GraphModifierHook's collision_free",
                         flag_values=fv)


def _inspect_flags(fv):
    flags.DEFINE_enum("format", "text", ["text", "json"], "output format", flag_values=fv)


def _ckpt_flags(fv):
    flags.DEFINE_enum("to", None, ["dense", "tables"], "convert: what to convert to",
                      flag_values=fv)
    flags.DEFINE_list("variables", [], "convert --to=tables: the [rows, dim] variables that "
                      "become tables", flag_values=fv)


def _export_flags(fv):
    flags.DEFINE_boolean("portable", False, "write a SavedModel whose ops are all stock "
                         "TensorFlow's", flag_values=fv)
    flags.DEFINE_string("model_dir", None, "--portable: take the state from this model_dir "
                        "(latest checkpoint, its deltas, Horovod parts) instead of SOURCE's "
                        "variables", flag_values=fv)
    flags.DEFINE_integer("min_count", 0, "leave out rows seen fewer than N times",
                         flag_values=fv)
    flags.DEFINE_string("seen_since", None, "leave out rows last seen before T: a value of "
                        "the tables' clock (global steps, or seconds with eviction_unit="
                        "'seconds'), or a time ago, 7d, 36h, 90m or 45s (--portable "
                        "--model-dir=MODEL_DIR, whose graph must count seconds)", flag_values=fv)
    flags.DEFINE_boolean("watch", False, "write a numbered version into OUT after each "
                         "new state of MODEL_DIR", flag_values=fv)
    flags.DEFINE_string("template", None, "--watch: the SavedModel graphmod.export_saved_model "
                        "wrote of the model (default: OUT/.template, which "
                        "GraphModifierHook(serving_export=...) writes)", flag_values=fv)
    flags.DEFINE_integer("keep", 5, "--watch: versions kept", flag_values=fv)
    flags.DEFINE_float("poll_secs", 5.0, "--watch: seconds between looks at MODEL_DIR",
                       flag_values=fv)
    flags.DEFINE_integer("until_step", None, "--watch: stop once a version of this global "
                         "step or later is written (default: never)", flag_values=fv)


def _verify_flags(fv):
    flags.DEFINE_integer("steps", 20, "steps each run trains", flag_values=fv)
    flags.DEFINE_float("rtol", 1e-4, "relative tolerance", flag_values=fv)
    flags.DEFINE_float("atol", 1e-6, "absolute tolerance", flag_values=fv)
    flags.DEFINE_string("html", None, "also write the loss curves and each variable's "
                        "difference by step to this HTML file", flag_values=fv)


def _verify(fv, args: List[str]) -> int:
    if len(args) != 1 or ":" not in args[0]:
        raise UsageError("verify takes one MODULE:FUNCTION (a module name or a .py file)")
    if fv.steps < 1:
        raise UsageError("--steps must be >= 1")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.verify(args[0], fv)


def _profile_flags(fv):
    flags.DEFINE_enum("format", "text", ["text", "json", "html"], "output format",
                      flag_values=fv)
    flags.DEFINE_string("output", None, "write to this file instead of stdout", flag_values=fv)
    flags.DEFINE_integer("top", 15, "slowest ops listed", flag_values=fv)


def _profile(fv, args: List[str]) -> int:
    if len(args) != 1:
        raise UsageError("profile takes one MODEL_DIR")
    if fv.top < 1:
        raise UsageError("--top must be >= 1")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.profile(args[0], fv)


def _export(fv, args: List[str]) -> int:
    if fv.portable == fv.watch:
        raise UsageError("export takes --portable SOURCE OUT or --watch MODEL_DIR OUT")
    if len(args) != 2:
        raise UsageError("export --portable takes SOURCE OUT" if fv.portable
                         else "export --watch takes MODEL_DIR OUT")
    if fv.seen_since is not None and not re.fullmatch(r"-?\d+|\d+[dhms]", fv.seen_since):
        raise UsageError(f"--seen-since={fv.seen_since}: neither a clock value (an integer) nor "
                         "a time ago (7d, 36h, 90m, 45s)")
    if fv.portable:
        if fv.template is not None or fv.until_step is not None:
            raise UsageError("--template and --until-step go with --watch")
        from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
        return commands.export_portable(args[0], args[1], fv)
    if fv.model_dir is not None:
        raise UsageError("--watch MODEL_DIR OUT takes the model_dir as its first argument")
    if fv.keep < 1 or fv.poll_secs <= 0:
        raise UsageError("--keep must be >= 1 and --poll-secs > 0")
    if fv.seen_since and fv.seen_since[-1].isalpha():  # each version would need its own now
        raise UsageError(f"--seen-since={fv.seen_since}: a time ago goes with --portable; "
                         "--watch takes a clock value")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.export_watch(args[0], args[1], fv)


def _ckpt(fv, args: List[str]) -> int:
    if args[:1] == ["compact"] and len(args) == 2:
        from graphmod.cli import ckpt  # pylint: disable=import-outside-toplevel
        print(ckpt.compact(args[1]))
        return OK
    if args[:1] == ["convert"] and len(args) == 3 and fv.to:
        if fv.to == "tables" and not fv.variables:
            raise UsageError("convert --to=tables needs --variables")
        from graphmod.cli import ckpt  # pylint: disable=import-outside-toplevel
        if fv.to == "dense":
            path, findings = ckpt.to_dense(args[1], args[2])
            for finding in findings:
                print(f"graphmod ckpt: {finding}", file=sys.stderr)
            print(path)
            return FINDINGS if findings else OK
        print(ckpt.to_tables(args[1], args[2], fv.variables))
        return OK
    raise UsageError("ckpt takes: compact MODEL_DIR | convert --to=dense MODEL_DIR OUT | "
                     "convert --to=tables --variables=a,b CHECKPOINT OUT")


def _diff(fv, args: List[str]) -> int:
    if not 1 <= len(args) <= 2:
        raise UsageError("diff takes BEFORE [AFTER] (AFTER defaults to BEFORE's model_dir dump)")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.diff(args, fv)


def _rewrite(fv, args: List[str]) -> int:
    if not fv.dry_run:
        raise UsageError("rewrite needs --dry-run (a real rewrite happens inside "
                         "GraphModifierHook, while training)")
    if len(args) != 1:
        raise UsageError("rewrite --dry-run takes one MODEL")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.rewrite(args[0], fv)


def _inspect(fv, args: List[str]) -> int:
    if len(args) != 1:
        raise UsageError("inspect takes one MODEL_DIR")
    from graphmod.cli import commands  # pylint: disable=import-outside-toplevel
    return commands.inspect(args[0], fv)


COMMANDS: Dict[str, tuple] = {
    "diff": (_diff_flags, _diff, "graphmod diff [flags] BEFORE [AFTER]",
             "Compares two graphs as graphs: ops added, removed and rerouted, grouped per\n"
             "converted variable and its table, each with the rule that made it when the\n"
             "rewrite's record is present. BEFORE and AFTER: a GraphDef (.pb, .pbtxt), a\n"
             "MetaGraphDef (.meta), or a model_dir where GraphModifierHook(dump_graph=True)\n"
             "wrote its graphs (one model_dir alone: its before and after graphs)."),
    "rewrite": (_rewrite_flags, _rewrite, "graphmod rewrite --dry-run [flags] MODEL",
                "Runs the hook's rewrite pipeline on a saved graph without training and\n"
                "prints the report and the diff. MODEL: a MetaGraphDef file (.meta, .pb,\n"
                ".pbtxt), a SavedModel directory, or a model_dir (its latest checkpoint's\n"
                "MetaGraph). Exit status 1 when a variable it would convert stays dense."),
    "inspect": (_inspect_flags, _inspect, "graphmod inspect [flags] MODEL_DIR",
                "A model_dir's tables (dim, rows, bytes, slots, settings), converted\n"
                "variables, conversion plan, and checkpoint chain (full checkpoint and\n"
                "deltas, checksums verified). Exit status 1 when a delta is torn."),
    "ckpt": (_ckpt_flags, _ckpt, "graphmod ckpt compact MODEL_DIR | ckpt convert --to=dense "
             "MODEL_DIR OUT | ckpt convert --to=tables --variables=a,b CHECKPOINT OUT",
             "compact: the latest full checkpoint with its deltas applied (and a sharded\n"
             "one's parts read) becomes a new full checkpoint, named after its last delta's\n"
             "step. convert --to=dense: each table becomes its plain variable, rows\n"
             "0..N-1 (N from the conversion plan; a key without a row reads the table's\n"
             "initial row), and its slot rows the optimizer's slot variables: the\n"
             "unmodified model resumes training from it (exit status 1 when keys of a\n"
             "table fed the full ids of `ids % N` share rows). convert --to=tables: plain\n"
             "[rows, dim] variables (and their optimizer slots) become tables keyed\n"
             "0..N-1. Prints the written checkpoint's path."),
    "verify": (_verify_flags, _verify, "graphmod verify [flags] MODULE:FUNCTION",
               "FUNCTION() (in a module name or a .py file) returns (estimator, input_fn) or\n"
               "(estimator, input_fn, hook): the Estimator as built for training, a seeded\n"
               "input_fn and the GraphModifierHook to train with (a default one if\n"
               "absent). graphmod.verify trains the model --steps steps unmodified and\n"
               "hooked from the same initial rows over the same batches, and compares the\n"
               "loss and every converted variable's rows and slots after each step.\n"
               "Prints the verdict. Exit status 1 when something differs over tolerance\n"
               "that no approximation the hook's report states explains."),
    "profile": (_profile_flags, _profile, "graphmod profile [flags] MODEL_DIR",
                "What GraphModifierHook(profile_every_steps=N) traced: per training process,\n"
                "the traced steps' wall time, their op time split into input, model,\n"
                "tables (lookup, apply, prefetch), communication and saves, the slowest\n"
                "ops, and each table's rows, bytes, growth per step, admissions,\n"
                "rejections, evictions and memory hit ratio. --format=html draws the\n"
                "split and the tables' growth."),
    "export": (_export_flags, _export, "graphmod export --portable [--model-dir=MODEL_DIR] "
               "SOURCE OUT | export --watch [--template=SOURCE] MODEL_DIR OUT",
               "--portable: SOURCE is a SavedModel graphmod.export_saved_model wrote (with\n"
               "graphmod's table ops). Writes OUT (absent or empty; written aside, then\n"
               "renamed), a SavedModel with the same signatures whose ops are all stock\n"
               "TensorFlow's: each table a HashTableV2 key -> row plus its rows, in OUT's\n"
               "variables; keys a table lacks read graphmod's initial row (or\n"
               "default_value). Optimizer slots, counts and pending ids are dropped. With\n"
               "--model-dir the state (latest checkpoint, its deltas, Horovod parts) is the\n"
               "model_dir's. --min-count/--seen-since leave rarely or long unseen rows out.\n"
               "Prints the report as JSON.\n"
               "--watch: after each full checkpoint or committed delta of MODEL_DIR, writes\n"
               "OUT/<global step> (TF Serving's version layout; written aside, renamed\n"
               "whole) from the template SavedModel's graph and the new state, keeping the\n"
               "newest --keep versions. Prints one JSON line per version. Runs until\n"
               "--until-step is reached, or SIGTERM or Ctrl-C (after the version being\n"
               "written; a second one stops it at once)."),
}


def _underscored(arg: str) -> str:
    """--dry-run as --dry_run (absl's names): both work; help and errors say --dry-run."""
    if not arg.startswith("--") or arg == "--":
        return arg
    flag, eq, value = arg[2:].partition("=")
    return "--" + flag.replace("-", "_") + eq + value


def _dashed(text: str) -> str:
    """absl's --[no]dry_run, flag 'dry_run' and its suggestions as --[no]dry-run."""
    text = re.sub(r"mean: (.*) \?", lambda m: "mean --" + m[1].replace(", ", ", --") + "?", text)
    return re.sub(r"(--(?:\[no\])?|flag ')(\w+)", lambda m: m[1] + m[2].replace("_", "-"), text)


def _usage() -> str:
    return (__doc__ or "").strip() + "\n"


def _one_line(text) -> str:
    """A message as one line: a file name may hold a newline."""
    return str(text).strip().replace("\r", "\\r").replace("\n", "\\n")


def _fail(name: str, message) -> int:
    print(f"graphmod {name}: {_one_line(message)}", file=sys.stderr)
    return USAGE


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(_usage(), file=sys.stdout if len(argv) >= 2 else sys.stderr)
        return OK if len(argv) >= 2 else USAGE
    name = argv[1]
    if name not in COMMANDS:
        print(f"graphmod: no command '{_one_line(name)}' (commands: {', '.join(COMMANDS)})",
              file=sys.stderr)
        return USAGE
    define, run_command, usage, about = COMMANDS[name]
    fv = _flag_values(define)
    try:
        args = fv([f"graphmod {name}"] + [_underscored(a) for a in argv[2:]])[1:]
    except flags.Error as e:
        return _fail(name, _dashed(str(e)))
    if fv.help:
        print(f"usage: {usage}\n\n{about}\n\nflags:\n{_dashed(fv.get_help())}")
        return OK
    # TensorFlow's start-up lines (CPU features and the like) are not the
    # command's output; its warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return run_command(fv, args)
    except UsageError as e:
        return _fail(name, f"{e} (see graphmod {name} --help)")
    except ImportError as e:  # graphmod itself cannot load (e.g. another TensorFlow)
        if "graphmod.cli.graphs" in sys.modules:
            raise
        return _fail(name, f"cannot load graphmod: {e}")
    except Exception as e:  # pylint: disable=broad-except
        # Inputs the command cannot read (graphmod is imported by now).
        graphs = sys.modules.get("graphmod.cli.graphs")
        merged = sys.modules.get("graphmod.checkpoint.merged")
        if graphs is not None and isinstance(e, graphs.InputError) or \
                merged is not None and isinstance(e, merged.StateError):
            return _fail(name, e)
        raise


def run() -> None:
    """The console script's entry point. A reader that stops early (`graphmod
    diff ... | head -1`) ends the command quietly, as a SIGPIPE ends `git log`."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # what stdout still holds goes nowhere, not to a 2nd error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + 13  # 128 + SIGPIPE, the status a shell gives a tool that SIGPIPE ended
    sys.exit(code)


if __name__ == "__main__":  # bazel run //:graphmod_cli -- COMMAND ...
    run()
