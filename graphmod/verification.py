"""graphmod.verify: proves the hook's rewrite on the user's own model.

>>> result = graphmod.verify(estimator, input_fn, steps=20)
>>> print(result.summary())
>>> assert result.ok

It trains the model twice from the same initial state, in temporary
model_dirs: unmodified, then with GraphModifierHook (the caller's hook, so
its settings), over the same batches, and compares step by step:
- the loss;
- for each converted variable, after every step, the table's rows and
  optimizer slots against the variable's rows and slot variables at the same
  keys (rows the table holds; the unmodified model's other rows are
  compared too once the table holds every row, as after adoption);
- each table's initializer against the variable's initial rows (their mean
  and spread, or every value for a constant one).
The same initial state: the unmodified run's first checkpoint (step 0) is
copied into the hooked run's model_dir, which the hook adopts, so the tables
start from the variables' very rows. A difference over tolerance names the
variable, the step and what differs, and says whether an approximation the
hook's report states explains it.
"""
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
    """How one converted variable trained with the hook against without it."""
    variable: str
    table: str
    largest_difference: float = 0.0     # relative, over every step compared
    first_step: Optional[int] = None    # the first step over tolerance (0: the initial rows)
    what: str = ""                      # what differs there first
    explained_by: str = ""              # an approximation the report states, if any
    compared: str = ""                  # what was compared, or why rows were not
    rows_compared: bool = False
    by_step: List[float] = dataclasses.field(default_factory=list)  # largest, steps 1, 2, ...

    @property
    def ok(self) -> bool:
        """Within tolerance, or over it where a stated approximation explains
        it (never the initial rows: no approximation changes those)."""
        return self.first_step is None or (self.first_step > 0 and bool(self.explained_by))


