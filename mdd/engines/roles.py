"""Roles on engines: which named engine plays each role (doctor, patient, companion, tool, judge).

The config's ``roles:`` maps a role to one engine name, a list of names (equal weights) or a
mapping of names to weights; ``default`` covers the roles not listed. A dialogue draws its engine
for each role once, from its own identity and the run seed, so every call of that role in that
dialogue goes to the same engine (and its prefix stays in that engine's cache), and a mix such
as ``doctor: [big, small]`` splits the dialogues between the models in the given shares.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

ROLES = ("doctor", "patient", "companion", "tool", "judge")
# the roles a synthesis calls (companion: a family member who came along)
SYNTH_ROLES = ("doctor", "patient", "companion", "tool")


def role_of(agent: str) -> str:
    """The role a request's ``agent`` plays (any other agent is the tool agent)."""
    return agent if agent in ROLES else "tool"


def parse_choice(key: str, value: Any) -> tuple[tuple[str, float], ...]:
    """``big`` | ``[big, small]`` | ``{big: 0.7, small: 0.3}`` → ((name, weight), ...)."""
    if isinstance(value, str):
        pairs = [(value, 1.0)]
    elif isinstance(value, (list, tuple)):
        pairs = [(v, 1.0) for v in value]
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ValueError(f"{key}: an engine name, a list of names or a mapping of names to weights, "
                         f"got {type(value).__name__}")
    if not pairs:
        raise ValueError(f"{key}: names no engine")
    out = []
    for name, w in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{key}: engine names are strings, got {name!r}")
        try:
            w = float(w)
        except (TypeError, ValueError):
            raise ValueError(f"{key}.{name}: the weight must be a number, got {w!r}") from None
        if not w > 0:
            raise ValueError(f"{key}.{name}: the weight must be > 0, got {w}")
        out.append((name, w))
    if len({n for n, _ in out}) != len(out):
        raise ValueError(f"{key}: names an engine twice")
    return tuple(out)


@dataclass(frozen=True)
class RoleMap:
    """Validated ``roles:`` (every name checked against ``engines:``)."""

    choices: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]  # (role, ((engine, weight), ...))

    @classmethod
    def build(cls, roles: Mapping[str, Any], engines: Mapping[str, Any], required: tuple[str, ...]) -> "RoleMap":
        parsed: dict[str, tuple[tuple[str, float], ...]] = {}
        for role, value in roles.items():
            if role != "default" and role not in ROLES:
                raise ValueError(f"roles.{role}: unknown role; known: {', '.join(ROLES)}, default")
            parsed[role] = parse_choice(f"roles.{role}", value)
            for name, _ in parsed[role]:
                if name not in engines:
                    raise ValueError(f"roles.{role}: unknown engine {name!r}; engines: {', '.join(engines)}")
        if "judge" in parsed and len(parsed["judge"]) > 1:
            raise ValueError("roles.judge: the judge takes one engine")
        if "default" not in parsed:
            for role in required:
                if role not in parsed:
                    raise ValueError(f"roles.{role}: no engine for this role (name one, or set roles.default)")
        used = {n for pairs in parsed.values() for n, _ in pairs}
        for name in engines:
            if name not in used:
                raise ValueError(f"engines.{name}: no role uses this engine")
        return cls(tuple(parsed.items()))

    def options(self, role: str) -> tuple[tuple[str, float], ...]:
        got = dict(self.choices)
        opts = got.get(role) or got.get("default")
        if opts is None:
            raise KeyError(f"roles.{role}: no engine for this role (name one, or set roles.default)")
        return opts

    def engine_for(self, role: str, session: str, run_seed: int) -> str:
        """The engine playing ``role`` in the dialogue ``session``: a draw by the weights, the same
        for every call of that dialogue, from (run seed, dialogue, role)."""
        opts = self.options(role)
        if len(opts) == 1:
            return opts[0][0]
        digest = hashlib.sha256(f"{run_seed}|{session}|{role}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64 * sum(w for _, w in opts)
        for name, w in opts:
            u -= w
            if u < 0:
                return name
        return opts[-1][0]


def per_model(models: Mapping[str, str], by_role: Mapping[str, int]) -> dict[str, int]:
    """A per-role count summed per model (a dialogue keeps one model per role)."""
    out: dict[str, int] = {}
    for role, n in by_role.items():
        if n and role in models:
            out[models[role]] = out.get(models[role], 0) + int(n)
    return out
