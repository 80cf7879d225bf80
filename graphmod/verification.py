"""graphmod.verify: proves the hook's rewrite on the user's own model.

>>> result = graphmod.verify(estimator, input_fn, steps=20)
>>> print(result.summary())
>>> assert result.ok

It trains the model twice from the same initial state, in temporary
model_dirs: unmodified, then with GraphModifierHook (the caller's hook, so
its settings), over the same batches, and compares step by step:
- the loss;
- for each converted variable, after every step, every row and optimizer
  slot of its table against the variable's rows and slot variables (the
  table must hold exactly the keys 0..rows-1: adoption gives it every row);
- each dense variable both runs train, after every step;
- each table's initializer against the variable's initial rows (their mean
  and spread, or every value for a constant one), unless warm-started.
A table that stores its rows smaller (storage_dtype) rounds every row it
updates, and its initial rows. The hooked model is then trained twice: with
those tables stored as float32, compared exactly as above (the rewrite),
and as asked, where each of their values may differ by the rounding its row
went through: twice the form's half step at the value then (float16,
bfloat16; int8: the row's step) for the initial rows and each update, added
up; anything beyond fails, looked up or not. The loss and the dense
variables of that second run are not compared (the rounding moves them).
The same initial state: the unmodified run's first checkpoint (step 0) is
copied into the hooked run's model_dir, which the hook adopts, so the tables
start from the variables' very rows.

A difference over tolerance names the variable, the step and the values. An
approximation the hook's report states for a variable (lazy Adam, L2 over
looked-up rows, dense FTRL/Momentum updates) explains a difference only where
it can cause one: a row the step did not look up starting to differ. A row
the step looked up that starts to differ is a failure whatever the report
says. The loss and the dense variables may then differ from the step after
an explained difference on. Tables whose keys are the full ids
(collision-free keys) or that did not start from the variable's rows cannot
be compared: the result says so and does not pass.

It holds every variable of each step in memory: verify a few steps of a
model that fits memory a few times over.
"""
import copy
import dataclasses
import glob
import hashlib
import html as html_lib
import os
import shutil
import tempfile
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from graphmod import horovod
from graphmod.embeddings import stored_rows
from graphmod.embeddings.partition import owner_of_numpy
from graphmod.horovod import save_schedule
from graphmod.state import graph_state

tf1 = tf.compat.v1

# Mean and standard deviation of each table initializer kind, over (a, b)
# (graphmod.embeddings.initializers.TableInitializer; truncated at 2 sigma).
_TRUNCATED_STD = 0.87962566103423978
_MOMENTS = {
    "zeros": lambda a, b: (0.0, 0.0),
    "constant": lambda a, b: (a, 0.0),
    "uniform": lambda a, b: ((a + b) / 2, (b - a) / np.sqrt(12.0)),
    "normal": lambda a, b: (a, b),
    "truncated_normal": lambda a, b: (a, b * _TRUNCATED_STD),
}


