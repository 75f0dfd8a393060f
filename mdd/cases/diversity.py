"""Fidelity and diversity of a set of synthetic cases.

- ``js_distance``: Jensen-Shannon distance (base 2: 0 same, 1 disjoint) of the generated mix against
  the profile, per attribute: ICD prefix (share of all diagnoses), number of diagnoses, and the age band
  and gender the profile expects given the diagnoses drawn.
- ``near_duplicates``: character 5-gram shingles of each record's text; a case's nearest neighbour by
  Jaccard similarity; the share of cases whose nearest is at or over 0.8.
- ``symptom_sets``: per first diagnosis, cases and distinct sets of symptoms present.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
from scipy.spatial.distance import jensenshannon

from mdd import knowledge
from mdd.cases.plan import CasePlan, Profile

NEAR_DUPLICATE = 0.8
SHINGLE = 5
TEXT_FIELDS = ("主诉", "现病史", "家族史", "个人史", "精神检查", "处理意见")


def js(p: dict[Any, float], q: dict[Any, float]) -> float:
    keys = sorted(set(p) | set(q), key=str)
    a = np.array([p.get(k, 0.0) for k in keys], dtype=float)
    b = np.array([q.get(k, 0.0) for k in keys], dtype=float)
    if a.sum() == 0 or b.sum() == 0:
        return 1.0
    return float(jensenshannon(a / a.sum(), b / b.sum(), base=2))


def _shares(c: Counter) -> dict[Any, float]:
    total = sum(c.values())
    return {k: v / total for k, v in c.items()} if total else {}


def record_text(rec: dict[str, Any]) -> str:
    parts = []
    for f in TEXT_FIELDS:
        v = rec.get(f)
        parts.append("；".join(f"{k}：{x}" for k, x in v.items()) if isinstance(v, dict) else str(v or ""))
    return "\n".join(parts)


def near_duplicates(texts: Sequence[str], threshold: float = NEAR_DUPLICATE, chunk: int = 2000) -> dict[str, Any]:
    """Nearest-neighbour character-shingle Jaccard of every text (exact, by sparse products in chunks)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    if len(texts) < 2:
        return {"cases": len(texts), "share": 0.0, "pairs_at_or_over": 0, "max_jaccard": 0.0, "p99_nearest": 0.0}
    vec = HashingVectorizer(analyzer="char", ngram_range=(SHINGLE, SHINGLE), binary=True, norm=None,
                            alternate_sign=False, n_features=2**22, lowercase=False)
    x = vec.transform(texts).astype(np.float32).tocsr()
    sizes = np.asarray(x.sum(axis=1)).ravel()
    nearest = np.zeros(len(texts))
    pairs = 0
    for start in range(0, len(texts), chunk):
        inter = (x[start:start + chunk] @ x.T).toarray()
        union = sizes[start:start + chunk, None] + sizes[None, :] - inter
        jac = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        for i in range(jac.shape[0]):
            jac[i, start + i] = 0.0
        nearest[start:start + chunk] = jac.max(axis=1)
        pairs += int((jac >= threshold).sum())
    return {"cases": len(texts), "share": float((nearest >= threshold).mean()), "pairs_at_or_over": pairs // 2,
            "max_jaccard": round(float(nearest.max()), 4), "p99_nearest": round(float(np.quantile(nearest, 0.99)), 4),
            "median_nearest": round(float(np.median(nearest)), 4), "threshold": threshold, "shingle_chars": SHINGLE}


def expected_attributes(firsts: Sequence[str], profile: Profile) -> tuple[dict[str, float], dict[str, float]]:
    """The age-band and gender mix the profile expects for cases with these first diagnoses (ICD prefixes)."""
    bands: dict[str, float] = {}
    female = 0.0
    for first in firsts:
        table = profile.age.get(first) or profile.age["default"]
        total = sum(table.values())
        for b, w in table.items():
            bands[b] = bands.get(b, 0) + w / total
        female += profile.female_share.get(first, profile.female_share.get("default", 0.5))
    n = max(len(firsts), 1)
    return {b: v / n for b, v in bands.items()}, {"女": female / n, "男": 1 - female / n}


def _prefixes(rec: dict[str, Any]) -> list[str]:
    return [c.strip().split(".")[0][:3] for c in re.split(r"[,，、;；/]", str(rec["ICD编码"])) if c.strip()]


