"""What the rule judge reads and returns: a dialogue as rounds (``DialogueView``: exchange i is the i-th
round of ``mdd.record.rounds``), the keyword matching of a rule's condition (negation-aware), and the
judge's anchors and verdicts. The judges (``mdd.evaluate.judges``) and the rule runner
(``mdd.evaluate.rules``) both stand on it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, cast

from mdd.evaluate.rule_set import Condition
from mdd.record import rounds, speaker_of

# --- dialogues -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Exchange:
    index: int
    doctor: str
    patient: str | None  # None: a doctor turn without answer (e.g. the final diagnosis)
    companion: str | None = None  # what the family member in the room said in this exchange


@dataclass(frozen=True)
class DialogueView:
    """A dialogue as 0-based exchanges, with the metadata preconditions may test."""

    dialogue_id: str
    exchanges: tuple[Exchange, ...]
    age: Any = None
    age_range: Any = None  # [lo, hi] from the exact age (checklist.age_range); the age itself is rounded
    gender: Any = None
    diagnosis: str | None = None
    icd_code: str | None = None
    companion: str | None = None  # the companion's relation (母亲, 丈夫 …); None: the patient came alone

    def __len__(self) -> int:
        return len(self.exchanges)

    def text(self, i: int, speaker: str) -> str:
        """The text of ``speaker`` (doctor | patient | companion | any) in exchange ``i``."""
        ex = self.exchanges[i]
        if speaker == "doctor":
            return ex.doctor
        if speaker == "patient":
            return ex.patient or ""
        if speaker == "companion":
            return ex.companion or ""
        return "\n".join(t for t in (ex.doctor, ex.patient or "", ex.companion) if t is not None)

    def upto(self, i: int, speaker: str) -> str:
        """The text of ``speaker`` in exchanges ``0..i`` (cumulative)."""
        return "\n".join(self.text(j, speaker) for j in range(i + 1))

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], position: int = 0) -> "DialogueView":
        did = str(rec.get("dialogue_id") if rec.get("dialogue_id") is not None else f"#{position}")
        turns = rec.get("turns")
        if turns is None:
            raise ValueError(f"dialogue {did!r}: field 'turns' is missing")
        turns = list(turns)
        for k, t in enumerate(turns):
            if speaker_of(t.get("speaker", "")) is None:
                raise ValueError(f"dialogue {did!r}: turn {k} has unknown speaker {t.get('speaker')!r}")
        return cls(
            dialogue_id=did,
            exchanges=tuple(Exchange(i, str(cast(Mapping[str, Any], r.doctor).get("text") or "")
                                     if r.doctor is not None else "",
                                     r.text("patient"), r.text("companion"))
                            for i, r in enumerate(rounds(turns))),
            age=rec.get("age"),
            age_range=rec.get("age_range"),
            gender=rec.get("gender"),
            diagnosis=rec.get("diagnosis"),
            icd_code=rec.get("icd_code"),
            companion=rec.get("companion"),
        )


_NEG_CUES = ("没有", "没", "不", "无", "从未", "未曾", "并未", "否认")
_QUESTION_FORMS = ("有没有", "是不是", "会不会", "能不能", "要不要", "有无", "是否")
_CLAUSE_END = set("，。！？；：,.!?;:\n")
_NEG_WINDOW = 12


def _negated_at(text: str, pos: int, length: int) -> bool:
    """Whether the hit ``text[pos:pos+length]`` is negated: a cue (没有, 不, 从未...) in the
    same clause within a few characters on either side (``没有幻听``, ``幻听倒是没有遇到过``),
    question forms (有没有, 是不是) excepted. A heuristic for the offline judge."""
    lo, hi = pos, pos + length
    while lo > 0 and pos - lo < _NEG_WINDOW and text[lo - 1] not in _CLAUSE_END:
        lo -= 1
    while hi < len(text) and hi - (pos + length) < _NEG_WINDOW and text[hi] not in _CLAUSE_END:
        hi += 1
    context = text[lo:pos] + " " + text[pos + length:hi]
    for q in _QUESTION_FORMS:
        context = context.replace(q, " ")
    return any(c in context for c in _NEG_CUES)


def _hit(text: str, kw: str, skip_negated: bool) -> bool:
    """Whether ``kw`` occurs in ``text`` (lower-cased), at least once not negated if asked."""
    k = kw.lower()
    start = text.find(k)
    while start >= 0:
        if not (skip_negated and _negated_at(text, start, len(k))):
            return True
        start = text.find(k, start + 1)
    return False


@dataclass(frozen=True, slots=True)
class Hits:
    """Keyword hits of a condition on some text. Hits on a concatenation are the union of the
    hits on its parts (keywords never span exchanges), so cumulative tests add up ``Hits``."""

    any: frozenset[str] = frozenset()
    all: tuple[frozenset[str], ...] = ()
    none: frozenset[str] = frozenset()

    def __or__(self, other: "Hits") -> "Hits":
        groups = other.all if not self.all else tuple(a | b for a, b in zip(self.all, other.all))
        return Hits(self.any | other.any, groups, self.none | other.none)


def keyword_hits(cond: Condition, text: str) -> Hits:
    low = text.lower()
    neg = cond.skip_negated
    return Hits(
        frozenset(k for k in cond.any if _hit(low, k, neg)),
        tuple(frozenset(k for k in g if _hit(low, k, neg)) for g in cond.all),
        frozenset(k for k in cond.none if k.lower() in low),
    )


def decide(cond: Condition, hits: Hits) -> tuple[bool, dict[str, Any]]:
    """``any`` needs one hit, every ``all`` group one hit each, ``none`` no hit."""
    groups = hits.all or tuple(frozenset() for _ in cond.all)
    ok = (not cond.any or bool(hits.any)) and all(groups) and not hits.none
    ev: dict[str, Any] = {}
    if cond.any:
        ev["matched_any"] = [k for k in cond.any if k in hits.any]
    if cond.all:
        ev["matched_all"] = [[k for k in g if k in h] for g, h in zip(cond.all, groups)]
    if cond.none:
        ev["forbidden_found"] = [k for k in cond.none if k in hits.none]
    return ok, ev


def match_keywords(cond: Condition, text: str) -> tuple[bool, dict[str, Any]]:
    """The offline test on one text: ``any`` (one hit), every ``all`` group (one hit each),
    no ``none`` hit.

    With ``cond.skip_negated`` (default for patient speech) a positive hit only counts when
    some occurrence is not negated (``没有幻听`` is not a mention of hallucinations); ``none``
    hits always count.
    """
    return decide(cond, keyword_hits(cond, text))


# --- verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where a precondition's text test first holds (``turn`` None: never)."""

    turn: int | None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    turn: int | None = None  # the exchange where the criterion held, when known
    evidence: dict[str, Any] = field(default_factory=dict)


__all__ = ["Anchor", "DialogueView", "Exchange", "Hits", "Verdict", "decide", "keyword_hits", "match_keywords"]
