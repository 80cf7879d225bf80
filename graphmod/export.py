"""export_saved_model: a SavedModel of an Estimator whose embeddings are tables.

>>> path = graphmod.export_saved_model(estimator, serving_input_receiver_fn, "/tmp/export")

The SavedModel serves in any process that has imported graphmod (which loads
the table ops): tf.compat.v1.saved_model.load(sess, ["serve"], path).
"""
from typing import Optional


def export_saved_model(estimator, serving_input_receiver_fn, export_dir_base: str,
                       hook=None, **kwargs) -> bytes:
    """Estimator.export_saved_model with graphmod's rewrite of the serving graph.

    The Estimator builds its export graph, Saver and restore without running
    hooks; this runs `hook` (default GraphModifierHook()) on that graph right
    after the model_fn, so the Saver restores the checkpoint's tables. Extra
    keyword arguments go to Estimator.export_saved_model. Returns its path.
    """
    from graphmod.hooks.graph_modifier import GraphModifierHook

    hook = hook if hook is not None else GraphModifierHook()
    call_model_fn = estimator._call_model_fn  # pylint: disable=protected-access

    def call_and_rewrite(*args, **kw):
        spec = call_model_fn(*args, **kw)
        hook.begin()  # the export graph is the default graph here
        return spec

    estimator._call_model_fn = call_and_rewrite  # pylint: disable=protected-access
    try:
        return estimator.export_saved_model(export_dir_base, serving_input_receiver_fn, **kwargs)
    finally:
        del estimator._call_model_fn  # pylint: disable=protected-access
