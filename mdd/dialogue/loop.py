"""Algorithm 1 of MDD-5k as an explicit async state machine.

    START → EXPERIENCE (FicExpGen) → OPENING → NEXT_TOPIC (IsDialEnd, RandVisit, DupDetect)
          → ASK (EmpathGen, PromptGen, DocGen) → ANSWER (TriggerExp, PatGen)
          → REVIEW (ParseExp graft, probes, IsTopicEnd) → ASK | NEXT_TOPIC … → FINAL (labels)

A dialogue is a pure function of (case, variant, run seed, config, engine): every random
choice comes from a seed derived from (run seed, case id, variant), and every LLM call
carries a seed derived from it too.
"""
from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass, field
from typing import Any

from mdd.cases import Case, case_fields
from mdd.checklist import age_range
from mdd.config import DialogueConfig
from mdd.dialogue import guards, ops, wording
from mdd.dialogue import prompts as P
from mdd.dialogue.agenda import TopicAgenda
from mdd.dialogue.closing import spoken_closing
from mdd.dialogue.companion import CompanionRole, addressee
from mdd.dialogue.exemplars import ExemplarRetriever, instruction_block
from mdd.dialogue.patient import PatientRole
from mdd.dialogue.setting import agenda_for, companion_of, style_of
from mdd.dialogue.views import agent_view
from mdd.engines.base import Completion, EngineBase, Message, Request, Sampling
from mdd.record import DialogueRecord, Turn, doctor_turns
from mdd.record.speech import jargon_turns
from mdd.tree import Topic

ROLES = ("doctor", "patient", "companion", "tool")
MIN_DOCTOR_TURNS = 10  # DupDetect never trims a dialogue below this many questions


class GuardFailure(RuntimeError):
    """A generated turn that still failed its guards after every regeneration: the dialogue ends as a
    counted failure with the guards' reasons (never as a clean row). Retrying the dialogue cannot be
    expected to help more than the regenerations did, so the driver does not."""

    retriable = False

    def __init__(self, dialogue_id: str, speaker: str, turn: int, failures: list[guards.Failure],
                 events: list[dict[str, Any]], generated: dict[str, int]):
        self.speaker, self.turn, self.failures, self.events, self.generated = speaker, turn, failures, events, generated
        self.guards = sorted({f.guard for f in failures})
        super().__init__(f"{dialogue_id}: the {speaker}'s turn {turn} failed "
                         + "; ".join(str(f) for f in failures) + " after every regeneration")

    def only_repeats(self) -> bool:
        """The turn failed only as a repeat of the speaker's own earlier words (a question asked before)."""
        return all(f.guard == "repeat" or (f.guard == "echo" and f.detail == "own") for f in self.failures)

    def only_echoes(self) -> bool:
        """The turn failed only as an echo: of the other side's last words or of its own earlier ones."""
        return all(f.guard in ("echo", "repeat") for f in self.failures)


class Phase(enum.Enum):
    START = "start"
    EXPERIENCE = "experience"
    OPENING = "opening"
    NEXT_TOPIC = "next_topic"
    ASK = "ask"
    ANSWER = "answer"
    REVIEW = "review"
    FINAL = "final"
    DONE = "done"


@dataclass
class Accounting:
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    prompt_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    output_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    cached_tokens: int = 0
    cached_by_role: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    by_op: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    generated: dict[str, int] = field(default_factory=dict)  # generated turns by speaker (the guards' denominator)

    def add(self, agent: str, op: str, c: Completion) -> None:
        role = agent if agent in ROLES else "tool"
        self.calls[role] += 1
        self.prompt_tokens[role] += c.prompt_tokens
        self.output_tokens[role] += c.output_tokens
        self.cached_tokens += c.cached_tokens
        self.cached_by_role[role] += c.cached_tokens
        self.by_op[op] = self.by_op.get(op, 0) + 1