@dataclasses.dataclass
class VerifyResult:
    steps: int
    losses: List[List[float]]                 # per step: [unmodified, hooked]
    loss_first_step: Optional[int]            # first step whose losses differ over tolerance
    findings: Dict[str, Finding]
    skipped: List[dict]                       # variables the hook left dense, with the reason
    rtol: float = 1e-4                        # the tolerances compared with
    atol: float = 1e-6

    @property
    def loss_explained_by(self) -> str:
        """The stated approximation of a variable whose rows differed at or
        before the step where the losses first differ, if any: the loss
        difference follows from it."""
        if self.loss_first_step is None:
            return ""
        return next((f"{f.variable}: {f.explained_by}" for f in self.findings.values()
                     if f.explained_by and (not f.rows_compared or f.first_step is not None
                                            and f.first_step <= self.loss_first_step)), "")

    @property
    def ok(self) -> bool:
        """No difference over tolerance that no stated approximation explains."""
        return (self.loss_first_step is None or bool(self.loss_explained_by)) and \
            all(f.ok for f in self.findings.values())

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        lines = [f"graphmod.verify: {'PASS' if self.ok else 'FAIL'} over {self.steps} steps"]
        if self.loss_first_step is not None:
            plain, hooked = self.losses[self.loss_first_step - 1]
            why = f", explained ({self.loss_explained_by})" if self.loss_explained_by else ""
            lines.append(f"  loss differs from step {self.loss_first_step}: {plain:.9g} "
                         f"unmodified, {hooked:.9g} hooked{why}")
        for f in self.findings.values():
            state = ("ok" if f.first_step is None else
                     f"explained ({f.explained_by})" if f.explained_by else "DIFFERS")
            where = "" if f.first_step is None else \
                f"; first over tolerance at step {f.first_step}: {f.what}"
            lines.append(f"  {f.variable} -> table '{f.table}': {state}, largest relative "
                         f"difference {f.largest_difference:.3g}{where} ({f.compared})")
        for s in self.skipped:
            lines.append(f"  {s['variable']}: stays dense ({s['reason']})")
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
        self.loss = graph.get_collection(tf1.GraphKeys.LOSSES)[0]
        self.inputs = [t for op in graph.get_operations() if op.type == "IteratorGetNext"
                       for t in op.outputs]
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
    model_dirs go (a temporary folder, removed after, if None)."""
    from graphmod.hooks.graph_modifier import GraphModifierHook  # pylint: disable=import-outside-toplevel
    hook = hook if hook is not None else GraphModifierHook()
    if steps < 1:
        raise ValueError(f"graphmod.verify: steps must be >= 1, got {steps}")
    own = work_dir is None
    work = tempfile.mkdtemp(prefix="graphmod-verify-") if own else work_dir
    try:
        plain_dir, hooked_dir = os.path.join(work, "unmodified"), os.path.join(work, "hooked")
        candidates: List[str] = []

        def dense_state():
            graph = tf1.get_default_graph()
            variables = {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
            candidates.extend(n for n, v in variables.items() if v.shape.rank == 2)
            return {n: variables[n] for n in candidates}

        plain = _Recorder(dense_state)
        _estimator(estimator, plain_dir, steps).train(input_fn, steps=steps, hooks=[plain])
        _copy_first_checkpoint(plain_dir, hooked_dir)

        def table_state():
            from graphmod.state import tables  # pylint: disable=import-outside-toplevel
            return {t.name: t.export() for t in tables(tf1.get_default_graph())}

        hooked = _Recorder(table_state)
        _estimator(estimator, hooked_dir, steps).train(input_fn, steps=steps,
                                                       hooks=[hook, hooked])
        if plain.batches != hooked.batches:
            step = next(i for i, (a, b) in enumerate(zip(plain.batches, hooked.batches), 1)
                        if a != b) if len(plain.batches) == len(hooked.batches) else 1
            raise ValueError(f"graphmod.verify: input_fn gave different batches to the two runs "
                             f"(first at step {step}): seed its shuffles and random ops")
        report = hook.report
        losses = [[a, b] for a, b in zip(plain.losses, hooked.losses)]
        loss_first = next((i for i, (a, b) in enumerate(losses, 1)
                           if not np.isclose(b, a, rtol=rtol, atol=atol)), None)
        findings = {t["variable"]: _compare(t, report, plain.after, hooked.after, rtol, atol)
                    for t in report.tables}
        result = VerifyResult(steps, losses, loss_first, findings, list(report.skipped), rtol,
                              atol)
        logging.info("%s", result.summary())
        return result
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


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


def _compare(entry: dict, report, plain: List[dict], hooked: List[dict], rtol: float,
             atol: float) -> Finding:
    variable, table = entry["variable"], entry["table"]
    f = Finding(variable, table)
    approximations = [a["what"] for a in report.approximations if a["variable"] == variable]
    if approximations:
        f.explained_by = "; ".join(approximations)
    initial = plain[0][variable]
    if not entry["warm_started"]:
        problem = _initializer_differs(entry["initializer"], initial, rtol, atol)
        if problem:
            f.first_step, f.what, f.largest_difference = 0, problem, float("inf")
    if entry.get("unsqueezed"):
        f.compared = "initializer only: the table's keys are the full ids, not rows"
        f.explained_by = "; ".join(
            [f.explained_by] * bool(f.explained_by) +
            [f"collision-free keys: ids that shared a row of the variable "
             f"({', '.join(entry['unsqueezed'])}) have rows of their own in the table"])
        return f
    if variable not in report.adopted:
        f.compared = "initializer only: the table did not start from the variable's rows"
        return f
    slots = entry.get("slot_variables") or []
    f.compared = f"rows and {len(slots)} slot(s) at {len(plain) - 1} steps"
    f.rows_compared = True
    for step in range(1, len(plain)):
        rows = hooked[step][table]
        keys = rows["keys"]
        pairs = [("rows", plain[step][variable][keys], rows["values"])]
        pairs += [(f"slot '{s}'", plain[step][s][keys], rows["slots"][:, k])
                  for k, s in enumerate(slots) if s in plain[step]]
        f.by_step.append(0.0)
        for what, want, got in pairs:
            diff = np.abs(got - want)
            relative = float(np.max(diff / np.maximum(np.abs(want), atol), initial=0.0))
            f.by_step[-1] = max(f.by_step[-1], relative)
            f.largest_difference = max(f.largest_difference, relative)
            over = diff > atol + rtol * np.abs(want)
            if over.any() and f.first_step is None:
                i = np.argwhere(over)[0]
                f.first_step = step
                f.what = (f"{what} of key {keys[i[0]]}: {got[tuple(i)]:.9g} hooked, "
                          f"{want[tuple(i)]:.9g} unmodified")
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
