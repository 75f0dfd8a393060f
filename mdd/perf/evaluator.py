"""How well the evaluator tells real exchanges from negative controls, per embedder.

``measure(dialogues, embedder)`` scores a table of dialogues and, for every control recipe, a copy
whose answers are *all* replaced, each set on its own as the stage would score a folder holding only
it: the IDF learnt from that set, whole-dialogue batches, ``ExchangeScorer.score``. Per recipe: the
controls' high-quality share, the AUC of ``patient_ability`` (and ``relevance``) real vs control, and
the first failed gates. Two groups of recipes:

- ``TUNED``: the self-check's own recipes (``mdd/evaluate/validity.py``), seen while choosing the
  gates and thresholds;
- ``HELD_OUT``: recipes written for this benchmark and never used to choose anything: the answer of
  the *next* question of the same dialogue, the answer given to the most similar question of another
  case, fillers and leaks phrased unlike the self-check's lists, the question echoed back.

``python -m jobs.bench_evaluator`` runs it on the shared MDD-5k slice and writes the JSON.
"""
from __future__ import annotations

import random
import time
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from mdd.evaluate.validity import RECIPES as TUNED
from mdd.evaluate.validity import _patient_slots, auc, make_controls, score_dialogues

HELD_OUT = ("next_answer", "similar_question_other_case", "other_fillers", "paraphrased_leak", "question_echo")
OTHER_FILLERS = ("这个嘛……我也说不上来。", "啊？", "就那样吧，没什么特别的。", "我想想……算了，不知道怎么说。", "哦。",
                 "随便吧。", "嗯，是这样的。", "我不太记得了。", "嗯，对。", "好的。")
LEAK_PHRASES = ("我上网查了，觉得自己就是{diagnosis}。", "医院开的单子上写着{icd}。", "我知道我这是{diagnosis}。")


def _bigrams(text: str) -> set[str]:
    return {text[i:i + 2] for i in range(len(text) - 1)}


def held_out_controls(dialogues: list[dict], recipe: str, seed: int = 1) -> list[dict]:
    rng = random.Random(f"{seed}:{recipe}")
    if recipe == "similar_question_other_case":
        pool = []
        for d in dialogues:
            turns = d.get("turns") or []
            pool += [(d.get("case_id"), _bigrams(turns[i - 1]["text"]), turns[i]["text"])
                     for i in _patient_slots(turns)]
    out = []
    for d in dialogues:
        turns = [dict(t) for t in (d.get("turns") or [])]
        slots = _patient_slots(turns)
        texts = [turns[i]["text"] for i in slots]
        if recipe == "next_answer":
            if len(slots) < 2:
                continue
            new = texts[1:] + texts[:1]
        elif recipe == "similar_question_other_case":
            new = []
            for i in slots:
                q = _bigrams(turns[i - 1]["text"])
                best = max((p for p in pool if p[0] != d.get("case_id")),
                           key=lambda p: len(q & p[1]) / (len(q | p[1]) or 1), default=None)
                new.append(best[2] if best else turns[i]["text"])
        elif recipe == "other_fillers":
            new = [rng.choice(OTHER_FILLERS) for _ in slots]
        elif recipe == "paraphrased_leak":
            diag = (d.get("diagnosis") or "").split(",")[0]
            icd = (d.get("icd_code") or "").split(",")[0]
            new = [t + rng.choice(LEAK_PHRASES).format(diagnosis=diag or icd, icd=icd or diag) for t in texts]
        elif recipe == "question_echo":
            new = [turns[i - 1]["text"] for i in slots]
        else:
            raise ValueError(f"unknown held-out recipe {recipe!r}")
        for i, text in zip(slots, new):
            turns[i]["text"] = text
        out.append({**d, "turns": turns, "dialogue_id": f"{d['dialogue_id']}~{recipe}"})
    return out


class _Memo:
    """An embedder that encodes each distinct text once (the recipes reuse the real texts)."""

    def __init__(self, inner: Any):
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.cache: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            for t, v in zip(new, self.inner.encode(new)):
                self.cache[t] = v
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def _scorer_for(rows: list[dict], embedder: Any, spaces: str, records: dict | None) -> Any:
    from mdd.evaluate.relevance import LexicalSpace
    from mdd.evaluate.scoring import ExchangeScorer

    texts = [t.get("text") or "" for d in rows for t in (d.get("turns") or []) if t]
    return ExchangeScorer(embedder, idf=LexicalSpace.document_frequencies(texts), records=records,
                          relevance_spaces=spaces)