class Dialogue:
    """One dialogue's state machine. ``await Dialogue(...).run()`` returns its table row."""

    def __init__(self, case: Case, variant: int, run_seed: int, engine: EngineBase, cfg: DialogueConfig,
                 persona: ops.Persona, triple: tuple[str, str, str], exemplars: ExemplarRetriever | None = None):
        self.case, self.variant, self.engine, self.cfg = case, variant, engine, cfg
        self.exemplars = exemplars
        self.persona, self.triple = persona, triple
        self.id = ops.dialogue_id(case.case_id, variant)
        self.seed = ops.derive_seed(run_seed, case.case_id, variant)
        self.rng = random.Random(self.seed)
        self.rng_wording = random.Random(ops.derive_seed(run_seed, case.case_id, variant, "wording"))
        self.acct = Accounting()
        self.phase = Phase.START
        self.turns: list[dict[str, Any]] = []
        # the instruction each generated turn answered, by turn index: it stays in the speaker's
        # view, so every prompt extends that agent's previous prompt and its own output
        self.instructions: dict[int, str] = {}
        self.topics: list[str] = []
        self.topic_ids: list[str] = []
        self.story = ""
        self.agenda: TopicAgenda | None = None
        self.topic: Topic | None = None
        self.topic_exchanges = 0
        self.exchanges = 0
        self.context_used = 0  # the longest prompt so far plus room for two answers
        self.group = ""
        self.followup = False
        self.new_topic = False
        self.question = ""
        self.answer = ""  # the answer to the doctor's current question (patient's or companion's)
        self.empathy = ""  # the empathy cue of the doctor's current turn
        self.reask = False  # the current doctor turn re-asks an evasive answer
        self.checking = ""  # the companion's words the doctor's current question checks with the patient
        self.patient = PatientRole(case, style_of(case, run_seed, variant),
                                   ops.derive_seed(run_seed, case.case_id, variant, "patient"))
        self.patient_system = ""
        # who came along to the visit (None: the patient came alone, companion topics are dropped)
        self.companion, seed = companion_of(case, run_seed, variant, cfg)
        self.escort = CompanionRole(case, self.companion, cfg.companion, seed) if self.companion else None
        self.companion_system = ""
        # the turn guards: what the record documents, every failed attempt, generated turns by speaker
        self.record = guards.RecordFacts.of(case_fields(case))
        self.guard_events: list[dict[str, Any]] = []
        self.generated = self.acct.generated
        self.trimmed: dict[str, int] = {}  # turns cut back to their last whole sentence, by speaker
        self.topics_skipped = 0  # topics left because the doctor could only ask again what it had asked
        self.addressee = "patient"  # who the doctor's current question is for
        self.interjected = False  # the companion cut in after the last answer
        self.doctor_system = persona.system_prompt() + (P.DOCTOR_COMPANION.format(
            relation=self.companion.relation, address=self.companion.address) if self.companion else "")
        s = cfg.sampling
        free: dict[str, Any] = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                    frequency_penalty=s.frequency_penalty, repetition_penalty=s.repetition_penalty)
        self.sp_doctor = Sampling(max_tokens=s.doctor_max_tokens, min_tokens=s.doctor_min_tokens, **free)
        self.sp_patient = Sampling(max_tokens=s.patient_max_tokens, min_tokens=s.patient_min_tokens, **free)
        self.sp_story = Sampling(max_tokens=s.story_max_tokens,
                                 **{**free, "frequency_penalty": s.story_frequency_penalty})
        self.sp_verdict = Sampling(temperature=0.0, top_p=1.0, max_tokens=s.verdict_max_tokens,
                                   choice=(ops.YES, ops.NO))
        self.sp_json = Sampling(temperature=0.0, top_p=1.0, max_tokens=s.json_max_tokens)

    # --- the engine, with accounting and per-call seeds -----------------------------------

    async def call(self, agent: str, op: str, messages: list[Message], sampling: Sampling,
                   context: dict[str, Any]) -> Completion:
        n = sum(self.acct.calls.values())
        seeded = dataclasses.replace(sampling, seed=(self.seed + n) % (2**31 - 1))
        ctx = {"persona": self.persona.id, "speed": self.persona.speed, **context}
        c = await self.engine.generate(Request(messages=tuple(messages), sampling=seeded, agent=agent, op=op,
                                               session=self.id, context=ctx))
        self.acct.add(agent, op, c)
        self.context_used = max(self.context_used, c.prompt_tokens + 2 * sampling.max_tokens)
        return c

    # --- the agents' views of the history (append-only; mdd/dialogue/views.py) -------------

    def _view(self, system: str, speaker: str, opening: str | None) -> list[Message]:
        labels = None
        if self.companion is not None:
            labels = {"doctor": "医生", "patient": "患者" if speaker == "doctor" else self.companion.kin,
                      "companion": self.companion.relation}
        elif self.cfg.layout.labels == "always":
            labels = {"doctor": "医生", "patient": "患者"}
        return agent_view(system, opening, self.turns, self.instructions, speaker, labels, self.cfg.history_window,
                          self.cfg.layout.instruction)

    def doctor_view(self) -> list[Message]:
        return self._view(self.doctor_system, "doctor", P.OPENING_PATIENT)

    def patient_view(self) -> list[Message]:
        return self._view(self.patient_system, "patient", None)

    def companion_view(self) -> list[Message]:
        return self._view(self.companion_system, "companion", None)

    async def _companion_says(self, turn: tuple[str, dict[str, Any]] | None, topic: str,
                              grounding: list[str]) -> bool:
        """The companion's turn, when there is one (an answer or an interjection)."""
        if turn is None or self.escort is None:
            return False
        instruction, context = turn
        context = {**context, "question": self._previous("companion")}
        text = await self._generate("companion", self.companion_view(), instruction, self.sp_patient, context)
        self._say("companion", text, topic, instruction, grounding=grounding)
        self.escort.heard(text)
        return True

    async def _generate(self, speaker: str, view: list[Message], instruction: str, sampling: Sampling,
                        context: dict[str, Any], topic_risk: bool = False) -> str:
        """One speaking turn, checked by the guards: a failing attempt is asked again (a new seed, the
        guard's corrective note after the instruction) up to ``guards.max_regenerations`` times; then
        the dialogue fails (GuardFailure). Every failed attempt is kept in ``guard_events``."""
        g = self.cfg.guards
        gen = ops.SPEAK[speaker]
        own = tuple(t["text"] for t in self.turns if t["speaker"] == speaker)
        previous = self._previous(speaker)
        names = [self.persona.surname] if speaker == "doctor" else \
            [self.companion.relation] if speaker == "companion" and self.companion else []
        self.generated[speaker] = self.generated.get(speaker, 0) + 1
        note = ""
        for attempt in range(g.max_regenerations + 1):
            c = await gen(self.call, view, instruction + note, self._hotter(sampling, attempt),
                          {**context, "attempt": attempt} if attempt else context)
            text, finish = self._trimmed(speaker, guards.strip_label(c.text, speaker, names), c.finish_reason)
            fails = guards.check(guards.Turn(
                speaker=speaker, text=text, finish_reason=finish, previous=previous, own=own,
                asked=own if speaker == "doctor" else (), topic_risk=topic_risk, record=self.record), g.enabled)
            if not fails:
                return text
            self._guard_failed(speaker, attempt, fails, text)
            note = guards.note(fails[0], speaker, self._risk_facts)
        raise GuardFailure(self.id, speaker, len(self.turns), fails, self.guard_events, self.generated)

    def _may_skip(self) -> bool:
        g = self.cfg.guards
        return g.skip_asked_topic and self.topics_skipped < g.max_topics_skipped

    def _unask(self) -> None:
        """Take back the doctor's last question (its answer could only echo it or what was said before):
        the exchange never happened, a topic it opened is not counted as asked, and the topic ends."""
        assert self.turns and self.turns[-1]["speaker"] == "doctor" and self.topic is not None
        self.instructions.pop(len(self.turns) - 1, None)
        self.turns.pop()
        if self.topic_exchanges == 0 and self.topic_ids and self.topic_ids[-1] == self.topic.id:
            self.topic_ids.pop()
            self.topics.pop()
        self.topics_skipped += 1
        self.reask = self.interjected = False

    def _hotter(self, sampling: Sampling, attempt: int) -> Sampling:
        """A regeneration samples hotter (``guards.temperature_step`` per attempt, at most
        ``guards.max_temperature``): a small model's peaked distribution otherwise gives the failed turn
        again, new seed or not."""
        if not attempt or not sampling.temperature:
            return sampling
        g = self.cfg.guards
        return dataclasses.replace(sampling, temperature=min(g.max_temperature,
                                                             sampling.temperature + g.temperature_step * attempt))

    def _trimmed(self, speaker: str, text: str, finish_reason: str | None) -> tuple[str, str | None]:
        """A turn stopped at the token limit is cut back to its last whole sentence when enough is left
        (counted in the row's ``trimmed_turns``); otherwise it stays as it is for the truncation guard."""
        kept = guards.trim_to_sentence(text, finish_reason) if self.cfg.guards.trim else None
        if kept is None:
            return text, finish_reason
        self.trimmed[speaker] = self.trimmed.get(speaker, 0) + 1
        return kept, "stop"

    def _guard_failed(self, speaker: str, attempt: int, fails: list[guards.Failure], text: str) -> None:
        for f in fails:
            self.guard_events.append({"turn": len(self.turns), "speaker": speaker, "guard": f.guard,
                                      "attempt": attempt, "reason": f.reason, "text": text[:200]})

    def _previous(self, speaker: str) -> str:
        """The other side's last turn: for the doctor the last answer, for the others the last question."""
        for t in reversed(self.turns):
            if (t["speaker"] == "doctor") != (speaker == "doctor") and t["speaker"] in guards.SPEAKERS:
                return t["text"]
        return ""

    def _risk_facts(self, kind: str) -> str:
        """The record's clauses on a documented risk, in the patient's own words (a corrective note)."""
        return "；".join(self.patient.lay.text(c) for c in self.record.risks.get(kind, ()))[:120]

    def _say(self, speaker: str, text: str, topic: str, instruction: str | None = None,
             grounding: list[str] | None = None) -> None:
        if instruction is not None:
            self.instructions[len(self.turns)] = instruction
        turn: dict[str, Any] = {"speaker": speaker, "text": text, "topic": topic}
        if grounding is not None:  # the case-record fields a patient (or companion) turn was written from
            turn["grounding"] = grounding
        self.turns.append(turn)

    def patient_text(self) -> str:
        return "".join(t["text"] for t in self.turns if t["speaker"] == "patient")

    # --- states ------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        handlers = {
            Phase.START: self._start,
            Phase.EXPERIENCE: self._experience,
            Phase.OPENING: self._opening,
            Phase.NEXT_TOPIC: self._next_topic,
            Phase.ASK: self._ask,
            Phase.ANSWER: self._answer,
            Phase.REVIEW: self._review,
            Phase.FINAL: self._final,
        }
        steps = 0
        while self.phase is not Phase.DONE:
            steps += 1
            if steps > 20 * self.cfg.max_exchanges + 50:  # a bug guard, never an endless dialogue
                raise RuntimeError(f"{self.id}: state machine did not terminate")
            self.phase = await handlers[self.phase]()
        return self.row()

    def plan_agenda(self) -> TopicAgenda:
        """The dialogue's agenda and length target, drawn from its seed before any call."""
        return agenda_for(self.case, self.rng, self.cfg, self.persona, self.escort)

    async def _start(self) -> Phase:
        self.agenda = self.plan_agenda()
        return Phase.EXPERIENCE

    async def _experience(self) -> Phase:
        self.story = await self._story()
        self.patient_system = self.patient.system_prompt(self.triple, self.story,
                                                         self.companion.relation if self.companion else None)
        if self.escort is not None:
            self.companion_system = self.escort.system_prompt()
        return Phase.OPENING

    async def _story(self) -> str:
        """FicExpGen, guarded (loop, leak, language, truncation, role) when ``guards.story`` is on."""
        g = self.cfg.guards
        enabled = tuple(x for x in g.enabled if x in ("loop", "leak", "language", "truncation", "role")) \
            if g.story else ()
        self.generated["story"] = 1
        note = ""
        for attempt in range(g.max_regenerations + 1):
            c = await ops.fic_exp_gen(self.call, self.case, self.triple, self._hotter(self.sp_story, attempt), note)
            text, finish = self._trimmed("story", c.text.strip(), c.finish_reason)
            fails = guards.check(guards.Turn(speaker="story", text=text, finish_reason=finish), enabled)
            if not fails:
                time, people, event = self.triple
                return text or f"{time}，{ops.triple_phrase(people, event)}，那段时间我心里一直很难受。"
            self._guard_failed("story", attempt, fails, text)
            note = guards.note(fails[0], "story")
        raise GuardFailure(self.id, "story", 0, fails, self.guard_events, self.generated)

    async def _opening(self) -> Phase:
        instruction = ops.prompt_gen(self.persona, None, followup=False, new_topic=False, empathy="")
        if self.companion is not None:
            instruction += P.DOC_OPENING_COMPANION.format(relation=self.companion.relation)
        q = await self._generate("doctor", self.doctor_view(), instruction, self.sp_doctor,
                                 {"opening": True, "surname": self.persona.surname,
                                  "companion": self.companion.address if self.companion else None})
        self._say("doctor", q, "开场", instruction)
        p_instruction, p_context = self.patient.opening()
        a = await self._generate("patient", self.patient_view(), p_instruction, self.sp_patient, p_context)
        self._say("patient", a, "开场", p_instruction, grounding=["主诉", "现病史"])
        self.patient.heard(a)
        await self._companion_says(self.escort.opening() if self.escort else None, "开场", ["主诉", "现病史"])
        self.exchanges += 1
        return Phase.NEXT_TOPIC

    async def _next_topic(self) -> Phase:
        assert self.agenda is not None
        while True:
            if ops.is_dial_end(self.agenda, self.exchanges, self.cfg.max_exchanges, self.context_used,
                               self.cfg.max_context_tokens):
                return Phase.FINAL
            topic = self.agenda.next(self.exchanges)
            if topic is None:
                return Phase.FINAL
            if self.cfg.dup_detect and topic.group != self.group and topic.kind == "symptom":
                self.group = topic.group
                if await self._dup_detect(topic):
                    continue  # the conversation already covered it
            self.group = topic.group or self.group
            self.topic, self.topic_exchanges, self.followup, self.new_topic = topic, 0, False, bool(self.topics)
            self.topics.append(topic.topic)
            self.topic_ids.append(topic.id)
            return Phase.ASK

    async def _dup_detect(self, topic: Topic) -> bool:
        """DupDetect once per group, over its pending topics; True when ``topic`` itself is covered."""
        assert self.agenda is not None
        # required topics are asked whatever the conversation covered
        candidates = [t for t in [topic] + self.agenda.upcoming_in_group(topic.group) if not self.agenda.is_required(t)]
        if not candidates:
            return False
        covered = await ops.dup_detect(self.call, self.doctor_view(), candidates, self.patient_text(),
                                       self.sp_json, self.acct.fallbacks)
        room = len(self.topics) + len(self.agenda) + 1 - MIN_DOCTOR_TURNS
        covered = covered[: max(0, room)]
        self.agenda.remove(c for c in covered if c != topic.id)
        return topic.id in covered

    async def _ask(self) -> Phase:
        assert self.topic is not None
        last_answer = self.turns[-1]["text"] if self.turns else ""
        self.empathy = empathy = ops.empath_gen(self.persona, last_answer, self.rng_wording, recent=bool(self.empathy))
        if not self.followup:
            self.addressee = addressee(self.topic, self.companion, self.rng, self.cfg.companion.p_either)
        lay_topic = self.patient.lay.topic(self.topic)
        if self.interjected:  # the companion cut in: the doctor checks with the patient
            assert self.escort is not None  # only a companion interjects
            self.addressee = "patient"
            instruction = self.escort.after_interjection(self.topic)
        elif self.addressee == "companion" and not self.followup:
            assert self.escort is not None and self.companion is not None  # addressee() names one only if there
            instruction = self.escort.doctor_instruction(self.topic, new_topic=self.new_topic)
            lay_topic = lay_topic.replace("你", self.companion.pron)
        else:
            instruction = ops.prompt_gen(self.persona, self.topic, followup=self.followup,
                                         new_topic=self.new_topic, empathy=empathy, reask=self.reask)
        instruction += wording.avoid_note(self.turns)
        shown = []
        if self.exemplars is not None and (not self.followup or self.cfg.exemplars.followups):
            shown = self.exemplars.pick(self.case.case_id, self.topic.topic, self.topic.ask, last_answer)
        asked = instruction + instruction_block(shown, self.cfg.exemplars.answer_chars)
        try:
            self.question = await self._generate(
            "doctor", self.doctor_view(), asked, self.sp_doctor,
            {"topic": self.topic.topic, "ask": self.topic.ask, "followup": self.followup, "empathy": empathy,
             "explain": self.persona.explain, "surname": self.persona.surname, "kind": self.topic.kind,
             "reask": self.reask, "empathic": self.persona.empathy, "lay_topic": lay_topic,
             "addressee": self.addressee, "after_companion": self.interjected,
             "companion": self.companion.address if self.companion else None,
             "relation": self.companion.called if self.companion else None,
             "openers": wording.used_openers(self.turns), "suicide": wording.is_suicide_topic(self.topic),
             "asked": [t["text"] for t in self.turns if t["speaker"] == "doctor"],
             "last_answer": last_answer,
             "exemplars": [{"topic": e.topic, "question": e.question} for e in shown]},
            )
        except GuardFailure as exc:
            if not (self._may_skip() and exc.only_repeats()):
                raise
            # every attempt asked again what was asked before: the topic is taken as covered (DupDetect's
            # verdict, reached by the guards) and the interview goes on; the attempts stay in guard_events
            self.topics_skipped += 1
            self.reask = self.interjected = False
            return Phase.NEXT_TOPIC
        self.checking = last_answer if self.interjected else ""
        self.reask = self.interjected = False
        self._say("doctor", self.question, self.topic.topic,
                  asked if self.cfg.exemplars.keep_in_history else instruction)
        if shown:
            self.turns[-1]["exemplars"] = [e.id for e in shown]
        return Phase.ANSWER

    async def _answer(self) -> Phase:
        assert self.topic is not None
        if self.addressee == "companion" and self.escort is not None:
            await self._companion_says(self.escort.answer(self.topic), self.topic.topic, list(self.topic.case_fields))
            self.answer = self.turns[-1]["text"]
            self.topic_exchanges += 1
            self.exchanges += 1
            return Phase.REVIEW
        view = self.patient_view()
        trigger = await ops.trigger_exp(self.call, view, self.topic, self.sp_verdict, self.acct.fallbacks)
        instruction, context = self.patient.turn(self.topic, self.question, followup=self.followup,
                                                 empathy=bool(self.empathy), trigger=trigger, story=self.story,
                                                 triple=self.triple, checking=self.checking)
        try:
            self.answer = answer = await self._generate("patient", view, instruction, self.sp_patient, context,
                                                        topic_risk=guards.is_thought_topic(self.topic.topic))
        except GuardFailure as exc:
            if not (self._may_skip() and exc.only_echoes()):
                raise
            self._unask()  # the patient can only say again what was said: the topic is done
            return Phase.NEXT_TOPIC
        self._say("patient", answer, self.topic.topic, instruction, grounding=list(self.topic.case_fields))
        self.patient.heard(answer, self.topic)
        if self.escort is not None:  # the companion may cut in, while the doctor can still follow up
            can_follow = (self.topic_exchanges + 1 < self.cfg.max_exchanges_per_topic
                          and self.exchanges + 1 < self.cfg.max_exchanges)
            self.interjected = await self._companion_says(
                self.escort.interjection(self.topic, answer, context["affirmed"], can_follow), self.topic.topic,
                list(self.topic.case_fields))
        self.topic_exchanges += 1
        self.exchanges += 1
        return Phase.REVIEW

    async def _review(self) -> Phase:
        assert self.topic is not None and self.agenda is not None
        answer = self.answer
        if self.topic.kind == "graft" and self.topic_exchanges == 1:
            grafted = await ops.parse_exp(self.call, self.doctor_view(), self.triple, self.story, self.sp_json,
                                          self.acct.fallbacks, group=self.topic.group)
            self.agenda.insert_next(grafted)
        self.agenda.insert_next(ops.open_probes(self.topic, answer))
        cap = self.persona.cap(self.topic, self.cfg.max_exchanges_per_topic)
        if self.interjected:  # the doctor follows up on what the companion said, no verdict needed
            self.followup = True
            return Phase.ASK
        if self.exchanges < self.cfg.max_exchanges and ops.needs_reask(
                answer, self.topic_exchanges, cap, self.cfg.max_exchanges_per_topic):
            self.followup = self.reask = True  # a dodged question gets a gentle re-ask, no verdict needed
            return Phase.ASK
        if not self.agenda.allows_followup(self.exchanges) or await ops.is_topic_end(
            self.call, self.doctor_view(), self.topic, self.topic_exchanges, cap, answer, self.sp_verdict,
            self.acct.fallbacks,
        ):
            return Phase.NEXT_TOPIC
        self.followup = True
        return Phase.ASK

    async def _final(self) -> Phase:
        # spoken (lay diagnosis, plan, follow-up, safety); the labels stay exact in their columns
        self._say("doctor", spoken_closing(self.case, self.rng_wording), "诊断结果")
        return Phase.DONE

    # --- output ------------------------------------------------------------------------

    def dialogue_record(self) -> DialogueRecord:
        c, a = self.case, self.acct
        time, people, event = self.triple
        return DialogueRecord(
            dialogue_id=self.id,
            case_id=c.case_id,
            variant=self.variant,
            seed=self.seed,
            doctor_persona=self.persona.id,
            experience=self.story,
            experience_triple={"time": time, "people": people, "event": event},
            topics=list(self.topics),
            turns=[Turn.from_row(t) for t in self.turns],
            icd_code=c.icd_code,
            diagnosis=c.diagnosis,
            treatment=c.treatment,
            gender=c.gender,
            age=c.age_public,
            age_range=age_range(c.age),
            n_turns=doctor_turns(self.turns),
            n_exchanges=self.exchanges,
            engine=self.engine.name,
            model=self.engine.model,
            llm_calls=sum(a.calls.values()),
            prompt_tokens=sum(a.prompt_tokens.values()),
            output_tokens=sum(a.output_tokens.values()),
            prompt_tokens_by_role=dict(a.prompt_tokens),
            output_tokens_by_role=dict(a.output_tokens),
            fallbacks=sum(a.fallbacks.values()),
            source="mdd",
            patient_style=self.patient.style.id,
            companion=self.companion.relation if self.companion else None,
            jargon_turns=jargon_turns(self.turns),
            topic_ids=list(self.topic_ids),
            required_items=self.agenda.required_items if self.agenda is not None else [],
            items_asked=self.agenda.items_asked(self.topic_ids) if self.agenda is not None else [],
            exemplar_index=self.exemplars.source if self.exemplars is not None else None,
            guard_events=list(self.guard_events),
            regenerations=len({(e["turn"], e["speaker"], e["attempt"]) for e in self.guard_events}),
            trimmed_turns=sum(self.trimmed.values()),
            topics_skipped=self.topics_skipped,
            case_source=c.source,
            case_profile=c.profile,
            case_plan_seed=c.plan_seed,
        )

    def row(self) -> dict[str, Any]:
        """The dialogue table's row (``dialogue_record().to_row()``)."""
        return self.dialogue_record().to_row()


async def run_dialogue(case: Case, variant: int, run_seed: int, engine: EngineBase, cfg: DialogueConfig,
                       persona: ops.Persona, triple: tuple[str, str, str],
                       exemplars: ExemplarRetriever | None = None) -> tuple[dict[str, Any], Accounting]:
    d = Dialogue(case, variant, run_seed, engine, cfg, persona, triple, exemplars)
    row = await d.run()
    return row, d.acct
