"""The run's running totals (calls, tokens, speech, guards, by role and by model) as dialogues come in."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mdd.dialogue.guards import GuardTally
from mdd.record.speech import SpeechTally

BY_MODEL = ("calls", "prompt_tokens", "output_tokens", "cached_tokens")


@dataclass
class RunStats:
    dialogues: int = 0
    retries: int = 0
    calls_by_role: Counter = field(default_factory=Counter)
    calls_by_op: Counter = field(default_factory=Counter)
    prompt_tokens_by_role: Counter = field(default_factory=Counter)
    output_tokens_by_role: Counter = field(default_factory=Counter)
    cached_tokens_by_role: Counter = field(default_factory=Counter)
    by_model: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in BY_MODEL})
    fallbacks: Counter = field(default_factory=Counter)
    cached_tokens: int = 0
    exchanges: int = 0
    speech: SpeechTally = field(default_factory=SpeechTally)
    guards: GuardTally = field(default_factory=GuardTally)
    by_model_role: dict[str, dict[str, Counter]] = field(default_factory=dict)  # model -> role -> calls, tokens
    written: int = 0  # dialogues written to shards by this run

    def add(self, res: dict[str, Any]) -> None:
        row = res["row"]
        self.speech.add(row)
        self.dialogues += 1
        self.exchanges += row["n_exchanges"]
        self.prompt_tokens_by_role.update(row["prompt_tokens_by_role"])
        self.output_tokens_by_role.update(row["output_tokens_by_role"])
        self.cached_tokens_by_role.update(row.get("cached_tokens_by_role") or {})
        for u in row.get("usage_by_model") or []:
            for k in BY_MODEL:
                self.by_model[k][u["model"]] += u[k]
        self.calls_by_role.update(res["calls_by_role"])
        self.calls_by_op.update(res["calls_by_op"])
        self.fallbacks.update(res["fallbacks"])
        self.cached_tokens += res["cached_tokens"]
        self.guards.add(res.get("generated") or {}, row.get("guard_events") or [])
        per_role = {"calls": res["calls_by_role"], "prompt_tokens": row["prompt_tokens_by_role"],
                    "output_tokens": row["output_tokens_by_role"],
                    "cached_tokens": row.get("cached_tokens_by_role") or {}}
        for role, model in (row.get("models") or {}).items():
            if model is None:
                continue
            c = self.by_model_role.setdefault(model, {}).setdefault(role, Counter())
            for k, v in per_role.items():
                c[k] += int(v.get(role) or 0)

    def by_model_and_role(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{model: {role: {calls, prompt_tokens, output_tokens, cached_tokens}}}`` over the run's dialogues."""
        return {m: {r: dict(c) for r, c in sorted(roles.items())} for m, roles in sorted(self.by_model_role.items())}
