"""The tool agent's operations and the doctor/patient generators, each a named function.

Symbolic operations (RandVisit, IsDialEnd, EmpathGen, PromptGen, the triple sampling of
FicExpGen) are plain functions. Operations that ask the LLM for a verdict (IsTopicEnd,
TriggerExp, DupDetect, ParseExp) use structured output and fall back to a rule when the
answer is empty, malformed or off-format; every fallback is counted.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from mdd import knowledge
from mdd.cases import Case
from mdd.dialogue import prompts as P
from mdd.dialogue import wording
from mdd.dialogue.agenda import TopicAgenda
from mdd.dialogue.experience import fitting_triples, life_situations  # noqa: F401 (life_situations: API)
from mdd.dialogue.lay import lay
from mdd.engines.base import Completion, Message, Sampling
from mdd.tree import Topic, experience_topics, mentions

# call(agent, op, messages, sampling, context) -> Completion; the loop's accounting wrapper
Call = Callable[[str, str, list[Message], Sampling, dict[str, Any]], Awaitable[Completion]]

YES, NO = "是", "否"


def derive_seed(run_seed: int, case_id: str, variant: int, salt: str = "") -> int:
    """A 63-bit seed from (run seed, case id, variant): the same inputs give the same dialogue."""
    h = hashlib.sha256(f"{run_seed}|{case_id}|{variant}|{salt}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def dialogue_id(case_id: str, variant: int) -> str:
    return f"{case_id}-v{variant}"


# --- personas -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Persona:
    id: str
    surname: str
    age: int
    gender: str
    speciality: str
    speed: str  # fast | normal | slow
    style: str
    empathy: bool
    explain: str  # never | rarely | sometimes | often

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Persona":
        speed = str(d.get("speed", "normal"))
        explain = str(d.get("explain", "rarely"))
        if speed not in P.SPEED:
            raise knowledge.KnowledgeError(f"persona {d.get('id')}: speed must be one of {sorted(P.SPEED)}")
        if explain not in P.EXPLAIN:
            raise knowledge.KnowledgeError(f"persona {d.get('id')}: explain must be one of {sorted(P.EXPLAIN)}")
        return cls(
            id=str(d["id"]), surname=str(d.get("surname", "李")), age=int(d.get("age", 40)),
            gender=str(d.get("gender", "女")), speciality=str(d.get("speciality", "")), speed=speed,
            style=str(d.get("style", "温和")), empathy=bool(d.get("empathy", False)), explain=explain,
        )

    def cap(self, topic: Topic, hard_cap: int) -> int:
        """Exchanges allowed on a topic: fast personas ask once, slow ones may dig one more."""
        base = topic.max_exchanges
        if self.speed == "fast":
            base = 1
        elif self.speed == "slow":
            base += 1
        return max(1, min(base, hard_cap))

    def system_prompt(self) -> str:
        return P.DOCTOR_SYSTEM.format(
            age=self.age, gender=P.gender_word(self.gender), speciality=self.speciality, style=self.style,
            speed=P.SPEED[self.speed], explain=P.EXPLAIN[self.explain],
            empathy="会关注并回应患者的情绪" if self.empathy else "较少表达共情，专注于收集信息",
            overused=wording.overused_text(),
        )


def all_personas() -> list[Persona]:
    return [Persona.from_dict(d) for d in knowledge.personas()]


def choose_persona(personas: list[Persona], run_seed: int, case_id: str, variant: int) -> Persona:
    """Variants of one case walk a seeded permutation of the personas: no repeats until all are used."""
    perm = list(personas)
    random.Random(derive_seed(run_seed, case_id, -1, "persona")).shuffle(perm)
    return perm[variant % len(perm)]


# --- FicExpGen ----------------------------------------------------------------------


_FITTING: dict[int, tuple[Case, tuple[tuple[str, str, str], ...]]] = {}  # id(case) → (case, its triples)


def graph_triples(case: Case) -> list[tuple[str, str, str]]:
    """Every (time, people, event) of the case's knowledge graph that fits the case and itself
    (mdd/dialogue/experience.py), worked out once per case object in a process (every variant of a
    case, and the driver's submission order, draw from the same list); a fresh list each call."""
    got = _FITTING.get(id(case))
    if got is None or got[0] is not case:
        if len(_FITTING) >= 4096:
            _FITTING.clear()
        got = _FITTING[id(case)] = (case, tuple(fitting_triples(case)))
    return list(got[1])


def sample_triples(case: Case, run_seed: int, n: int) -> list[tuple[str, str, str]]:
    """n triples for the variants of a case, distinct events first, then distinct triples."""
    triples = graph_triples(case)
    if not triples:
        raise knowledge.KnowledgeError(f"case {case.case_id}: its experience graph has no triple that fits")
    rng = random.Random(derive_seed(run_seed, case.case_id, -1, "experience"))
    rng.shuffle(triples)
    picked: list[tuple[str, str, str]] = []
    seen_events: set[str] = set()
    for t in triples:
        if t[2] not in seen_events:
            picked.append(t)
            seen_events.add(t[2])
        if len(picked) == n:
            return picked
    rest = [t for t in triples if t not in picked]
    return (picked + rest)[:n] if len(picked) + len(rest) >= n else [triples[i % len(triples)] for i in range(n)]


def work_text(case: Case) -> str:
    return case.section("个人史", "工作、学习情况") or case.section("个人史", "工作情况") or "工作学习情况未说明"


async def fic_exp_gen(call: Call, case: Case, triple: tuple[str, str, str], sampling: Sampling,
                      note: str = "") -> Completion:
    """FicExpGen: a fictitious past experience story from a (time, people, event) triple (``note``: a
    corrective note after a guard failed the last attempt)."""
    time, people, event = triple
    ctx = {"triple": {"time": time, "people": people, "event": event}, "age": case.age_public, "gender": case.gender,
           "work": work_text(case), "diagnosis": case.diagnosis, "complaint": case.complaint}
    msgs = [
        Message("system", P.STORY_SYSTEM),
        # in lay words: the story is told to the patient agent as its own past
        Message("user", P.STORY_USER.format(age=case.age_public, gender=P.gender_word(case.gender),
                                            work=lay().text(work_text(case)), complaint=lay().text(case.complaint),
                                            time=time, people=people, event=event) + note),
    ]
    return await call("tool", "FicExpGen", msgs, sampling, ctx)


# --- symbolic operations ----------------------------------------------------------------

def empath_gen(persona: Persona, answer: str, rng: random.Random | None = None, recent: bool = False) -> str:
    """EmpathGen: an empathy instruction for empathic personas when the answer shows distress, worded
    differently each time and never on two doctor turns in a row (``recent``)."""
    if not persona.empathy or recent:
        return ""
    return wording.empathy_cue(answer, rng)


def prompt_gen(persona: Persona, topic: Topic | None, *, followup: bool, new_topic: bool, empathy: str,
               reask: bool = False) -> str:
    """PromptGen: the doctor's per-turn instruction from the topic, the persona and the state."""
    if topic is None:
        return P.DOC_OPENING.format(surname=persona.surname)
    safe = wording.safe_note(topic)
    if reask:
        return P.DOC_REASK.format(topic=topic.topic, how=P.REASK_GENTLE if persona.empathy else P.REASK_PLAIN) + safe
    if followup:
        return P.DOC_FOLLOWUP.format(topic=topic.topic, empathy=empathy) + safe
    explain = P.DOC_EXPLAIN if persona.explain in ("sometimes", "often") else ""
    return P.DOC_TOPIC.format(transition=P.DOC_TRANSITION if new_topic else "", topic=topic.topic,
                              ask=topic.ask or topic.topic, empathy=empathy, explain=explain) + safe


def is_dial_end(agenda: TopicAgenda, exchanges: int, max_exchanges: int, context_used: int = 0,
                context_limit: int = 0) -> bool:
    """IsDialEnd: the interview is sufficient (every required item asked and the length target
    reached, or nothing left), the dialogue's hard cap reached, or the context nearly full."""
    full = context_limit > 0 and context_used >= context_limit
    return agenda.finished(exchanges) or exchanges >= max_exchanges or full


def needs_reask(answer: str, topic_exchanges: int, cap: int, hard_cap: int) -> bool:
    """A dodged answer (还好吧 / 不记得了 …) gets one gentle re-ask, even past the persona's cap (but
    never past the hard cap per topic)."""
    from mdd.dialogue.patient import evasive

    return topic_exchanges <= cap and topic_exchanges < hard_cap and evasive(answer)


def open_probes(topic: Topic, answer: str) -> list[Topic]:
    """Skip logic: a topic's follow-up probes open only when the answer affirms one of their cues."""
    return [p for p in topic.probes if p.if_answer and mentions(answer, p.if_answer)]


def triple_phrase(people: str, event: str) -> str:
    """"班主任" + "当众贬低" → "班主任当众贬低"; an event that already names the person (or is the
    patient's own, 我自己) stays as it is."""
    return event if not people or people in event or people == "我自己" else f"{people}{event}"


def short_point(text: str, limit: int = 15) -> str:
    """A topic label: the text up to its first clause break, at most ``limit`` characters."""
    return re.split(r"[，,。；;]", text, maxsplit=1)[0][:limit]


# --- LLM verdicts with rule fallbacks ---------------------------------------------------


PLACEMENTS = ("after", "before", "system")


class View(list):
    """An agent's messages (``Message`` s) and where a per-turn instruction goes in them
    (``DialogueConfig.layout.instruction``): ``after`` the other side's last words in the same user
    message, ``before`` them (their words end the message), or as a ``system`` message of its own right
    before the reply. Either way the prompt extends the agent's previous prompt: the last user message
    is not part of any earlier prompt of this agent."""

    def __init__(self, messages: Any = (), placement: str = "after"):
        super().__init__(messages)
        self.placement = placement


def with_instruction(history: list[Message], instruction: str) -> View:
    """The history with an instruction placed as its ``placement`` says (a plain list: after)."""
    placement = getattr(history, "placement", "after")
    if placement == "system":
        return View(list(history) + [Message("system", instruction)], placement)
    if history and history[-1].role == "user":
        last = history[-1].content
        text = f"{instruction}\n\n{last}" if placement == "before" else f"{last}\n\n{instruction}"
        return View(list(history[:-1]) + [Message("user", text)], placement)
    return View(list(history) + [Message("user", instruction)], placement)


def _yes_no(text: str, op: str, fallbacks: dict[str, int], rule: Callable[[], bool]) -> bool:
    """A 是/否 verdict; anything else counts a fallback and the rule decides."""
    text = text.strip()
    if text.startswith(YES):
        return True
    if text.startswith(NO):
        return False
    fallbacks[op] = fallbacks.get(op, 0) + 1
    return rule()


def _denial(answer: str) -> bool:
    return bool(re.match(r"^\s*(没有|没|不会|不太|还好|都还|正常|不是|否)", answer)) and len(answer) < 40


async def is_topic_end(call: Call, doctor_view: list[Message], topic: Topic, exchanges: int, cap: int,
                       answer: str, sampling: Sampling, fallbacks: dict[str, int]) -> bool:
    """IsTopicEnd: the hard cap first, then the LLM's verdict (rule on a bad answer)."""
    if exchanges >= cap:
        return True
    out = await call("tool", "IsTopicEnd", with_instruction(doctor_view, P.IS_TOPIC_END.format(topic=topic.topic)),
                     sampling, {"topic": topic.topic, "exchanges": exchanges, "cap": cap, "answer": answer})
    return _yes_no(out.text, "IsTopicEnd", fallbacks, lambda: _denial(answer) or len(answer) >= 60)


async def trigger_exp(call: Call, patient_view: list[Message], topic: Topic, sampling: Sampling,
                      fallbacks: dict[str, int]) -> bool:
    """TriggerExp: should the patient bring in the fictitious experience in this answer?

    Outside the event inquiry branch the answer is no without a call; inside it, the LLM
    decides (the graft topic itself always triggers: it is where the story is told).
    """
    if topic.kind == "graft":
        return True
    if topic.kind != "experience" and topic.group != "event":
        return False
    out = await call("tool", "TriggerExp", with_instruction(patient_view, P.TRIGGER_EXP), sampling,
                     {"topic": topic.topic, "kind": topic.kind, "group": topic.group})
    return _yes_no(out.text, "TriggerExp", fallbacks, lambda: topic.kind == "experience")


def dup_detect_rule(candidates: list[Topic], patient_text: str) -> list[str]:
    """A topic counts as covered when two of its keywords already came up in the patient's words."""
    return [t.id for t in candidates if sum(1 for k in set(t.keywords) if k and k in patient_text) >= 2]


async def dup_detect(call: Call, doctor_view: list[Message], candidates: list[Topic], patient_text: str,
                     sampling: Sampling, fallbacks: dict[str, int]) -> list[str]:
    """DupDetect: which pending topics did the conversation already cover? One structured call."""
    if not candidates:
        return []
    names = [t.topic for t in candidates]
    schema = {
        "type": "object",
        "properties": {"covered": {"type": "array", "items": {"type": "string", "enum": names},
                                   "maxItems": len(names)}},
        "required": ["covered"],
        "additionalProperties": False,
    }
    listing = "\n".join(f"- {n}" for n in names)
    out = await call("tool", "DupDetect", with_instruction(doctor_view, P.DUP_DETECT.format(topics=listing)),
                     Sampling(temperature=0.0, top_p=1.0, max_tokens=sampling.max_tokens, seed=sampling.seed,
                              json_schema=schema),
                     {"candidates": [{"id": t.id, "topic": t.topic, "keywords": list(t.keywords)} for t in candidates],
                      "patient_text": patient_text})
    try:
        covered = json.loads(out.text)["covered"]
        if not isinstance(covered, list):
            raise ValueError("covered is not a list")
        by_name = {t.topic: t.id for t in candidates}
        return [by_name[c] for c in covered if c in by_name]
    except (ValueError, KeyError, TypeError):
        fallbacks["DupDetect"] = fallbacks.get("DupDetect", 0) + 1
        return dup_detect_rule(candidates, patient_text)


def parse_exp_rule(triple: tuple[str, str, str]) -> list[str]:
    time, people, event = triple
    return [short_point(triple_phrase(people, event)), f"{time}那件事后的感受"[:15]]


async def parse_exp(call: Call, doctor_view: list[Message], triple: tuple[str, str, str], story: str,
                    sampling: Sampling, fallbacks: dict[str, int], group: str) -> list[Topic]:
    """ParseExp: the patient's account of the past → the experience inquiry subtree to graft."""
    schema = {
        "type": "object",
        "properties": {"points": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                  "minItems": 1, "maxItems": 3}},
        "required": ["points"],
        "additionalProperties": False,
    }
    out = await call("tool", "ParseExp", with_instruction(doctor_view, P.PARSE_EXP),
                     Sampling(temperature=0.0, top_p=1.0, max_tokens=sampling.max_tokens, seed=sampling.seed,
                              json_schema=schema),
                     {"triple": {"time": triple[0], "people": triple[1], "event": triple[2]}, "story": story})
    points: list[str] = []
    try:
        raw = json.loads(out.text)["points"]
        points = [str(p).strip()[:20] for p in raw if str(p).strip()][:3]
    except (ValueError, KeyError, TypeError):
        pass
    # an answer of only symbols or whitespace is as useless as a malformed one
    points = [p for p in points if re.search(r"[\u4e00-\u9fffA-Za-z]", p)]
    if not points:
        fallbacks["ParseExp"] = fallbacks.get("ParseExp", 0) + 1
        points = parse_exp_rule(triple)
    return experience_topics(points, group)


