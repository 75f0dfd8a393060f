"""Per-exchange quality metrics (doctor question + patient answer), all in [0, 1]: the seed's formula.

Patient answer: relevance α, relevance_rank (rank of the true answer among in-batch distractor
answers), faithfulness β, robustness γ (leaks and record phrasing);
patient_ability = mean(α, β, γ) over the parts that are known (β is unknown, NaN, where no record
and no LLM judge can check it). The stage computes α, β and the rank elsewhere
(``mdd/evaluate/scoring.py``: the calibrated relevance of ``relevance.py``, the record-based
faithfulness of ``faithfulness.py``) and passes them in; without them the seed's own α
(question↔answer cosine mapped to [0, 1]) and β (LLM judge or a constant) are used.
Doctor question: specificity δ, targetedness ε, professionalism ζ; doctor_quality = mean.
overall = mean(doctor_quality, patient_ability). ``high_quality`` here is the seed's plain
``overall ≥ threshold``; the stage's decision adds the gates of ``gates.py``.

Every lexicon and constant comes from ``mdd/knowledge/lexicons.yaml``. The work is done per
batch with numpy; per-row Python is limited to regex scans.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from mdd.schema import METRICS

LEXICON_PACKAGE = "mdd.knowledge"
LEXICON_FILE = "lexicons.yaml"


def _alternation(terms: Sequence[str]) -> re.Pattern:
    terms = sorted({str(t) for t in terms if str(t)}, key=len, reverse=True)
    if not terms:
        return re.compile(r"(?!x)x")
    return re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE)


@lru_cache(maxsize=4)
def load_lexicon(path: str | None = None) -> dict[str, Any]:
    if path is None:
        text = resources.files(LEXICON_PACKAGE).joinpath(LEXICON_FILE).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    for key in ("doctor", "patient", "scoring"):
        if not isinstance(data, dict) or key not in data:
            raise ValueError(f"{path or LEXICON_FILE}: missing section {key!r}")
    return data


@dataclass(frozen=True)
class _Compiled:
    spec: list[re.Pattern]
    vague: re.Pattern
    elements: list[re.Pattern]
    clinical_terms: list[str]
    clinical_any: re.Pattern
    record: re.Pattern
    jargon: re.Pattern
    separators: re.Pattern
    scoring: dict[str, Any]


@lru_cache(maxsize=4)
def _compiled(path: str | None = None) -> _Compiled:
    lex = load_lexicon(path)
    doc, pat = lex["doctor"], lex["patient"]
    seps = pat.get("label_separators") or [","]
    return _Compiled(
        spec=[_alternation(v) for v in doc["specificity"].values()],
        vague=_alternation(doc.get("vague") or []),
        elements=[_alternation(v) for v in doc["elements"].values()],
        clinical_terms=list(doc["clinical_terms"]),
        clinical_any=_alternation(doc["clinical_terms"]),
        record=_alternation(pat["record_phrasing"]),
        jargon=_alternation(pat["jargon"]),
        separators=re.compile("|".join(re.escape(s) for s in seps)),
        scoring=lex["scoring"],
    )


def _clip(x: np.ndarray) -> np.ndarray:
    x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    return np.clip(x, 0.0, 1.0)


# --- doctor question ------------------------------------------------------------------

def doctor_scores(questions: Sequence[str], lexicon: str | None = None) -> dict[str, np.ndarray]:
    c = _compiled(lexicon)
    sc = c.scoring
    n = len(questions)
    n_spec = np.zeros(n)
    vague = np.zeros(n, dtype=bool)
    n_elem = np.zeros(n)
    n_terms = np.zeros(n)
    density = np.zeros(n)
    for i, q in enumerate(questions):
        q = q or ""
        n_spec[i] = sum(1 for p in c.spec if p.search(q))
        vague[i] = c.vague.search(q) is not None
        n_elem[i] = sum(1 for p in c.elements if p.search(q))
        hits = c.clinical_any.findall(q)
        n_terms[i] = len(set(hits))
        density[i] = sum(len(h) for h in hits) / max(len(q), 1)

    s = sc["specificity"]
    spec = s["base"] + s["per_category"] * n_spec - s["vague_penalty"] * (vague & (n_spec <= 1))

    t = sc["targetedness"]
    targ = t["base"] + t["per_element"] * n_elem

    p = sc["professionalism"]
    prof = np.where(
        n_terms == 0,
        p["none"],
        np.where(
            n_terms < p["ideal_min"],
            p["one"],
            p["ideal"] - p["per_excess"] * np.maximum(n_terms - p["ideal_max"], 0),
        ),
    )
    prof = prof - p["density_penalty"] * (density > p["max_density"])
    spec, targ, prof = _clip(spec), _clip(targ), _clip(prof)
    return {
        "specificity": spec,
        "targetedness": targ,
        "professionalism": prof,
        "doctor_quality": _clip((spec + targ + prof) / 3.0),
    }


# --- patient answer -------------------------------------------------------------------

def _label_parts(value: str | None, seps: re.Pattern) -> list[str]:
    if not value:
        return []
    return [x.strip() for x in seps.split(str(value)) if x and x.strip()]


def robustness(
    answers: Sequence[str],
    diagnoses: Sequence[str | None],
    icd_codes: Sequence[str | None],
    lexicon: str | None = None,
) -> np.ndarray:
    c = _compiled(lexicon)
    r = c.scoring["robustness"]
    out = np.ones(len(answers))
    for i, a in enumerate(answers):
        a = a or ""
        pen = 0.0
        low = a.lower()
        for name in _label_parts(diagnoses[i], c.separators):
            if len(name) >= 2 and name in a:
                pen += r["diagnosis_leak"]
                break
        for code in _label_parts(icd_codes[i], c.separators):
            if len(code) >= 3 and code.lower() in low:
                pen += r["icd_leak"]
                break
        n_rec = len(set(c.record.findall(a)))
        pen += min(r["record_phrasing_max"], r["record_phrasing_each"] * n_rec)
        n_jar = len(set(c.jargon.findall(a)))
        pen += min(r["jargon_max"], r["jargon_each"] * n_jar)
        over = len(a) - r["long_answer_chars"]
        if over > 0:
            pen += min(r["long_answer_max"], r["long_answer_per_char"] * over)
        out[i] = 1.0 - pen
    return _clip(out)


def relevance(q_emb: np.ndarray, a_emb: np.ndarray, answers: Sequence[str], lexicon: str | None = None) -> np.ndarray:
    """The seed's α: question–answer cosine mapped to [0, 1], lowered for very short answers."""
    r = _compiled(lexicon).scoring["relevance"]
    cos = np.einsum("ij,ij->i", q_emb.astype(np.float64), a_emb.astype(np.float64))
    alpha = (np.clip(cos, -1.0, 1.0) + 1.0) / 2.0
    lengths = np.fromiter((len((a or "").strip()) for a in answers), dtype=np.float64, count=len(answers))
    short = r["short_answer_chars"]
    factor = np.where(lengths < short, np.maximum(r["short_answer_floor"], lengths / short), 1.0)
    return _clip(alpha * factor)