@dataclasses.dataclass
class Finding:
    """How one variable trained with the hook against without it: a
    converted one (its table named) or a dense one (table "")."""
    variable: str
    table: str
    largest_difference: float = 0.0     # relative, over every step compared
    first_step: Optional[int] = None    # the first step over tolerance (0: the initial rows)
    what: str = ""                      # what differs there first
    # The first step at which a row starts to differ that the step looked up
    # (or, step 0, the initial rows or keys), and one it did not look up.
    looked_up: Optional[int] = None
    looked_up_what: str = ""
    not_looked_up: Optional[int] = None
    not_looked_up_what: str = ""
    unexplained_step: Optional[int] = None  # set by VerifyResult: the first step nothing explains
    unexplained: str = ""               # what differs there
    explained_by: str = ""              # the approximation the report states, if any
    rounding: str = ""                  # the stored form's approximation, if any
    compared: str = ""                  # what was compared
    comparable: bool = True             # False: rows could not be compared (compared says why)
    by_step: List[float] = dataclasses.field(default_factory=list)  # largest, steps 1, 2, ...

    @property
    def ok(self) -> bool:
        return self.comparable and self.unexplained_step is None

    def differs(self, step: int, what: str, looked_up: bool = True) -> None:
        if self.first_step is None:
            self.first_step, self.what = step, what
        if looked_up and self.looked_up is None:
            self.looked_up, self.looked_up_what = step, what
        if not looked_up and self.not_looked_up is None:
            self.not_looked_up, self.not_looked_up_what = step, what

    def judge(self, diverged: Optional[int]) -> None:
        """Sets the first step no approximation explains: a row the step
        looked up starting to differ, or (without a stated approximation) any
        row, before the model diverged by an explained difference at step
        `diverged` (after which every difference may follow from that one)."""
        candidates = [(self.looked_up, self.looked_up_what)]
        if not self.explained_by:
            candidates.append((self.not_looked_up, self.not_looked_up_what))
        for step, what in sorted((c for c in candidates if c[0] is not None)):
            if step == 0 or diverged is None or step <= diverged:
                self.unexplained_step, self.unexplained = step, what
                return

    def line(self) -> str:
        name = self.variable + (f" -> table '{self.table}'" if self.table else " (dense)")
        if not self.comparable:
            return f"  {name}: NOT COMPARED ({self.compared})"
        if self.unexplained_step is not None:
            return (f"  {name}: DIFFERS from step {self.unexplained_step}: {self.unexplained} "
                    f"(largest relative difference {self.largest_difference:.3g}; "
                    f"{self.compared})")
        if self.first_step is not None:
            return (f"  {name}: explained from step {self.first_step} "
                    f"({self.explained_by or 'the difference it follows'}): "
                    f"{self.what} (largest relative difference {self.largest_difference:.3g})")
        return (f"  {name}: ok, largest relative difference {self.largest_difference:.3g} "
                f"({self.compared})")


