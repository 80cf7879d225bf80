"""A disk tier under an unchanged Estimator: the hooked model with its table's
memory budget at a quarter of its rows trains as the same hooked model all in
memory (losses, and every row, slot, count and version of its checkpoints and
deltas, bit for bit), and as the unmodified model (losses and rows, to float
rounding). Evaluation restores the checkpoint into a tiered table and reads
cold rows where they are; a resume from the checkpoint and its deltas goes on
as the all-in-memory resume does. Rows really go to disk: the tier's segment
files grow while training, and the files are gone when training ends."""
import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import graphmod

tf1 = tf.compat.v1
pytestmark = pytest.mark.filterwarnings("ignore:`tf.layers.dense` is deprecated")

VOCAB, DIM, BATCH = 4000, 8, 128
TABLE = "input_layer/item_embedding/embedding_weights"


def input_fn(start):
    """Zipf ids (a = 1.2) over VOCAB, a label the ids decide; batches from `start`."""
    def fn():
        rng = np.random.default_rng(start)
        n = 40 * BATCH
        item = np.minimum(rng.zipf(1.2, n), VOCAB) - 1
        item = (item * 7919) % VOCAB  # popular ids spread over the vocabulary
        labels = ((item % 5 == 0) | (rng.random(n) < 0.1)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices(({"item": item}, labels)).batch(BATCH)
    return fn


def model_fn(features, labels, mode):
    item = tf.feature_column.categorical_column_with_identity("item", VOCAB)
    # A constant start: the unmodified model's rows start where the table's do
    # (a random initializer gives both the same distribution, not the same draws).
    column = tf.feature_column.embedding_column(item, DIM, initializer=tf1.constant_initializer(0.1))
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


class LossLog(tf1.train.SessionRunHook):
    """Each step's loss, in order."""

    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(tf1.get_collection(tf1.GraphKeys.LOSSES)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(run_values.results)


class SegmentBytes(tf1.train.SessionRunHook):
    """The largest total size of the tier's segment files seen after a step."""

    def __init__(self, path):
        self.path, self.most = path, 0

    def after_run(self, run_context, run_values):
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(self.path)
                    for f in files if f.startswith("seg-"))
        self.most = max(self.most, total)


def estimator(model_dir):
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1,
                                    save_checkpoints_steps=15, keep_checkpoint_max=2)
    return tf.estimator.Estimator(model_fn, config=config)


def hook(storage=None):
    settings = (graphmod.TableSettings(memory_budget=0.25, storage_path=storage, num_shards=4)
                if storage else graphmod.TableSettings(num_shards=4))
    return graphmod.GraphModifierHook(min_rows=100, incremental_every_steps=4,
                                      tables={TABLE: settings})


def train(model_dir, steps, start, hooks):
    losses = LossLog()
    estimator(model_dir).train(input_fn(start), steps=steps, hooks=hooks + [losses])
    return np.array(losses.losses)


def checkpoint_state(model_dir):
    """Every table entry and variable of the latest checkpoint with its deltas
    merged in, rows sorted by key."""
    from graphmod.checkpoint import merged
    path = merged.write(merged.latest(model_dir),
                        os.path.join(tempfile.mkdtemp(dir=os.path.dirname(model_dir)),
                                     "model.ckpt"))[0]
    reader = tf.train.load_checkpoint(path)
    out = {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(path)}
    order = np.argsort(out[f"{TABLE}-keys"])
    for field in ("keys", "values", "slots", "counts", "last_seen", "versions"):
        out[f"{TABLE}-{field}"] = out[f"{TABLE}-{field}"][order]
    return out


def assert_same_state(a, b):
    """Equal checkpoints, bit for bit; last_seen is each run's wall clock."""
    assert a.keys() == b.keys()
    for name in a:
        if not name.endswith("last_seen"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_table_four_times_its_budget_trains_as_all_in_memory(tmp_path):
    storage = str(tmp_path / "tier")
    memory_dir, disk_dir, dense_dir = (str(tmp_path / n) for n in ("memory", "disk", "dense"))
    segments = SegmentBytes(storage)
    memory = train(memory_dir, 40, 0, [hook()])
    disk = train(disk_dir, 40, 0, [hook(storage), segments])
    dense = train(dense_dir, 40, 0, [])
    assert len(disk) == 40 and len(set(disk.tolist())) > 1
    np.testing.assert_array_equal(disk, memory)
    np.testing.assert_allclose(disk, dense, rtol=1e-5)
    # Rows went to disk (a quarter of them fit in memory) and the files went afterwards.
    assert segments.most > 1000, segments.most
    assert not [f for _, _, files in os.walk(storage) for f in files]

    a, b = checkpoint_state(memory_dir), checkpoint_state(disk_dir)
    assert len(a[f"{TABLE}-keys"]) > 200
    assert_same_state(a, b)
    dense_rows = tf.train.load_checkpoint(dense_dir).get_tensor(TABLE)
    np.testing.assert_allclose(b[f"{TABLE}-values"], dense_rows[b[f"{TABLE}-keys"]],
                               rtol=1e-4, atol=1e-6)

    # Evaluation restores into a tiered table; a resume goes on from the
    # checkpoint and its deltas as the all-in-memory one does.
    metrics = [estimator(d).evaluate(input_fn(99), steps=5, hooks=[h])
               for d, h in ((memory_dir, hook()), (disk_dir, hook(storage)))]
    assert metrics[0] == metrics[1]
    resumed = [train(memory_dir, 20, 7, [hook()]), train(disk_dir, 20, 7, [hook(storage)])]
    np.testing.assert_array_equal(resumed[0], resumed[1])
    assert_same_state(checkpoint_state(memory_dir), checkpoint_state(disk_dir))


def test_a_bad_tier_setting_is_named():
    with pytest.raises(ValueError, match="memory_budget and storage_path go together"):
        graphmod.TableSettings(memory_budget=0.5)
    with pytest.raises(ValueError, match="memory_budget must be"):
        graphmod.TableSettings(memory_budget=1.5, storage_path="/tmp/x")
