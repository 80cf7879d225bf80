"""Every code block of README.md and docs/*.md runs here, so a guide that
goes stale fails a test naming its file and line (docs/notes/ hold notes,
not guides, and are not read).

Blocks: fenced ones only, each with its language. ```python runs, ```sh
runs each of its commands, ```text is a listing (a folder tree), not code.
A fence without a language, or an indented code block, fails
test_every_code_block_is_fenced_with_a_language.

Python blocks run in this process (TensorFlow is imported once), each by
exec in a namespace of its own, compiled under the doc's path with the
doc's line numbers, so a traceback points into the doc. A guide's block is
a fragment of its reader's program and uses the reader's names (model_fn,
input_fn, estimator, ...). The block's *context* makes them, from one tiny
real model (below: four embedding variables, a dense layer, Adagrad, a
batch holding every feature the guides read). The default context is
"estimator"; a block needing another says so on the line above its fence:
`<!-- test-context: NAME -->` (an HTML comment, which GitHub does not show).
CONTEXTS lists them all, among them the check-only ones, for blocks that
cannot run in a unit process, with the reason: such a block is compiled, may
use only the names its context lists, and every graphmod name it calls must
exist and take the arguments it passes. So are the graphmod calls in a
block's comments (`# table API: graphmod.create_table(...)`) and in the
prose's inline code (`TableSettings(prefetch=False)`). A generator a block
leaves (estimator.predict's) is drained: predict works as it is read.

sh blocks: each command (a line and its `\\` continuations) is a test.
`graphmod ...` runs the installed script (.venv/bin/graphmod) in this
process with runpy, since a process of its own would import TensorFlow
again (~5 s a command); one that runs until stopped (`export --watch`) runs
as a process and gets SIGTERM once it printed its first version. Other
commands run in bash. All run in a fresh folder where `.venv` and
`examples` link to the checkout's, and must exit 0. EXEMPT_COMMANDS lists
the commands that are not run, and why.

Paths and placeholders: the guides' example paths (/tmp/export,
/srv/models/ctr, ...: PATHS) and the placeholders of commands (MODEL_DIR,
OUT, ...: PLACEHOLDERS) become paths in the module's workspace (models
trained once, on first use) or in the block's own folder (a block that
writes gets a copy to write to). A synopsis' optional `[--flag=X]` is
given. A placeholder not in PLACEHOLDERS fails its command.
"""
import ast
import builtins
import contextlib
import dataclasses
import functools
import inspect
import io
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import tokenize
import traceback
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format

import graphmod
from graphmod.checkpoint import serving_versions

pytestmark = pytest.mark.slow

tf1 = tf.compat.v1
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


# ---------------------------------------------------------------- the blocks

@dataclasses.dataclass(frozen=True)
class Block:
    doc: str              # path from the repository's root
    line: int             # the block's first line of code (1-based)
    lang: str             # python, sh, text; "" when the fence names none
    context: Optional[str]
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
CONTEXT = re.compile(r"^\s*<!--\s*test-context:\s*(\S+)\s*-->\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
LANGUAGES = ("python", "sh", "text")


def docs() -> List[str]:
    guides = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    return ["README.md"] + [f"docs/{name}" for name in guides]


def blocks(doc: str) -> List[Block]:
    """The code blocks of doc. An indented code block (4 spaces after a
    blank line, not continuing a list item) comes back with lang "" so the
    language test names it."""
    lines = (REPO / doc).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            indent, lang = fence.groups()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert end is not None, f"{doc}:{i + 1}: a fence that never closes"
            code = "\n".join(line[len(indent):] if line.startswith(indent) else line.strip()
                             for line in lines[i + 1:end])
            above = next((line for line in reversed(lines[:i]) if line.strip()), "")
            context = CONTEXT.match(above)
            found.append(Block(doc, i + 2, lang, context and context.group(1), code))
            i = end + 1
            continue
        if lines[i].startswith("    ") and i and not lines[i - 1].strip():
            previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
            if not previous.startswith(" ") and not LIST_ITEM.match(previous):
                found.append(Block(doc, i + 1, "", None, lines[i].strip()))
        i += 1
    return found


ALL_BLOCKS = [b for doc in docs() for b in blocks(doc)]


@dataclasses.dataclass(frozen=True)
class Command:
    block: Block
    line: int
    text: str             # as the doc has it, continuations joined

    @property
    def where(self) -> str:
        return f"{self.block.doc}:{self.line}"


def commands(block: Block) -> List[Command]:
    """The commands of an sh block: a line and its `\\` continuations, with
    comment-only lines left out."""
    found, pending, start = [], [], None
    for n, line in enumerate(block.code.splitlines(), block.line):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        start = start if pending else n
        pending.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            found.append(Command(block, start, " ".join(part.strip() for part in pending)))
            pending = []
    assert not pending, f"{block.where}: a command ends in a continuation"
    return found


PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]
COMMANDS = [c for b in ALL_BLOCKS if b.lang == "sh" for c in commands(b)]


