"""How the speakers sound, measured: clinical jargon in patient turns, doctor turns that open like an
earlier one, the spread of patient turn lengths.

The jargon detector is the evaluator's lexicon (``mdd/knowledge/lexicons.yaml``: ``patient.jargon``,
matched as substrings): a patient turn "uses jargon" when it holds one of its terms. Every synthesized
dialogue carries ``jargon_turns`` (its patient turns that do); the run's share goes to ``run.json``.
On the 100 MDD-5k dialogues in ``../shared/mdd5k`` 18.2% of patient turns use jargon (tests/test_speech.py).
"""
from __future__ import annotations

import re
import statistics
from collections import Counter
from functools import lru_cache
from typing import Any, Iterable, Sequence

from mdd import knowledge

OPENER_CHARS = 3
SHORT_TURN_CHARS = 20
_LEADING = re.compile(r"^[\s，。、：:“”\"'（）()!！?？…\.\-—]+")


def _alternation(terms: Iterable[str]) -> re.Pattern:
    terms = sorted({str(t) for t in terms if str(t)}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in terms) or r"(?!x)x", re.IGNORECASE)


@lru_cache(maxsize=None)
def jargon_pattern() -> re.Pattern:
    """The terms a patient would not use spontaneously (``patient.jargon``)."""
    return _alternation(knowledge.load_yaml("lexicons.yaml")["patient"]["jargon"])


@lru_cache(maxsize=None)
def leak_pattern() -> re.Pattern:
    """Jargon and record phrasing (the case schema's field names among it): what no text shown to a
    speaking agent as its own words or instructions may hold."""
    pat = knowledge.load_yaml("lexicons.yaml")["patient"]
    return _alternation(list(pat["jargon"]) + list(pat["record_phrasing"]))


def jargon_in(text: str) -> list[str]:
    return jargon_pattern().findall(text or "")


def uses_jargon(text: str) -> bool:
    return jargon_pattern().search(text or "") is not None


def _turns_of(turns: Sequence[dict[str, Any]] | None, speaker: str) -> list[str]:
    return [str(t.get("text") or "") for t in turns or () if t and t.get("speaker") == speaker]


def jargon_turns(turns: Sequence[dict[str, Any]] | None) -> int:
    """How many of a dialogue's patient turns use jargon."""
    return sum(1 for t in _turns_of(turns, "patient") if uses_jargon(t))


def opener(text: str, n: int = OPENER_CHARS) -> str:
    """A turn's first ``n`` characters, leading punctuation and spaces skipped."""
    return _LEADING.sub("", text or "")[:n]


def repeated_openers(turns: Sequence[dict[str, Any]] | None, n: int = OPENER_CHARS) -> tuple[int, int]:
    """(doctor turns that open with the same ``n`` characters as an earlier doctor turn of the
    dialogue, doctor turns)."""
    seen: set[str] = set()
    repeated = total = 0
    for text in _turns_of(turns, "doctor"):
        key = opener(text, n)
        if not key:
            continue
        total += 1
        repeated += key in seen
        seen.add(key)
    return repeated, total


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Mean, coefficient of variation and share under 20 characters of turn lengths."""
    if not lengths:
        return {"turns": 0, "mean": 0.0, "cv": 0.0, "share_under_20": 0.0}
    mean = statistics.fmean(lengths)
    return {
        "turns": len(lengths),
        "mean": round(mean, 1),
        "cv": round(statistics.pstdev(lengths) / mean, 3) if mean else 0.0,
        "share_under_20": round(sum(1 for x in lengths if x < SHORT_TURN_CHARS) / len(lengths), 3),
    }


class SpeechTally:
    """Run figures over dialogue rows: jargon share, repeated openers, patient turn lengths, styles and
    companions. ``add`` a row as each dialogue finishes; ``summary`` for ``run.json``."""

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.jargon = 0
        self.repeated = 0
        self.doctor_turns = 0
        self.dialogues = 0
        self.styles: Counter = Counter()
        self.companions: Counter = Counter()
        self.companion_turns = 0

    def add(self, row: dict[str, Any]) -> None:
        turns = row.get("turns") or []
        patient = _turns_of(turns, "patient")
        self.dialogues += 1
        self.lengths.extend(len(t) for t in patient)
        jargon = row.get("jargon_turns")
        self.jargon += jargon if jargon is not None else jargon_turns(turns)
        r, t = repeated_openers(turns)
        self.repeated += r
        self.doctor_turns += t
        if row.get("patient_style"):
            self.styles[row["patient_style"]] += 1
        if row.get("companion"):
            self.companions[row["companion"]] += 1
        self.companion_turns += len(_turns_of(turns, "companion"))

    def summary(self) -> dict[str, Any]:
        n = len(self.lengths)
        return {
            "patient_turns": n,
            "patient_jargon_share": round(self.jargon / n, 4) if n else 0.0,
            "patient_length": length_stats(self.lengths),
            "doctor_repeated_opener_share": round(self.repeated / self.doctor_turns, 4) if self.doctor_turns else 0.0,
            "patient_styles": dict(sorted(self.styles.items())),
            "companions": dict(sorted(self.companions.items())),
            "dialogues_with_companion": sum(self.companions.values()),
            "companion_turns": self.companion_turns,
        }
