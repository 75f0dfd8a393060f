"""A dialogue's setting, drawn from its seeds before any call: who the doctor is (persona), the fictitious
past experience's triple, the patient's speech style, who came along, and the agenda with its length
target. ``Dialogue`` draws its own from these functions; ``plan_dialogue`` gives the same figures to the
synthesis room's plan (its submission order) without building a dialogue."""
from __future__ import annotations

import random
from dataclasses import dataclass

from mdd.cases import Case
from mdd.config import DialogueConfig
from mdd.dialogue import ops
from mdd.dialogue.agenda import TopicAgenda
from mdd.dialogue.companion import Companion, CompanionRole, choose_companion
from mdd.dialogue.patient import Style, choose_style


def setting(personas: list[ops.Persona], case: Case, run_seed: int,
            variant: int) -> tuple[ops.Persona, tuple[str, str, str]]:
    """The doctor persona and the experience triple of a (case, variant), drawn from the run seed."""
    persona = ops.choose_persona(personas, run_seed, case.case_id, variant)
    return persona, ops.sample_triples(case, run_seed, variant + 1)[variant]


def style_of(case: Case, run_seed: int, variant: int) -> Style:
    return choose_style(case, ops.derive_seed(run_seed, case.case_id, variant, "style"))


def companion_of(case: Case, run_seed: int, variant: int, cfg: DialogueConfig) -> tuple[Companion | None, int]:
    """Who came along (None: nobody) and the companion's seed."""
    seed = ops.derive_seed(run_seed, case.case_id, variant, "companion")
    return choose_companion(case, seed, cfg.companion), seed


def agenda_for(case: Case, rng: random.Random, cfg: DialogueConfig, persona: ops.Persona,
               escort: CompanionRole | None) -> TopicAgenda:
    """The dialogue's agenda and length target (``rng``: the dialogue's own, before any other draw)."""
    return TopicAgenda.for_case(case, rng, cfg.interview, speed=persona.speed, cap=cfg.max_exchanges,
                                companion=escort is not None, companion_knows=escort.knows if escort else None,
                                companion_required=escort.required() if escort else ())


@dataclass(frozen=True)
class DialoguePlan:
    """What a (case, variant) will be, known before any call."""

    case_id: str
    variant: int
    persona: str  # the doctor persona's id
    triple: tuple[str, str, str]  # (time, people, event) of the fictitious experience
    style: str  # the patient's speech style id
    companion: str | None  # the companion's relation; None: the patient comes alone
    target: int  # the agenda's length target in exchanges, within synth.dialogue.max_exchanges


def plan_dialogue(case: Case, variant: int, run_seed: int, cfg: DialogueConfig,
                  personas: list[ops.Persona]) -> DialoguePlan:
    persona, triple = setting(personas, case, run_seed, variant)
    who, seed = companion_of(case, run_seed, variant, cfg)
    escort = CompanionRole(case, who, cfg.companion, seed) if who else None
    rng = random.Random(ops.derive_seed(run_seed, case.case_id, variant))
    target = agenda_for(case, rng, cfg, persona, escort).target
    return DialoguePlan(case.case_id, variant, persona.id, triple, style_of(case, run_seed, variant).id,
                        who.relation if who else None,
                        min(target, cfg.max_exchanges) if target is not None else cfg.max_exchanges)