def test_every_code_block_is_fenced_with_a_language():
    bad = [f"{b.where}: {'```' + b.lang if b.lang else 'no language'}" for b in ALL_BLOCKS
           if b.lang not in LANGUAGES]
    assert not bad, f"fence code blocks with one of {LANGUAGES}: {bad}"
    # A test-context comment that no fence follows (a block moved away from it).
    marks = sum(bool(CONTEXT.match(line)) for doc in docs()
                for line in (REPO / doc).read_text().splitlines())
    assert marks == sum(b.context is not None for b in ALL_BLOCKS)


def test_every_guide_is_read():
    """The guides this module reads hold code to run (a rename of docs/ or
    a change of the fence syntax would otherwise pass with nothing run)."""
    with_code = {b.doc for b in PYTHON} | {c.block.doc for c in COMMANDS}
    assert {"README.md", "docs/hook.md", "docs/cli.md", "docs/serving.md"} <= with_code


# ------------------------------------------------- the model the guides use

ROWS, DIM, BATCH, BATCHES = 20_000, 4, 16, 24


def input_fn():
    """BATCHES batches, the same at every call (graphmod.verify trains twice
    over them). Every feature a guide reads: user_id, item_id and item are
    [batch, 1] int64 ids, ids three of them, timestamp int seconds."""
    rng = np.random.default_rng(0)
    n = BATCH * BATCHES
    ids = rng.integers(0, ROWS, size=(n, 3))
    features = {"ids": ids, "user_id": ids[:, :1], "item_id": ids[:, 1:2], "item": ids[:, 2:],
                "timestamp": 1_700_000_000 + 60 * np.arange(n)[:, None]}
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)


def eval_input_fn():
    return input_fn().take(4)


