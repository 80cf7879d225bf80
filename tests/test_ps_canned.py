"""A canned estimator on a parameter-server cluster: DNNLinearCombinedClassifier
(FTRL for the linear part, Adagrad for the DNN, embeddings partitioned by
input_layer_partitioner), train_and_evaluate under TF_CONFIG with the hook, on
a chief, 2 ps tasks and an evaluator (real processes on loopback, stopped by
run_cluster). Every partitioned embedding and linear weight becomes a table
sharded over both ps tasks, and the cluster's losses equal the same script's
in one process, bit for bit."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from ps_cluster import run_cluster  # noqa: E402

pytestmark = pytest.mark.slow

JOB = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import graphmod
    tf1 = tf.compat.v1

    class LossLog(tf1.train.SessionRunHook):
        def before_run(self, run_context):
            graph = tf1.get_default_graph()
            # The loss alone, in step order: a global step fetched in the same run
            # races with its increment on a ps task (either value may come back).
            return tf1.train.SessionRunArgs(graph.get_collection(tf1.GraphKeys.LOSSES)[0])

        def after_run(self, run_context, run_values):
            with open(sys.argv[1] + ".losses", "a") as f:
                f.write(f"{run_values.results!r}\\n")

    def input_fn():
        rng = np.random.default_rng(0)
        n = 512
        features = {"user": rng.integers(0, 3000, n),
                    "item": rng.integers(0, 500, n).astype(str).astype(bytes),
                    "x": rng.normal(size=n).astype(np.float32)}
        labels = (features["user"] % 3 == 0).astype(np.int64)
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64)

    user = tf.feature_column.categorical_column_with_identity("user", 3000)
    item = tf.feature_column.categorical_column_with_hash_bucket("item", 1000)
    x = tf.feature_column.numeric_column("x")
    estimator = tf1.estimator.DNNLinearCombinedClassifier(
        model_dir=sys.argv[1], linear_feature_columns=[user, item, x],
        dnn_feature_columns=[tf.feature_column.embedding_column(user, 8),
                             tf.feature_column.embedding_column(item, 8), x],
        dnn_hidden_units=[16],
        config=tf.estimator.RunConfig(tf_random_seed=1, save_checkpoints_steps=10),
        input_layer_partitioner=tf1.min_max_variable_partitioner(
            max_partitions=2, min_slice_size=8 << 10))
    hook = graphmod.GraphModifierHook(incremental_every_steps=5, min_rows=100)
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=20, hooks=[hook, LossLog()]),
        tf.estimator.EvalSpec(input_fn, steps=2, hooks=[hook], throttle_secs=1,
                              start_delay_secs=0))
""")


def test_wide_and_deep_trains_on_the_cluster_as_in_one_process(tmp_path):
    cluster, single = str(tmp_path / "cluster"), str(tmp_path / "single")
    logs = str(tmp_path / "logs")
    status = run_cluster([sys.executable, "-c", JOB, cluster], ps=2, log_dir=logs, timeout=300)
    for name, code in status.items():
        assert code == 0, open(os.path.join(logs, f"{name}.log")).read()[-3000:]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", JOB, single], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [open(d + ".losses").read().splitlines() for d in (cluster, single)]
    assert len(losses[0]) == 20 and losses[0] == losses[1]
    with open(os.path.join(cluster, "graphmod", "rewrite_report_train.json")) as f:
        report = json.load(f)
    tables = {t["table"]: (t["optimizer"], t["ps_shards"]) for t in report["tables"]}
    assert report["skipped"] == []
    assert tables == {
        **{f"dnn/input_from_feature_columns/input_layer/{c}_embedding/embedding_weights/"
           f"part_{i}": ("adagrad", 2) for c in ("user", "item") for i in (0, 1)},
        "linear/linear_model/item/weights/part_0": ("ftrl", 2),
        **{f"linear/linear_model/user/weights/part_{i}": ("ftrl", 2) for i in (0, 1)}}
    # The evaluator evaluated the cluster's checkpoints with the rewritten graph.
    assert os.path.exists(os.path.join(cluster, "graphmod", "rewrite_report_eval.json"))
