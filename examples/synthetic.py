"""Synthetic Criteo-like click data: deterministic, download-free, numpy only.

Each row has 13 dense features ``I1..I13`` (float32, log1p of log-normal
counts), 26 categorical features ``C1..C26`` (int64 hashed-looking raw ids with
Zipf-like frequencies), an optional ``timestamp`` (int64 unix seconds) and a
binary ``label`` drawn from a known logit, so the best achievable AUC is known.

The data is an infinite stream addressed by row number: row ``r`` is the same
whatever chunk it is generated in, because randomness is seeded per fixed-size
block of rows by ``(seed, block index)``.

Example:
    >>> cfg = SyntheticCriteo(seed=1)
    >>> features, labels = generate(cfg, 1000)
    >>> features["C3"].shape, features["C3"].dtype, labels.shape
    ((1000, 1), dtype('int64'), (1000, 1))
    >>> 0.7 < bayes_auc(cfg, 50_000) < 0.9
    True
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

if TYPE_CHECKING:  # TensorFlow is only needed by input_fn; keep plain imports cheap.
    import tensorflow as tf

# Criteo-like cardinalities, capped to 100..1,000,000 so defaults stay laptop-sized.
DEFAULT_VOCAB_SIZES: tuple[int, ...] = (
    1_000, 500, 1_000_000, 500_000, 300, 100, 10_000, 600, 100, 100_000,
    5_000, 1_000_000, 3_000, 100, 15_000, 1_000_000, 100, 5_000, 2_000, 100,
    1_000_000, 100, 100, 300_000, 100, 150_000,
)

BLOCK_ROWS = 4096  # unit of seeding; changing it changes the stream
START_TIME = 1_699_920_000  # 2023-11-14 00:00:00 UTC, first row's timestamp
SECONDS_PER_DAY = 86_400

# Signal strengths: per-id weights ~ N(0, _CAT_WEIGHT_STD^2) summed over 26
# features give a logit std of ~1.2, i.e. a Bayes AUC of ~0.76-0.82 (seed-dependent).
_CAT_WEIGHT_STD = 0.22
_DENSE_WEIGHT_STD = 0.15
_CALIBRATION_ROWS = 16 * BLOCK_ROWS
_WEIGHT_TABLE_MAX = 1 << 22  # larger vocabularies hash weights on the fly
_WORK_ROWS = 16 * BLOCK_ROWS  # rows per vectorised step; keeps temporaries cache-sized

# Distinct SeedSequence tags so row, parameter and shuffle streams never overlap.
_TAG_ROWS, _TAG_PARAMS, _TAG_SHUFFLE = 0, 1, 2
_MASK63 = np.uint64((1 << 63) - 1)
_POW10 = 10 ** np.arange(1, 19, dtype=np.int64)  # thresholds for decimal lengths


@dataclasses.dataclass(frozen=True)
class SyntheticCriteo:
    """Configuration of the synthetic stream (hashable, so results can be cached).

    Attributes:
      n_dense: number of dense features ``I1..``.
      n_categorical: number of categorical features ``C1..``.
      vocab_sizes: ids per categorical feature; None cycles DEFAULT_VOCAB_SIZES.
      zipf_a: power-law exponent of id frequencies (frequency ~ rank**-a).
      seed: non-negative seed; everything (ids, weights, labels) depends on it.
      positive_rate: target mean label, reached by calibrating the logit bias.
      contiguous_ids: ids are 0..V-1 (can index a tf.Variable directly) instead
        of hashed-looking values spread over [1, 2**63).
      string_ids: ids are bytes like ``b"C3_123"`` (same underlying ids).
      with_timestamp: add an int64 ``timestamp`` feature.
      days, rows_per_day: timestamps advance linearly, ``rows_per_day`` rows per
        simulated day; ``num_rows = days * rows_per_day`` rows span ``days`` days.
      drift: fraction of each vocabulary whose popularity ranks rotate per day.
        Rotation makes ids fade from head to tail while never-seen ids burst
        in at the head, so age-based eviction matters. 0 = stationary stream.
        Ranks move ``drift * V`` per day, so large vocabularies churn faster:
        drift=0.01 replaces the top-1000 of a 1M vocabulary ~10 times a day.
    """

    n_dense: int = 13
    n_categorical: int = 26
    vocab_sizes: tuple[int, ...] | None = None
    zipf_a: float = 1.2
    seed: int = 0
    positive_rate: float = 0.25
    contiguous_ids: bool = False
    string_ids: bool = False
    with_timestamp: bool = False
    days: int = 1
    rows_per_day: int = 100_000
    drift: float = 0.0

    def __post_init__(self) -> None:
        if self.vocab_sizes is not None:
            # A list would make the config unhashable (breaks caching).
            object.__setattr__(self, "vocab_sizes", tuple(int(v) for v in self.vocab_sizes))
            if len(self.vocab_sizes) != self.n_categorical:
                raise ValueError("len(vocab_sizes) must equal n_categorical")
        if min(self.vocab, default=1) < 1:
            raise ValueError("vocab sizes must be >= 1")
        if self.seed < 0 or self.zipf_a < 0 or self.drift < 0:
            raise ValueError("seed, zipf_a and drift must be non-negative")
        if not 0 < self.positive_rate < 1:
            raise ValueError("positive_rate must be in (0, 1)")
        if self.rows_per_day < 1 or self.days < 0:
            raise ValueError("rows_per_day must be >= 1 and days >= 0")

    @property
    def vocab(self) -> tuple[int, ...]:
        """Resolved vocabulary size of every categorical feature."""
        if self.vocab_sizes is not None:
            return self.vocab_sizes
        d = DEFAULT_VOCAB_SIZES
        return tuple(d[i % len(d)] for i in range(self.n_categorical))

    @property
    def dense_names(self) -> list[str]:
        return [f"I{i + 1}" for i in range(self.n_dense)]

    @property
    def categorical_names(self) -> list[str]:
        return [f"C{i + 1}" for i in range(self.n_categorical)]

    @property
    def num_rows(self) -> int:
        """Rows spanning the configured ``days`` (default size for input_fn)."""
        return self.days * self.rows_per_day


# ----------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser: a cheap, well-mixed 64-bit hash."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hashed_normal(seed: int, feature: int, idx: np.ndarray) -> np.ndarray:
    """N(0,1) value per (seed, feature, id index) without storing a table."""
    key = _splitmix64(np.array([(seed * 1_000_003 + feature) % 2**64], dtype=np.uint64))[0]
    h = _splitmix64(idx.astype(np.uint64) ^ key)
    # Box-Muller from two 26-bit uniforms in (0, 1).
    scale = 1.0 / (1 << 26)
    u1 = ((h >> np.uint64(38)).astype(np.float64) + 0.5) * scale
    u2 = (((h >> np.uint64(12)) & np.uint64((1 << 26) - 1)).astype(np.float64) + 0.5) * scale
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


@functools.lru_cache(maxsize=4)
def _weight_tables(seed: int, vocab: tuple[int, ...]) -> tuple[np.ndarray | None, ...]:
    """Per-id weights as arrays for vocabularies small enough to tabulate.

    Tables hold exactly the values `_hashed_normal` would give, so tabulated and
    on-the-fly features are interchangeable; tables just make lookups cheap.
    """
    def table(f: int, v: int) -> np.ndarray:
        idx = np.arange(v)
        # Chunked so temporaries stay in cache.
        return _CAT_WEIGHT_STD * np.concatenate(
            [_hashed_normal(seed, f, idx[i:i + _WORK_ROWS]) for i in range(0, v, _WORK_ROWS)])

    return tuple(table(f, v) if v <= _WEIGHT_TABLE_MAX else None for f, v in enumerate(vocab))


@functools.lru_cache(maxsize=16)
def _dense_params(seed: int, n_dense: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-feature log-count location, scale and label weight."""
    rng = np.random.default_rng([seed, _TAG_PARAMS])
    mu = rng.uniform(0.0, 4.0, (n_dense, 1)).astype(np.float32)
    sigma = rng.uniform(0.5, 1.5, (n_dense, 1)).astype(np.float32)
    beta = rng.normal(0.0, _DENSE_WEIGHT_STD, n_dense)
    return mu, sigma, beta