def relevance_score(z: np.ndarray, fit: np.ndarray, in_kind: np.ndarray, answers: Sequence[str],
                    lexicon: str | None = None) -> np.ndarray:
    """The stage's α from the calibrated signals of ``mdd/evaluate/relevance.py``:
    sigmoid((z - z_mid) / z_scale) x min(1, fit / fit_full), at least ``in_kind`` for a terse answer
    in kind, lowered like the seed's α for answers under ``short_answer_chars``."""
    r = _compiled(lexicon).scoring["relevance"]
    z = np.asarray(z, dtype=np.float64)
    base = 1.0 / (1.0 + np.exp(-(z - r["z_mid"]) / r["z_scale"]))
    base = base * np.clip(np.asarray(fit, dtype=np.float64) / r["fit_full"], 0.0, 1.0)
    lengths = np.fromiter((len((a or "").strip()) for a in answers), dtype=np.float64, count=len(answers))
    short = r["short_answer_chars"]
    factor = np.where(lengths < short, np.maximum(r["short_answer_floor"], lengths / short), 1.0)
    return _clip(np.where(np.asarray(in_kind, dtype=bool), np.maximum(base, r["in_kind"]), base * factor))


def distractor_index(n: int, k: int) -> np.ndarray:
    """Deterministic distractors: for row i, rows (i + offset) mod n, offsets spread over 1..n-1."""
    k = min(k, n - 1)
    if k <= 0:
        return np.zeros((n, 0), dtype=np.int64)
    offsets = 1 + (np.arange(k) * (n - 1)) // k
    return (np.arange(n)[:, None] + offsets[None, :]) % n


def relevance_rank(q_emb: np.ndarray, a_emb: np.ndarray, k: int) -> np.ndarray:
    """1 when the true answer beats all ``k`` in-batch distractors, 0 when it loses to all."""
    return rank_from_sims(q_emb @ a_emb.T, k)


def rank_from_sims(sims: np.ndarray, k: int) -> np.ndarray:
    """``relevance_rank`` from the batch's similarity matrix (``sims[i, j]`` = question i · answer j)."""
    n = len(sims)
    idx = distractor_index(n, k)
    if idx.shape[1] == 0:
        return np.ones(n)
    true = np.diag(sims)[:, None]
    d = np.take_along_axis(sims, idx, axis=1)
    rank = (d > true + 1e-7).sum(1) + 0.5 * (np.abs(d - true) <= 1e-7).sum(1)
    return _clip(1.0 - rank / idx.shape[1])


# --- faithfulness (optional LLM judge) ------------------------------------------------

FAITH_SYSTEM = (
    "你是精神科病历核对员。给定患者病历和患者在问诊中的一句回答，判断回答内容是否与病历一致、"
    "没有编造病历中不存在或相矛盾的信息。只回答“是”或“否”。"
)


def case_record(diagnosis: str | None, treatment: str | None, patient_turns: Sequence[str], limit: int = 3000) -> str:
    parts = []
    if diagnosis:
        parts.append(f"诊断：{diagnosis}")
    if treatment:
        parts.append(f"处理：{treatment}")
    transcript = "\n".join(t for t in patient_turns if t)
    if transcript:
        parts.append("患者自述：\n" + transcript[:limit])
    return "\n".join(parts)


