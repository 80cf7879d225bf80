"""export_saved_model: a SavedModel of an Estimator whose embeddings are tables.

>>> path = graphmod.export_saved_model(estimator, serving_input_receiver_fn, "/tmp/export")

The serving graph is rewritten by the same pipeline as training, replaying
the conversion plan training saved in the Estimator's model_dir, so it reads
the same tables with the same keys, restored from the latest full checkpoint
and its incremental deltas. The SavedModel serves in any process that
has imported graphmod (which loads the table ops):
tf.compat.v1.saved_model.load(sess, ["serve"], path). With portable=True
it is then converted to one that serves on stock TensorFlow (TF Serving
included): see graphmod.checkpoint.portable.
"""
import os
import shutil
import tempfile

from absl import logging


def export_saved_model(estimator, serving_input_receiver_fn, export_dir_base: str, *,
                       rules, portable: bool = False, **kwargs) -> bytes:
    """Estimator.export_saved_model with graphmod's rewrite of the serving graph.

    The Estimator builds its export graph, Saver and restore without running
    hooks; this rewrites that graph right after the model_fn with the rules
    given (graphmod.export_saved_model hands in graphmod's own), so the Saver
    restores the checkpoint's tables. Extra keyword arguments go to
    Estimator.export_saved_model. Returns its path. portable=True: the
    SavedModel is written with graphmod's ops aside (a '.tmp-' dir under
    export_dir_base, which TF Serving skips), then converted into
    export_dir_base/<timestamp> with stock ops only.
    """
    if portable:
        return _portable_export(estimator, serving_input_receiver_fn, export_dir_base,
                                rules=rules, **kwargs)
    import tensorflow as tf

    from graphmod.rewrite import plan_file
    from graphmod.rewrite.pipeline import rewrite
    from graphmod.rewrite.plan import RewriteSettings
    from graphmod.checkpoint.saver import TableSaver

    if plan_file.read(estimator.model_dir) is None:
        logging.warning("graphmod: %s holds no conversion plan (not trained with "
                        "GraphModifierHook?); the export converts what a default hook would",
                        estimator.model_dir)
    model_fn = estimator.model_fn  # public: the model_fn bound to the Estimator's params

    def rewritten_model_fn(features, labels, mode, config):
        spec = model_fn(features, labels, mode, config)
        graph = tf.compat.v1.get_default_graph()
        report = rewrite(graph, RewriteSettings(), "predict", rules=rules,
                         model_dir=estimator.model_dir)
        report.log()
        # The export restores with the scaffold's Saver (or a plain one it
        # makes): the rewrite's TableSaver also applies the checkpoint's deltas.
        savers = [s for s in graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
                  if isinstance(s, TableSaver)]
        if savers and spec.scaffold.saver is None:
            spec = spec._replace(scaffold=tf.compat.v1.train.Scaffold(
                saver=savers[0], copy_from_scaffold=spec.scaffold))
        return spec

    # An Estimator of the same model_dir and config whose model_fn is the
    # estimator's followed by the rewrite exports what the estimator would.
    rewriting = tf.estimator.Estimator(rewritten_model_fn, estimator.model_dir, estimator.config)
    return rewriting.export_saved_model(export_dir_base, serving_input_receiver_fn, **kwargs)


def _portable_export(estimator, serving_input_receiver_fn, export_dir_base: str, *,
                     rules, **kwargs) -> bytes:
    from graphmod.checkpoint.portable import portable_saved_model  # pylint: disable=import-outside-toplevel
    os.makedirs(export_dir_base, exist_ok=True)
    aside = tempfile.mkdtemp(prefix=".tmp-graphmod-export-", dir=export_dir_base)
    try:
        source = export_saved_model(estimator, serving_input_receiver_fn, aside,
                                    rules=rules, **kwargs).decode()
        out = os.path.join(export_dir_base, os.path.basename(source))
        report = portable_saved_model(source, out)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    logging.info("graphmod: portable SavedModel %s: tables %s", out,
                 ", ".join(f"{t['table']} ({t['rows']} rows)" for t in report["tables"]))
    return out.encode()