def model_fn(features, labels, mode):
    """A user's model, written without graphmod: variables named as the
    guides name them (u, i: the warm start's targets; emb: `ckpt convert
    --variables=emb`'s; a feature column over item: docs/tiers.md's
    input_layer/item_embedding), each with ROWS rows, so the hook converts
    them all."""
    def variable(name):
        return tf1.get_variable(name, [ROWS, DIM],
                                initializer=tf1.truncated_normal_initializer(stddev=0.05))
    item = tf1.feature_column.embedding_column(
        tf1.feature_column.categorical_column_with_identity("item", ROWS), DIM)
    net = tf.concat([
        tf.nn.embedding_lookup(variable("u"), features["user_id"][:, 0]),
        tf.nn.embedding_lookup(variable("i"), features["item_id"][:, 0]),
        tf.reduce_sum(tf.nn.embedding_lookup(variable("emb"), features["ids"]), 1),
        tf1.feature_column.input_layer(features, [item])], 1)
    logits = tf.squeeze(tf1.layers.dense(net, 1), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def serving_input_receiver_fn():
    """One input, ids (docs/serving.md's requests send {"ids": [1, 2, 3]});
    the model's other features are read from it."""
    ids = tf1.placeholder(tf.int64, [None, 3], name="ids")
    features = {"ids": ids, "user_id": ids[:, :1], "item_id": ids[:, 1:2], "item": ids[:, 2:]}
    return tf.estimator.export.ServingInputReceiver(features, {"ids": ids})


def make_estimator(model_dir: str, **config) -> tf.estimator.Estimator:
    return tf.estimator.Estimator(model_fn, model_dir,
                                  config=tf.estimator.RunConfig(**config) if config else None)


class Workspace:
    """What the blocks read, made once for the module and only when a block
    asks for it (a single block run with -k pays for its own needs only)."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cached_property
    def trained_dir(self) -> str:
        """Trained with the hook: graphs dumped (graphmod diff), checkpoints
        and deltas (inspect, compact, export)."""
        path = str(self.root / "trained")
        make_estimator(path, save_checkpoints_steps=10).train(input_fn, hooks=[
            graphmod.GraphModifierHook(dump_graph=True, incremental_every_steps=5)])
        return path

    def trained_copy(self, folder: Path) -> str:
        """A copy of trained_dir for a block that changes it (made once)."""
        if not folder.exists():
            shutil.copytree(self.trained_dir, folder)
        return str(folder)

    @functools.cached_property
    def dense_dir(self) -> str:
        """Trained without graphmod: what `rewrite --dry-run` reads."""
        path = str(self.root / "dense")
        make_estimator(path).train(input_fn, steps=2)
        return path

    @functools.cached_property
    def dense_checkpoint(self) -> str:
        return tf.train.latest_checkpoint(self.dense_dir)

    @functools.cached_property
    def graph_files(self) -> Dict[str, str]:
        """The hook's graphs before and after its rewrite, as a binary and a
        text GraphDef."""
        dumps = Path(self.trained_dir) / "graphmod"
        before = tf1.GraphDef()
        text_format.Parse((dumps / "graph_before_train.pbtxt").read_text(), before)
        (self.root / "before.pb").write_bytes(before.SerializeToString())
        shutil.copy(dumps / "graph_after_train.pbtxt", self.root / "after.pbtxt")
        return {"BEFORE.pb": str(self.root / "before.pb"),
                "AFTER.pbtxt": str(self.root / "after.pbtxt")}

    @functools.cached_property
    def saved_model(self) -> str:
        """A SavedModel graphmod.export_saved_model wrote of the trained model."""
        return graphmod.export_saved_model(make_estimator(self.trained_dir),
                                           serving_input_receiver_fn,
                                           str(self.root / "export")).decode()

    @functools.cached_property
    def portable(self) -> str:
        """A portable version, as TF Serving finds it under its base folder."""
        return graphmod.export_saved_model(make_estimator(self.trained_dir),
                                           serving_input_receiver_fn,
                                           str(self.root / "portable"), portable=True).decode()

    @functools.cached_property
    def ids_npy(self) -> str:
        path = self.root / "ids.npy"
        np.save(path, np.array([[1, 2, 3]], np.int64))
        return str(path)

    def _dense_source(self, folder: str, name: str, step: int) -> str:
        """A model_dir holding a dense variable `name` of u's and i's shape."""
        path = self.root / folder
        with tf.Graph().as_default():
            variable = tf1.get_variable(name, [ROWS, DIM])
            with tf1.Session() as session:
                session.run(variable.initializer)
                tf1.train.Saver([variable]).save(session, str(path / "model.ckpt"), step)
        return str(path)

    @functools.cached_property
    def user_tower(self) -> str:
        return self._dense_source("user_tower", "user_emb", 300)

    @functools.cached_property
    def item_tower(self) -> str:
        return self._dense_source("item_tower", "item_emb", 5000)  # model.ckpt-5000


# The guides' example paths: what each becomes, for a block run in `folder`.
Value = Callable[[Workspace, Path], str]
PATHS: Dict[str, Value] = {
    "/tmp/export": lambda ws, folder: str(folder / "export"),           # an export's base
    "/tmp/export/1700000000": lambda ws, folder: ws.saved_model,       # one it wrote
    "/srv/models/ctr": lambda ws, folder: str(folder / "serving"),     # TF Serving's base
    "/srv/models/ctr/1300": lambda ws, folder: ws.portable,            # a version in it
    "/models/ctr": lambda ws, folder: ws.trained_copy(folder / "model_dir"),
    "/models/user_tower": lambda ws, folder: ws.user_tower,
    "/models/item_tower": lambda ws, folder: ws.item_tower,
    "/mnt/ssd/graphmod": lambda ws, folder: str(folder / "ssd"),
    "/tmp/ids.npy": lambda ws, folder: ws.ids_npy,
    "/tmp/ps_model": lambda ws, folder: str(folder / "ps_model"),
}
PLACEHOLDERS: Dict[str, Value] = {
    "MODEL_DIR": lambda ws, folder: ws.trained_copy(folder / "model_dir"),
    "DENSE_MODEL_DIR": lambda ws, folder: ws.dense_dir,
    "CKPT": lambda ws, folder: ws.dense_checkpoint,
    "BEFORE.pb": lambda ws, folder: ws.graph_files["BEFORE.pb"],
    "AFTER.pbtxt": lambda ws, folder: ws.graph_files["AFTER.pbtxt"],
    "SAVED_MODEL": lambda ws, folder: ws.saved_model,
    "OUT": lambda ws, folder: str(folder / "out"),
    "SERVING_BASE": lambda ws, folder: str(folder / "serving"),
    "N": lambda ws, folder: "2",
}
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]+(?:\.\w+)?\b")  # what a placeholder looks like


def substitute(text: str, values: Dict[str, Value], ws: Workspace, folder: Path) -> str:
    """text with each of values' names (whole, the longest first) replaced by
    its value, each computed once."""
    if not values:
        return text
    names = sorted(values, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(?:%s)(?![\w-])" % "|".join(map(re.escape, names)))
    made: Dict[str, str] = {}

    def value(match):
        name = match.group(0)
        if name not in made:
            made[name] = values[name](ws, folder)
        return made[name]
    return pattern.sub(value, text)


# ------------------------------------------------------------- the contexts

def user_names() -> dict:
    """What a guide's fragment takes from the user's program."""
    return dict(tf=tf, graphmod=graphmod, model_fn=model_fn, input_fn=input_fn,
                eval_input_fn=eval_input_fn, serving_input_receiver_fn=serving_input_receiver_fn)


def fresh_estimator(ws: Workspace, folder: Path) -> dict:
    model_dir = str(folder / "model_dir")
    return dict(user_names(), model_dir=model_dir, estimator=make_estimator(model_dir))


def trained_estimator(ws: Workspace, folder: Path) -> dict:
    model_dir = ws.trained_copy(folder / "model_dir")
    return dict(user_names(), model_dir=model_dir, estimator=make_estimator(model_dir))


def rule_runs_in_the_pipeline(names: dict) -> None:
    """docs/extending.md's rule module, registered after graphmod's own
    rules (the registry checks its AFTER), rewrites a training graph through
    the real pipeline, and its rewrite gets the converted variable."""
    # pylint: disable=import-outside-toplevel
    from graphmod.rewrite import pipeline
    from graphmod.rewrite.rule import registry
    from graphmod.rewrite_rules import RULES
    from graphmod.settings import RewriteSettings
    calls = []

    def rewrite(rw, conversions, context):
        calls.append([c.name for c in conversions])
        names["rewrite"](rw, conversions, context)
    rules = registry(*[types.SimpleNamespace(NAME=r.name, AFTER=r.after, check=r.check,
                                             rewrite=r.rewrite) for r in RULES],
                     types.SimpleNamespace(**dict(names, rewrite=rewrite)))
    with tf.Graph().as_default() as graph:
        emb = tf1.get_variable("emb", [ROWS, DIM])
        ids = tf1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids))
        tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_or_create_global_step())
        report = pipeline.rewrite(graph, RewriteSettings(), "train", rules=rules)
    assert calls == [["emb"]], calls
    assert [t["variable"] for t in report.tables] == ["emb"]


@dataclasses.dataclass(frozen=True)
class Context:
    about: str
    names: Optional[Callable[[Workspace, Path], dict]] = None  # the block's namespace
    after: Optional[Callable[[dict], None]] = None             # run after the block
    ranks: int = 1                                             # > 1: under horovodrun
    # Check only (compiled, names and arguments checked), and why; the names
    # such a block takes from the program it is part of.
    exempt: str = ""
    takes: frozenset = frozenset()


CONTEXTS: Dict[str, Context] = {
    "estimator": Context(
        "the default: the user's model and an Estimator of it on a fresh model_dir",
        fresh_estimator),
    "trained": Context(
        "the Estimator on a copy of a model_dir trained with the hook", trained_estimator),
    "rule": Context(
        "a rewrite rule's module, then run in the pipeline after graphmod's rules",
        lambda ws, folder: {}, after=rule_runs_in_the_pipeline),
    "horovod": Context(
        "2 Horovod ranks (horovodrun, Gloo over loopback), the user's names in each, and "
        "MODEL_DIR, rank 0's model_dir", ranks=2),
    "horovod-table-api": Context(
        "the table API on Horovod ranks",
        exempt="a fragment of a graph-mode training program on several ranks (its ids, loss, "
               "dense variables, session); examples/horovod_sharded.py is that program whole, "
               "and tests/test_distributed.py::test_the_example_runs_on_two_ranks runs it on 2 "
               "ranks",
        takes=frozenset({"hvd", "tf", "graphmod", "table", "table_opt", "ids", "loss",
                         "dense_vars"})),
}

# Commands not run (how they start), and why. Their files in the checkout
# (.venv/..., examples/...) must exist, and `make`'s target in the Makefile.
EXEMPT_COMMANDS: Dict[str, str] = {
    "pip install": "installs into the environment this test runs in; tests/test_packaging.py "
                   "builds a wheel and installs it into a fresh venv with TensorFlow from PyPI",
    "make": "sets up a machine and runs the whole suite, this test included",
    "docker run": "starts stock TF Serving's container (a download); tests/test_portable*.py "
                  "serve the same SavedModels with stock TensorFlow, as `saved_model_cli run` "
                  "does here",
    "curl": "asks the TF Serving container of `docker run`",
    ".venv/bin/horovodrun": "its 200 steps on 2 ranks take ~40 s on 2 cores; "
                            "tests/test_distributed.py::test_the_example_runs_on_two_ranks runs "
                            "the same example on 2 ranks with --steps 20",
}


def context_of(block: Block) -> Context:
    name = block.context or "estimator"
    if name not in CONTEXTS:
        fail(block.where, f"no test-context '{name}' (CONTEXTS: {', '.join(CONTEXTS)})")
    return CONTEXTS[name]


def exemption_of(command: Command) -> Optional[str]:
    return next((why for start, why in EXEMPT_COMMANDS.items()
                 if command.text == start or command.text.startswith(start + " ")), None)


# ---------------------------------------------------------------- the runs

def fail(where: str, what: str, output: str = "") -> None:
    pytest.fail(f"{where}: {what}" + (f"\n{output[-6000:]}" if output else ""), pytrace=False)


def compiled(block: Block, code: str):
    """code compiled under the doc's path with the doc's line numbers."""
    return compile("\n" * (block.line - 1) + code, str(REPO / block.doc), "exec")


def names_of(tree: ast.AST):
    """(the names code binds, the names it reads)."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names}
    return bound, read


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """The block's own folder and working directory, where `.venv` and
    `examples` are the checkout's (the guides' commands use both)."""
    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    """One workspace for the module: its models are trained once, on first use."""
    return Workspace(tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.where)
def test_python_block(block, ws, folder):
    context = context_of(block)
    check_comments(block)
    code = substitute(block.code, PATHS, ws, folder)
    if context.exempt:
        check_only(block, code, context)
    elif context.ranks > 1:
        run_on_ranks(block, code, context.ranks, folder)
    else:
        run_here(block, code, context, ws, folder)


def run_here(block: Block, code: str, context: Context, ws: Workspace, folder: Path) -> None:
    bound, read = names_of(ast.parse(code))
    if "model_fn" in bound and "estimator" in read - bound:
        fail(block.where, "defines a model_fn, then uses an estimator not made of it")
    names = context.names(ws, folder)
    raised = None
    try:
        exec(compiled(block, code), names)  # pylint: disable=exec-used
        for value in list(names.values()):
            if inspect.isgenerator(value):  # estimator.predict's: it works when read
                list(value)
    except Exception:  # pylint: disable=broad-except
        raised = traceback.format_exc()
    finally:
        # A ServingExport works in a thread of its own, which outlives
        # train(): wait for it (also on failure: no thread runs on into
        # later tests), then it must have exported without an error.
        exports = [v for v in names.values() if isinstance(v, graphmod.ServingExport)]
        for export in exports:
            assert export.join(300), f"{block.where}: the ServingExport thread did not end"
    if raised:
        fail(block.where, "the block raised", raised)
    for export in exports:
        if export.error is not None or not serving_versions.versions(export.base):
            fail(block.where, f"the ServingExport wrote no version into {export.base}",
                 repr(export.error))
    if context.after:
        context.after(names)


def check_only(block: Block, code: str, context: Context) -> None:
    """A block that cannot run here compiles, takes from its program only the
    names its context lists, and each graphmod name it calls exists and
    takes the arguments it passes."""
    compiled(block, code)  # a SyntaxError names the doc's line
    tree = ast.parse("\n" * (block.line - 1) + code)
    bound, read = names_of(tree)
    unknown = read - bound - set(dir(builtins)) - context.takes
    if unknown:
        fail(block.where, f"uses names its context does not list: {sorted(unknown)}")
    check_graphmod_calls(block.doc, tree)


def check_comments(block: Block) -> None:
    """Code in a block's comments (`# table API: graphmod.create_table(...)`):
    the graphmod names it calls, checked as in check_only. A comment that
    is prose (it does not parse) has none."""
    lines = io.StringIO(block.code).readline
    for token in tokenize.generate_tokens(lines):
        if token.type != tokenize.COMMENT or "graphmod." not in token.string:
            continue
        text = token.string.lstrip("# ")
        text = text.split(": ", 1)[1] if re.match(r"^[\w ]+: ", text) else text
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        line = block.line + token.start[0] - 1
        ast.increment_lineno(tree, line - 1)
        check_graphmod_calls(block.doc, tree)


def check_graphmod_calls(doc: str, tree: ast.AST, partial: bool = False) -> None:
    """Each graphmod name tree calls (graphmod.X..., or a bare public name of
    graphmod's when partial) exists and takes the arguments passed; partial:
    some of them (an option named in prose: `TableSettings(prefetch=False)`)."""
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        dotted = ast.unparse(call.func)
        if partial and dotted.split(".")[0] in graphmod.__all__:
            dotted = "graphmod." + dotted
        if not dotted.startswith("graphmod."):
            continue
        where = f"{doc}:{call.lineno}"
        target = graphmod
        for part in dotted.split(".")[1:]:
            if not hasattr(target, part):
                fail(where, f"no {dotted}")
            target = getattr(target, part)
        if any(isinstance(a, ast.Starred) for a in call.args) or \
                any(k.arg is None for k in call.keywords):
            continue  # f(*args, **kwargs): nothing to check
        bind = inspect.signature(target).bind_partial if partial else \
            inspect.signature(target).bind
        try:
            bind(*call.args, **{k.arg: k.value for k in call.keywords})
            error = None
        except TypeError as e:
            error = str(e)
        if error:
            fail(where, f"{dotted}(...): {error}")


INLINE = re.compile(r"`([^`]+)`")


@pytest.mark.parametrize("doc", docs())
def test_calls_in_the_prose(doc):
    """An inline `graphmod.X(...)` or `PublicName(...)` of the prose (one that
    parses: `ServingExport(min_count=, seen_since=)` is a list of names)
    calls what exists, with arguments it takes."""
    text = (REPO / doc).read_text()
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for span in INLINE.finditer(text):
        code = span.group(1).replace("\n", " ")
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        ast.increment_lineno(tree, text.count("\n", 0, span.start()))
        check_graphmod_calls(doc, tree, partial=True)


RANK_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_docs
    doc, line, code, model_dir = sys.argv[1:]
    names = dict(test_docs.user_names(), MODEL_DIR=model_dir)
    exec(compile("\\n" * (int(line) - 1) + open(code).read(), doc, "exec"), names)
    print("the block ran", flush=True)
""")


def run_on_ranks(block: Block, code: str, ranks: int, folder: Path) -> None:
    (folder / "ranks.py").write_text(RANK_SCRIPT.format(tests=str(REPO / "tests")))
    (folder / "block.py").write_text(code)
    done = subprocess.run(
        # (--start-timeout: each rank imports TensorFlow on 2 busy cores.)
        [str(BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
         "--start-timeout", "120",
         sys.executable, "ranks.py", str(REPO / block.doc), str(block.line), "block.py",
         str(folder / "model_dir")], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TMPDIR=str(folder)))  # rank 1's temporary model_dir: in folder
    if done.returncode != 0 or done.stdout.count("the block ran") != ranks:
        output = done.stdout + done.stderr
        start = output.find("Traceback (most recent call last)")  # a rank's, before horovodrun's
        fail(block.where, f"the block failed on {ranks} ranks", output[max(start, 0):][:6000])


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_command(command, ws, folder):
    why = exemption_of(command)
    if why:
        check_exempt(command)
        pytest.skip(f"not run: {why}")
    unknown = [p for p in PLACEHOLDER.findall(command.text) if p not in PLACEHOLDERS]
    if unknown:
        fail(command.where, f"placeholders this test does not know: {unknown}")
    text = substitute(command.text, {**PATHS, **PLACEHOLDERS}, ws, folder)
    text = re.sub(r"\[(--[^\]\s]+)\]", r"\1", text)  # a synopsis' optional flags: given
    argv = shlex.split(text, comments=True)
    if Path(argv[0]).name != "graphmod":
        # TMPDIR: what the command leaves in temporary folders (ps_cluster.py's
        # logs) stays in the block's folder.
        returncode, output = run_in_bash(text, folder)
        if returncode != 0:
            fail(command.where, f"exit status {returncode}: {text}", output)
    elif "--watch" in argv:
        watch_until_a_version(command, argv)
    else:
        run_graphmod(command, argv, text)


def run_in_bash(text: str, folder: Path, timeout: float = 600) -> tuple:
    """(exit status, output) of a command in a process group of its own: on
    a timeout, SIGINT lets it stop what it started (ps_cluster.py's tasks,
    in sessions of their own, are stopped by its `finally`), then SIGKILL."""
    process = subprocess.Popen(["bash", "-eo", "pipefail", "-c", text], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}",
                                        TMPDIR=str(folder)))
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        return f"timeout after {timeout:.0f} s", output


def check_exempt(command: Command) -> None:
    argv = shlex.split(command.text, comments=True)
    for arg in argv:
        if arg.startswith((".venv/", "examples/")) and not (REPO / arg).exists():
            fail(command.where, f"{arg}: no such file in the checkout")
    if argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        missing = [t for t in argv[1:] if t not in targets]
        if missing:
            fail(command.where, f"no make target {missing}")


def run_graphmod(command: Command, argv: List[str], text: str) -> None:
    """The installed script, run in this process."""
    out, status, raised = io.StringIO(), 0, None
    old, sys.argv = sys.argv, ["graphmod", *argv[1:]]
    try:
        # The command sets TF_CPP_MIN_LOG_LEVEL for its process: not for this one's.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                mock.patch.dict(os.environ):
            runpy.run_path(str(BIN / "graphmod"), run_name="__main__")
    except SystemExit as e:
        status = e.code or 0
    except Exception:  # pylint: disable=broad-except
        raised = traceback.format_exc()
    finally:
        sys.argv = old
    if raised or status != 0:
        fail(command.where, f"exit status {status}: {text}" if not raised else f"raised: {text}",
             out.getvalue() + (raised or ""))


def watch_until_a_version(command: Command, argv: List[str]) -> None:
    """A command that runs until interrupted: a process of the installed
    script, stopped with SIGTERM once it printed its first version (or
    killed after 2 minutes)."""
    process = subprocess.Popen([str(BIN / "graphmod"), *argv[1:]], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(120, process.kill)
    timer.start()
    lines, stopped = [], False
    try:
        for line in process.stdout:  # to its end, after the SIGTERM too
            lines.append(line)
            if line.startswith('{"version"') and not stopped:
                process.send_signal(signal.SIGTERM)
                stopped = True
        status = process.wait()
    finally:
        timer.cancel()
        process.kill()
    if status != 0 or not any(line.startswith('{"version"') for line in lines):
        fail(command.where, f"exit status {status}, no version: {' '.join(argv)}",
             "".join(lines))


def test_every_path_and_placeholder_is_in_a_guide():
    """PATHS and PLACEHOLDERS hold what the guides use, no more: a name
    the guides dropped is to go from here too."""
    text = "\n".join(b.code for b in ALL_BLOCKS if b.lang in ("python", "sh"))
    unused = [name for name in [*PATHS, *PLACEHOLDERS]
              if not re.search(r"(?<![\w./-])%s(?![\w-])" % re.escape(name), text)]
    assert not unused, unused
