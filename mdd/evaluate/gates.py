"""The high-quality decision: gates an exchange must pass whatever its mean, then the threshold.

``overall`` keeps the seed's formula (``mdd/evaluate/quality.py``); ``high_quality`` is this
module's decision on top of it. The gates run in this order and ``hq_reason`` names the first
one an exchange fails (or ``ok``); every word list and limit is in the ``gates`` section of
``mdd/knowledge/lexicons.yaml``:

=================  ===========================================================================
``guard``          the question or the answer fails a turn guard (``mdd/dialogue/guards.py``: echo,
                   loop, wrong role, prompt leak, repeated question, language, contradiction of the
                   record): whatever else it scores, a collapsed turn is no example to learn from
``filler``         the answer carries no information: after interjections and non-committal
                   phrases are taken out, fewer than ``min_content_chars`` characters are left,
                   and it is not a terse answer in kind (a denial to a yes/no question,
                   a time or count to a duration/frequency question)
``echo``           the answer only repeats the question
``leak``           the case's own diagnosis or ICD code, any ICD-10-like code, or a diagnostic
                   statement ("医生说我是…症") in the answer
``record_copy``    (a known record only) the answer is mostly verbatim record text
``off_question``   the answer does not respond to this question: its calibrated relevance
                   (``mdd/evaluate/relevance.py``) is under ``min_z`` standard deviations above
                   chance, or it fits another question of the same dialogue clearly better
                   (``fit < min_fit``); a terse answer in kind passes
``contradiction``  faithfulness, where known, is under ``faithfulness.min``
``below_threshold`` ``overall < evaluate.threshold``
=================  ===========================================================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, cast

import numpy as np

from mdd.evaluate.quality import _alternation

GATES = ("guard", "filler", "echo", "leak", "record_copy", "off_question", "contradiction", "below_threshold")
OK = "ok"
_PUNCT = re.compile(r"[\s\W_]+", re.UNICODE)
_CLAUSE_ENDS = "，,。；;！!？?\n"
_LABEL_SPLIT = re.compile(r"[,，、;；/\s]+")
_BRACKETS = re.compile(r"[［\[（(【][^］\]）)】]*[］\]）)】]")


@dataclass(frozen=True)
class GateSpec:
    interjections: re.Pattern
    noncommittal: re.Pattern
    min_content_chars: int
    terse_max_chars: int
    denial_start: re.Pattern
    polar_question: re.Pattern
    duration_question: re.Pattern
    time_answer: re.Pattern
    echo_min_new_share: float
    min_label_chars: int
    icd: re.Pattern
    cues: re.Pattern
    cue_negation: re.Pattern
    disorders: re.Pattern
    statement_window: int
    copy_min_run: int
    copy_max_share: float
    copy_min_chars: int
    min_z: float
    min_fit: float
    min_faithfulness: float


@lru_cache(maxsize=4)
def gate_spec(path: str | None = None) -> GateSpec:
    from mdd.evaluate.quality import load_lexicon

    lex = load_lexicon(path)
    g = lex.get("gates")
    where = path or "lexicons.yaml"
    if not isinstance(g, dict):
        raise ValueError(f"{where}: missing section gates")
    try:
        info, leak, copy, rel = g["information"], g["leak"], g["record_copy"], g["relevance"]
        denials = sorted(info["denial_words"], key=len, reverse=True)
        return GateSpec(
            interjections=_alternation(info["interjections"]),
            noncommittal=_alternation(info["noncommittal"]),
            min_content_chars=int(info["min_content_chars"]),
            terse_max_chars=int(info["terse_max_chars"]),
            denial_start=re.compile("^(?:" + "|".join(re.escape(p) for p in denials) + ")"),
            polar_question=_alternation(info["polar_question"]),
            duration_question=_alternation(info["duration_question"]),
            time_answer=re.compile(info["time_answer"]),
            echo_min_new_share=float(g["echo"]["min_new_share"]),
            min_label_chars=int(leak["min_label_chars"]),
            icd=re.compile(leak["icd_pattern"]),
            cues=_alternation(leak["statement_cues"]),
            cue_negation=_alternation(leak["statement_negation"]),
            disorders=_alternation(leak["disorders"]),
            statement_window=int(leak["statement_window"]),
            copy_min_run=int(copy["min_run"]),
            copy_max_share=float(copy["max_share"]),
            copy_min_chars=int(copy["min_answer_chars"]),
            min_z=float(rel["min_z"]),
            min_fit=float(rel["min_fit"]),
            min_faithfulness=float(g["faithfulness"]["min"]),
        )
    except (KeyError, TypeError, re.error) as exc:
        raise ValueError(f"{where}: gates: bad or missing entry: {exc}") from exc


# --- the single tests ---------------------------------------------------------------------

def content(answer: str, spec: GateSpec) -> str:
    """The answer without punctuation, interjections and non-committal phrases."""
    text = _PUNCT.sub("", answer or "")
    text = spec.noncommittal.sub("", text)
    return spec.interjections.sub("", text)


def question_kind(question: str, spec: GateSpec) -> str:
    """``duration`` | ``polar`` (it asks yes or no somewhere) | ``open``."""
    q = question or ""
    if spec.duration_question.search(q):
        return "duration"
    if spec.polar_question.search(q):
        return "polar"
    return "open"


def answered_in_kind(question: str, answer: str, spec: GateSpec) -> bool:
    """A terse answer of the kind the question asks for: a denial to a yes/no question
    ("没有。"), a time or count to a duration question ("两个多月。")."""
    bare = _PUNCT.sub("", answer or "")
    if len(bare) > spec.terse_max_chars or spec.noncommittal.search(bare):
        return False
    kind = question_kind(question, spec)
    core = spec.interjections.sub("", bare)
    if not core:
        return False
    if kind == "polar":
        return spec.denial_start.search(core) is not None
    if kind == "duration":
        return spec.time_answer.search(core) is not None
    return False


def _bigrams(text: str) -> set[str]:
    t = _PUNCT.sub("", text or "")
    return {t[i:i + 2] for i in range(len(t) - 1)}


def echoes(question: str, answer: str, spec: GateSpec) -> bool:
    if len(answer or "") > 2 * len(question or "") + 2:  # too long to be a repeat: skip the set work
        return False
    grams = _bigrams(answer)
    if not grams:
        return False
    new = len(grams - _bigrams(question)) / len(grams)
    return new < spec.echo_min_new_share


def label_terms(diagnosis: str | None, icd_code: str | None, spec: GateSpec) -> list[str]:
    """The case's own label as literal terms: diagnosis parts (brackets kept and removed) and codes."""
    terms: list[str] = []
    for part in _LABEL_SPLIT.split(diagnosis or ""):
        for variant in (part, _BRACKETS.sub("", part)):
            variant = variant.strip()
            if len(variant) >= spec.min_label_chars:
                terms.append(variant)
    terms += [c for c in _LABEL_SPLIT.split(icd_code or "") if len(c) >= 3]
    return list(dict.fromkeys(terms))


