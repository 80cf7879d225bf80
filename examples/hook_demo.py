"""graphmod's main demo: an ordinary Estimator, unchanged, trained with GraphModifierHook.

The model_fn below is plain TF1 code, written the way one writes it without
graphmod: each categorical feature has a tf.Variable embedding sized by a
vocabulary guess, and raw ids are folded into it with `ids % vocab`, so
distinct ids share rows. Adding graphmod.GraphModifierHook() to train,
evaluate and predict turns every embedding into a dynamic table keyed by the
raw id (no folding, no shared rows), trains it with the same Adagrad, and saves
it in the Estimator's checkpoints. The run trains the model both ways on the
synthetic Criteo-like data and prints eval AUC, examples/s and table sizes.

    python examples/hook_demo.py [--train_steps 1500] [--batch_size 512]
"""
import tempfile
import time

import tensorflow as tf
from absl import app, flags, logging

import graphmod
from graphmod import profiles
import synthetic as data

tf1 = tf.compat.v1
FLAGS = flags.FLAGS
flags.DEFINE_integer("train_steps", 1500, "training steps of each model")
flags.DEFINE_integer("batch_size", 512, "examples per step")
flags.DEFINE_integer("vocab_guess", 20_000, "rows of each embedding variable (ids are folded into them)")
flags.DEFINE_integer("dim", 8, "embedding width")

CFG = data.SyntheticCriteo(n_dense=13, n_categorical=8, seed=7,
                           vocab_sizes=(300_000, 200_000, 100_000, 50_000, 20_000, 5_000, 500, 50))


def model_fn(features, labels, mode):
    """A DeepFM-style model written for plain tf.Variables (no graphmod in it)."""
    vocab = FLAGS.vocab_guess
    embs = []
    for name in CFG.categorical_names:
        table = tf1.get_variable(f"{name}_embedding", [vocab, FLAGS.dim],
                                 initializer=tf1.truncated_normal_initializer(stddev=0.05))
        embs.append(tf.nn.embedding_lookup(table, features[name][:, 0] % vocab))
    e = tf.stack(embs, 1)                                           # [B, F, D]
    fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(e, 1)) - tf.reduce_sum(tf.square(e), 1), 1)
    dense = tf.concat([features[n] for n in CFG.dense_names], 1)
    h = tf1.layers.dense(tf.concat([tf.reshape(e, [-1, len(embs) * FLAGS.dim]), dense], 1), 64,
                         tf.nn.relu, kernel_initializer=tf1.glorot_uniform_initializer())
    logits = tf.squeeze(tf1.layers.dense(h, 1, kernel_initializer=tf1.glorot_uniform_initializer()),
                        1) + fm
    probability = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probability": probability})
    y = tf.squeeze(labels, 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf1.train.AdagradOptimizer(0.05).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      eval_metric_ops={"auc": tf1.metrics.auc(y, probability)})


def run(with_hook: bool) -> dict:
    model_dir = tempfile.mkdtemp(prefix="graphmod_hook_demo_")
    est = tf.estimator.Estimator(model_fn, model_dir=model_dir)
    # dump_graph: the graphs before and after the rewrite, for `graphmod diff`;
    # profile_every_steps: where a training step's time goes, for `graphmod profile`.
    hooks = lambda: ([graphmod.GraphModifierHook(dump_graph=True, profile_every_steps=500)]  # noqa: E731
                     if with_hook else [])
    n = FLAGS.train_steps * FLAGS.batch_size
    start = time.time()
    est.train(data.input_fn(CFG, FLAGS.batch_size, n), hooks=hooks())
    seconds = time.time() - start
    metrics = est.evaluate(data.input_fn(CFG, 4096, 200_000, start=n), hooks=hooks())
    rows = {name: shape[0] for name, shape in tf.train.list_variables(model_dir)
            if name.endswith("-keys")}
    return dict(auc=metrics["auc"], examples_per_s=n / seconds, rows=rows, model_dir=model_dir)


def main(_):
    logging.set_verbosity(logging.INFO)
    tf1.logging.set_verbosity(tf1.logging.WARN)
    plain = run(with_hook=False)
    hooked = run(with_hook=True)
    bayes = data.bayes_auc(CFG, 200_000, start=FLAGS.train_steps * FLAGS.batch_size)
    print("=" * 64)
    print(f"unchanged model, plain variables : eval AUC {plain['auc']:.4f}, "
          f"{plain['examples_per_s']:,.0f} examples/s")
    print(f"unchanged model + GraphModifierHook: eval AUC {hooked['auc']:.4f}, "
          f"{hooked['examples_per_s']:,.0f} examples/s")
    print(f"best possible AUC on this data   : {bayes:.4f}")
    print(f"tables (rows) in {hooked['model_dir']}:")
    for name, rows in sorted(hooked["rows"].items()):
        print(f"  {name[:-len('-keys')]:>16}: {rows:>8,} rows (variable had {FLAGS.vocab_guess:,})")
    print(f"what the hook changed: graphmod diff {hooked['model_dir']}")
    if profiles.read(hooked["model_dir"]):  # (runs of fewer than 500 steps trace none)
        print(f"where its step time went: graphmod profile {hooked['model_dir']}")
    print("=" * 64)


if __name__ == "__main__":
    app.run(main)
