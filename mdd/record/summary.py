"""The synthesis run's summary as a typed record: what ``run_synthesis`` writes to ``run.json["synthesize"]``
(``to_json``, the same keys in the same order as ever) and what the report, the dataset card and the headline
figures read back (``from_json``: a section written by an older version lacks some keys, which read as their
defaults). Readers use attributes (``s.counts.dialogues_run``, ``s.engine.name``, ``s.setting("synth",
"variants")``), never chains of ``.get``."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping


def _from(cls: type, d: Any) -> Any:
    """An instance of the dataclass ``cls`` from a mapping (missing keys: defaults; unknown keys ignored)."""
    d = d if isinstance(d, Mapping) else {}
    kw = {}
    for f in fields(cls):  # every field has a default: a missing or null key keeps it
        if d.get(f.name) is None:
            continue
        sub = _NESTED.get((cls.__name__, f.name))
        kw[f.name] = _from(sub, d[f.name]) if sub is not None else d[f.name]
    return cls(**kw)


@dataclass
class Counts:
    cases_valid: int = 0
    cases_by_source: dict[str, int] = field(default_factory=dict)
    cases_rejected: int = 0
    reject_rows: int = 0
    dialogues_planned: int = 0
    dialogues_already_written: int = 0
    dialogues_run: int = 0
    dialogues_failed: int = 0
    dialogues_in_output: int = 0
    dialogue_retries: int = 0
    exchanges_run: int = 0


@dataclass
class LLMCalls:
    by_role: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    total: int = 0
    per_exchange: float | None = None


@dataclass
class Tokens:
    prompt_by_role: dict[str, int] = field(default_factory=dict)
    output_by_role: dict[str, int] = field(default_factory=dict)
    cached_by_role: dict[str, int] = field(default_factory=dict)
    prompt_by_model: dict[str, int] = field(default_factory=dict)
    output_by_model: dict[str, int] = field(default_factory=dict)
    cached_by_model: dict[str, int] = field(default_factory=dict)
    cached_prompt_tokens: int = 0


@dataclass
class EngineInfo:
    name: str | None = None
    model: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class SynthesisSummary:
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, masked, the input path as its label
    versions: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    interrupted: bool = False
    counts: Counts = field(default_factory=Counts)
    mixed_sources: bool = False
    # the run's synthetic cases against their profile (JS distance per attribute, near-duplicates, distinct
    # symptom sets), by profile; None when no case is synthetic
    synthetic_cases: dict[str, Any] | None = None
    quarantined_shards: list[dict[str, str]] = field(default_factory=list)
    personal_data_masked: dict[str, list[str]] = field(default_factory=dict)
    control_characters_removed: int = 0
    wall_time_s: float | None = None
    dialogues_per_min: float | None = None
    llm_calls: LLMCalls = field(default_factory=LLMCalls)
    tokens: Tokens = field(default_factory=Tokens)
    fallbacks: dict[str, int] = field(default_factory=dict)
    guards: dict[str, Any] = field(default_factory=dict)
    usage_by_model_and_role: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    speech: dict[str, Any] = field(default_factory=dict)  # jargon share, repeated openers, turn lengths, styles
    engine: EngineInfo = field(default_factory=EngineInfo)
    # the Ray node of each dialogue worker as started, and of each engine actor
    placement: dict[str, list[Any]] = field(default_factory=dict)
    roles: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "SynthesisSummary":
        return _from(cls, d)

    def setting(self, *path: str) -> Any:
        """The run's config at ``path`` (``setting("synth", "variants")``); None where it says nothing."""
        node: Any = self.config
        for k in path:
            if not isinstance(node, Mapping) or node.get(k) is None:
                return None
            node = node[k]
        return node


_NESTED: dict[tuple[str, str], type] = {
    ("SynthesisSummary", "counts"): Counts, ("SynthesisSummary", "llm_calls"): LLMCalls,
    ("SynthesisSummary", "tokens"): Tokens, ("SynthesisSummary", "engine"): EngineInfo,
}
