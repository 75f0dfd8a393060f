"""Lay words: case text as the patient (or the family member with them) would say it.

The rules are ``mdd/knowledge/lay_terms.yaml``; the guarantee is here: :meth:`Lay.text` never returns
a term of the evaluator's jargon or record-phrasing lexicon (a clause it cannot translate is left
out), so nothing a speaking agent is shown from the case reads like a record or a mental-state exam.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.cases import Case
from mdd.record.speech import leak_pattern
from mdd.tree import Topic

_CLAUSE = re.compile(r"([，,。；;！!？?\n]+)")
_SPACES = re.compile(r"[ \t\u3000]+")
# quotation marks and brackets: a clause never ends inside a pair, and a mark left without its partner
# (a record's own typo) is taken out, so nothing shown or said has an unbalanced quote
PAIRS = ("“”", "‘’", "（）", "()", "「」", "『』", "《》", "【】", "[]")


def _open(text: str) -> bool:
    return any(text.count(a) > text.count(b) for a, b in PAIRS)


def tidy(text: str) -> str:
    """``text`` without the quotation marks and brackets that have no partner."""
    for a, b in PAIRS:
        if text.count(a) != text.count(b):
            text = text.replace(a, "").replace(b, "")
    return text


def split_clauses(text: str, pattern: re.Pattern = _CLAUSE) -> list[tuple[str, str]]:
    """(clause, separator) pairs of ``text``; ``pattern`` has one capturing group (the separators).
    A separator inside quotation marks or brackets does not end a clause (“拖累了老伴，不如早点走”)."""
    parts = pattern.split(text or "")
    out: list[tuple[str, str]] = []
    buf, i = "", 0
    while i < len(parts):
        c, sep = parts[i], parts[i + 1] if i + 1 < len(parts) else ""
        buf += c
        i += 2
        if _open(buf) and i < len(parts):
            buf += sep
            continue
        out.append((tidy(buf), sep))
        buf = ""
    return out


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a clause boundary (never mid-word), else ""."""
    if len(text) <= limit:
        return text
    out = ""
    for c, sep in split_clauses(text):
        if len(out) + len(c) > limit:
            break
        out += c + sep[:1]
    return out.rstrip("，,；; ")


@dataclass(frozen=True)
class Lay:
    drop: tuple[re.Pattern, ...]
    grammar: tuple[tuple[re.Pattern, str], ...]
    terms: dict[str, str]
    term_pattern: re.Pattern
    exam_fields: tuple[str, ...]
    topics: dict[str, str]
    groups: dict[str, str]
    experience: str
    memo: dict[tuple[str, str], str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Lay":
        terms = {str(k): str(v or "") for k, v in (data.get("terms") or {}).items()}
        keys = sorted(terms, key=len, reverse=True)
        return cls(
            drop=tuple(re.compile(p) for p in data.get("drop") or ()),
            grammar=tuple((re.compile(p), r) for p, r in data.get("grammar") or ()),
            terms=terms,
            term_pattern=re.compile("|".join(re.escape(k) for k in keys) or r"(?!x)x"),
            exam_fields=tuple(data.get("exam_fields") or ()),
            topics={str(k): str(v) for k, v in (data.get("topics") or {}).items()},
            groups={str(k): str(v) for k, v in (data.get("groups") or {}).items()},
            experience=str(data.get("experience") or "{point}"),
        )

    def clause(self, c: str, who: str = "我") -> str:
        """One clause in lay words, or "" when it is record phrasing or untranslatable."""
        if any(p.search(c) for p in self.drop):
            return ""
        for pattern, rep in self.grammar:
            c = pattern.sub(rep.replace("{I}", who), c)
        c = self.term_pattern.sub(lambda m: self.terms[m.group(0)], c)
        c = _SPACES.sub("", c).strip()
        return "" if leak_pattern().search(c) else c

    def text(self, text: str, who: str = "我") -> str:
        """Case text in lay words. ``who``: 我 for the patient, 他/她 for a companion speaking of them."""
        key = (text or "", who)
        if key not in self.memo:
            self.memo[key] = self._text(*key)
        return self.memo[key]

    def _text(self, text: str, who: str) -> str:
        out: list[str] = []
        for raw, sep in split_clauses(text):
            c = tidy(self.clause(raw, who))
            if c:
                out.append(c + sep[:1])
            elif out and sep and sep[0] in "。；;！!？?\n" and out[-1][-1:] in "，,":
                out[-1] = out[-1][:-1] + sep[0]  # a dropped clause ended the sentence: so does the last kept one
        return "".join(out).strip("，, ")

    def topic(self, topic: Topic) -> str:
        """What the doctor is asking about, in the patient's words."""
        if topic.kind == "experience":
            return self.experience.format(point=self.text(topic.topic) or "那件事")
        lay = topic.lay or self.topics.get(topic.id)
        return lay or self.groups.get(topic.group) or self.groups.get("", "最近的情况")

    def appearance(self, case: Case, who: str = "我") -> str:
        """How the patient comes across today (from the exam's observable sub-fields), in lay words."""
        exam = case.exam
        if isinstance(exam, str):
            return self.text(exam, who)
        parts = [self.text(exam.get(f, ""), who) for f in self.exam_fields]
        return "；".join(p for p in parts if p)


@lru_cache(maxsize=None)
def lay() -> Lay:
    return Lay.from_data(knowledge.load_yaml("lay_terms.yaml"))
