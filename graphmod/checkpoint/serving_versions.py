"""Portable SavedModels of a model_dir's state, as TF Serving's numbered versions.

>>> export_state("/tmp/export/1700000000", "/models/ctr", "/srv/ctr/1")   # once
>>> watch("/models/ctr", "/tmp/export/1700000000", "/srv/ctr", keep=5)    # forever

A model_dir's state changes with every full checkpoint and every committed
delta (graphmod.checkpoint.deltas). Its serving graph does not: a template
SavedModel graphmod.export_saved_model wrote of the same model gives the
graph, the model_dir the state (graphmod.checkpoint.merged writes it as one
checkpoint first, deltas and Horovod parts applied). TF Serving watches a
base directory and loads the highest numbered version in it; a version is
named after its state's global step, written aside under a name starting
with '.' (which TF Serving skips) and renamed into place whole, and the
newest `keep` versions stay.
"""
import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

import tensorflow as tf
from absl import logging

from graphmod.checkpoint import deltas, merged
from graphmod.checkpoint.portable import NotPortable, portable_saved_model


def export_state(template: str, model_dir: str, out_dir: str, *, min_count: int = 0,
                 seen_since: Optional[int] = None) -> Dict:
    """Writes out_dir (absent or empty): the portable SavedModel of
    template's graph with model_dir's latest state. Returns
    portable_saved_model's report with the state's `step`."""
    state = merged.latest(model_dir)
    with _merged(state, os.path.dirname(os.path.abspath(out_dir))) as written:
        return _export(template, written, out_dir, min_count, seen_since)


def versions(base: str) -> List[int]:
    """The version numbers in base, oldest first."""
    if not os.path.isdir(base):
        return []
    return sorted(int(n) for n in os.listdir(base)
                  if n.isdigit() and os.path.isdir(os.path.join(base, n)))


def export_new_version(template: str, model_dir: str, base: str, *, keep: int = 5,
                       min_count: int = 0, seen_since: Optional[int] = None) -> Optional[Dict]:
    """If model_dir's latest state is newer than base's newest version, writes
    it as version <step> and removes all but the newest `keep` versions.
    Returns the export's report with `seconds_from_commit` (from the state's
    commit, its manifest or checkpoint index written, to the version in
    place), or None when there is nothing new."""
    if keep < 1:
        raise NotPortable(f"keep {keep}: must be >= 1")
    state = merged.latest(model_dir)
    have = versions(base)
    if have and state.step <= have[-1]:
        return None
    committed_at = _committed_at(state)  # read now: the training may delete the files
    with _merged(state, base) as written:
        # Named by the step the merge reached: a delta committed meanwhile is in it.
        out_dir = os.path.join(base, str(written[1].step))
        if os.path.exists(out_dir):  # another writer was first
            return None
        report = _export(template, written, out_dir, min_count, seen_since)
    report["seconds_from_commit"] = round(time.time() - committed_at, 3)
    for old in versions(base)[:-keep]:
        shutil.rmtree(os.path.join(base, str(old)), ignore_errors=True)
    logging.info("graphmod: serving version %s written (%s + %d delta(s)), %.1f s after its "
                 "commit", out_dir, os.path.basename(state.checkpoint), report["deltas"],
                 report["seconds_from_commit"])
    return report