@dataclasses.dataclass
class VerifyResult:
    steps: int
    losses: List[List[float]]                 # per step: [unmodified, hooked]
    loss_first_step: Optional[int]            # first step whose losses differ over tolerance
    findings: Dict[str, Finding]              # converted variables, by name
    dense: Dict[str, Finding]                 # dense variables both runs train, by name
    skipped: List[dict]                       # variables the hook left dense, with the reason
    rtol: float = 1e-4                        # the tolerances compared with
    atol: float = 1e-6

    notes: List[str] = dataclasses.field(default_factory=list)  # what was not verified
    # Under Horovod: the other ranks whose comparison failed, with their summaries
    other_ranks: List[str] = dataclasses.field(default_factory=list)
    # Tables storing rows smaller: the run with their storage dtypes, whose
    # rows are compared within their rounding (the loss and dense variables
    # are not: the rounding moves them; the run above checks them exactly)
    rounded: Optional["VerifyResult"] = None

    def __post_init__(self):
        for f in self.findings.values():
            f.judge(self.diverged_at)

    @property
    def diverged_at(self) -> Optional[int]:
        """The first step at which a stated approximation made rows differ
        (rows the step did not look up): from the step after it, the loss,
        the dense variables and the rows may all differ in consequence."""
        steps = [f.not_looked_up for f in self.findings.values()
                 if f.explained_by and f.not_looked_up is not None
                 and (f.looked_up is None or f.looked_up > f.not_looked_up)]
        return min(steps, default=None)

    def _explained_before(self, step: int) -> str:
        """The approximation that explains a difference first seen at `step`
        (in the loss, a dense variable or a table), or ""."""
        d = self.diverged_at
        if d is None or step <= d:
            return ""
        return next(f"{f.variable}: {f.explained_by}" for f in self.findings.values()
                    if f.explained_by and f.not_looked_up == d)

    @property
    def loss_explained_by(self) -> str:
        if self.loss_first_step is None:
            return ""
        return self._explained_before(self.loss_first_step)

    @property
    def ok(self) -> bool:
        """Everything compared, and no difference over tolerance that no stated
        approximation explains."""
        dense_ok = all(f.first_step is None or self._explained_before(f.first_step)
                       for f in self.dense.values())
        return ((self.loss_first_step is None or bool(self.loss_explained_by)) and dense_ok
                and all(f.ok for f in self.findings.values()) and not self.other_ranks
                and (self.rounded is None or self.rounded.ok))

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        lines = [f"graphmod.verify: {'PASS' if self.ok else 'FAIL'} over {self.steps} steps"]
        if self.loss_first_step is not None:
            plain, hooked = self.losses[self.loss_first_step - 1]
            why = (f", explained ({self.loss_explained_by})" if self.loss_explained_by
                   else ", DIFFERS")
            lines.append(f"  loss differs from step {self.loss_first_step}: {plain:.9g} "
                         f"unmodified, {hooked:.9g} hooked{why}")
        lines += [f.line() for f in self.findings.values()]
        differing = [f for f in self.dense.values() if f.first_step is not None]
        for f in differing:
            why = self._explained_before(f.first_step)
            lines.append(f"  {f.variable} (dense): differs from step {f.first_step}: {f.what}"
                         + (f", explained ({why})" if why else ", DIFFERS"))
        if self.dense and not differing:
            lines.append(f"  {len(self.dense)} dense variable(s): ok")
        for s in self.skipped:
            lines.append(f"  {s['variable']}: stays dense ({s['reason']})")
        if self.rounded is not None:
            lines.append("  with the storage dtypes asked for (a second run, rows within their "
                         "rounding):")
            lines += ["  " + f.line() for f in self.rounded.findings.values()]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  {line}" for r in self.other_ranks for line in r.splitlines()]
        return "\n".join(lines)

    def html(self) -> str:
        """A self-contained page: the verdict, the loss both ways by step, and
        each converted variable's largest relative difference by step against
        the tolerance."""
        from graphmod import charts  # pylint: disable=import-outside-toplevel
        e = html_lib.escape
        verdict = self.summary().splitlines()
        parts = [f"<p class='{'' if self.ok else 'bad'}'><b>{e(verdict[0])}</b></p>",
                 "<ul>" + "".join(f"<li>{e(line.strip())}</li>" for line in verdict[1:]) +
                 "</ul>",
                 charts.line_chart("loss by step", {
                     "unmodified": [a for a, _ in self.losses],
                     "hooked": [b for _, b in self.losses]})]
        for f in self.findings.values():
            if f.by_step:
                parts.append(charts.line_chart(
                    f"{f.variable}: largest relative difference of rows and slots",
                    {f.table: f.by_step}, log_y=True, guide=self.rtol,
                    guide_label=f"tolerance {self.rtol:g}"))
        return charts.page("graphmod verify", parts)


class _Recorder(tf1.train.SessionRunHook):
    """Each step's loss and a fingerprint of its batch; after each step, what
    `states()` fetches (variables, or tables' exported rows)."""

    def __init__(self, states):
        self.states = states
        self.losses, self.batches, self.after = [], [], []

    def begin(self):
        graph = tf1.get_default_graph()
        # The Estimator adds the EstimatorSpec's loss last (tf.losses adds parts first).
        self.loss = graph.get_collection(tf1.GraphKeys.LOSSES)[-1]
        # What the step reads of its input (a stash of it, where the ids go
        # a step ahead: graphmod.horovod.ids_ahead).
        ahead = graph_state(graph).step_inputs
        self.inputs = [t for op in graph.get_operations() if op.type == "IteratorGetNext"
                       for t in ahead.get(op.name, op.outputs)]
        self.fetches = self.states()

    def after_create_session(self, session, coord):
        self.after.append(session.run(self.fetches))  # step 0: the initial state

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs((self.loss, self.inputs))

    def after_run(self, run_context, run_values):
        loss, inputs = run_values.results
        self.losses.append(float(loss))
        digest = hashlib.sha1()
        for value in inputs:
            digest.update(np.ascontiguousarray(value).tobytes())
        self.batches.append(digest.hexdigest())
        self.after.append(run_context.session.run(self.fetches))