def leaks(answer: str, terms: Sequence[str], spec: GateSpec) -> bool:
    a = answer or ""
    low = a.lower()
    if any(t.lower() in low for t in terms):
        return True
    if spec.icd.search(a):
        return True
    for cue in spec.cues.finditer(a):
        clause_start = max(a.rfind(p, 0, cue.start()) for p in _CLAUSE_ENDS) + 1
        if spec.cue_negation.search(a, clause_start, cue.start()):
            continue
        m = spec.disorders.search(a, cue.end())
        if m and m.start() - cue.end() <= spec.statement_window:
            return True
    return False


@lru_cache(maxsize=64)
def _record_runs(record: str, n: int) -> frozenset[str]:
    """The record's character n-grams (punctuation out), once per record."""
    r = _PUNCT.sub("", record)
    return frozenset(r[i:i + n] for i in range(len(r) - n + 1))


def copied_share(answer: str, record: str, min_run: int) -> float:
    """Share of the answer's characters inside verbatim runs of >= ``min_run`` shared with ``record``."""
    a = _PUNCT.sub("", answer or "")
    grams = _record_runs(record or "", min_run)
    if len(a) < min_run or not grams:
        return 0.0
    covered = np.zeros(len(a), dtype=bool)
    for i in range(len(a) - min_run + 1):
        if a[i:i + min_run] in grams:
            covered[i:i + min_run] = True
    return float(covered.mean())


# --- the decision ------------------------------------------------------------------------------

def decide(
    questions: Sequence[str],
    answers: Sequence[str],
    overall: np.ndarray,
    threshold: float,
    relevance_z: np.ndarray,
    relevance_fit: np.ndarray,
    faithfulness: Sequence[float | None] | np.ndarray,
    diagnoses: Sequence[str | None],
    icd_codes: Sequence[str | None],
    records: Sequence[str | None] | None = None,
    lexicon: str | None = None,
    guards: Sequence[Sequence[str]] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """(high_quality, hq_reason) per exchange. ``records``: the case record's text where known;
    ``guards``: the turn guards each exchange fails (``speaker:guard``; empty: none)."""
    spec = gate_spec(lexicon)
    n = len(answers)
    records = records if records is not None else [None] * n
    faith = np.array([np.nan if v is None else float(v) for v in faithfulness], dtype=np.float64)
    reasons: list[str] = []
    label_cache: dict[tuple, list[str]] = {}
    for i in range(n):
        q, a = questions[i] or "", answers[i] or ""
        terse_ok = answered_in_kind(q, a, spec)
        key = (diagnoses[i], icd_codes[i])
        if key not in label_cache:
            label_cache[key] = label_terms(diagnoses[i], icd_codes[i], spec)
        if guards is not None and guards[i]:
            reasons.append("guard")
        elif len(content(a, spec)) < spec.min_content_chars and not terse_ok:
            reasons.append("filler")
        elif not terse_ok and echoes(q, a, spec):
            reasons.append("echo")
        elif leaks(a, label_cache[key], spec):
            reasons.append("leak")
        elif records[i] and len(_PUNCT.sub("", a)) >= spec.copy_min_chars and \
                copied_share(a, cast(str, records[i]), spec.copy_min_run) > spec.copy_max_share:
            reasons.append("record_copy")
        elif not terse_ok and (relevance_z[i] < spec.min_z or relevance_fit[i] < spec.min_fit):
            reasons.append("off_question")
        elif np.isfinite(faith[i]) and faith[i] < spec.min_faithfulness:
            reasons.append("contradiction")
        elif overall[i] < threshold:
            reasons.append("below_threshold")
        else:
            reasons.append(OK)
    hq = np.array([r == OK for r in reasons], dtype=bool)
    return hq, reasons


def reason_counts(reasons: Sequence[str]) -> dict[str, int]:
    out = {g: 0 for g in (*GATES, OK)}
    for r in reasons:
        out[r] = out.get(r, 0) + 1
    return out