def measure(dialogues: pa.Table, embedder: Any, spaces: str = "lexical", per_batch: int = 12,
            records: dict | None = None, recipes: Sequence[str] = TUNED + HELD_OUT) -> dict:
    rows = dialogues.to_pylist()
    t0 = time.perf_counter()
    real = score_dialogues(_scorer_for(rows, embedder, spaces, records), rows, per_batch)
    assert real is not None, "no exchanges to score"
    real_s = time.perf_counter() - t0
    r_pa = real.column("patient_ability").to_numpy()
    r_rel = real.column("relevance").to_numpy()
    hq = real.column("high_quality").to_numpy(zero_copy_only=False)
    reasons = real.column("hq_reason").to_pylist()
    result: dict[str, Any] = {
        "dialogues": len(rows), "exchanges": real.num_rows, "relevance_spaces": spaces,
        "real": {"hq_share": float(hq.mean()), "hq_reasons": {k: reasons.count(k) for k in sorted(set(reasons))},
                 "score_s": round(real_s, 3)},
        "recipes": {},
    }
    for recipe in recipes:
        ctrl_rows = make_controls(rows, recipe) if recipe in TUNED else held_out_controls(rows, recipe)
        ctrl = score_dialogues(_scorer_for(ctrl_rows, embedder, spaces, records), ctrl_rows, per_batch)
        assert ctrl is not None, f"{recipe}: no control exchanges to score"
        c_hq = ctrl.column("high_quality").to_numpy(zero_copy_only=False)
        c_reasons = ctrl.column("hq_reason").to_pylist()
        result["recipes"][recipe] = {
            "tuned_on": recipe in TUNED,
            "exchanges": ctrl.num_rows,
            "hq_share": float(c_hq.mean()),
            "auc_patient_ability": auc(r_pa, ctrl.column("patient_ability").to_numpy()),
            "auc_relevance": auc(r_rel, ctrl.column("relevance").to_numpy()),
            "hq_reasons": {k: c_reasons.count(k) for k in sorted(set(c_reasons))},
        }
    return result


def format_result(name: str, r: dict) -> str:
    lines = [f"{name}: {r['dialogues']} dialogues, {r['exchanges']} exchanges, relevance vectors "
             f"{r['relevance_spaces']}; real exchanges high quality {100 * r['real']['hq_share']:.1f}%",
             f"  {'control':<30}{'group':<10}{'HQ share':>9}{'AUC patient_ability':>21}{'AUC relevance':>15}"]
    for k, v in r["recipes"].items():
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        lines.append(f"  {k:<30}{'tuned' if v['tuned_on'] else 'held-out':<10}{100 * v['hq_share']:>8.1f}%"
                     f"{fmt(v['auc_patient_ability']):>21}{fmt(v['auc_relevance']):>15}")
    return "\n".join(lines)


