"""Tests for examples/synthetic.py, the synthetic Criteo-like stream."""

import os
import sys
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import synthetic as data  # noqa: E402 (examples/synthetic.py: the demos' data)

# Small vocabularies keep most tests fast; the default config (up to 1M ids)
# is exercised where its size matters.
SMALL = data.SyntheticCriteo(vocab_sizes=tuple(50 + 37 * i for i in range(26)), seed=7)


def assert_same(a, b):
    (fa, la), (fb, lb) = a, b
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
    np.testing.assert_array_equal(la, lb)


def concat(parts):
    feats = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    return feats, np.concatenate([p[1] for p in parts])


def test_shapes_dtypes_and_names():
    cfg = data.SyntheticCriteo()
    feats, labels = data.generate(cfg, 1000)
    assert list(feats) == [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    for name in cfg.dense_names:
        assert feats[name].shape == (1000, 1) and feats[name].dtype == np.float32
        assert np.isfinite(feats[name]).all() and (feats[name] >= 0).all()  # log1p(count)
    for name in cfg.categorical_names:
        assert feats[name].shape == (1000, 1) and feats[name].dtype == np.int64
    assert labels.shape == (1000, 1) and labels.dtype == np.float32
    assert set(np.unique(labels)) == {0.0, 1.0}
    # Hashed-looking ids: positive (0/-1 stay free as hash-table sentinels)
    # and spread over int64, not 0..V-1.
    ids = np.concatenate([feats[n] for n in cfg.categorical_names])
    assert ids.min() > 0 and ids.max() > 2**50
    assert data.generate(cfg, 0)[1].shape == (0, 1)


def test_deterministic_by_seed():
    assert_same(data.generate(SMALL, 500, 123), data.generate(SMALL, 500, 123))
    other = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, seed=8)
    a, b = data.generate(SMALL, 500)[0], data.generate(other, 500)[0]
    assert not np.array_equal(a["C1"], b["C1"])
    assert not np.array_equal(a["I1"], b["I1"])


def test_chunking_invariance_example_from_docs():
    cfg = data.SyntheticCriteo()
    whole = data.generate(cfg, 200, 0)
    assert_same(whole, concat([data.generate(cfg, 100, 0), data.generate(cfg, 100, 100)]))


@settings(max_examples=15, deadline=None)
@given(start=st.integers(0, 3 * data.BLOCK_ROWS), n=st.integers(1, 2 * data.BLOCK_ROWS),
       cut=st.floats(0, 1))
def test_chunking_invariance_everywhere(start, n, cut):
    # Every code path that depends on the row number: drift, timestamps, strings.
    cfg = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, with_timestamp=True,
                               rows_per_day=1000, drift=0.05, string_ids=True)
    k = int(cut * n)
    whole = data.generate(cfg, n, start)
    assert_same(whole, concat([data.generate(cfg, k, start), data.generate(cfg, n - k, start + k)]))


def test_chunking_across_work_chunks():
    # Pieces that straddle the internal 64K-row work chunks and 4K-row blocks.
    cfg = data.SyntheticCriteo(n_categorical=3, vocab_sizes=(10, 1000, 10**6), n_dense=2)
    whole = data.generate(cfg, 70_000, 1)
    assert_same(whole, concat([data.generate(cfg, 4097, 1), data.generate(cfg, 65_903, 4098)]))


def test_power_law_frequencies():
    cfg = data.SyntheticCriteo(n_categorical=1, vocab_sizes=(1_000_000,), n_dense=0, zipf_a=1.2)
    ids = data.generate(cfg, 200_000)[0]["C1"][:, 0]
    counts = np.sort(np.unique(ids, return_counts=True)[1])[::-1]
    # Head dominates: top id ~14% of traffic, the median seen id appears once.
    assert counts[0] > 1000 * np.median(counts)
    assert 5_000 < len(counts) < 100_000  # far fewer distinct ids than rows or vocab
    ranks = np.arange(10, 300)
    slope = np.polyfit(np.log(ranks + 1), np.log(counts[ranks]), 1)[0]
    assert slope == pytest.approx(-1.2, abs=0.15)


