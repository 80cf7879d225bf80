"""graphmod demo: a DeepFM-style CTR model on raw hashed ids, with no vocabulary.

What it shows
-------------
* A plain ``tf.estimator.Estimator`` whose ``model_fn`` uses graphmod's explicit
  table API: one dynamic embedding table per categorical feature (C1..C26),
  created with ``graphmod.create_table`` and read with ``graphmod.sparse_lookup``.
* The ids are raw 63-bit "hashed-looking" int64 values (synthetic.py's
  synthetic Criteo-like stream). There is no vocabulary file, no hash-bucket
  size and no collisions: a table inserts a row the first time a *training*
  lookup sees an id, so tables grow with the data.
* Two optimizers in one train op: a graphmod sparse optimizer
  (``graphmod.optimizers.Adagrad``) updates only the table rows the batch looked
  up, and an ordinary ``tf.compat.v1.train`` optimizer trains the dense layers.
* Tables are saved in the Estimator's ordinary checkpoints (entries
  ``<table>-keys``, ``-values``, ``-slots``, ...), so ``evaluate`` and
  ``predict`` restore them like any variable. Eval/predict lookups are
  read-only: ids never seen in training get the table's missing value and do
  not grow the table.

At the end it prints training throughput (examples/s), the eval AUC next to the
data's Bayes AUC (the best any model could reach on the same rows), a few
predictions, and how many rows each table holds in the checkpoint. With the
defaults (1.5M examples, ~1 minute on 2 cores) it reaches an eval AUC of ~0.747
against a Bayes AUC of ~0.771; the tables end up with ~833k rows.

Run:  python examples/table_api_demo.py [--train_steps 3000] [--batch_size 512] [--model_dir DIR]
"""
import os
import shutil
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's C++ start-up banners

from absl import app, flags, logging  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_estimator as tf_estimator  # noqa: E402

import graphmod  # noqa: E402
import synthetic as data  # noqa: E402

tf1 = tf.compat.v1
ModeKeys = tf_estimator.estimator.ModeKeys

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Checkpoint directory (default: a fresh temp dir, "
                    "deleted at the end). With an existing checkpoint, training resumes from "
                    "it on the rows of the stream that follow the ones already trained on.")
flags.DEFINE_integer("train_steps", 3000, "Training steps (batches).")
flags.DEFINE_integer("batch_size", 512, "Examples per batch.")
flags.DEFINE_integer("eval_examples", 100_000, "Held-out rows to evaluate on.")
flags.DEFINE_integer("dim", 8, "Embedding width of each table (FM factor size).")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic data stream.")

# Eval rows come from far down the stream, after any training rows.
EVAL_START = 50_000_000


