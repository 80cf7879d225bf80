"""An unchanged Estimator model trained by `train_and_evaluate` with
GraphModifierHook: on one machine, or, under TF_CONFIG, as every task of a
parameter-server cluster (examples/ps_cluster.py starts one locally).

    python examples/ps_train.py /tmp/ps_model                       # one process
    python examples/ps_cluster.py --ps 2 -- python examples/ps_train.py /tmp/ps_model

The model has a plain embedding, one partitioned two ways (as PS users
partition large ones: a part per ps task) and a hashed string column.
Nothing in it knows about graphmod or the cluster: the Estimator's
replica_device_setter puts each variable on a ps task, and the hook puts each
table where its variable was.
"""
import argparse

import numpy as np
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
WORDS = [f"w{i}" for i in range(97)]


def model_fn(features, labels, mode):
    init = tf1.truncated_normal_initializer(0.1)
    emb = tf1.get_variable("emb", [20000, 4], initializer=init)
    part = tf1.get_variable("part", [20000, 4], initializer=init,
                            partitioner=tf1.fixed_size_partitioner(2))
    words = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket("s", 20000), 4)
    net = tf.concat([
        tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), 1),
        tf.reduce_sum(tf.nn.embedding_lookup(part, features["ids"] * 397 % 20000), 1),
        tf1.feature_column.input_layer(features, [words])], 1)
    # A constant kernel: a distributed graph holds other ops than a local one,
    # which moves random initializers' op-level seeds (hook or not), and the
    # cluster is compared with one process.
    logits = tf.squeeze(tf1.layers.dense(
        net, 1, kernel_initializer=tf1.constant_initializer(0.1)), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def input_fn():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    s = np.array(WORDS)[rng.integers(0, len(WORDS), 256)].astype(bytes)
    labels = ((ids[:, 0] + (s == b"w5")) % 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids, "s": s}, labels)).repeat().batch(32)


def train(model_dir: str, steps: int, hooks=()) -> None:
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1,
                                    save_checkpoints_steps=10)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    hook = graphmod.GraphModifierHook(dump_graph=True, incremental_every_steps=5)
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=steps, hooks=[hook, *hooks]),
        tf.estimator.EvalSpec(input_fn, steps=2, hooks=[hook], throttle_secs=1,
                              start_delay_secs=0))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    train(args.model_dir, args.steps)