def test_contiguous_ids_are_the_same_stream():
    hashed = data.generate(SMALL, 3000)
    cfg = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, seed=SMALL.seed, contiguous_ids=True)
    contiguous = data.generate(cfg, 3000)
    np.testing.assert_array_equal(hashed[1], contiguous[1])  # ids format does not touch labels
    for f, name in enumerate(cfg.categorical_names):
        c, h = contiguous[0][name][:, 0], hashed[0][name][:, 0]
        assert c.min() >= 0 and c.max() < cfg.vocab[f]
        # One-to-one correspondence between the two id spaces.
        n_pairs = len(set(zip(c.tolist(), h.tolist())))
        assert n_pairs == len(np.unique(c)) == len(np.unique(h))


@pytest.mark.parametrize("contiguous", [False, True])
def test_string_ids(contiguous):
    base = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, contiguous_ids=contiguous)
    ints = data.generate(base, 2000)[0]
    strs, labels = data.generate(data.SyntheticCriteo(
        vocab_sizes=SMALL.vocab_sizes, contiguous_ids=contiguous, string_ids=True), 2000)
    np.testing.assert_array_equal(labels, data.generate(base, 2000)[1])
    for name in base.categorical_names:
        col = strs[name]
        assert col.shape == (2000, 1) and col.dtype.kind == "S"
        prefix = f"{name}_".encode()
        assert all(s.startswith(prefix) for s in col[:, 0])
        parsed = np.array([int(s[len(prefix):]) for s in col[:, 0]])
        np.testing.assert_array_equal(parsed, ints[name][:, 0])
    if contiguous:  # rank 0 exists in a 2000-row Zipf sample: no leading-zero issues
        assert b"C1_0" in set(strs["C1"][:, 0])


def test_timestamps():
    cfg = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, with_timestamp=True,
                               days=3, rows_per_day=5000)
    ts = data.generate(cfg, cfg.num_rows)[0]["timestamp"]
    assert ts.shape == (15_000, 1) and ts.dtype == np.int64
    assert (np.diff(ts[:, 0]) >= 0).all()
    assert ts[0, 0] == data.START_TIME
    span = ts[-1, 0] - ts[0, 0]
    assert 3 * 86_400 - 60 < span < 3 * 86_400
    # Continuing the stream continues the clock.
    assert data.generate(cfg, 1, cfg.num_rows)[0]["timestamp"][0, 0] == data.START_TIME + 3 * 86_400
    assert "timestamp" not in data.generate(SMALL, 10)[0]


def _top(ids, k):
    values, counts = np.unique(ids, return_counts=True)
    return set(values[np.argsort(-counts)[:k]])


@pytest.mark.parametrize("drift", [0.0, 0.3])
def test_drift_brings_new_ids(drift):
    cfg = data.SyntheticCriteo(n_categorical=1, vocab_sizes=(10_000,), n_dense=0,
                               rows_per_day=20_000, days=3, drift=drift, with_timestamp=True)
    ids = data.generate(cfg, cfg.num_rows)[0]["C1"][:, 0]
    day0, day2 = ids[:20_000], ids[40_000:]
    overlap = len(_top(day0, 50) & _top(day2, 50))
    unseen = np.mean(~np.isin(day2, day0))  # share of day-2 traffic on ids absent on day 0
    if drift == 0:
        assert overlap >= 40 and unseen < 0.15
    else:
        assert overlap <= 5 and unseen > 0.5


def test_label_is_learnable():
    for seed in (0, 1):
        cfg = data.SyntheticCriteo(seed=seed)
        feats, labels, logit = data.generate_with_logits(cfg, 250_000)
        assert 0.24 < labels.mean() < 0.26
        # Observed Bayes AUC: 0.773 (seed 0), 0.819 (seed 1).
        bayes = data.auc(labels, logit)
        assert 0.7 < bayes < 0.9
        # Signal is learnable from finite data, not only by the oracle:
        # smoothed per-id log-odds summed over features (naive Bayes), fitted on
        # 200K rows, scores held-out rows well above chance (~0.69 observed).
        train, test = slice(0, 200_000), slice(200_000, None)
        prior = labels[train].mean()
        score = np.zeros(50_000)
        for name in cfg.categorical_names:
            values, inv = np.unique(feats[name][:, 0], return_inverse=True)
            pos = np.bincount(inv[train], weights=labels[train, 0], minlength=len(values))
            cnt = np.bincount(inv[train], minlength=len(values))
            rate = (pos + 10 * prior) / (cnt + 10)
            score += np.log(rate / (1 - rate))[inv[test]]
        assert 0.62 < data.auc(labels[test], score) < bayes
    assert data.bayes_auc(data.SyntheticCriteo(), 20_000) > 0.7


