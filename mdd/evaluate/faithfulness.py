"""Faithfulness without an LLM: is the answer consistent with the case record behind it?

For dialogues this project synthesized, the case record is known (``OUT/cases.parquet``, one row
per case, its fields as a map ``path → text``) and each patient turn may name the record fields it
was grounded on (``turns[].grounding``). The lexicon (``faithfulness`` in
``mdd/knowledge/lexicons.yaml``) lists symptom concepts with the words records and patients use.
Each concept is *stated* by a text as present (``+1``) or absent (``-1``): a mention is negated
by a clause-wide cue earlier in its clause ("否认兴奋话多、花钱多") or by a negation cue at most
``negation_window`` characters before it, other mentions and list joiners not counted
("没有兴奋话多、幻听及被害感" negates all three).

Per answer:

- a **contradiction** (the answer affirms a concept the record denies, or denies one the record
  affirms) gives 0;
- otherwise 1, less ``unsupported_penalty`` for each concept the answer affirms that neither the
  record nor the dialogue's fictitious experience mentions (capped at ``max_unsupported_penalty``).

The record's stance on a concept comes from the turn's grounding fields first, else from the
whole record. An answer with no lexicon concept scores 1: nothing in it contradicts or goes
beyond the record's symptom statements. Where no record is known (imported dialogues) the score
is ``None`` (null in ``eval/turns``): unknown, not a constant; ``patient_ability`` is then the
mean of the parts that are known.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from mdd.evaluate.quality import _alternation

_CLAUSE = re.compile(r"[。；;，,！？!?\n]")


@dataclass(frozen=True)
class FaithLexicon:
    concepts: dict[str, re.Pattern]
    any_concept: re.Pattern
    clause_negation: re.Pattern
    negation: re.Pattern
    window: int
    list_item_chars: int
    unsupported_penalty: float
    max_unsupported_penalty: float


@lru_cache(maxsize=4)
def faith_lexicon(path: str | None = None) -> FaithLexicon:
    from mdd.evaluate.quality import load_lexicon

    lex = load_lexicon(path)
    f = lex.get("faithfulness")
    if not isinstance(f, dict) or not isinstance(f.get("concepts"), dict):
        raise ValueError(f"{path or 'lexicons.yaml'}: missing section faithfulness.concepts")
    return FaithLexicon(
        concepts={k: _alternation(v) for k, v in f["concepts"].items()},
        any_concept=_alternation([t for v in f["concepts"].values() for t in v]),
        clause_negation=_alternation(f.get("clause_negation") or []),
        negation=_alternation(f.get("negation") or []),
        window=int(f.get("negation_window", 4)),
        list_item_chars=int(f.get("list_item_chars", 10)),
        unsupported_penalty=float(f.get("unsupported_penalty", 0.25)),
        max_unsupported_penalty=float(f.get("max_unsupported_penalty", 0.5)),
    )


_JOINERS = re.compile(r"[、及和或与跟也还]")


def _negates(between: str, lex: FaithLexicon) -> bool:
    """Does a negation cue reach a mention with ``between`` in between? Yes when it is near, other
    mentions and list joiners not counted ("没有兴奋话多、幻听及被害感"), or when it heads a list of
    short items ("没有特别兴奋、话特别多、花钱多")."""
    if len(_JOINERS.sub("", lex.any_concept.sub("", between))) <= lex.window:
        return True
    items = _JOINERS.split(between)
    return len(items) > 1 and all(len(x) <= lex.list_item_chars for x in items)


def stances(text: str, lex: FaithLexicon) -> dict[str, int]:
    """Concept → +1 (stated present) or -1 (stated absent); a present mention wins over an absent one."""
    out: dict[str, int] = {}
    for clause in _CLAUSE.split(text or ""):
        if not clause:
            continue
        for name, pat in lex.concepts.items():
            for m in pat.finditer(clause):
                before = clause[: m.start()]
                negated = lex.clause_negation.search(before) is not None or any(
                    _negates(clause[n.end(): m.start()], lex) for n in lex.negation.finditer(before)
                )
                sign = -1 if negated else 1
                if out.get(name) != 1:
                    out[name] = sign
    return out


def record_text(fields: Mapping[str, str] | None, paths: Sequence[str] | None = None) -> str:
    """The text of the record fields at ``paths`` (a section name takes all its sub-fields)."""
    if not fields:
        return ""
    if not paths:
        return "；".join(v for v in fields.values() if v)
    keep = []
    for k, v in fields.items():
        if v and any(k == p or k.startswith(p + ".") for p in paths):
            keep.append(v)
    return "；".join(keep)


class RecordStances:
    """Stances of one case record, memoised per set of grounding fields."""

    def __init__(self, fields: Mapping[str, str], lex: FaithLexicon):
        self.fields = dict(fields)
        self.lex = lex
        self.whole = stances(record_text(self.fields), lex)
        self._by_paths: dict[tuple[str, ...], dict[str, int]] = {}

    def for_paths(self, paths: Sequence[str] | None) -> dict[str, int]:
        if not paths:
            return self.whole
        key = tuple(paths)
        if key not in self._by_paths:
            self._by_paths[key] = stances(record_text(self.fields, key), self.lex)
        return self._by_paths[key]


def score_answer(answer: str, record: RecordStances, grounding: Sequence[str] | None = None,
                 experience: str | None = None) -> float:
    lex = record.lex
    said = stances(answer, lex)
    if not said:
        return 1.0
    near = record.for_paths(grounding)
    extra = stances(experience or "", lex) if experience else {}
    unsupported = 0
    for concept, sign in said.items():
        known = near.get(concept, record.whole.get(concept))
        if known is not None and known != sign:
            return 0.0
        if known is None and sign > 0 and concept not in extra:
            unsupported += 1
    return max(0.0, 1.0 - min(lex.max_unsupported_penalty, lex.unsupported_penalty * unsupported))


def score_record_faithfulness(answers: Sequence[str], case_ids: Sequence[str | None],
                              groundings: Sequence[Sequence[str] | None], experiences: Sequence[str | None],
                              records: Mapping[str, Mapping[str, str]] | None,
                              lexicon: str | None = None) -> list[float | None]:
    """Per answer: a score in [0, 1] where the case's record is known, else None."""
    lex = faith_lexicon(lexicon)
    cache: dict[str, RecordStances] = {}
    out: list[float | None] = []
    for a, cid, g, exp in zip(answers, case_ids, groundings, experiences):
        fields = (records or {}).get(cid) if cid is not None else None
        if not fields:
            out.append(None)
            continue
        assert cid is not None  # fields come only with a case id
        if cid not in cache:
            cache[cid] = RecordStances(fields, lex)
        out.append(score_answer(a, cache[cid], g, exp))
    return out