def relevance_options(dialogues: pa.Table, embedders: dict[str, Any], per_batch: int = 12,
                      recipes: Sequence[str] = ("moved_within_dialogue", "moved_across_dialogues")) -> dict:
    """AUC, real vs control, of each relevance signal the issue asked to compare: raw cosine in each
    embedder's vectors, the seed's in-batch rank, IDF n-gram cosine, the calibrated z and fit, the
    stage's α, and a question-type agreement check. Every set is scored on its own, IDF from itself."""
    from mdd.evaluate.gates import answered_in_kind, gate_spec, question_kind
    from mdd.evaluate.quality import relevance_score
    from mdd.evaluate.relevance import LexicalSpace, signals
    from mdd.evaluate.scoring import explode

    spec = gate_spec()

    def features(rows: list[dict]) -> dict[str, np.ndarray]:
        texts = [t.get("text") or "" for d in rows for t in (d.get("turns") or []) if t]
        space = LexicalSpace(*LexicalSpace.document_frequencies(texts))
        feats: dict[str, list] = {}
        for s in range(0, len(rows), per_batch):
            table, _ = explode(pa.Table.from_pylist(rows[s:s + per_batch]))
            q, a = table.column("question").to_pylist(), table.column("answer").to_pylist()
            ids = table.column("dialogue_id").to_pylist()
            vec = space.encode(q + a)
            lex = signals(vec[: len(q)], vec[len(q):], ids)
            kind = np.array([answered_in_kind(x, y, spec) for x, y in zip(q, a)])
            parts = {"IDF n-gram cosine": lex.cos, "IDF n-gram z (calibrated)": lex.z,
                     "IDF n-gram fit within the dialogue": lex.fit,
                     "relevance_rank, IDF n-grams": lex.rank,
                     "stage's relevance (α)": relevance_score(lex.z, lex.fit, kind, a),
                     # the type check as a score: 1 when a yes/no or duration question gets an answer of that
                     # kind anywhere in its first clause or text, 0 when not, 0.5 for open questions
                     "question-type agreement": np.array([_type_agrees(x, y, spec, question_kind)
                                                          for x, y in zip(q, a)])}
            for name, emb in embedders.items():
                e = emb.encode(q + a)
                sig = signals(e[: len(q)], e[len(q):], ids)
                parts[f"{name} cosine"] = sig.cos
                parts[f"{name} relevance_rank"] = sig.rank
                parts[f"{name} z (calibrated)"] = sig.z
                parts[f"{name} + IDF n-gram mean z"] = (sig.z + lex.z) / 2
            for k, v in parts.items():
                feats.setdefault(k, []).append(np.asarray(v, dtype=np.float64))
        return {k: np.concatenate(v) for k, v in feats.items()}

    rows = dialogues.to_pylist()
    real = features(rows)
    out: dict[str, dict] = {name: {} for name in real}
    for recipe in recipes:
        ctrl = features(make_controls(rows, recipe))
        for name in real:
            out[name][recipe] = auc(real[name], ctrl[name])
    return out


def _type_agrees(question: str, answer: str, spec: Any, question_kind: Any) -> float:
    kind = question_kind(question, spec)
    if kind == "open":
        return 0.5
    head = answer[:12]
    if kind == "polar":
        return float(spec.denial_start.search(head) is not None or head.startswith(("有", "是", "对", "会", "嗯")))
    return float(spec.time_answer.search(answer) is not None)


def format_options(name: str, opts: dict) -> str:
    recipes = list(next(iter(opts.values())))
    lines = [f"{name}: AUC real vs control per relevance signal",
             f"  {'signal':<40}" + "".join(f"{r:>26}" for r in recipes)]
    for sig, by in opts.items():
        lines.append(f"  {sig:<40}" + "".join(f"{by[r]:>26.3f}" for r in recipes))
    return "\n".join(lines)


def scoring_cost(dialogues: pa.Table, repeats: int = 3, per_batch: int = 12) -> dict:
    """Seconds per dialogue of the scoring work, the seed's scorer (embed every question and answer,
    its metrics, overall ≥ threshold) against the stage's (``ExchangeScorer``: relevance vectors,
    metrics, faithfulness, gates), alternated in one process so that the machine's load hits both;
    min/median/max over ``repeats``."""
    from mdd.evaluate.quality import QualityScorer
    from mdd.evaluate.scoring import ExchangeScorer, explode
    from mdd.index.embedders import make_embedder

    rows = dialogues.to_pylist()
    batches = [pa.Table.from_pylist(rows[s:s + per_batch]) for s in range(0, len(rows), per_batch)]
    texts = [t.get("text") or "" for d in rows for t in (d.get("turns") or []) if t]
    from mdd.evaluate.relevance import LexicalSpace

    new = ExchangeScorer(make_embedder("hashing"), idf=LexicalSpace.document_frequencies(texts))
    seed = QualityScorer(make_embedder("hashing"))

    def run_seed() -> None:
        for b in batches:
            t, _ = explode(b)
            seed.score(t.column("question").to_pylist(), t.column("answer").to_pylist(),
                       t.column("diagnosis").to_pylist(), t.column("icd_code").to_pylist())

    def run_new() -> None:
        for b in batches:
            new.score(b)

    times: dict[str, list[float]] = {"seed": [], "stage": []}
    for _ in range(repeats):
        for name, fn in (("seed", run_seed), ("stage", run_new)):
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / len(rows))
    stats: dict[str, Any] = {k: {"min": min(v), "median": float(np.median(v)), "max": max(v)}
                             for k, v in times.items()}
    stats["ratio_stage_over_seed_median"] = stats["stage"]["median"] / stats["seed"]["median"]
    stats["dialogues"] = len(rows)
    return stats