def _block_draws(cfg: SyntheticCriteo, start: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw random numbers for rows start..start+n, seeded per block of rows.

    Whole blocks are drawn and then sliced, which is what makes the stream
    independent of how callers chunk it. Layout is feature-major ([C, n]) so
    per-feature work below runs on contiguous rows.
    """
    c, d = cfg.n_categorical, cfg.n_dense
    b0, b1 = start // BLOCK_ROWS, (start + n - 1) // BLOCK_ROWS + 1
    m = (b1 - b0) * BLOCK_ROWS
    u_cat = np.empty((c, m))
    g = np.empty((d + 1, m), dtype=np.float32)
    u_lab = np.empty(m)
    for i, b in enumerate(range(b0, b1)):
        rng = np.random.default_rng([cfg.seed, _TAG_ROWS, b])
        rows = slice(i * BLOCK_ROWS, (i + 1) * BLOCK_ROWS)
        u_cat[:, rows] = rng.random((c, BLOCK_ROWS))
        g[:, rows] = rng.standard_normal((d + 1, BLOCK_ROWS), dtype=np.float32)
        u_lab[rows] = rng.random(BLOCK_ROWS)
    off = start - b0 * BLOCK_ROWS
    return u_cat[:, off:off + n], g[:, off:off + n], u_lab[off:off + n]


def _zipf_ranks(u: np.ndarray, vocab: np.ndarray, a: float) -> np.ndarray:
    """Inverse CDF of a continuous power law on [1, V+1) (vocab broadcasts
    against u): rank 0 is the most frequent id, P(rank r) ~ (r+1)**-a.
    Closed form, so a vocabulary of 10**9 costs the same as one of 100."""
    vf = vocab.astype(np.float64)
    if abs(a - 1.0) < 1e-9:
        x = np.exp(u * np.log1p(vf))
    else:
        x = (1.0 - u * (1.0 - (vf + 1.0) ** (1.0 - a))) ** (1.0 / (1.0 - a))
    return np.minimum(x.astype(np.int64) - 1, vocab - 1)


def _raw_ids(idx: np.ndarray) -> np.ndarray:
    """Spread id indices ([C, n]) over [1, 2**63) so they look like hashed ids.

    Multiplying by an odd constant mod 2**63 and an xorshift are both
    bijections, so distinct indices stay distinct; +1 keeps 0 (and negative
    values such as -1) free for hash tables that reserve them as empty keys.
    """
    mult = _splitmix64(np.arange(idx.shape[0], dtype=np.uint64) + np.uint64(12345)) | np.uint64(1)
    x = ((idx.astype(np.uint64) + np.uint64(1)) * mult[:, None]) & _MASK63
    x ^= x >> np.uint64(29)
    return x.view(np.int64)


def _digits(ids: np.ndarray) -> np.ndarray:
    """[n, 19] decimal digits (most significant first) of ids in [0, 2**63).

    int64 division is slow in numpy, so split into base-1e7 limbs once and
    peel digits off with (SIMD-friendly) uint32 division.
    """
    out = np.empty((ids.shape[0], 19), dtype=np.uint8)
    x = ids.astype(np.uint64)
    ten7 = np.uint64(10**7)
    limbs = []
    for _ in range(2):
        q = x // ten7
        limbs.append((x - q * ten7).astype(np.uint32))
        x = q
    limbs.append(x.astype(np.uint32))  # < 10**5
    col = 18
    for limb, nd in zip(limbs, (7, 7, 5)):
        for _ in range(nd):
            q = limb // np.uint32(10)
            out[:, col] = limb - q * np.uint32(10)
            limb, col = q, col - 1
    return out


def _write_strings(out: np.ndarray, rows: slice, prefix: bytes, ids: np.ndarray) -> None:
    """out[rows] = prefix + decimal(ids), for an 'S' array of shape [n, 1].

    Digits are written left-aligned into the raw bytes; numpy's 'S' dtype
    drops the trailing NUL padding, which yields variable-length strings."""
    width = out.dtype.itemsize
    p, ndig = len(prefix), width - len(prefix)
    chars = _digits(ids)[:, 19 - ndig:] + np.uint8(ord("0"))
    length = np.searchsorted(_POW10, ids, side="right") + 1
    buf = np.zeros((ids.shape[0], width), dtype=np.uint8)
    buf[:, :p] = np.frombuffer(prefix, dtype=np.uint8)
    for n_digits in range(1, ndig + 1):  # few distinct lengths: Zipf head or ~19 digits
        sel = np.flatnonzero(length == n_digits)
        if sel.size:
            buf[sel, p:p + n_digits] = chars[sel, ndig - n_digits:]
    out.view(np.uint8).reshape(out.shape[0], width)[rows] = buf


def _chunk_bounds(start: int, n: int) -> list[tuple[int, int]]:
    """Split rows into pieces aligned to _WORK_ROWS, so no block is drawn twice
    and temporaries stay cache-sized (numpy is several times faster then)."""
    cuts = [start, *range((start // _WORK_ROWS + 1) * _WORK_ROWS, start + n, _WORK_ROWS), start + n]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _rows(cfg: SyntheticCriteo, n: int, start: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Features, bias-free logit and label uniforms of rows start..start+n."""
    vocab = np.array(cfg.vocab, dtype=np.int64)[:, None]
    mu, sigma, beta = _dense_params(cfg.seed, cfg.n_dense)
    tables = _weight_tables(cfg.seed, cfg.vocab)

    feats = {name: np.empty((n, 1), dtype=np.float32) for name in cfg.dense_names}
    for f, name in enumerate(cfg.categorical_names):
        if cfg.string_ids:
            max_id = cfg.vocab[f] - 1 if cfg.contiguous_ids else 2**63 - 1
            feats[name] = np.empty((n, 1), dtype=f"S{len(name) + 1 + len(str(max_id))}")
        else:
            feats[name] = np.empty((n, 1), dtype=np.int64)
    logit = np.empty(n)
    u_lab = np.empty(n)

    for lo, hi in _chunk_bounds(start, n):
        rows = slice(lo - start, hi - start)
        u_cat, g, u_lab[rows] = _block_draws(cfg, lo, hi - lo)

        # Dense: log-normal counts sharing a per-row latent (so they correlate
        # with each other), then log1p as Criteo pipelines usually do.
        dense = np.log1p(np.floor(np.exp(mu + sigma * (0.6 * g[:1] + 0.8 * g[1:]))))
        for j, name in enumerate(cfg.dense_names):
            feats[name][rows, 0] = dense[j]
        logit[rows] = beta @ dense

        # Categorical: popularity rank -> id index (rotated by drift) -> raw id.
        idx = _zipf_ranks(u_cat, vocab, cfg.zipf_a)
        if cfg.drift > 0:
            day = np.arange(lo, hi) / cfg.rows_per_day
            shift = np.minimum((np.mod(cfg.drift * day, 1.0) * vocab).astype(np.int64), vocab - 1)
            idx -= shift
            idx += np.where(idx < 0, vocab, 0)
        for f in range(cfg.n_categorical):
            table = tables[f]
            w = table[idx[f]] if table is not None else (
                _CAT_WEIGHT_STD * _hashed_normal(cfg.seed, f, idx[f]))
            logit[rows] += w
        ids = idx if cfg.contiguous_ids else _raw_ids(idx)
        for f, name in enumerate(cfg.categorical_names):
            if cfg.string_ids:
                _write_strings(feats[name], rows, f"{name}_".encode(), ids[f])
            else:
                feats[name][rows, 0] = ids[f]

    if cfg.with_timestamp:
        row = np.arange(start, start + n, dtype=np.int64)
        feats["timestamp"] = (START_TIME + row * SECONDS_PER_DAY // cfg.rows_per_day).reshape(n, 1)
    return feats, logit, u_lab


@functools.lru_cache(maxsize=16)
def _bias(cfg: SyntheticCriteo) -> float:
    """Bias putting the mean label at cfg.positive_rate, fitted by bisection on
    the stream's first rows (so it is a deterministic function of the config)."""
    _, z, _ = _rows(cfg, _CALIBRATION_ROWS, 0)
    lo, hi = -40.0, 40.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.mean(1.0 / (1.0 + np.exp(-(z + mid)))) < cfg.positive_rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _bias_key(cfg: SyntheticCriteo) -> SyntheticCriteo:
    # Id format and timestamps do not change the logit; share one calibration.
    return dataclasses.replace(cfg, contiguous_ids=True, string_ids=False, with_timestamp=False)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------


def generate_with_logits(
    config: SyntheticCriteo, n: int, start: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Like `generate`, also returning the true logit (float64, shape [n, 1])."""
    if n < 0 or start < 0:
        raise ValueError("n and start must be non-negative")
    feats, z, u_lab = _rows(config, n, start)
    logit = z + _bias(_bias_key(config))
    labels = (u_lab < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32).reshape(n, 1)
    return feats, labels, logit.reshape(n, 1)


def generate(config: SyntheticCriteo, n: int, start: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Rows ``start .. start+n`` of the infinite deterministic stream.

    Returns ``(features, labels)``: features maps ``I*`` (float32), ``C*``
    (int64, or bytes if ``string_ids``) and optionally ``timestamp`` (int64)
    to arrays of shape [n, 1]; labels is float32 [n, 1] of 0/1.

    Example:
        >>> cfg = SyntheticCriteo(vocab_sizes=(10,) * 26)
        >>> a = generate(cfg, 100)[1]
        >>> b = np.concatenate([generate(cfg, 30)[1], generate(cfg, 70, start=30)[1]])
        >>> bool((a == b).all())
        True
    """
    feats, labels, _ = generate_with_logits(config, n, start)
    return feats, labels


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC via the rank-sum statistic; tied scores get average ranks.

    Example:
        >>> auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
    """
    y = np.asarray(labels).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank per value
    rank_sum = avg_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def bayes_auc(config: SyntheticCriteo, n: int = 200_000, start: int = 0) -> float:
    """AUC of the true logit on rows start..start+n: the ceiling any model can reach.

    Example:
        >>> round(bayes_auc(SyntheticCriteo(), 20_000), 2) > 0.7
        True
    """
    _, labels, logit = generate_with_logits(config, n, start)
    return auc(labels, logit)


_CHUNK_ROWS = 1 << 16  # rows generated per numpy call inside input_fn
_CACHE_MAX_ROWS = 1 << 20  # up to ~300 MB of int features kept between epochs


def input_fn(
    config: SyntheticCriteo,
    batch_size: int,
    num_examples: int | None = None,
    start: int = 0,
    shuffle: bool = False,
    repeat: int | None = 1,
    drop_remainder: bool = False,
) -> Callable[[], "tf.data.Dataset"]:
    """A zero-arg ``input_fn`` for tf.estimator yielding ``(features, labels)`` batches.

    Rows ``start .. start+num_examples`` (default ``config.num_rows``) are
    generated in numpy chunks inside ``tf.data.Dataset.from_generator``; that
    keeps large arrays out of the GraphDef (Estimator serialises the graph, and
    from_tensor_slices would embed the data as constants). Datasets of up to
    ~1M rows are cached in memory after the first pass, so re-invoking the
    returned function (as Estimator does on every train/evaluate call) or
    ``repeat`` does not regenerate them.

    Args:
      batch_size: rows per batch; batches are [batch, 1] tensors per feature.
      shuffle: shuffle chunk order and rows within each chunk of ~65k rows,
        differently per epoch but deterministically. Off keeps stream (time) order.
      repeat: number of passes over the data; None repeats forever.
      drop_remainder: drop the final partial batch of each pass (static shapes).

    Example:
        >>> fn = input_fn(SyntheticCriteo(), batch_size=256, num_examples=10_000)
        >>> # tf.estimator.LinearClassifier(...).train(fn)
    """
    import tensorflow as tf

    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    total = config.num_rows if num_examples is None else int(num_examples)
    end = start + total
    chunk = batch_size * max(1, _CHUNK_ROWS // batch_size)  # whole batches per chunk
    starts = list(range(start, end, chunk))
    # Only the last chunk can be short; keep it last when shuffling so at most
    # one partial batch per pass, always at the end.
    n_full = len(starts) if total % chunk == 0 else len(starts) - 1
    cache: dict[int, tuple[dict[str, np.ndarray], np.ndarray]] | None = (
        {} if total <= _CACHE_MAX_ROWS else None)

    def load(cs: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if cache is not None and cs in cache:
            return cache[cs]
        out = generate(config, min(chunk, end - cs), cs)
        if cache is not None:
            cache[cs] = out
        return out

    def batches() -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        for epoch in itertools.count() if repeat is None else range(repeat):
            order, rng = starts, None
            if shuffle:
                rng = np.random.default_rng([config.seed, _TAG_SHUFFLE, epoch])
                order = [starts[i] for i in rng.permutation(n_full)] + starts[n_full:]
            for cs in order:
                feats, labels = load(cs)
                if rng is not None:
                    p = rng.permutation(labels.shape[0])
                    feats, labels = {k: v[p] for k, v in feats.items()}, labels[p]
                for i in range(0, labels.shape[0], batch_size):
                    if drop_remainder and i + batch_size > labels.shape[0]:
                        break
                    yield {k: v[i:i + batch_size] for k, v in feats.items()}, labels[i:i + batch_size]

    rows = batch_size if drop_remainder else None
    cat_dtype = tf.string if config.string_ids else tf.int64
    spec = {name: tf.TensorSpec([rows, 1], tf.float32) for name in config.dense_names}
    spec.update({name: tf.TensorSpec([rows, 1], cat_dtype) for name in config.categorical_names})
    if config.with_timestamp:
        spec["timestamp"] = tf.TensorSpec([rows, 1], tf.int64)
    signature = (spec, tf.TensorSpec([rows, 1], tf.float32))

    def make_dataset() -> "tf.data.Dataset":
        ds = tf.data.Dataset.from_generator(batches, output_signature=signature)
        return ds.prefetch(2)

    return make_dataset