@lru_cache(maxsize=1)
def _symptom_patterns() -> dict[str, re.Pattern]:
    """Each plan symptom's wordings (``case_plans.yaml``) as one pattern; a ``{slot}`` matches a few characters."""
    out = {}
    for key, s in knowledge.load_yaml("case_plans.yaml")["symptoms"].items():
        alts = [re.sub(r"\\\{\w+\\\}", ".{1,6}?", re.escape(t)) for t in s.get("present") or []]
        if alts:
            out[key] = re.compile("|".join(alts))
    return out


def stated_symptoms(rec: dict[str, Any]) -> frozenset[str]:
    """The plan symptoms a record's history states in one of the writer's wordings (what a run can tell
    of a synthetic record without its plan)."""
    text = f"{rec.get('主诉', '')}。{rec.get('现病史', '')}"
    return frozenset(k for k, pat in _symptom_patterns().items() if pat.search(text))


def _band(profile: Profile, age: int) -> str:
    for name, (lo, hi) in profile.age_bands.items():
        if lo <= age <= hi:
            return name
    return "other"


def diversity(records: Sequence[dict[str, Any]], plans: Sequence[CasePlan] | None, profile: Profile) -> dict[str, Any]:
    """The figures of ``records`` (MDD-5k schema, exact ages) against ``profile``. With their ``plans``
    the symptom sets are the plans'; without (a run reading a case file) they are the symptoms each
    record's history states (:func:`stated_symptoms`)."""
    prefixes = Counter(c for r in records for c in _prefixes(r))
    n_diag = Counter(len(_prefixes(r)) for r in records)
    bands = Counter(_band(profile, int(r["年龄"])) for r in records)
    genders = Counter(r["性别"] for r in records)
    if plans is not None:
        firsts = [p.prefixes[0] for p in plans]
        present = [frozenset(p.present) for p in plans]
    else:
        firsts = [_prefixes(r)[0] for r in records]
        present = [stated_symptoms(r) for r in records]
    exp_bands, exp_gender = expected_attributes(firsts, profile)
    sets: dict[str, set] = {}
    counts: Counter = Counter()
    for first, symptoms in zip(firsts, present):
        sets.setdefault(first, set()).add(symptoms)
        counts[first] += 1
    n = max(len(records), 1)
    return {
        "cases": len(records),
        "js_distance": {
            "icd_prefix": round(js(_shares(prefixes), profile.mix()), 4),
            "n_diagnoses": round(js(_shares(n_diag), profile.n_mix()), 4),
            "age_band": round(js(_shares(bands), exp_bands), 4),
            "gender": round(js(_shares(genders), exp_gender), 4),
        },
        "n_diagnoses_share": {str(k): round(v / n, 4) for k, v in sorted(n_diag.items())},
        "profile_n_diagnoses_share": {str(k): round(v, 4) for k, v in sorted(profile.n_mix().items())},
        "icd_prefix_counts": dict(prefixes.most_common()),
        "near_duplicates": near_duplicates([record_text(r) for r in records]),
        "symptom_sets": {k: {"cases": counts[k], "distinct": len(v)} for k, v in
                         sorted(sets.items(), key=lambda kv: -counts[kv[0]])},
    }


def by_source(cases: Sequence[Any]) -> dict[str, int]:
    """Validated cases (:class:`mdd.cases.Case`) counted by provenance: synthetic, real, unstated."""
    c = Counter(getattr(x, "source", None) or "unstated" for x in cases)
    return {k: c[k] for k in ("synthetic", "real", "unstated") if c[k]}


def mixed(counts: dict[str, int]) -> bool:
    """Synthetic cases together with real (or unstated) ones."""
    return bool(counts.get("synthetic")) and bool(counts.get("real") or counts.get("unstated"))


def run_figures(cases: Sequence[Any]) -> dict[str, Any] | None:
    """A run's synthetic cases against their profile (the figures :func:`diversity` gives, from the records
    alone); per profile when they come from several. None: the run has no synthetic case."""
    from mdd.cases.plan import ProfileError, load_profile

    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        if getattr(c, "source", None) == "synthetic":
            groups.setdefault(c.profile or "?", []).append({**c.to_record(), "年龄": c.age})  # exact age: bands
    if not groups:
        return None
    out: dict[str, Any] = {}
    for name, records in groups.items():
        try:
            out[name] = diversity(records, None, load_profile(name))
        except ProfileError as exc:
            out[name] = {"cases": len(records), "error": str(exc)}
    return out
