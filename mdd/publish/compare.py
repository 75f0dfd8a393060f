"""Fidelity of a run's dialogues against a reference corpus (``mdd compare``).

    mdd compare --out DIR --reference SRC [--embedder hashing:512] [--max-turns 20000]

``DIR`` is a run (its ``synth/``); ``SRC`` is the MDD-5k release (``MDD_5k/`` + ``Label/``), the
shared slice's layout (``dialogues/`` + ``labels/``), a folder of ``patient_N.json`` files, or
another run's folder. For each set it measures, and between the two it gives a distance for each:

- turn lengths per speaker (characters; the doctor's questions, i.e. doctor turns that an answer
  follows, and every patient and companion turn): mean, median, coefficient of variation, share
  under 20 and over 150 characters; distance: Wasserstein-1 between the length distributions;
- exchanges per dialogue (a doctor turn answered by the patient or the companion); Wasserstein-1;
- speaker shares of turns and of characters; Jensen-Shannon divergence (base 2: 0 same, 1 disjoint);
- topic coverage by the trees' keywords: per topic of the symptom trees and modules, the share of
  dialogues in which a doctor question names one of its distinctive keywords (a keyword that at
  most two topics list: "多久" or "开始" tell no topic apart); Jensen-Shannon divergence of the two
  coverage profiles, and the topics that differ most;
- distinct-1/2/3 (character n-grams) per speaker and dialogue; Wasserstein-1 per n;
- the Fréchet distance between the two sets' turn embeddings (the metric behind FBD: a Gaussian
  fit of each set, ``|mu1 - mu2|^2 + Tr(S1 + S2 - 2 (S1 S2)^1/2)``), over all turns and per
  speaker, on a seeded sample of at most ``max_turns`` turns per set.

The console gets a table; ``DIR/compare.json`` gets everything and ``run.json["compare"]`` the
distances.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, cast

import numpy as np

from mdd.record import count_exchanges, rounds

SPEAKERS = ("doctor", "patient", "companion")
SHORT, LONG = 20, 150
NGRAMS = (1, 2, 3)
DEFAULT_EMBEDDER = "hashing:512"
DEFAULT_MAX_TURNS = 20_000
DISTINCTIVE = 2  # a keyword listed by at most this many topics identifies them
_PUNCT = re.compile(r"[\s，。！？、；：,.!?;:…“”‘’\"'（）()《》【】\-—~～]+")


# --- per-set measures ---------------------------------------------------------------------


def speaker_turns(dialogue: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(speaker, text) of the turns that count: the doctor's questions (a doctor turn that opens an
    exchange: not the closing diagnosis), every patient and companion turn."""
    out = []
    for r in rounds(dialogue.get("turns")):
        if r.answered:  # the turns of a table row are mappings
            out.append(("doctor", str(cast(Mapping[str, Any], r.doctor).get("text") or "")))
        replies = cast(tuple[tuple[int, Mapping[str, Any]], ...], r.replies)
        out += [(str(t["speaker"]), str(t.get("text") or "")) for _, t in replies]
    return out


def exchanges(dialogue: Mapping[str, Any]) -> int:
    return count_exchanges(dialogue.get("turns"))


def describe(values: Sequence[float]) -> dict[str, Any]:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"n": 0}
    mean = float(v.mean())
    return {"n": int(v.size), "mean": round(mean, 3), "median": float(np.median(v)),
            "cv": round(float(v.std() / mean), 4) if mean else None,
            "share_under_20": round(float((v < SHORT).mean()), 4), "share_over_150": round(float((v > LONG).mean()), 4),
            "min": float(v.min()), "max": float(v.max())}


def distinct_n(text: str, n: int) -> float | None:
    """Distinct n-grams over all n-grams of the text's characters (punctuation and spaces out)."""
    chars = _PUNCT.sub("", text)
    total = len(chars) - n + 1
    return len({chars[i:i + n] for i in range(total)}) / total if total > 0 else None