def model_fn(features, labels, mode, params):
    """DeepFM-ish: first-order terms + FM pairwise term + MLP, on table embeddings.

    Each categorical feature gets one table of width 1 + dim: column 0 is the
    feature's first-order (wide) weight, columns 1.. its FM/deep embedding.
    """
    dim = params["dim"]
    is_training = mode == ModeKeys.TRAIN

    # One sparse optimizer object trains all tables; create_table needs it to
    # know which slot rows (here Adagrad's accumulator) each key keeps.
    sparse_opt = graphmod.optimizers.Adagrad(params["sparse_lr"], initial_accumulator_value=0.1)

    first_order, factors = [], []
    for name in params["categorical"]:
        table = graphmod.create_table(
            name, dim=1 + dim, optimizer=sparse_opt,
            # New rows start small: zeros would give the FM term no gradient.
            initializer=tf1.truncated_normal_initializer(stddev=0.01))
        # features[name] is int64 [B, 1]; "sum" over the single id -> [B, 1+dim].
        # Training lookups insert unseen ids; eval/predict lookups only read.
        row = graphmod.sparse_lookup(table, features[name], is_training=is_training,
                                     combiner="sum")
        first_order.append(row[:, :1])
        factors.append(row[:, 1:])

    v = tf.stack(factors, axis=1)                       # [B, F, dim]
    # FM pairwise interactions: 0.5 * ((sum v)^2 - sum v^2), summed over dim.
    fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(v, 1)) - tf.reduce_sum(tf.square(v), 1),
                             axis=1, keepdims=True)
    wide = tf.add_n(first_order)                        # [B, 1]

    dense = tf.concat([features[n] for n in params["dense"]], axis=1)  # [B, 13], log1p counts
    deep = tf.concat([tf.reshape(v, [-1, len(factors) * dim]), dense], axis=1)
    # The TF1 initializer takes its seed from the graph (RunConfig.tf_random_seed),
    # so runs are repeatable; tf.layers' default (Keras') is seeded at random.
    init = tf1.glorot_uniform_initializer()
    for i, units in enumerate(params["hidden"]):
        deep = tf1.layers.dense(deep, units, activation=tf.nn.relu, kernel_initializer=init,
                                name=f"mlp_{i}")
    deep = tf1.layers.dense(deep, 1, kernel_initializer=init, name="mlp_out")

    logits = wide + fm + deep                           # [B, 1]
    probs = tf.sigmoid(logits)

    if mode == ModeKeys.PREDICT:
        return tf_estimator.estimator.EstimatorSpec(
            mode, predictions={"probability": probs[:, 0], "logit": logits[:, 0]})

    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    if mode == ModeKeys.EVAL:
        metrics = {"auc": tf1.metrics.auc(labels, probs, num_thresholds=2000,
                                          summation_method="careful_interpolation")}
        return tf_estimator.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

    # TRAIN: the dense optimizer trains the MLP (the tables hold no tf.Variable,
    # so it never sees them); the sparse optimizer finds every training lookup
    # of its tables in this graph and updates just the rows looked up.
    global_step = tf1.train.get_or_create_global_step()
    dense_opt = tf1.train.AdamOptimizer(params["dense_lr"])
    dense_train = dense_opt.minimize(loss, global_step=global_step)
    sparse_train = sparse_opt.minimize(loss)
    train_op = tf.group(dense_train, sparse_train)

    # Log how many ids the tables hold as training goes (the Estimator already
    # logs the loss and steps/s every log_step_count_steps).
    total_rows = tf.add_n([t.size() for t in graphmod.tables()])
    hook = tf_estimator.estimator.LoggingTensorHook(
        {"table_rows": total_rows}, every_n_iter=params["log_every"])
    return tf_estimator.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                                training_hooks=[hook])


class ThroughputHook(tf1.train.SessionRunHook):
    """Times training steps after the first one (which pays for graph set-up)."""

    def __init__(self):
        self.steps, self.first, self.last = 0, None, None

    def after_run(self, run_context, run_values):
        now = time.time()
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now


def table_rows_in_checkpoint(model_dir, names):
    """Rows per table, read from the latest checkpoint's `<table>-keys` entry."""
    shapes = dict(tf.train.list_variables(model_dir))
    return {n: shapes[f"{n}-keys"][0] for n in names}


def unseen_fraction(model_dir, cfg, n, start):
    """Share of the categorical ids in rows start..start+n that no table holds
    (eval lookups give those the table's missing value: here the row the id
    would have been initialized with)."""
    reader = tf.train.load_checkpoint(model_dir)
    feats, _ = data.generate(cfg, n, start)
    unseen = sum(np.count_nonzero(~np.isin(feats[c], reader.get_tensor(f"{c}-keys")))
                 for c in cfg.categorical_names)
    return unseen / (n * cfg.n_categorical)


def quiet_tf_logging():
    """INFO logs (steps, loss, checkpoints) without TF1 deprecation noise."""
    tf1.logging.set_verbosity(tf1.logging.INFO)
    logging.set_verbosity(logging.INFO)
    tf_logger = tf.get_logger()
    tf_logger.propagate = False  # TF has its own handler; absl's would print each line twice
    tf_logger.addFilter(lambda record: "is deprecated" not in record.getMessage())
    warnings.filterwarnings("ignore", message=".*tf.layers.dense.*is deprecated")


