"""A table larger than its memory budget: an unchanged Estimator whose
embedding's table keeps a quarter of its rows in memory and the rest on a
local disk, trained with GraphModifierHook (tests/test_tiers.py and
tests/test_tier_crash.py run it).

  python examples/tier_train.py MODEL_DIR --storage /mnt/ssd/graphmod --steps 40

The model is ordinary TF1 code: one embedding column over VOCAB ids, a
dense head, Adagrad. The hook's TableSettings give the table its budget:
memory_budget=0.25 (a fraction of its rows; or bytes) and storage_path (a
directory on a local disk; the table's files go in a fresh subdirectory and
are removed when training ends). Training equals the all-in-memory run
(--all-in-memory), row for row. --start picks where in the id stream a run
begins (a resumed run goes on with new batches).
"""
import argparse

import numpy as np
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
VOCAB, DIM, BATCH = 4000, 8, 128
TABLE = "input_layer/item_embedding/embedding_weights"


def input_fn(start: int):
    """Zipf ids (a = 1.2) over VOCAB and a label the ids decide, from seed `start`."""
    def fn():
        rng = np.random.default_rng(start)
        n = 40 * BATCH
        item = np.minimum(rng.zipf(1.2, n), VOCAB) - 1
        item = (item * 7919) % VOCAB  # popular ids spread over the vocabulary
        labels = ((item % 5 == 0) | (rng.random(n) < 0.1)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({"item": item}, labels)).repeat().batch(BATCH)
    return fn


def model_fn(features, labels, mode):
    item = tf.feature_column.categorical_column_with_identity("item", VOCAB)
    # A constant start, so the unmodified model's rows start where the
    # table's do (a random initializer gives both the same distribution, not
    # the same draws) and the runs can be compared number for number.
    column = tf.feature_column.embedding_column(item, DIM,
                                                initializer=tf1.constant_initializer(0.1))
    emb = tf1.feature_column.input_layer(features, [column])
    logits = tf1.layers.dense(emb, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=4))
    logits = tf.squeeze(logits, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops={"mean_logit": tf1.metrics.mean(logits)})
    train_op = tf1.train.AdagradOptimizer(0.3).minimize(
        loss, global_step=tf1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def estimator(model_dir: str) -> tf.estimator.Estimator:
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1,
                                    save_checkpoints_steps=15, keep_checkpoint_max=2,
                                    save_summary_steps=13)
    return tf.estimator.Estimator(model_fn, config=config)


def hook(storage: str = None) -> graphmod.GraphModifierHook:
    """The hook, with the table's budget at a quarter of its rows on `storage`
    (None: all in memory); a delta every 4 steps."""
    settings = (graphmod.TableSettings(memory_budget=0.25, storage_path=storage, num_shards=4)
                if storage else graphmod.TableSettings(num_shards=4))
    return graphmod.GraphModifierHook(min_rows=100, incremental_every_steps=4,
                                      tables={TABLE: settings})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--storage", help="a directory on a local disk for the rows beyond the budget")
    ap.add_argument("--all-in-memory", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--start", type=int, default=0)
    args = ap.parse_args()
    if not args.all_in_memory and not args.storage:
        ap.error("--storage DIR (or --all-in-memory)")
    estimator(args.model_dir).train(input_fn(args.start), steps=args.steps,
                                    hooks=[hook(None if args.all_in_memory else args.storage)])


if __name__ == "__main__":
    main()
