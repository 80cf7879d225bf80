"""ProfileHook: traces every Nth training step and writes where its time went.

GraphModifierHook(profile_every_steps=N) builds and drives one in training
graphs; `graphmod profile MODEL_DIR` reads what it wrote (graphmod.profiles).
A traced step runs with TensorFlow's FULL_TRACE, which costs that step some
time of its own: trace every few hundred steps in production training.
"""
import os
import time
from typing import Dict, Optional

import tensorflow as tf
from absl import logging

from graphmod import profiles

tf1 = tf.compat.v1


class ProfileHook(tf1.train.SessionRunHook):
    """Every `every_steps`-th run of the session: the step's op times and the
    tables' counters, one JSON line appended to `path`."""

    def __init__(self, every_steps: int):
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
            raise ValueError(f"GraphModifierHook: profile_every_steps must be a positive "
                             f"integer or None, got {every_steps!r}")
        self.every_steps = every_steps
        self.path: Optional[str] = None
        self._fetches: Dict = {}
        self._runs, self._traced, self._started = 0, False, 0.0

    def start(self, path: str, counters: Dict[str, Dict[str, tf.Tensor]]) -> None:
        """Before the session: where to write, and the counters to fetch."""
        self.path, self._runs = path, 0
        self._fetches = {"step": tf1.train.get_global_step(), "counters": counters}
        tf.io.gfile.makedirs(os.path.dirname(path))
        logging.info("graphmod: profiling every %d steps into %s", self.every_steps, path)

    def before_run(self, run_context):
        self._runs += 1
        self._traced = self._runs % self.every_steps == 0
        if not self._traced:
            return None
        self._started = time.perf_counter()
        return tf1.train.SessionRunArgs(
            self._fetches, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values) -> None:
        if not self._traced or run_values.results is None:
            return
        wall_ms = (time.perf_counter() - self._started) * 1000
        stats = []
        for device in run_values.run_metadata.step_stats.dev_stats:
            for node in device.node_stats:
                # timeline_label: "name = Type(inputs)"; none for _SOURCE and the like.
                label = node.timeline_label.split(" = ", 1)
                if len(label) == 2:
                    stats.append((node.node_name, label[1].split("(", 1)[0],
                                  node.all_end_rel_micros))
        results = run_values.results
        record = profiles.step_record(int(results["step"]), wall_ms, stats, results["counters"])
        with tf.io.gfile.GFile(self.path, "a") as f:
            f.write(profiles.json_line(record))
