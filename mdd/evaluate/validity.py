"""The validity self-check of every evaluation run: can this evaluator, on this data, tell real
exchanges from negative controls?

A bounded, deterministic sample of the run's own dialogues (``evaluate.validity.sample_dialogues``)
is copied into control dialogues whose patient answers are replaced, one recipe at a time:

=============================  ===============================================================
``moved_within_dialogue``      every answer moved to another question of the same dialogue
``moved_across_dialogues``     every answer taken from a dialogue of another case
``filler``                     every answer a filler (``validity.fillers`` in lexicons.yaml)
``diagnosis_leak``             the real answer with a sentence leaking the case's own diagnosis
                               or ICD code inserted (``validity.leak_templates``)
``echo``                       the question said back, then the start of the real answer (a
                               trained model's echo)
``loop``                       the real answer's first clause (of 4+ characters) said five times over
``role_swap``                  the patient speaks as the doctor or as an assistant and asks
                               another question of the dialogue (``validity.role_swap_templates``)
=============================  ===============================================================

The real sample and each control set are scored by the same pipeline
(``ExchangeScorer.score``, in batches of whole dialogues like the stage). Per recipe and metric:
the AUC of real against control (the probability that a real exchange scores above a control
one, ties counted half) and both means; for ``high_quality`` the means are the HQ shares.
A recipe is *separated* when ``patient_ability``'s AUC reaches ``min_auc`` and the controls' HQ
share stays at or under ``max_control_hq_share``; a run where any recipe is not separated says so
loudly (a warning, ``evaluate.validity.separated = false`` in run.json, the console summary).
"""
from __future__ import annotations

import hashlib
import logging
import random
import re
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from mdd.record import exchanges
from mdd.schema import METRICS, VALIDITY

log = logging.getLogger(__name__)

RECIPES = ("moved_within_dialogue", "moved_across_dialogues", "filler", "diagnosis_leak", "echo", "loop", "role_swap")


def auc(real: Sequence[float] | np.ndarray, control: Sequence[float] | np.ndarray) -> float | None:
    """P(real > control) + ½ P(real = control) (Mann–Whitney); NaNs dropped; None when a side is empty."""
    r = np.asarray(real, dtype=np.float64)
    c = np.asarray(control, dtype=np.float64)
    r, c = r[~np.isnan(r)], c[~np.isnan(c)]
    if len(r) == 0 or len(c) == 0:
        return None
    values = np.concatenate([r, c])
    uniq, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    avg_rank = first + (counts + 1) / 2.0  # 1-based average rank of each distinct value
    ranks = avg_rank[inv]
    u = ranks[: len(r)].sum() - len(r) * (len(r) + 1) / 2.0
    return float(u / (len(r) * len(c)))


@lru_cache(maxsize=4)
def _validity_lexicon(path: str | None) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    from mdd.evaluate.quality import load_lexicon

    v = load_lexicon(path).get("validity") or {}
    fillers, templates = tuple(v.get("fillers") or ()), tuple(v.get("leak_templates") or ())
    swaps = tuple(v.get("role_swap_templates") or ())
    if not fillers or not templates or not swaps:
        raise ValueError(f"{path or 'lexicons.yaml'}: validity needs fillers, leak_templates and role_swap_templates")
    return fillers, templates, swaps


def sample_ids(dialogue_ids: Sequence[str], n: int) -> list[str]:
    """``n`` dialogue ids chosen by a stable hash: the same run gives the same sample."""
    key = lambda d: hashlib.sha1(d.encode("utf-8")).hexdigest()  # noqa: E731
    return sorted(sorted(set(dialogue_ids), key=key)[:n])


def _patient_slots(turns: list[dict]) -> list[int]:
    """Indices of the turns that answer a doctor turn (the scored exchanges)."""
    return [e.answer_position for e in exchanges(turns)]


def make_controls(dialogues: list[dict], recipe: str, seed: int = 0, lexicon: str | None = None) -> list[dict]:
    """Copies of ``dialogues`` (rows of the dialogue table) with every scored answer replaced."""
    rng = random.Random(f"{seed}:{recipe}")
    fillers, templates, swaps = _validity_lexicon(lexicon)
    pool = [(d.get("case_id"), d["turns"][i]["text"]) for d in dialogues for i in _patient_slots(d.get("turns") or [])]
    several_cases = len({c for c, _ in pool}) > 1
    out = []
    for d in dialogues:
        turns = [dict(t) for t in (d.get("turns") or [])]
        slots = _patient_slots(turns)
        texts = [turns[i]["text"] for i in slots]
        if recipe == "moved_within_dialogue":
            if len(slots) < 2:
                continue
            k = rng.randrange(1, len(slots))
            new = texts[k:] + texts[:k]
        elif recipe == "moved_across_dialogues":
            others = [t for c, t in pool if (c != d.get("case_id") if several_cases else t not in texts)]
            if not others:
                continue
            new = [rng.choice(others) for _ in slots]
        elif recipe == "filler":
            new = [rng.choice(fillers) for _ in slots]
        elif recipe == "diagnosis_leak":
            diag = (d.get("diagnosis") or "").split(",")[0].strip()
            icd = (d.get("icd_code") or "").split(",")[0].strip()
            if not diag and not icd:
                continue
            new = []
            for t in texts:
                leak = rng.choice(templates).format(diagnosis=diag or icd, icd=icd or diag)
                new.append(leak + t if rng.random() < 0.5 else t + leak)
        elif recipe == "echo":
            new = [turns[i - 1]["text"] + t[:20] for i, t in zip(slots, texts)]
        elif recipe == "loop":
            new = [(next((c for c in re.split(r"[，。,！？!?]", t) if len(c) >= 4), t[:8])[:30] + "，") * 5
                   for t in texts]
        elif recipe == "role_swap":
            questions = [turns[i - 1]["text"] for i in slots]
            if len(questions) < 2:
                continue
            k = rng.randrange(1, len(questions))
            new = [rng.choice(swaps).format(question=q) for q in questions[k:] + questions[:k]]
        else:
            raise ValueError(f"validity: unknown control recipe {recipe!r}")
        for i, text in zip(slots, new):
            turns[i]["text"] = text
        out.append({**d, "turns": turns, "dialogue_id": f"{d['dialogue_id']}~{recipe}"})
    return out