def main(argv):
    del argv
    quiet_tf_logging()

    cfg = data.SyntheticCriteo(seed=FLAGS.seed)  # raw hashed int64 ids, Zipf frequencies
    temp_dir = None
    model_dir = FLAGS.model_dir
    if model_dir is None:
        model_dir = temp_dir = tempfile.mkdtemp(prefix="graphmod_demo_")
    logging.info("model_dir: %s", model_dir)

    throughput = ThroughputHook()
    params = {
        "categorical": cfg.categorical_names, "dense": cfg.dense_names,
        "dim": FLAGS.dim, "hidden": (64, 32),
        "sparse_lr": 0.05, "dense_lr": 1e-3, "log_every": 500,
    }
    run_config = tf_estimator.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=FLAGS.seed,
        save_checkpoints_steps=None, save_checkpoints_secs=600,  # short run: at start and end
        log_step_count_steps=500, keep_checkpoint_max=2,
        # Two cores: let each op use both, and run two ops at a time.
        session_config=tf1.ConfigProto(intra_op_parallelism_threads=2,
                                       inter_op_parallelism_threads=2))
    estimator = tf_estimator.estimator.Estimator(model_fn, config=run_config, params=params)

    # ---- train: one pass over fresh rows of the stream (each row seen once).
    # A resumed run (--model_dir with a checkpoint) continues after the rows
    # the checkpoint was trained on; its tables are restored and keep growing.
    done = estimator.get_variable_value("global_step") if estimator.latest_checkpoint() else 0
    n_train = FLAGS.train_steps * FLAGS.batch_size
    train_input = data.input_fn(cfg, FLAGS.batch_size, num_examples=n_train,
                                start=int(done) * FLAGS.batch_size)
    logging.info("training %d steps of %d examples (from step %d)",
                 FLAGS.train_steps, FLAGS.batch_size, done)
    t0 = time.time()
    estimator.train(train_input, steps=FLAGS.train_steps, hooks=[throughput])
    train_secs = time.time() - t0

    # ---- evaluate on held-out rows (restores the checkpoint, tables included).
    eval_input = data.input_fn(cfg, 4096, num_examples=FLAGS.eval_examples, start=EVAL_START)
    t0 = time.time()
    metrics = estimator.evaluate(eval_input)
    eval_secs = time.time() - t0
    best = data.bayes_auc(cfg, FLAGS.eval_examples, start=EVAL_START)

    # ---- predict a few held-out rows (again from the checkpoint).
    n_show = 8
    feats, labels, true_logit = data.generate_with_logits(cfg, n_show, start=EVAL_START)
    pred_input = lambda: tf.data.Dataset.from_tensor_slices(feats).batch(n_show)  # noqa: E731
    preds = list(estimator.predict(pred_input, yield_single_examples=True))

    rows = table_rows_in_checkpoint(model_dir, cfg.categorical_names)
    unseen = unseen_fraction(model_dir, cfg, FLAGS.eval_examples, EVAL_START)

    # ---- report
    print()
    print("=" * 64)
    print(f"train: {FLAGS.train_steps} steps x {FLAGS.batch_size} = {n_train:,} examples in "
          f"{train_secs:.1f}s (incl. set-up) -> {n_train / train_secs:,.0f} examples/s")
    if throughput.steps:
        steady = throughput.steps * FLAGS.batch_size / (throughput.last - throughput.first)
        print(f"       steady state after the first step: {steady:,.0f} examples/s")
    print(f"eval : {FLAGS.eval_examples:,} held-out examples in {eval_secs:.1f}s; "
          f"{unseen:.1%} of their ids were never seen in training")
    print(f"eval AUC {metrics['auc']:.4f}  (Bayes AUC of these rows {best:.4f}, random 0.5)   "
          f"loss {metrics['loss']:.4f}")
    print("\npredictions on held-out rows:")
    print("   p(click)   true p   label")
    for p, z, y in zip(preds, true_logit[:, 0], labels[:, 0]):
        print(f"   {p['probability']:.4f}    {1 / (1 + np.exp(-z)):.4f}   {int(y)}")
    print("\ntable rows in the checkpoint (ids seen in training; vocab = ids that exist):")
    for name, vocab in zip(cfg.categorical_names, cfg.vocab):
        print(f"   {name:>4}: {rows[name]:>8,} rows  (vocab {vocab:,})")
    print(f"   total: {sum(rows.values()):,} rows")
    print("=" * 64)

    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
