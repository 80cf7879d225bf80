"""An unchanged Estimator model trained by `train_and_evaluate` with
GraphModifierHook: on one machine, or, under TF_CONFIG, as every task of a
parameter-server cluster (examples/ps_cluster.py starts one locally).

    python examples/ps_train.py /tmp/ps_model                       # one process
    python examples/ps_cluster.py --ps 2 -- python examples/ps_train.py /tmp/ps_model
    python examples/ps_train.py --dense /tmp/dense_model              # without graphmod
    python examples/ps_train.py /tmp/warm --warm-from /tmp/dense_model  # emb warm-started

The model has a plain embedding, one partitioned two ways (as PS users
partition large ones: a part per ps task) and a hashed string column.
Nothing in it knows about graphmod or the cluster: the Estimator's
replica_device_setter puts each variable on a ps task, and the hook shards
each variable's table by key over all the ps tasks.
"""
import argparse
from typing import Optional

import numpy as np
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
WORDS = [f"w{i}" for i in range(97)]


def model_fn(features, labels, mode, params):
    # A constant initial row makes the unmodified model's numbers comparable
    # (graphmod draws a key's initial row from the same distribution, not
    # the same values as the variable's initializer).
    init = (tf1.constant_initializer(0.05) if params.get("constant_init")
            else tf1.truncated_normal_initializer(0.1))
    emb = tf1.get_variable("emb", [20000, 4], initializer=init)
    part = tf1.get_variable("part", [20000, 4], initializer=init,
                            partitioner=tf1.fixed_size_partitioner(2))
    words = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket("s", 20000), 4,
        initializer=init)
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
    loss = tf1.losses.sigmoid_cross_entropy(labels, logits)  # (in the LOSSES collection)
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def input_fn():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 3))
    s = np.array(WORDS)[rng.integers(0, len(WORDS), 256)].astype(bytes)
    labels = ((ids[:, 0] + (s == b"w5")) % 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids, "s": s}, labels)).repeat().batch(32)


class LossLog(tf1.train.SessionRunHook):
    """Appends each training step's global step and loss to a file. The step is
    read in the same run as its increment: on a ps task either value may come
    back, so compare runs by their losses in order."""

    def __init__(self, path: str):
        self.path = path

    def before_run(self, run_context):
        del run_context
        graph = tf1.get_default_graph()
        return tf1.train.SessionRunArgs([tf1.train.get_global_step(graph),
                                         graph.get_collection(tf1.GraphKeys.LOSSES)[0]])

    def after_run(self, run_context, run_values):
        del run_context
        step, loss = run_values.results
        with open(self.path, "a") as f:
            f.write(f"{step} {loss!r}\n")


# Admission and eviction of the hashed words' table (--policies): an id gets
# a row at its second sighting; rows unseen for a step leave every 5 steps.
POLICIES = dict(tables={"input_layer/s_embedding/*": dict(
    access_threshold=2, eviction_threshold=1, eviction_unit="steps")}, evict_step_interval=5)


def train(model_dir: str, steps: int, hooks=(), hooked: bool = True,
          constant_init: bool = False, policies: bool = False, warm_from: Optional[str] = None) -> None:
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1,
                                    save_checkpoints_steps=10)
    # emb's rows from another model's checkpoint (its slots start afresh).
    warm = warm_from and tf.estimator.WarmStartSettings(warm_from, vars_to_warm_start="emb:0")
    estimator = tf.estimator.Estimator(model_fn, config=config, warm_start_from=warm,
                                       params=dict(constant_init=constant_init))
    graphmod_hooks = [graphmod.GraphModifierHook(dump_graph=True, incremental_every_steps=5,
                                                 **(POLICIES if policies else {}))
                      ] if hooked else []
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=steps,
                                          hooks=[*graphmod_hooks, *hooks]),
        tf.estimator.EvalSpec(input_fn, steps=2, hooks=graphmod_hooks, throttle_secs=1,
                              start_delay_secs=0))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dense", action="store_true",
                        help="without graphmod: the model as its author trains it")
    parser.add_argument("--constant-init", action="store_true",
                        help="embeddings start at a constant (to compare with --dense)")
    parser.add_argument("--policies", action="store_true",
                        help="admission and eviction for the hashed words' table")
    parser.add_argument("--losses", help="append each step's global step and loss to this file")
    parser.add_argument("--warm-from", help="a checkpoint (or model_dir) to warm-start emb from")
    args = parser.parse_args()
    train(args.model_dir, args.steps, hooks=[LossLog(args.losses)] if args.losses else [],
          hooked=not args.dense, constant_init=args.constant_init, policies=args.policies,
          warm_from=args.warm_from)