def verify(estimator: tf.estimator.Estimator, input_fn, steps: int = 20, hook=None,
           rtol: float = 1e-4, atol: float = 1e-6, work_dir: Optional[str] = None
           ) -> VerifyResult:
    """Trains `estimator`'s model `steps` steps unmodified and with `hook`
    (a GraphModifierHook; a default one if None) from the same initial state
    over input_fn's batches, which must be the same both times (a seeded
    input_fn), and compares them (module docstring). work_dir: where the two
    model_dirs go (a temporary folder, removed after, if None). Under Horovod
    (hvd.init() called, more than one rank) every rank calls it: the
    unmodified run is the model on those ranks, each rank compares the keys
    its tables own, and each rank's result holds every rank's failures."""
    from graphmod.hooks.graph_modifier import GraphModifierHook  # pylint: disable=import-outside-toplevel
    hook = hook if hook is not None else GraphModifierHook()
    if steps < 1:
        raise ValueError(f"graphmod.verify: steps must be >= 1, got {steps}")
    ranks = horovod.horovod_ranks()
    own = work_dir is None
    work = tempfile.mkdtemp(prefix="graphmod-verify-") if own else work_dir
    try:
        plain_dir, hooked_dir = os.path.join(work, "unmodified"), os.path.join(work, "hooked")
        names: List[str] = []

        def variables():
            graph = tf1.get_default_graph()
            return {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}

        def dense_state():
            held = variables()
            names.extend(held)
            return held

        plain = _Recorder(dense_state)
        _estimator(estimator, plain_dir, steps).train(input_fn, steps=steps, hooks=[plain])

        def hooked_state():
            from graphmod.state import tables  # pylint: disable=import-outside-toplevel
            graph = tf1.get_default_graph()
            held = variables()
            return {"tables": {t.name: t.export() for t in tables(graph)},
                    "dense": {n: held[n] for n in names if n in held}}

        def train_hooked(with_hook, model_dir: str) -> _Recorder:
            _copy_first_checkpoint(plain_dir, model_dir)
            recorder = _Recorder(hooked_state)
            _estimator(estimator, model_dir, steps).train(input_fn, steps=steps,
                                                          hooks=[with_hook, recorder])
            return recorder

        # Tables storing rows smaller round every update: the rewrite is
        # checked exactly with them stored as float32, and their rounding
        # in a second run, on the rows alone.
        float32_hook = _float32_twin(hook)
        hooked = train_hooked(float32_hook or hook, hooked_dir)
        rounding = (train_hooked(hook, os.path.join(work, "stored_smaller"))
                    if float32_hook is not None else None)
        try:
            for run in filter(None, (hooked, rounding)):
                if plain.batches != run.batches:
                    step = next(i for i, (a, b) in enumerate(zip(plain.batches, run.batches), 1)
                                if a != b) if len(plain.batches) == len(run.batches) else 1
                    raise ValueError(f"graphmod.verify: input_fn gave different batches to the "
                                     f"runs (first at step {step}): seed its shuffles and random "
                                     "ops")
            report = (float32_hook or hook).report
            losses = [[a, b] for a, b in zip(plain.losses, hooked.losses)]
            loss_first = next((i for i, (a, b) in enumerate(losses, 1)
                               if not np.isclose(b, a, rtol=rtol, atol=atol)), None)
            findings = {t["variable"]: _compare_table(t, report, plain.after, hooked.after, rtol,
                                                      atol, _owned(t, ranks))
                        for t in report.tables}
            converted = {n for t in report.tables
                         for n in [t["variable"], *t["slot_variables"]]}
            shared = [n for n in hooked.after[0]["dense"] if n not in converted
                      and n != "global_step"]
            dense = {n: _compare_dense(n, plain.after, hooked.after, rtol, atol) for n in shared}
            notes = [f"'{k['op']}' keeps its squeezed keys here ({k['reason']}): a fresh "
                     "training with collision_free=True keys the full ids, a model this cannot "
                     "compare" for k in report.squeezed_keys_kept]
            result = VerifyResult(steps, losses, loss_first, findings, dense,
                                  list(report.skipped), rtol, atol, notes)
            if rounding is not None:
                stored = [t for t in hook.report.tables if stored_rows.approximation(
                    t["storage_dtype"], t["slot_storage_dtype"])]
                result.rounded = VerifyResult(
                    steps, [[a, b] for a, b in zip(plain.losses, rounding.losses)], None,
                    {t["variable"]: _compare_table(t, hook.report, plain.after, rounding.after,
                                                   rtol, atol, _owned(t, ranks))
                     for t in stored}, {}, [], rtol, atol)
        except Exception as e:  # pylint: disable=broad-except
            if ranks <= 1:
                raise
            result, error = None, e  # raised on every rank, once all know
        else:
            error = None
        if ranks > 1:
            # Every rank's verdict on every rank (its own keys are all it saw).
            every = save_schedule.gather(
                [False, repr(error)] if error is not None else [result.ok, result.summary()],
                "graphmod_verify")
            failed = [(r, summary) for r, (ok, summary) in enumerate(every)
                      if not ok and r != horovod.horovod_rank()]
            if error is not None:
                raise error
            crashed = [f"rank {r}: {summary}" for r, summary in failed
                       if not summary.startswith("graphmod.verify:")]
            if crashed:
                raise RuntimeError("graphmod.verify failed on another rank: " + "; ".join(crashed))
            result.other_ranks = [f"rank {r}: {summary}" for r, summary in failed]
        logging.info("%s", result.summary())
        return result
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _float32_twin(hook):
    """The hook with every table it stores smaller (storage_dtype) stored as
    float32, or None when it stores none smaller."""
    tables = hook.settings.tables
    if not any(stored_rows.approximation(*stored_rows.forms(t.storage_dtype,
                                                            t.slot_storage_dtype))
               for t in tables.values()):
        return None
    twin = copy.copy(hook)  # (the hook serves one graph at a time; its runs are in turn)
    twin.settings = dataclasses.replace(hook.settings, tables={
        pattern: dataclasses.replace(t, storage_dtype="float32", slot_storage_dtype=None)
        for pattern, t in tables.items()})
    return twin