@contextlib.contextmanager
def _merged(state: merged.State, parent: str):
    """(path, state) of the state written as one checkpoint in a scratch dir
    in parent (the export's file system; a name TF Serving skips), removed
    afterwards."""
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".tmp-state-", dir=parent)
    try:
        yield merged.write(state, os.path.join(scratch, "model.ckpt"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _export(template, written, out_dir, min_count, seen_since) -> Dict:
    path, state = written
    report = portable_saved_model(template, out_dir, variables=path, min_count=min_count,
                                  seen_since=seen_since)
    report.update(checkpoint=state.checkpoint, deltas=len(state.deltas), step=state.step)
    return report


def watch(template: str, model_dir: str, base: str, *, keep: int = 5, poll_secs: float = 5.0,
          min_count: int = 0, seen_since: Optional[int] = None,
          stop: Optional[Callable[[], bool]] = None,
          on_version: Optional[Callable[[Dict], None]] = None) -> int:
    """Writes a version after each new state of model_dir until stop()
    returns True (checked after each poll; None: forever). A model_dir with no
    checkpoint yet is waited for; a checkpoint the training's Saver deletes
    (max_to_keep) while it is read is passed over for the newer one, one
    saved again under its name is waited for until its save completes. One
    watcher per base: what an earlier one killed mid-write left is removed.
    Returns the number of versions written."""
    _remove_half_written(base)
    written, seen, waiting = 0, None, _Waiting()
    while True:
        before = _signature(model_dir)
        report = None
        if before != seen:  # checksums the chain only when the model_dir changed
            try:
                report = export_new_version(template, model_dir, base, keep=keep,
                                            min_count=min_count, seen_since=seen_since)
                seen = before
                waiting.over()
            except merged.NoCheckpoint:
                pass
            except (merged.StateError, NotPortable, OSError, tf.errors.OpError) as e:
                # Read again at the next poll (not at once: an error that recurs
                # while the training commits faster than an export takes
                # would never reach stop()).
                if not _retried(model_dir, before, e, waiting):
                    raise  # not a race with the training's saver: torn or unreadable
        if report is not None:
            written += 1
            if on_version is not None:
                on_version(report)
        if stop is not None and stop():
            return written
        if report is None:
            time.sleep(poll_secs)


class _Waiting:
    """How long a reader has waited for an unfinished save: logged when it
    starts, and again every WARN_SECS while it lasts (a save killed
    mid-write leaves the checkpoint so until someone removes it)."""
    WARN_SECS = 600

    def __init__(self):
        self.since: Optional[float] = None
        self._told = 0.0

    def on(self, checkpoint: str, e: BaseException) -> None:
        now = time.time()
        if self.since is None:
            self.since = self._told = now
            logging.info("graphmod: waiting for the save of %s to complete (%s)", checkpoint,
                         _first_line(e))
        elif now - self._told >= self.WARN_SECS:
            self._told = now
            logging.warning("graphmod: the save of %s has not completed for %.0f s (%s); a "
                            "save killed mid-write leaves it so, and the training's restore "
                            "refuses it too", checkpoint, now - self.since, _first_line(e))

    def over(self) -> None:
        self.since = None


def _retried(model_dir: str, before, e: BaseException, waiting: _Waiting) -> bool:
    """Whether a failed read of model_dir's state is one to read again: its
    latest checkpoint's save has not completed (waited for), or the
    training changed it while it was read (its signature, taken `before`)."""
    if _unfinished(model_dir):
        waiting.on(_latest(model_dir), e)
        return True
    if _signature(model_dir) != before:
        logging.info("graphmod: %s changed while read (%s); reading it again", model_dir,
                     _first_line(e))
        return True
    return False


def _latest(model_dir: str) -> Optional[str]:
    return tf.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None


def _unfinished(model_dir: str) -> bool:
    """Whether the latest checkpoint's save has not completed: Horovod ranks
    write it again under its name (a resumed run saves its step again), its
    table parts before their manifest commits them. (A ps task's save keeps
    the old manifest while it writes its part again in place: a read that
    fails meanwhile sees the signature change.)"""
    latest = _latest(model_dir)
    return latest is not None and merged.unfinished(latest)


def _signature(model_dir: str):
    """What changes when the training commits a state, deletes a checkpoint or
    writes one again under its name: the state file, the names of the latest
    checkpoint's files (a part written again in place shows its temporary
    files until its index is renamed into place), the time and size of its
    indexes and manifests, and its delta manifest's. Data files by name
    only: one stat a file would be hundreds of requests a poll on a remote
    model_dir of many ranks."""
    files = [os.path.join(model_dir, "checkpoint")]
    latest = _latest(model_dir)
    names = ()
    if latest is not None:
        folder, name = os.path.split(latest)
        try:
            names = tuple(sorted(f for f in tf.io.gfile.listdir(folder)
                                 if f.startswith(name + ".")))
        except tf.errors.NotFoundError:
            pass
        files += [os.path.join(folder, f) for f in names if f.endswith((".index", ".json"))]
        files.append(os.path.join(deltas.directory(latest), "manifest.json"))
    out = [names]
    for path in files:
        try:
            stat = tf.io.gfile.stat(path)
            out.append((path, stat.mtime_nsec, stat.length))
        except tf.errors.NotFoundError:
            out.append((path, None, None))
    return tuple(out)


def _remove_half_written(base: str) -> None:
    """The scratch dirs (.tmp-state-*, .tmp-portable-*) a watcher killed
    mid-write left in base; TF Serving never reads them (names starting with '.')."""
    for name in os.listdir(base) if os.path.isdir(base) else []:
        if name.startswith((".tmp-state-", ".tmp-portable-", ".tmp-template-")):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _committed_at(state: merged.State) -> float:
    """When state was committed: its last delta's manifest or its checkpoint written."""
    path = (os.path.join(deltas.directory(state.checkpoint), "manifest.json") if state.deltas
            else state.checkpoint + ".index")
    try:
        return tf.io.gfile.stat(path).mtime_nsec / 1e9  # gfile: remote model_dirs too
    except tf.errors.NotFoundError:  # deleted by the training meanwhile
        return time.time()


class ServingExport:
    """GraphModifierHook(serving_export=ServingExport(receiver_fn, base)):
    while the chief trains, a thread writes a portable version into base
    after each full checkpoint or committed delta (`watch`). The template is
    exported once, from the first checkpoint, into base/.template (TF Serving
    skips names starting with '.'). When training ends the thread writes the
    final state's version, then stops."""

    def __init__(self, serving_input_receiver_fn, base: str, *, keep: int = 5,
                 poll_secs: float = 2.0, min_count: int = 0, seen_since: Optional[int] = None):
        if keep < 1:
            raise ValueError(f"graphmod: ServingExport keep={keep}: must be >= 1")
        if poll_secs <= 0:
            raise ValueError(f"graphmod: ServingExport poll_secs={poll_secs}: must be > 0")
        self.receiver_fn, self.base, self.keep = serving_input_receiver_fn, base, keep
        self.poll_secs, self.min_count, self.seen_since = poll_secs, min_count, seen_since
        self.reports: List[Dict] = []
        self.error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        self.model_dir: Optional[str] = None
        self._final_step: Optional[int] = None
        self._ended_at = 0.0

    def start(self, estimator, rules) -> None:
        """Starts the thread for estimator's model_dir (unless it runs)."""
        self.model_dir = estimator.model_dir
        self._final_step = None  # a new training: its own final step
        if self._thread is not None and self._thread.is_alive():
            return
        self.error = None
        # Not a daemon: the process waits for the last version when train() returns.
        self._thread = threading.Thread(target=self._run, args=(estimator, rules),
                                        name="graphmod-serving-export")
        self._thread.start()

    def finish(self, final_step: int) -> None:
        """Training ended at final_step: the thread writes that state's version
        (once the Estimator's last checkpoint is written) and stops."""
        self._final_step, self._ended_at = final_step, time.time()

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits for the thread to write the final version; whether it has stopped."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _done(self) -> bool:
        if self._final_step is None:
            # Training raised (the hooks' end never ran) and the program is
            # exiting: the interpreter waits for this thread, so it stops.
            return not threading.main_thread().is_alive()
        if tf.train.latest_checkpoint(self.model_dir) is None:
            logging.warning("graphmod: the training wrote no checkpoint: no serving version "
                            "written into %s", self.base)
            return True
        newest = versions(self.base)
        # The Estimator's saver writes the final checkpoint after the hooks'
        # end; a state that never reaches the final step ends the wait.
        return (bool(newest) and newest[-1] >= self._final_step) \
            or time.time() - self._ended_at > 10 * self.poll_secs + 60

    def _run(self, estimator, rules) -> None:
        from graphmod.checkpoint.export import export_saved_model  # pylint: disable=import-outside-toplevel
        try:
            while tf.train.latest_checkpoint(estimator.model_dir) is None:
                if self._done():
                    return
                time.sleep(self.poll_secs)
            template, waiting = os.path.join(self.base, ".template"), _Waiting()
            while not os.path.isdir(template):
                before = _signature(estimator.model_dir)
                aside = tempfile.mkdtemp(prefix=".tmp-template-", dir=_made(self.base))
                try:
                    made = export_saved_model(estimator, self.receiver_fn, aside,
                                              rules=rules).decode()
                    os.rename(made, template)
                except (ValueError, OSError, tf.errors.OpError) as e:
                    # The export restores the latest checkpoint: one the training's
                    # Saver deleted (max_to_keep) meanwhile is passed over for the
                    # next, one being saved again under its name is waited for.
                    if not _retried(estimator.model_dir, before, e, waiting):
                        raise
                    if self._done():
                        return
                    time.sleep(self.poll_secs)
                finally:
                    shutil.rmtree(aside, ignore_errors=True)
            watch(template, estimator.model_dir, self.base, keep=self.keep,
                  poll_secs=self.poll_secs, min_count=self.min_count,
                  seen_since=self.seen_since, stop=self._done, on_version=self.reports.append)
        except BaseException as e:  # pylint: disable=broad-except
            self.error = e
            logging.error("graphmod: serving export into %s stopped: %s", self.base,
                          _first_line(e))


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _made(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    return folder


__all__ = ["export_state", "export_new_version", "watch", "versions", "ServingExport"]
