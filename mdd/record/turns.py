"""Turns, rounds and exchanges: what "an exchange" is, defined once for every stage.

A dialogue's turns alternate between the doctor and whoever answers: the patient, or the companion
in the room (``ANSWERERS``). A *round* is a doctor turn with the turns that follow it up to the next
doctor turn (its replies); a round without a doctor turn opens a dialogue whose patient spoke first.
An *exchange* is a round whose doctor turn is answered: the turn right after it is the patient's or
the companion's. Its answer is that turn; a companion's interjection after a patient answer belongs to
the same round but is no exchange of its own. The closing diagnosis, a doctor turn nobody answers, is
a round and not an exchange. The k-th exchange is eval/turns' ``turn`` k.

Speakers are read canonically: ``doctor``, ``patient``, ``companion`` (and the synonyms of imported
corpora: bot / assistant / 医生, user / 患者, 家属 …). Missing turns (null entries) are skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

DOCTOR = "doctor"
ANSWERERS = ("patient", "companion")
SPEAKERS = (DOCTOR,) + ANSWERERS

_SYNONYMS = {
    "doctor": DOCTOR, "bot": DOCTOR, "assistant": DOCTOR, "医生": DOCTOR, "助手": DOCTOR,
    "patient": "patient", "user": "patient", "患者": "patient", "用户": "patient",
    "companion": "companion", "家属": "companion", "陪同者": "companion",
}


def speaker_of(raw: Any) -> str | None:
    """The canonical speaker of a turn's ``speaker`` value; None when it names nobody known."""
    return _SYNONYMS.get(str(raw if raw is not None else "").strip().lower())


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the dialogue table's ``turns`` (mdd.schema.TURN)."""

    speaker: str
    text: str
    topic: str | None = None
    grounding: tuple[str, ...] | None = None  # patient turns: the record fields the answer drew on
    exemplars: tuple[int, ...] | None = None  # doctor turns: ids of the exemplars it saw

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Turn":
        g, e = row.get("grounding"), row.get("exemplars")
        return cls(str(row.get("speaker") or ""), str(row.get("text") or ""), row.get("topic"),
                   tuple(g) if g is not None else None, tuple(e) if e is not None else None)

    def to_row(self) -> dict[str, Any]:
        return {"speaker": self.speaker, "text": self.text, "topic": self.topic,
                "grounding": list(self.grounding) if self.grounding is not None else None,
                "exemplars": list(self.exemplars) if self.exemplars is not None else None}


TurnLike = Mapping[str, Any] | Turn


def _get(turn: TurnLike, key: str) -> Any:
    return getattr(turn, key) if isinstance(turn, Turn) else turn.get(key)


@dataclass(frozen=True, slots=True)
class Round:
    """A doctor turn (``position`` in the turns; None: the patient spoke first) and its replies."""

    position: int | None
    doctor: TurnLike | None
    replies: tuple[tuple[int, TurnLike], ...]  # (position, turn) of each reply, in order

    def text(self, speaker: str) -> str | None:
        """The replies of ``speaker`` joined by newlines; None when it said nothing in this round."""
        said = [str(_get(t, "text") or "") for _, t in self.replies if speaker_of(_get(t, "speaker")) == speaker]
        return "\n".join(said) if said else None

    @property
    def answered(self) -> bool:
        return (self.doctor is not None and self.position is not None  # a doctor turn has its position
                and bool(self.replies) and self.replies[0][0] == self.position + 1)


@dataclass(frozen=True, slots=True)
class Exchange:
    """The k-th answered doctor turn: ``index`` k, the question's and the answer's positions and turns."""

    index: int
    position: int
    question: TurnLike
    answer: TurnLike

    @property
    def answer_position(self) -> int:
        return self.position + 1

    @property
    def topic(self) -> str | None:
        return _get(self.question, "topic") or _get(self.answer, "topic")

    @property
    def question_text(self) -> str:
        return str(_get(self.question, "text") or "")

    @property
    def answer_text(self) -> str:
        return str(_get(self.answer, "text") or "")

    @property
    def answerer(self) -> str:
        return speaker_of(_get(self.answer, "speaker")) or ""


def rounds(turns: Sequence[TurnLike | None] | None) -> list[Round]:
    """The dialogue's rounds in order. A turn of an unknown speaker is left out of every round
    (a reader that must refuse such a dialogue checks ``speaker_of`` itself)."""
    out: list[Round] = []
    replies: list[tuple[int, TurnLike]] = []
    position: int | None = None
    doctor: TurnLike | None = None
    started = False
    for k, t in enumerate(turns or []):
        if not t:
            continue
        spk = speaker_of(_get(t, "speaker"))
        if spk is None:
            continue
        if spk == DOCTOR:
            if started:
                out.append(Round(position, doctor, tuple(replies)))
            position, doctor, replies, started = k, t, [], True
        else:
            replies.append((k, t))
            started = True
    if started:
        out.append(Round(position, doctor, tuple(replies)))
    return out


def exchanges(turns: Sequence[TurnLike | None] | None) -> list[Exchange]:
    """The dialogue's exchanges (answered doctor turns) in order."""
    out: list[Exchange] = []
    for r in rounds(turns):
        if r.answered:
            assert r.position is not None and r.doctor is not None
            out.append(Exchange(len(out), r.position, r.doctor, r.replies[0][1]))
    return out


def count_exchanges(turns: Sequence[TurnLike | None] | None) -> int:
    return len(exchanges(turns))


def doctor_turns(turns: Iterable[TurnLike | None] | None) -> int:
    """Doctor turns, the closing included (the dialogue table's ``n_turns``)."""
    return sum(1 for t in turns or [] if t and speaker_of(_get(t, "speaker")) == DOCTOR)