# --- the speaking agents ----------------------------------------------------------------
# Each returns the engine's completion (its text and finish reason): the loop checks the turn with
# the guards (mdd/dialogue/guards.py) and may ask again with a corrective ``note`` appended to the
# instruction.


async def doc_gen(call: Call, doctor_view: list[Message], instruction: str, sampling: Sampling,
                  context: dict[str, Any]) -> Completion:
    """DocGen: the doctor's next question, from the doctor's history and PromptGen's instruction."""
    return await call("doctor", "DocGen", with_instruction(doctor_view, instruction), sampling, context)


async def pat_gen(call: Call, patient_view: list[Message], instruction: str, sampling: Sampling,
                  context: dict[str, Any]) -> Completion:
    """PatGen: the patient's answer, from the case, the experience and the patient's history."""
    return await call("patient", "PatGen", with_instruction(patient_view, instruction), sampling, context)


async def companion_gen(call: Call, companion_view: list[Message], instruction: str, sampling: Sampling,
                        context: dict[str, Any]) -> Completion:
    """The companion's turn: an answer to the doctor, or an interjection after the patient."""
    return await call("companion", "CompanionGen", with_instruction(companion_view, instruction), sampling, context)


SPEAK = {"doctor": doc_gen, "patient": pat_gen, "companion": companion_gen}
