"""TableSaver: the Saver of a rewritten graph, which also adopts dense checkpoints.

A model trained without graphmod has checkpoints holding its embedding
variables densely (`emb`, and slots such as `emb/Adagrad`). When the hook then
converts those variables, their tables have no entries in that checkpoint:
an ordinary Saver would fail to restore it. TableSaver restores such a
checkpoint by adoption: everything else restores as usual, and each adopted
table imports the variable's trained rows and optimizer slots (row i becomes
key i), so the model right after adoption computes what the dense model did.
Its first save writes the tables in graphmod's format; a checkpoint that
already holds the tables restores as with any Saver.

The adoption rule (graphmod.rewrite_rules.dense_adoption) installs it in place
of the Saver an Estimator or MonitoredTrainingSession would build, with the
same settings.
"""
from typing import List, NamedTuple, Optional

import tensorflow as tf
from absl import logging
from tensorflow.python.ops import variables as tf_variables

tf1 = tf.compat.v1


class Adoption(NamedTuple):
    """A table that starts from a dense variable's checkpointed rows."""
    table: "graphmod.Table"  # noqa: F821
    variable: str            # the variable's name in checkpoints
    slots: List[str]         # its optimizer slots' names, in the table's slot order
    rows: int


def _restore(path: tf.Tensor, name: str) -> tf.Tensor:
    return tf.raw_ops.RestoreV2(prefix=path, tensor_names=[name], shape_and_slices=[""],
                                dtypes=[tf.float32])[0]


class TableSaver(tf1.train.Saver):
    """A tf.compat.v1.train.Saver (build deferred, var_list from the graph's
    collections) that restores a checkpoint holding adopted tables' variables
    densely by importing their rows."""

    def __init__(self, adoptions: List[Adoption], **saver_kwargs):
        super().__init__(defer_build=True, **saver_kwargs)
        self.adoptions = list(adoptions)
        self._adopt_path: Optional[tf.Tensor] = None
        self._adopt_ops: List[tf.Operation] = []
        self._others: Optional[tf1.train.Saver] = None

    def _build(self, checkpoint_path, build_save, build_restore):
        built = self._is_built
        super()._build(checkpoint_path, build_save, build_restore)
        if built or not self.adoptions or not build_restore:
            return
        # Built beside the ordinary restore, before the graph is finalized.
        adopted = {a.table.name for a in self.adoptions}
        others = [x for x in (self._var_list or tf_variables._all_saveable_objects())  # pylint: disable=protected-access
                  if getattr(getattr(x, "table", None), "name", None) not in adopted]
        with tf1.name_scope("graphmod_adopt"):
            self._adopt_path = tf1.placeholder(tf.string, [], name="checkpoint_path")
            for a in self.adoptions:
                with tf1.name_scope(a.table.name):
                    values = tf.reshape(_restore(self._adopt_path, a.variable),
                                        [a.rows, a.table.dim])
                    if a.slots:
                        slots = tf.stack([tf.reshape(_restore(self._adopt_path, s),
                                                     [a.rows, a.table.dim]) for s in a.slots], 1)
                    else:
                        slots = tf.zeros([a.rows, 0, a.table.dim])
                    keys = tf.range(a.rows, dtype=tf.int64)
                    self._adopt_ops.append(a.table.import_rows(keys, values, slots, replace=True))
            self._others = tf1.train.Saver(
                var_list=others or None, sharded=self._sharded, allow_empty=True,
                write_version=self._write_version)

    def holds_tables_densely(self, save_path: str) -> bool:
        """True when the checkpoint holds every adopted table's variable
        densely; False when it holds the tables; an error naming the table
        when it holds neither."""
        try:
            reader = tf.train.load_checkpoint(save_path)
        except (tf.errors.OpError, ValueError):
            return False  # the ordinary restore says what is wrong with the path
        dense = []
        for a in self.adoptions:
            if reader.has_tensor(f"{a.table.name}-keys"):
                continue
            missing = [n for n in [a.variable] + a.slots if not reader.has_tensor(n)]
            if missing:
                raise ValueError(f"graphmod: checkpoint {save_path} holds neither table "
                                 f"'{a.table.name}' nor the variable it adopts "
                                 f"(missing: {', '.join(missing)})")
            dense.append(a)
        if dense and len(dense) != len(self.adoptions):
            raise ValueError(f"graphmod: checkpoint {save_path} holds some adopted variables "
                             f"densely and others as tables "
                             f"({', '.join(a.table.name for a in dense)} densely)")
        return bool(dense)

    def restore(self, sess, save_path):
        if not self.adoptions or save_path is None or not self.holds_tables_densely(save_path):
            return super().restore(sess, save_path)
        fetches = list(self._adopt_ops)
        feed = {self._adopt_path: save_path}
        if not self._others._is_empty:  # pylint: disable=protected-access
            fetches.append(self._others.saver_def.restore_op_name)
            feed[self._others.saver_def.filename_tensor_name] = save_path
        sess.run(fetches, feed)
        for a in self.adoptions:
            logging.info("graphmod: adopted %s from the dense checkpoint %s: %d trained rows "
                         "(keys 0..%d)%s into table '%s'", a.variable, save_path, a.rows,
                         a.rows - 1, f" with slots {', '.join(a.slots)}" if a.slots else "",
                         a.table.name)