def score_dialogues(scorer: Any, dialogues: list[dict], per_batch: int, schema: pa.Schema | None = None
                    ) -> pa.Table | None:
    """Score dialogue rows in batches of ``per_batch`` whole dialogues (as the stage does)."""
    from mdd.schema import DIALOGUE

    if not dialogues:
        return None
    if schema is None:
        schema = pa.schema([f for f in DIALOGUE if f.name in dialogues[0]])
    parts = []
    for s in range(0, len(dialogues), per_batch):
        batch = pa.Table.from_pylist(dialogues[s:s + per_batch], schema=schema)
        parts.append(scorer.score(batch))
    parts = [p for p in parts if p.num_rows]
    return pa.concat_tables(parts) if parts else None


def self_check(scorer: Any, dialogues: pa.Table, per_batch: int, min_auc: float, max_control_hq_share: float,
               seed: int = 0, lexicon: str | None = None) -> tuple[dict, pa.Table]:
    """Score the sample ``dialogues`` and its controls; (summary for run.json, VALIDITY rows)."""
    rows_in = dialogues.to_pylist()
    real = score_dialogues(scorer, rows_in, per_batch, dialogues.schema)
    rows: list[dict] = []
    summary: dict[str, Any] = {"sample_dialogues": len(rows_in), "sample_exchanges": real.num_rows if real else 0,
                               "min_auc": min_auc, "max_control_hq_share": max_control_hq_share, "recipes": {}}
    if real is None:
        summary["separated"] = None
        summary["note"] = "no exchanges to check"
        return summary, VALIDITY.empty_table()
    real_hq = real.column("high_quality").to_numpy(zero_copy_only=False).astype(float)
    summary["real_hq_share"] = float(real_hq.mean())
    all_ok = True
    for recipe in RECIPES:
        ctrl_rows = make_controls(rows_in, recipe, seed=seed, lexicon=lexicon)
        ctrl = score_dialogues(scorer, ctrl_rows, per_batch, dialogues.schema)
        if ctrl is None:
            summary["recipes"][recipe] = {"exchanges": 0, "note": "no control could be made from this sample"}
            continue
        per_metric = {}
        for m in (*METRICS, "high_quality"):
            r = real.column(m).to_numpy(zero_copy_only=False).astype(float)
            c = ctrl.column(m).to_numpy(zero_copy_only=False).astype(float)
            a = auc(r, c)
            per_metric[m] = a
            rows.append({"control": recipe, "metric": m, "n_real": len(r), "n_control": len(c), "auc": a,
                         "real_mean": float(np.nanmean(r)) if np.isfinite(r).any() else None,
                         "control_mean": float(np.nanmean(c)) if np.isfinite(c).any() else None})
        ctrl_hq = float(ctrl.column("high_quality").to_numpy(zero_copy_only=False).astype(float).mean())
        pa_auc = per_metric["patient_ability"]
        ok = pa_auc is not None and pa_auc >= min_auc and ctrl_hq <= max_control_hq_share
        all_ok &= ok
        reasons = ctrl.column("hq_reason").to_pylist()
        summary["recipes"][recipe] = {
            "exchanges": ctrl.num_rows,
            "control_hq_share": ctrl_hq,
            "auc": {k: (round(v, 4) if v is not None else None) for k, v in per_metric.items()},
            "hq_reasons": {k: reasons.count(k) for k in sorted(set(reasons))},
            "separated": ok,
        }
        if not ok:
            log.warning("VALIDITY: the evaluator does not separate real exchanges from %s controls "
                        "(patient_ability AUC %s, controls' high-quality share %.1f%%): do not trust its "
                        "scores on this data", recipe, "n/a" if pa_auc is None else f"{pa_auc:.3f}", 100 * ctrl_hq)
    summary["separated"] = all_ok
    return summary, pa.Table.from_pylist(rows, schema=VALIDITY)


def format_validity(v: dict) -> list[str]:
    if not v or not v.get("recipes"):
        return []
    lines = [
        f"validity self-check on {v['sample_dialogues']} dialogues ({v['sample_exchanges']} exchanges; real HQ "
        f"{100 * v.get('real_hq_share', 0):.1f}%)",
        f"{'control':<24}{'HQ share':>9}{'AUC patient_ability':>21}{'AUC relevance':>15}{'AUC overall':>13}  separated",
        "-" * 92,
    ]
    for name, r in v["recipes"].items():
        if not r.get("exchanges"):
            lines.append(f"{name:<24}{'-':>9}  ({r.get('note', '')})")
            continue
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        lines.append(f"{name:<24}{100 * r['control_hq_share']:>8.1f}%{fmt(r['auc']['patient_ability']):>21}"
                     f"{fmt(r['auc']['relevance']):>15}{fmt(r['auc']['overall']):>13}  "
                     f"{'yes' if r['separated'] else 'NO'}")
    if v.get("separated") is False:
        lines.append("WARNING: the evaluator cannot separate real exchanges from some controls on this data; "
                     "its scores and high-quality pairs are not to be trusted here (see eval/validity.parquet)")
    return lines
