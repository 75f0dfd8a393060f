"""The dialogue record: one row of the dialogue table (``mdd.schema.DIALOGUE``) as a typed object.

Synthesis writes records (``DialogueRecord.to_row``), the importer of MDD-5k writes them, and the
readers of the table (the rule judge, the comparison, the export, the statistics) read rows back with
``DialogueRecord.from_row``. The field list is the schema's, column for column, in its order
(tests/test_record.py holds them together); a row read back and written again is the same row.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from mdd.record.turns import Exchange, Round, Turn, doctor_turns, exchanges, rounds


@dataclass
class DialogueRecord:
    dialogue_id: str
    case_id: str
    variant: int
    seed: int
    doctor_persona: str | None = None
    experience: str | None = None  # the fictitious past experience, as told
    experience_triple: dict[str, Any] | None = None  # {time, people, event}
    topics: list[str] | None = None
    turns: list[Turn] = field(default_factory=list)
    icd_code: str | None = None
    diagnosis: str | None = None
    treatment: str | None = None
    gender: str | None = None
    age: int | None = None  # rounded to tens (the published age)
    age_range: list[int] | None = None  # [lo, hi] around the exact age (the span rules on age need)
    n_turns: int | None = None
    n_exchanges: int | None = None
    engine: str | None = None
    model: str | None = None
    llm_calls: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    prompt_tokens_by_role: dict[str, Any] | None = None
    output_tokens_by_role: dict[str, Any] | None = None
    fallbacks: int | None = None
    source: str | None = None  # "mdd" synthesized, "mdd5k" imported
    patient_style: str | None = None
    jargon_turns: int | None = None
    topic_ids: list[str] | None = None
    required_items: list[str] | None = None
    items_asked: list[str] | None = None
    exemplar_index: str | None = None
    companion: str | None = None  # the companion's relation; None: the patient came alone
    models: dict[str, Any] | None = None
    calls_by_role: dict[str, Any] | None = None
    cached_tokens_by_role: dict[str, Any] | None = None
    usage_by_model: list[dict[str, Any]] | None = None
    guard_events: list[dict[str, Any]] | None = None
    regenerations: int | None = None
    trimmed_turns: int | None = None
    topics_skipped: int | None = None
    case_source: str | None = None
    case_profile: str | None = None
    case_plan_seed: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "DialogueRecord":
        """A row of the dialogue table (a mapping; columns it lacks are None, older files lack some)."""
        values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(cls)}
        values["turns"] = [Turn.from_row(t) for t in (row.get("turns") or []) if t]
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        """The row, every column of the schema."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["turns"] = [t.to_row() for t in self.turns]
        return row

    def rounds(self) -> list[Round]:
        return rounds(self.turns)

    def exchanges(self) -> list[Exchange]:
        return exchanges(self.turns)

    def counts(self) -> tuple[int, int]:
        """(doctor turns, exchanges): the table's ``n_turns`` and ``n_exchanges``."""
        return doctor_turns(self.turns), len(self.exchanges())