def _estimator(estimator, model_dir: str, steps: int) -> tf.estimator.Estimator:
    """The user's model in model_dir: a checkpoint at step 0 (the hooked run
    starts from it) and at the end only."""
    config = estimator.config.replace(model_dir=model_dir, save_checkpoints_steps=steps + 1,
                                      save_checkpoints_secs=None, keep_checkpoint_max=None)
    # Estimator.model_fn calls the user's model_fn with the estimator's params.
    return tf.estimator.Estimator(estimator.model_fn, config=config)


def _copy_first_checkpoint(plain_dir: str, hooked_dir: str) -> None:
    os.makedirs(hooked_dir)
    first = os.path.join(plain_dir, "model.ckpt-0")
    files = glob.glob(first + ".*")
    if not any(f.endswith(".index") for f in files):
        raise RuntimeError(f"graphmod.verify: the unmodified run wrote no step-0 checkpoint "
                           f"in {plain_dir}")
    for f in files:
        shutil.copy(f, hooked_dir)
    tf1.train.update_checkpoint_state(hooked_dir, os.path.join(hooked_dir, "model.ckpt-0"))


def _over(got: np.ndarray, want: np.ndarray, rtol: float, atol: float,
          allow=0.0) -> np.ndarray:
    """Where got is not within tolerance (and `allow`, elementwise) of want
    (NaN counts as over)."""
    return ~(np.abs(got - want) <= atol + rtol * np.abs(want) + allow)


# Bits of precision of the 16-bit forms, and float16's smallest step.
_MANTISSA_BITS = {"float16": 10, "bfloat16": 7}
_HALF_SUBNORMAL = 2.0 ** -24