def test_positive_rate_is_configurable():
    labels = data.generate(data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, positive_rate=0.05), 50_000)[1]
    assert 0.04 < labels.mean() < 0.06


def test_huge_vocabulary_hashes_weights_on_the_fly():
    # 10**12 ids cannot be tabulated; the hashed path must still be a pure
    # function of (seed, feature, id) so chunking does not matter.
    cfg = data.SyntheticCriteo(n_categorical=2, vocab_sizes=(10**12, 100), n_dense=1,
                               contiguous_ids=True)
    whole = data.generate(cfg, 6000)
    assert_same(whole, concat([data.generate(cfg, 2500), data.generate(cfg, 3500, 2500)]))
    ids = whole[0]["C1"]
    assert ids.max() < 10**12 and ids.max() > 10**6  # heavy tail reaches deep ranks
    assert data.bayes_auc(cfg, 20_000) > 0.55


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = rng.integers(0, 20, 300).astype(float)  # many ties
    pos, neg = s[y], s[~y]
    expected = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert data.auc(y, s) == pytest.approx(expected)
    assert data.auc([0, 1], [0.1, 0.9]) == 1.0 and data.auc([0, 1], [0.9, 0.1]) == 0.0
    with pytest.raises(ValueError):
        data.auc([1, 1], [0.1, 0.2])


def test_config_validation_and_hashability():
    cfg = data.SyntheticCriteo(n_categorical=2, vocab_sizes=[5, 6])
    assert cfg.vocab_sizes == (5, 6) and hash(cfg)  # lists are frozen into tuples
    with pytest.raises(ValueError):
        data.SyntheticCriteo(n_categorical=2, vocab_sizes=(5,))
    with pytest.raises(ValueError):
        data.SyntheticCriteo(positive_rate=1.0)
    assert data.SyntheticCriteo(n_categorical=30).vocab[26:] == data.DEFAULT_VOCAB_SIZES[:4]


def test_input_fn_in_graph_mode():
    tf = pytest.importorskip("tensorflow")
    cfg = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, with_timestamp=True)
    fn = data.input_fn(cfg, batch_size=256, num_examples=1000, start=40)
    with tf.Graph().as_default():
        feats, labels = tf.compat.v1.data.make_one_shot_iterator(fn()).get_next()
        assert feats["C1"].dtype == tf.int64 and feats["I1"].dtype == tf.float32
        assert feats["timestamp"].shape.as_list() == [None, 1]
        with tf.compat.v1.Session() as sess:
            for i in range(2):
                got_f, got_l = sess.run((feats, labels))
                assert_same((got_f, got_l), data.generate(cfg, 256, 40 + 256 * i))


def test_input_fn_repeat_shuffle_and_strings():
    tf = pytest.importorskip("tensorflow")
    cfg = data.SyntheticCriteo(vocab_sizes=SMALL.vocab_sizes, string_ids=True)
    fn = data.input_fn(cfg, batch_size=300, num_examples=1000, shuffle=True, repeat=2)
    batches = [(f["C2"].numpy()[:, 0], l.numpy()[:, 0]) for f, l in fn()]
    assert [len(l) for _, l in batches] == [300, 300, 300, 100] * 2
    epoch = [np.concatenate([b[0] for b in batches[i:i + 4]]) for i in (0, 4)]
    ref = data.generate(cfg, 1000)[0]["C2"][:, 0]
    assert sorted(epoch[0]) == sorted(epoch[1]) == sorted(ref)  # same rows each pass
    assert not np.array_equal(epoch[0], ref) and not np.array_equal(epoch[0], epoch[1])

    fixed = data.input_fn(SMALL, batch_size=300, num_examples=1000, drop_remainder=True)
    ds = fixed()
    assert ds.element_spec[1].shape.as_list() == [300, 1]
    assert sum(1 for _ in ds) == 3