@lru_cache(maxsize=1)
def topic_keywords() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every topic of the symptom trees and modules with distinctive keywords: id -> (label, its
    keywords that at most ``DISTINCTIVE`` topics list); a topic id that several trees hold has
    their keywords merged."""
    from mdd import knowledge
    from mdd.tree import all_topics, parse_node

    roots = [parse_node(knowledge.load_yaml(f"trees/{p.name}")["root"], p.stem)
             for p in sorted((knowledge.HERE / "trees").glob("*.yaml"))]
    roots += [parse_node(n, m["id"]) for m in knowledge.module_data() for n in m.get("nodes") or ()]
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for root in roots:
        for t in all_topics(root):
            if t.kind == "graft" or not t.keywords:
                continue
            label, words = out.get(t.id, (t.topic, ()))
            out[t.id] = (label, tuple(dict.fromkeys(words + t.keywords)))
    listed = Counter(w for _, words in out.values() for w in words)
    kept = {tid: (label, tuple(w for w in words if listed[w] <= DISTINCTIVE)) for tid, (label, words) in out.items()}
    return {tid: v for tid, v in sorted(kept.items()) if v[1]}


def measure(dialogues: Sequence[Mapping[str, Any]], topics: Mapping[str, tuple[str, tuple[str, ...]]]
            ) -> dict[str, Any]:
    """Everything the comparison needs of one set (the raw distributions under ``dist``)."""
    lengths: dict[str, list[int]] = {}
    chars: Counter = Counter()
    counts: Counter = Counter()
    distinct: dict[str, dict[int, list[float]]] = {}
    covered: Counter = Counter()
    topics_of: dict[str, list[str]] = {}
    for tid, (_, words) in topics.items():
        for w in words:
            topics_of.setdefault(w, []).append(tid)
    finder = re.compile("|".join(sorted(map(re.escape, topics_of), key=len, reverse=True))) if topics_of else None
    for d in dialogues:
        turns = speaker_turns(d)
        by_speaker: dict[str, list[str]] = {}
        for spk, text in turns:
            lengths.setdefault(spk, []).append(len(text))
            chars[spk] += len(text)
            counts[spk] += 1
            by_speaker.setdefault(spk, []).append(text)
        for spk, texts in by_speaker.items():
            joined = "".join(texts)
            for n in NGRAMS:
                if (v := distinct_n(joined, n)) is not None:
                    distinct.setdefault(spk, {}).setdefault(n, []).append(v)
        asked: set[str] = set()
        if finder is not None:
            for q in by_speaker.get("doctor", []):
                asked.update(tid for w in finder.findall(q) for tid in topics_of[w])
        covered.update(asked)
    ex = [exchanges(d) for d in dialogues]
    n = len(dialogues)
    speakers = [s for s in SPEAKERS if s in counts] + sorted(s for s in counts if s not in SPEAKERS)
    total_turns, total_chars = sum(counts.values()), sum(chars.values())
    return {
        "dialogues": n,
        "exchanges": describe(ex),
        "turn_chars": {s: describe(lengths[s]) for s in speakers},
        "speaker_share": {"turns": {s: round(counts[s] / total_turns, 4) for s in speakers} if total_turns else {},
                          "chars": {s: round(chars[s] / total_chars, 4) for s in speakers} if total_chars else {}},
        "distinct": {s: {f"distinct-{k}": round(float(np.mean(v)), 4) for k, v in distinct[s].items()}
                     for s in speakers if s in distinct},
        "topic_coverage": {t: round(covered[t] / n, 4) for t in topics} if n else {},
        "dist": {"exchanges": ex, "lengths": lengths, "distinct": distinct},
    }


# --- distances ------------------------------------------------------------------------------


def wasserstein(a: Sequence[float], b: Sequence[float]) -> float | None:
    from scipy.stats import wasserstein_distance

    return round(float(wasserstein_distance(a, b)), 4) if len(a) and len(b) else None


def jensen_shannon(p: Mapping[str, float], q: Mapping[str, float]) -> float | None:
    """JS divergence (base 2) of two distributions over the same keys (each renormalised)."""
    keys = sorted(set(p) | set(q))
    a = np.array([max(float(p.get(k, 0.0)), 0.0) for k in keys])
    b = np.array([max(float(q.get(k, 0.0)), 0.0) for k in keys])
    if a.sum() == 0 or b.sum() == 0:
        return None
    a, b = a / a.sum(), b / b.sum()
    m = (a + b) / 2

    def kl(x: np.ndarray, y: np.ndarray) -> float:
        mask = x > 0
        return float(np.sum(x[mask] * np.log2(x[mask] / y[mask])))

    return round(max(0.0, (kl(a, m) + kl(b, m)) / 2), 6)


def frechet(x: np.ndarray, y: np.ndarray) -> float | None:
    """Fréchet distance between Gaussian fits of two embedding samples (rows are samples).

    ``Tr((S1 S2)^1/2)`` is computed as the trace of ``(A S2 A)^1/2`` with ``A = S1^1/2`` (both
    symmetric, so two eigendecompositions instead of a general matrix square root)."""
    if len(x) < 2 or len(y) < 2:
        return None
    mu1, mu2 = x.mean(axis=0), y.mean(axis=0)
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    w, v = np.linalg.eigh(s1)
    a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    tr_covmean = float(np.sqrt(np.clip(np.linalg.eigvalsh(a @ s2 @ a), 0, None)).sum())
    d = float(np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * tr_covmean)
    return round(max(0.0, d), 6)


def sample_turns(dialogues: Sequence[Mapping[str, Any]], max_turns: int, seed: int) -> list[tuple[str, str]]:
    turns = [t for d in dialogues for t in speaker_turns(d)]
    if len(turns) > max_turns:
        turns = random.Random(seed).sample(turns, max_turns)
    return turns


def embed(turns: Sequence[tuple[str, str]], embedder: Any) -> dict[str, np.ndarray]:
    """Embeddings of the sampled turns: all of them and per speaker."""
    x = embedder.encode([t for _, t in turns]).astype(np.float64)
    out = {"all": x}
    for s in sorted({s for s, _ in turns}):
        out[s] = x[[i for i, (spk, _) in enumerate(turns) if spk == s]]
    return out


def compare(run: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], *,
            embedder: str = DEFAULT_EMBEDDER, max_turns: int = DEFAULT_MAX_TURNS, seed: int = 0) -> dict[str, Any]:
    """The measures of both sets and a distance for each."""
    from mdd.index.embedders import make_embedder

    if not run or not reference:
        raise ValueError("compare: both sets need at least one dialogue "
                         f"(run {len(run)}, reference {len(reference)})")
    topics = topic_keywords()
    a, b = measure(run, topics), measure(reference, topics)
    speakers = [s for s in SPEAKERS if s in a["turn_chars"] or s in b["turn_chars"]]
    dist: dict[str, Any] = {
        "exchanges_wasserstein": wasserstein(a["dist"]["exchanges"], b["dist"]["exchanges"]),
        "turn_chars_wasserstein": {s: wasserstein(a["dist"]["lengths"].get(s, []), b["dist"]["lengths"].get(s, []))
                                   for s in speakers},
        "speaker_share_js": {k: jensen_shannon(a["speaker_share"][k], b["speaker_share"][k])
                             for k in ("turns", "chars")},
        "topic_coverage_js": jensen_shannon(a["topic_coverage"], b["topic_coverage"]),
        "topic_coverage_mean_abs_diff": round(float(np.mean([abs(a["topic_coverage"][t] - b["topic_coverage"][t])
                                                             for t in topics])), 4),
        "distinct_wasserstein": {s: {f"distinct-{n}": wasserstein(a["dist"]["distinct"].get(s, {}).get(n, []),
                                                                  b["dist"]["distinct"].get(s, {}).get(n, []))
                                     for n in NGRAMS} for s in speakers},
    }
    emb = make_embedder(embedder)
    ea, eb = embed(sample_turns(run, max_turns, seed), emb), embed(sample_turns(reference, max_turns, seed), emb)
    dist["frechet"] = {k: frechet(ea[k], eb[k]) for k in ["all", *speakers] if k in ea and k in eb}
    diffs = sorted(topics, key=lambda t: -abs(a["topic_coverage"][t] - b["topic_coverage"][t]))[:10]
    for m in (a, b):
        m.pop("dist")
    return {
        "run": a, "reference": b, "distances": dist,
        "topics_most_different": [{"topic": t, "label": topics[t][0], "run": a["topic_coverage"][t],
                                   "reference": b["topic_coverage"][t]} for t in diffs],
        "settings": {"embedder": emb.name, "max_turns": max_turns, "seed": seed, "topics": len(topics),
                     "distinctive": DISTINCTIVE, "short_chars": SHORT, "long_chars": LONG},
    }


# --- console ----------------------------------------------------------------------------------


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def format_table(report: Mapping[str, Any]) -> str:
    a, b, d = report["run"], report["reference"], report["distances"]
    rows: list[tuple[str, Any, Any, str]] = [
        ("dialogues", a["dialogues"], b["dialogues"], ""),
        ("exchanges per dialogue", a["exchanges"].get("mean"), b["exchanges"].get("mean"),
         f"W1 {_fmt(d['exchanges_wasserstein'])}"),
    ]
    for s, w in d["turn_chars_wasserstein"].items():
        ta, tb = a["turn_chars"].get(s, {}), b["turn_chars"].get(s, {})
        rows += [
            (f"{s}: chars per turn", ta.get("mean"), tb.get("mean"), f"W1 {_fmt(w)} chars"),
            (f"{s}: coefficient of variation", ta.get("cv"), tb.get("cv"), ""),
            (f"{s}: share under {SHORT} chars", ta.get("share_under_20"), tb.get("share_under_20"), ""),
        ]
    for k in ("turns", "chars"):
        sa = " / ".join(f"{s} {v:.2f}" for s, v in a["speaker_share"][k].items())
        sb = " / ".join(f"{s} {v:.2f}" for s, v in b["speaker_share"][k].items())
        rows.append((f"speaker share of {k}", sa, sb, f"JS {_fmt(d['speaker_share_js'][k], 4)}"))
    cov_a, cov_b = a["topic_coverage"], b["topic_coverage"]
    rows.append((f"topic coverage ({len(cov_a)} topics, mean)", float(np.mean(list(cov_a.values()))),
                 float(np.mean(list(cov_b.values()))), f"JS {_fmt(d['topic_coverage_js'], 4)}"))
    for s, by_n in d["distinct_wasserstein"].items():
        for key, w in by_n.items():
            rows.append((f"{s}: {key}", a["distinct"].get(s, {}).get(key), b["distinct"].get(s, {}).get(key),
                         f"W1 {_fmt(w, 4)}"))
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{'figure':<{width}}{'run':>28}{'reference':>28}   distance", "-" * (width + 70)]
    for name, va, vb, dd in rows:
        lines.append(f"{name:<{width}}{_fmt(va):>28}{_fmt(vb):>28}   {dd}")
    fd = ", ".join(f"{k} {_fmt(v, 4)}" for k, v in d["frechet"].items())
    lines += ["", f"Fréchet distance of turn embeddings ({report['settings']['embedder']}): {fd}"]
    top = ", ".join(f"{t['label']} {t['run']:.2f}/{t['reference']:.2f}" for t in report["topics_most_different"][:6])
    lines.append(f"topics covered most differently (run/reference): {top}")
    return "\n".join(lines)


# --- a run against a reference ------------------------------------------------------------------

MDD5K_LAYOUTS = (("MDD_5k", "Label", "MDD-5k release"), ("dialogues", "labels", "MDD-5k (dialogues/ + labels/)"),
                 (".", ".", "MDD-5k files"))


def load_dialogues(src: str) -> tuple[list[dict[str, Any]], str]:
    """The dialogues of ``src`` (``{dialogue_id, turns, icd_code}``) and the layout found: a run's
    folder (``synth/``), or the MDD-5k layout (read in place, see :mod:`mdd.mdd5k`)."""
    from pathlib import Path

    from mdd.mdd5k import read_mdd5k
    from mdd.storage import SYNTH, open_store

    store = open_store(src)
    if store.parquet_files(SYNTH):
        rows = store.read_table(SYNTH, columns=["dialogue_id", "turns", "icd_code"]).to_pylist()
        return rows, f"run ({SYNTH}/)"
    root = Path(src)
    for dlg, lab, name in MDD5K_LAYOUTS:
        folder = root / dlg
        if folder.is_dir() and any(folder.glob("patient_*.json")):
            rows, _, _ = read_mdd5k(folder, root / lab if (root / lab).is_dir() else None)
            return [{k: r[k] for k in ("dialogue_id", "turns", "icd_code")} for r in rows], name
    raise FileNotFoundError(
        f"{src}: neither a run (synth/*.parquet) nor the MDD-5k layout (MDD_5k/ + Label/, dialogues/ + labels/, "
        "or patient_N.json files)")


def run_compare(out: str, reference: str, *, embedder: str = DEFAULT_EMBEDDER, max_turns: int = DEFAULT_MAX_TURNS,
                seed: int = 0) -> dict[str, Any]:
    """Compare the run in ``out`` with ``reference``; writes ``out/compare.json`` and
    ``run.json["compare"]``; returns the report."""
    from mdd.storage import open_store

    store = open_store(out)
    run, run_layout = load_dialogues(out)
    if not run_layout.startswith("run"):
        raise FileNotFoundError(f"{out}: --out must be a run's folder (synth/*.parquet), found the {run_layout} layout")
    ref, ref_layout = load_dialogues(reference)
    report = compare(run, ref, embedder=embedder, max_turns=max_turns, seed=seed)
    report["settings"].update({"out": store.display(), "reference": str(reference), "reference_layout": ref_layout})
    store.write_json("compare.json", report)
    store.update_run_json("compare", {"reference": str(reference), "reference_layout": ref_layout,
                                      "dialogues": {"run": len(run), "reference": len(ref)},
                                      "distances": report["distances"], "settings": report["settings"]})
    return report