def _rounding(form: str, have: np.ndarray, want: np.ndarray, rounded: np.ndarray):
    """What rounding rows stored as `form` adds where `rounded` (rows, along
    the first axis) went through it: twice the form's half step at the value
    (int8: the row's step over 255). 0 for float32."""
    if form == "float32":
        return 0.0
    have, want = np.asarray(have, np.float64), np.asarray(want, np.float64)
    rows = rounded.reshape((-1,) + (1,) * (have.ndim - 1))
    if form == "int8":
        flat = have.reshape(have.shape[0], -1)
        step = (flat.max(1) - flat.min(1)) / 255.0
        half = step.reshape((-1,) + (1,) * (have.ndim - 1)) / 2
    else:
        magnitude = np.maximum(np.abs(have), np.abs(want))
        exponent = np.floor(np.log2(np.maximum(magnitude, 1e-38)))
        half = 2.0 ** (exponent - _MANTISSA_BITS[form] - 1)
        if form == "float16":
            half = np.maximum(half, _HALF_SUBNORMAL / 2)
    return 2 * half * rows


def _relative(got: np.ndarray, want: np.ndarray, atol: float) -> float:
    diff = np.abs(got - want) / np.maximum(np.abs(want), atol)
    return float("inf") if np.isnan(diff).any() else float(np.max(diff, initial=0.0))


def _compare_dense(name: str, plain: List[dict], hooked: List[dict], rtol: float,
                   atol: float) -> Finding:
    f = Finding(name, "", compared=f"every value at {len(plain) - 1} steps")
    for step in range(len(plain)):
        want, got = np.asarray(plain[step][name]), np.asarray(hooked[step]["dense"][name])
        if want.shape != got.shape or not np.issubdtype(want.dtype, np.number):
            continue
        f.largest_difference = max(f.largest_difference, _relative(got, want, atol))
        over = _over(got, want, rtol, atol)
        if over.any() and f.first_step is None:
            i = tuple(np.argwhere(over)[0])
            f.differs(step, f"value at {list(i)}: {got[i]:.9g} hooked, {want[i]:.9g} "
                            "unmodified")
    return f


def _owned(entry: dict, ranks: int) -> Optional[np.ndarray]:
    """The keys of 0..rows-1 this Horovod rank's part of the report entry's
    table holds (None: every key, in one process or a replicated table)."""
    if ranks <= 1 or entry.get("placement") == "replicated":
        return None
    keys = np.arange(entry["rows"], dtype=np.int64)
    return keys[owner_of_numpy(keys, ranks) == horovod.horovod_rank()]