async def _judge_all(engine: Any, questions, answers, records, concurrency: int = 64) -> list[float | None]:
    from mdd.engines.base import Message, Request, Sampling

    sem = asyncio.Semaphore(concurrency)

    async def one(q: str, a: str, rec: str) -> float | None:
        req = Request(
            messages=(
                Message("system", FAITH_SYSTEM),
                Message("user", f"【病历】\n{rec}\n\n【医生提问】{q}\n【患者回答】{a}\n\n回答是否与病历一致？"),
            ),
            sampling=Sampling(temperature=0.0, choice=("是", "否"), max_tokens=4),
            agent="judge",
            op="Faithfulness",
        )
        async with sem:
            try:
                out = await engine.generate(req)
            except Exception:  # noqa: BLE001 - a failed judgement falls back to the default
                return None
        text = (out.text or "").strip()
        if text.startswith("是"):
            return 1.0
        if text.startswith("否"):
            return 0.0
        return None

    return await asyncio.gather(*(one(q, a, r) for q, a, r in zip(questions, answers, records)))


def faithfulness(
    questions: Sequence[str],
    answers: Sequence[str],
    records: Sequence[str] | None,
    engine: Any | None,
    default: float,
) -> np.ndarray:
    n = len(answers)
    if engine is None or records is None or n == 0:
        return np.full(n, float(default))
    verdicts = asyncio.run(_judge_all(engine, questions, answers, records))
    return _clip(np.array([default if v is None else v for v in verdicts], dtype=np.float64))


_seed_relevance = relevance
_seed_faithfulness = faithfulness


# --- everything together -----------------------------------------------------------------

class QualityScorer:
    """Scores batches of exchanges; one instance per worker (holds the embedder)."""

    def __init__(
        self,
        embedder: Any,
        threshold: float = 0.7,
        distractors: int = 15,
        faithfulness_default: float = 0.75,
        judge_engine: Any | None = None,
        lexicon: str | None = None,
    ):
        self.embedder = embedder
        self.threshold = float(threshold)
        self.distractors = int(distractors)
        self.faithfulness_default = float(faithfulness_default)
        self.judge_engine = judge_engine
        self.lexicon = lexicon
        _compiled(lexicon)  # fail early on a broken lexicon

    def score(
        self,
        questions: Sequence[str],
        answers: Sequence[str],
        diagnoses: Sequence[str | None] | None = None,
        icd_codes: Sequence[str | None] | None = None,
        records: Sequence[str] | None = None,
        q_emb: np.ndarray | None = None,
        a_emb: np.ndarray | None = None,
        relevance: np.ndarray | None = None,
        faithfulness: np.ndarray | None = None,
        rank: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Every metric. ``relevance`` / ``faithfulness`` / ``rank``: computed elsewhere (the stage's
        calibrated α, the record-based β with NaN where unknown, relevance_rank in the relevance
        vectors); else the seed's, from the embedder. ``patient_ability`` is the mean of the parts
        that are known."""
        n = len(questions)
        if len(answers) != n:
            raise ValueError("questions and answers differ in length")
        diagnoses = diagnoses if diagnoses is not None else [None] * n
        icd_codes = icd_codes if icd_codes is not None else [None] * n
        out: dict[str, np.ndarray]
        if n == 0:
            out = {m: np.zeros(0) for m in METRICS}
            out["high_quality"] = np.zeros(0, dtype=bool)
            return out
        if (q_emb is None or a_emb is None) and (relevance is None or rank is None):
            emb = self.embedder.encode(list(questions) + list(answers))
            q_emb, a_emb = emb[:n], emb[n:]
        out = {}
        if relevance is None:
            assert q_emb is not None and a_emb is not None  # encoded above when not given
            relevance = _seed_relevance(q_emb, a_emb, answers, self.lexicon)
        if faithfulness is None:
            faithfulness = _seed_faithfulness(questions, answers, records, self.judge_engine,
                                              self.faithfulness_default)
        out["relevance"] = _clip(relevance)
        if rank is None:
            assert q_emb is not None and a_emb is not None  # encoded above when not given
            rank = relevance_rank(q_emb, a_emb, self.distractors)
        out["relevance_rank"] = rank
        faith = np.asarray(faithfulness, dtype=np.float64)
        out["faithfulness"] = np.where(np.isnan(faith), np.nan, np.clip(faith, 0.0, 1.0))
        out["robustness"] = robustness(answers, diagnoses, icd_codes, self.lexicon)
        parts = np.vstack([out["relevance"], out["faithfulness"], out["robustness"]])
        known = ~np.isnan(parts)
        out["patient_ability"] = _clip(np.where(known, parts, 0.0).sum(0) / known.sum(0))
        out.update(doctor_scores(questions, self.lexicon))
        out["overall"] = _clip((out["doctor_quality"] + out["patient_ability"]) / 2.0)
        out["high_quality"] = out["overall"] >= self.threshold
        return out
