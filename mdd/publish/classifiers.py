"""The classifiers of the utility check (``mdd.publish.utility``): ``concepts`` (the symptom concepts a patient
affirms, negation-aware, + a class-balanced logistic regression; the default), ``tfidf`` (character 1–3-gram
TF-IDF + logistic regression; the leakage probe) and ``embed:<embedder>`` (a dialogue as the mean of its turns'
embeddings + a linear head). Each fits on texts and labels and predicts labels; ``model_factory`` makes one by
its name."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

DEFAULT_MODEL = "concepts"
MODELS = ("concepts", "tfidf", "embed:<embedder>")


class Classifier(Protocol):
    def fit(self, texts: list[str], y: list[str]) -> "Classifier": ...

    def predict(self, texts: list[str]) -> list[str]: ...


class _Constant:
    def __init__(self, label: str):
        self.label = label

    def predict(self, texts: list[str]) -> list[str]:
        return [self.label] * len(texts)


class CharCounts:
    """Character 1–3-gram counts, hashed (2**20 columns: no vocabulary to fit, so no fold sees another's),
    cached by text: cross-validation and the controls analyse each dialogue once."""

    def __init__(self, n_features: int = 2**20):
        from sklearn.feature_extraction.text import HashingVectorizer

        self._vec = HashingVectorizer(analyzer="char", ngram_range=(1, 3), n_features=n_features,
                                      alternate_sign=False, norm=None, dtype=np.float64)
        self._rows: dict[str, Any] = {}

    def matrix(self, texts: list[str]) -> Any:
        import scipy.sparse as sp

        todo = [t for t in dict.fromkeys(texts) if t not in self._rows]
        if todo:
            m = self._vec.transform(todo).tocsr()
            for i, t in enumerate(todo):
                self._rows[t] = m[i]
        return sp.vstack([self._rows[t] for t in texts], format="csr")


class TfidfLogReg:
    """Character 1–3-gram TF-IDF (sublinear tf; the n-grams in at least 2 training dialogues, IDF from the
    training dialogues only) + logistic regression with balanced class weights."""

    name = "tfidf"

    def __init__(self, counts: CharCounts | None = None, seed: int = 0, min_df: int = 2):
        self.counts, self.seed, self.min_df = counts or CharCounts(), seed, min_df
        self._cols: Any = None
        self._tfidf: Any = None
        self._clf: Any = None
        self._const: _Constant | None = None

    def fit(self, texts: list[str], y: list[str]) -> "TfidfLogReg":
        from sklearn.feature_extraction.text import TfidfTransformer
        from sklearn.linear_model import LogisticRegression

        if len(set(y)) < 2:
            self._const = _Constant(y[0])
            return self
        x = self.counts.matrix(texts)
        df = np.bincount(x.indices, minlength=x.shape[1])
        self._cols = np.flatnonzero(df >= min(self.min_df, len(texts)))
        x = x[:, self._cols]
        self._tfidf = TfidfTransformer(sublinear_tf=True).fit(x)
        self._clf = LogisticRegression(C=10.0, max_iter=2000, class_weight="balanced", random_state=self.seed)
        self._clf.fit(self._tfidf.transform(x), y)
        return self

    def predict(self, texts: list[str]) -> list[str]:
        if self._const is not None:
            return self._const.predict(texts)
        return list(self._clf.predict(self._tfidf.transform(self.counts.matrix(texts)[:, self._cols])))


class _LinearHead:
    """Logistic regression with balanced class weights over ``features(texts)`` (a subclass's); a training
    set of one class predicts that class."""

    C = 1.0
    seed = 0
    _clf: Any = None
    _const: _Constant | None = None

    def features(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def fit(self, texts: list[str], y: list[str]) -> "_LinearHead":
        from sklearn.linear_model import LogisticRegression

        if len(set(y)) < 2:
            self._const = _Constant(y[0])
            return self
        self._clf = LogisticRegression(C=self.C, max_iter=2000, class_weight="balanced", random_state=self.seed)
        self._clf.fit(self.features(texts), y)
        return self

    def predict(self, texts: list[str]) -> list[str]:
        if self._const is not None:
            return self._const.predict(texts)
        return list(self._clf.predict(self.features(texts)))


class EmbedLinear(_LinearHead):
    """A dialogue as the mean of its turns' embeddings (``mdd.index.embedders``), then logistic
    regression. Embeddings are cached by text, so cross-validation encodes each turn once."""

    C = 10.0

    def __init__(self, embedder: Any, cache: dict[str, np.ndarray], seed: int = 0):
        self.embedder, self.cache, self.seed = embedder, cache, seed
        self.name = f"embed:{embedder.name}"

    def features(self, texts: list[str]) -> np.ndarray:
        lines = [[ln for ln in t.split("\n") if ln.strip()] for t in texts]
        todo = sorted({ln for ls in lines for ln in ls if ln not in self.cache})
        if todo:
            for ln, v in zip(todo, self.embedder.encode(todo)):
                self.cache[ln] = v
        x = np.zeros((len(texts), int(self.embedder.dim)), dtype=np.float32)
        for i, ls in enumerate(lines):
            if ls:
                m = np.mean([self.cache[ln] for ln in ls], axis=0)
                x[i] = m / (np.linalg.norm(m) or 1.0)
        return x


class ConceptLinear(_LinearHead):
    """Symptom concepts, then logistic regression with balanced class weights. A text is a dialogue view,
    one turn a line; per concept of ``lexicons.yaml`` (faithfulness.concepts), whether any turn affirms
    it and the share of turns that do (``mdd.evaluate.faithfulness.stances``: a mention under a
    negation cue is a denial and counts nothing). Cached by text."""

    name = "concepts"

    def __init__(self, cache: dict[str, np.ndarray], seed: int = 0):
        from mdd.evaluate.faithfulness import faith_lexicon

        self.lex, self.cache, self.seed = faith_lexicon(), cache, seed
        self.concepts = list(self.lex.concepts)

    def vector(self, text: str) -> np.ndarray:
        from mdd.evaluate.faithfulness import stances

        if text not in self.cache:
            turns = [ln for ln in text.split("\n") if ln.strip()]
            pos = np.zeros(len(self.concepts))
            ix = {c: i for i, c in enumerate(self.concepts)}
            for ln in turns:
                for c, sign in stances(ln, self.lex).items():
                    if sign > 0:
                        pos[ix[c]] += 1
            self.cache[text] = np.concatenate([pos / max(len(turns), 1), (pos > 0).astype(float)])
        return self.cache[text]

    def features(self, texts: list[str]) -> np.ndarray:
        return np.array([self.vector(t) for t in texts]).reshape(len(texts), 2 * len(self.concepts))

    def weights(self) -> dict[str, dict[str, float]]:
        """Per class, the concepts with the largest positive weights (share and presence summed)."""
        if self._clf is None:
            return {}
        k = len(self.concepts)
        coef = self._clf.coef_
        rows = [coef[0] * -1, coef[0]] if coef.shape[0] == 1 else list(coef)
        out = {}
        for c, w in zip(self._clf.classes_, rows):
            total = w[:k] + w[k:]
            top = np.argsort(-total)[:5]
            out[str(c)] = {self.concepts[i]: round(float(total[i]), 3) for i in top if total[i] > 0}
        return out


def model_factory(spec: str = DEFAULT_MODEL, seed: int = 0) -> Callable[[], Classifier]:
    """A maker of fresh, unfitted classifiers for ``spec`` (``concepts``, ``tfidf`` or ``embed:<embedder>``)."""
    if spec == "concepts":
        cache: dict[str, np.ndarray] = {}
        return lambda: ConceptLinear(cache, seed)
    if spec == "tfidf":
        counts = CharCounts()
        return lambda: TfidfLogReg(counts, seed)
    if spec.startswith("embed:") and spec[len("embed:"):]:
        from mdd.index.embedders import make_embedder

        emb, cache = make_embedder(spec[len("embed:"):]), {}
        return lambda: EmbedLinear(emb, cache, seed)
    raise ValueError(f"unknown model {spec!r} (known: {', '.join(MODELS)})")