def _compare_table(entry: dict, report, plain: List[dict], hooked: List[dict], rtol: float,
                   atol: float, owned: Optional[np.ndarray] = None) -> Finding:
    """owned: the keys this rank's part holds, split across Horovod ranks."""
    variable, table, rows = entry["variable"], entry["table"], entry["rows"]
    f = Finding(variable, table)
    forms = (entry.get("storage_dtype", "float32"), entry.get("slot_storage_dtype", "float32"))
    f.rounding = stored_rows.approximation(*forms)
    f.explained_by = "; ".join(a["what"] for a in report.approximations
                               if a["variable"] == variable and a["what"] != f.rounding)
    initial = plain[0][variable]
    if not entry["warm_started"]:
        problem = _initializer_differs(entry["initializer"], initial, rtol, atol)
        if problem:
            f.largest_difference = float("inf")
            f.differs(0, problem)
    if entry.get("unsqueezed"):
        f.comparable = False
        f.compared = (f"its keys are the full ids ({', '.join(entry['unsqueezed'])}), not the "
                      "variable's rows; verify with GraphModifierHook(collision_free=False)")
        return f
    if variable not in report.adopted:
        f.comparable = False
        f.compared = "the table did not start from the variable's rows (not adopted)"
        return f
    slots = entry.get("slot_variables") or []
    expected = np.arange(rows) if owned is None else owned
    f.compared = (f"{rows} rows and {len(slots)} slot(s) at {len(plain) - 1} steps"
                  + ("" if owned is None else f" ({owned.size} of them on this rank)")
                  + ("" if not f.rounding else
                     f", within the rounding of rows stored as {forms[0]}"
                     + (f" (slots {forms[1]})" if forms[1] != forms[0] else "")))
    was_over = np.zeros(expected.size, bool)
    allowed: Dict[str, np.ndarray] = {}  # rounding each value may carry so far, by field
    for step in range(len(plain)):
        got = hooked[step]["tables"][table]
        keys = got["keys"]
        if keys.size != expected.size or np.any(np.sort(keys) != expected):
            outside = keys[(keys < 0) | (keys >= rows)]
            f.differs(step, f"the table holds {keys.size} keys, not exactly 0..{rows - 1}"
                            + ("" if owned is None else " that this rank owns")
                            + (f" (outside: {outside[:5].tolist()})" if outside.size else ""))
            return f
        order = np.argsort(keys)  # row i: key expected[i]
        keys = keys[order]
        # Rows this step looked up carry its version, the newest.
        looked_up = got["versions"][order] == got["versions"].max()
        rounded_now = looked_up if step > 0 else np.ones(expected.size, bool)
        pairs = [("rows", plain[step][variable][expected], got["values"][order], forms[0])]
        pairs += [(f"slot '{s}'", plain[step][s][expected], got["slots"][order][:, k], forms[1])
                  for k, s in enumerate(slots)]
        over = np.zeros(expected.size, bool)
        if step > 0:
            f.by_step.append(0.0)
        for what, want, have, form in pairs:
            relative = _relative(have, want, atol)
            f.largest_difference = max(f.largest_difference, relative)
            if step > 0:
                f.by_step[-1] = max(f.by_step[-1], relative)
            # A row's rounding adds up over its updates, each at the value
            # then (a value that shrank keeps the error of when it was larger).
            allowed[what] = allowed.get(what, 0.0) + _rounding(form, have, want, rounded_now)
            allow = allowed[what]
            over_what = _over(have, want, rtol, atol, allow).reshape(expected.size, -1).any(1)
            fresh = over_what & ~was_over & ~over
            if fresh.any():
                for rows_of, looked in ((fresh & looked_up, True), (fresh & ~looked_up, False)):
                    if not rows_of.any():
                        continue
                    i = int(np.argmax(rows_of))
                    j = tuple(np.argwhere(_over(have[i], want[i], rtol, atol,
                                                allow[i] if np.ndim(allow) else allow))[0])
                    f.differs(step, f"{what} of key {keys[i]}{list(j)}: {have[i][j]:.9g} "
                                    f"hooked, {want[i][j]:.9g} unmodified"
                                    + ("" if step == 0 else ", a row the step looked up"
                                       if looked else ", a row the step did not look up"),
                              looked_up=looked or step == 0)
            over |= over_what
        was_over |= over
    return f


def _initializer_differs(init: dict, rows: np.ndarray, rtol: float, atol: float) -> str:
    """Why the table's initializer does not draw rows like the variable's
    initial `rows`, or ""."""
    kind, a, b = init["kind"], init["a"], init["b"]
    if kind not in _MOMENTS:
        return f"unknown table initializer kind '{kind}'"
    mean, std = _MOMENTS[kind](a, b)
    values = rows.astype(np.float64).ravel()
    if std == 0.0:
        if np.allclose(values, mean, rtol=rtol, atol=atol):
            return ""
        return (f"initial rows: the table starts every value at {mean:.6g}, the variable's "
                f"range {values.min():.6g}..{values.max():.6g}")
    n = values.size
    got_mean, got_std = values.mean(), values.std()
    # Sampling error of a mean and a standard deviation over n draws, 5 sigma.
    mean_ok = abs(got_mean - mean) <= 5 * std / np.sqrt(n) + atol
    std_ok = abs(got_std / std - 1) <= 5 / np.sqrt(2 * n) + 0.01
    if mean_ok and std_ok:
        return ""
    return (f"initial rows: the table draws {kind} with mean {mean:.6g} and std {std:.6g}, "
            f"the variable's rows have mean {got_mean:.6g} and std {got_std:.6g}")
