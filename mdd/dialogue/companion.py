"""A companion in the room: the family member who came with the patient, a third speaker.

Who comes is decided per dialogue with its seed, consistent with the case (``companions.yaml``): a
minor (<= ``companion.minor_age``) always comes with a parent; an adult comes with someone by the
configured chance when elderly, psychotic or severely ill, or always when the record says so
(由…陪同). The relation follows the case's family and personal history: a spouse only when married,
a grown child only when there is one, a parent who is alive.

The companion has its own cached system prompt (what the family saw at home, school or work, the
early development when a parent, risk at home; all in lay words) and speaks in two ways: it answers
the doctor's questions for it (topics with ``audience: companion`` or ``either``), and it sometimes
interjects after a patient answer to add or to correct (more often when the patient played
something down that the record affirms).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.cases import Case
from mdd.config import CompanionConfig
from mdd.dialogue import prompts as P
from mdd.dialogue.lay import clip, lay
from mdd.dialogue.patient import Cues, denies, evasive, lay_facts, personal_text
from mdd.tree import Topic

_ACCOMPANIED = re.compile(r"由([^，。；,;]{1,12}?)陪同")


@lru_cache(maxsize=None)
def book() -> dict[str, Any]:
    data = knowledge.load_yaml("companions.yaml")
    if not data.get("relations"):
        raise knowledge.KnowledgeError("companions.yaml: no relations")
    return data


@dataclass(frozen=True)
class Companion:
    relation: str  # 母亲 | 父亲 | 丈夫 | 妻子 | 儿子 | 女儿
    address: str  # how the doctor addresses them
    called: str  # how the doctor refers to them talking to the patient (妈妈, 你爱人 …)
    kin: str  # what they call the patient (女儿, 丈夫 …)
    pron: str  # 他 | 她: the patient, as the companion speaks of them
    parent: bool

    @classmethod
    def of(cls, relation: str, case: Case) -> "Companion":
        r = book()["relations"][relation]
        return cls(relation=relation, address=str(r["address"]), called=str(r["called"]),
                   kin=str(r["kin"][case.gender]), pron="她" if case.gender == "女" else "他",
                   parent=bool(r.get("parent")))

    def can_answer(self, topic: Topic, case: Case) -> bool:
        """Only a parent speaks to pregnancy, birth and early development, and only when the case
        records them."""
        only = set(book().get("parent_only_fields") or ())
        if not (topic.case_fields and set(topic.case_fields) <= only):
            return True
        return self.parent and any(case.get(f).strip() not in ("", "无", "无。") for f in topic.case_fields)


def _family(case: Case) -> tuple[set[str], set[str]]:
    """(relations that exist and are alive, relations ruled out) from the case's history."""
    love = case.section("个人史", "婚恋情况")
    text = f"{case.present_illness}。{case.family_history}。{love}"
    gone = {rel for rel in ("母亲", "父亲") if re.search(f"{rel}[^，。；]{{0,4}}(去世|已故|病故|过世)", text)}
    have = set()
    if re.search(r"已婚|再婚", love) and not re.search(r"丧偶|离异|离婚", love):
        have.add("丈夫" if case.gender == "女" else "妻子")
    if re.search(r"[育有].{0,3}[一二两三]?子", love) or "儿子" in love:
        have.add("儿子")
    if re.search(r"[育有].{0,3}[一二两三]?女|女儿", love):
        have.add("女儿")
    for child, words in (("儿子", "儿子|一子"), ("女儿", "女儿|一女")):  # a child abroad does not come along
        if re.search(f"(?:{words})[^，。；]{{0,6}}(?:出国|国外|海外|外地|异地)", text):
            have.discard(child)
    if case.age < 60:
        have |= {"母亲", "父亲"} - gone
    return have, gone


def _named(case: Case) -> list[str]:
    """Relations the record says came along (由母亲陪同 / 由老伴和儿子陪同)."""
    m = _ACCOMPANIED.search(case.present_illness)
    if not m:
        return []
    words, rel = m.group(1), book()["relations"]
    out = [name for name, r in rel.items() if any(w in words for w in r["words"])
           and not (r.get("spouse_of") and r["spouse_of"] != case.gender)]
    aliases = book().get("aliases") or {}
    for w, kind in aliases.items():
        if w in words and kind == "spouse":
            out.append("丈夫" if case.gender == "女" else "妻子")
        elif w in words and kind == "parent":
            out.append("母亲")
    return list(dict.fromkeys(out))


def choose_companion(case: Case, seed: int, cfg: CompanionConfig) -> Companion | None:
    """Who, if anyone, came with the patient to this visit."""
    if not cfg.enabled:
        return None
    rng = random.Random(seed)
    have, gone = _family(case)
    named = [r for r in _named(case) if r not in gone]
    minor = case.age <= cfg.minor_age
    if not named and not minor:
        cues = Cues.of(case)
        chance = max(cfg.p_elderly if case.age >= cfg.elderly_age else 0.0,
                     cfg.p_psychotic if cues.psychosis else 0.0,
                     cfg.p_severe if any(w in case.diagnosis for w in cfg.severe_words) else 0.0)
        if rng.random() >= chance:
            return None
    if named:
        return Companion.of(rng.choice(named), case)
    parents = sorted({"母亲", "父亲"} - gone)
    lives = re.search(r"随(母亲|父亲)生活", case.present_illness + case.family_history)
    if minor and lives and lives.group(1) in parents:
        return Companion.of(lives.group(1), case)
    if minor or (case.age < 30 and not have - {"母亲", "父亲"}):
        pool = parents or ["母亲"]
        weights = [cfg.p_mother if p == "母亲" else 1 - cfg.p_mother for p in pool]
        return Companion.of(rng.choices(pool, weights=weights)[0], case)
    spouse: list[str] = [r for r in ("丈夫", "妻子") if r in have]
    children: list[str] = [r for r in ("儿子", "女儿") if r in have]
    pool = spouse or children or parents
    if case.age >= cfg.elderly_age and children and (not spouse or rng.random() < 0.5):
        pool = children
    return Companion.of(rng.choice(pool), case) if pool else None


class CompanionRole:
    """One dialogue's companion: its system prompt and, per turn, its instruction and the scripted
    engine's context. Counts its interjections."""

    def __init__(self, case: Case, who: Companion, cfg: CompanionConfig, seed: int):
        self.case, self.who, self.cfg = case, who, cfg
        self.lay = lay()
        self.rng = random.Random(seed)
        self.interjections = 0
        self.said: list[str] = []
        self.system = ""

    def _mine(self, text: str) -> str:
        """Case text as the companion says it: the record's words for them become 我."""
        for word in sorted(book()["relations"][self.who.relation]["words"], key=len, reverse=True):
            text = text.replace(word, "我")
        return text

    def system_prompt(self) -> str:
        c, w, words = self.case, self.who, self.lay
        development = ""
        if w.parent:
            dev = "；".join(x for x in (words.text(c.section("个人史", "孕产情况"), w.pron),
                                        words.text(c.section("个人史", "发育情况"), w.pron)) if x)
            development = P.COMPANION_DEVELOPMENT.format(pron=w.pron, text=dev) if dev else ""
        self.system = P.COMPANION_SYSTEM.format(
            relation=w.relation, kin=w.kin, pron=w.pron, age=c.age_public, gender=P.gender_word(c.gender),
            work=words.text(c.section("个人史", "工作、学习情况") or c.section("个人史", "工作情况"), w.pron) or "没说",
            complaint=words.text(c.complaint, w.pron), present=self._mine(words.text(c.present_illness, w.pron)),
            physical=words.text(c.physical_history, w.pron) or "没什么",
            family=words.text(c.family_history, w.pron) or "没什么",
            personal=personal_text(c, words, w.pron), development=development,
            attitude=book()["attitude"].format(kin=w.kin),
        )
        return self.system

    def _budget(self, key: str) -> int:
        lo, hi = book()[key]
        return self.rng.randint(int(lo), int(hi))

    def heard(self, text: str) -> None:
        self.said.append(text)

    def answer(self, topic: Topic) -> tuple[str, dict[str, Any]]:
        """The companion answers the doctor's question for it."""
        facts = self._mine(lay_facts(self.case, topic, self.lay, self.who.pron))
        n = self._budget("budget")
        what = self.lay.topic(topic).replace("你", self.who.pron)
        instruction = P.COMPANION_ANSWER.format(topic=what, pron=self.who.pron, length=P.length_words(n))
        return instruction, self._context(facts, n, interject=False, correct=False)

    def interjection(self, topic: Topic, answer: str, affirmed: bool,
                     can_follow: bool) -> tuple[str, dict[str, Any]] | None:
        """Whether the companion cuts in after the patient's answer, and with what: it corrects an
        answer that played down what the record affirms, or adds what it saw at home. Only while the
        doctor can still follow up on the topic (the follow-up takes the topic-end verdict's call)."""
        if self.interjections >= self.cfg.max_interjections or not can_follow:
            return None
        facts = self._mine(lay_facts(self.case, topic, self.lay, self.who.pron))
        # what the patient just said is no news: only what they left out counts
        # and only what the family saw happen: a denial is no news worth cutting in for
        facts = "，".join(c for c in re.split(r"[，,。；;]", facts)
                         if c and c.replace(self.who.pron, "我") not in answer and not denies(c))
        if not facts or topic.kind in ("experience", "graft"):
            return None
        played_down = affirmed and (evasive(answer) or denies(answer) or answer.startswith("还好"))
        if self.rng.random() >= (self.cfg.p_correct if played_down else self.cfg.p_interject):
            return None
        self.interjections += 1
        n = self._budget("interject_budget")
        how = P.COMPANION_CORRECT if played_down else P.COMPANION_ADD
        instruction = P.COMPANION_INTERJECT.format(pron=self.who.pron, how=how, length=P.length_words(n))
        return instruction, self._context(facts, n, interject=True, correct=played_down)

    def knows(self, topic: Topic) -> bool:
        return self.who.can_answer(topic, self.case)

    @staticmethod
    def required() -> tuple[str, ...]:
        """Topic ids asked whenever a companion is in the room."""
        return tuple(book().get("required_topics") or ())

    def doctor_instruction(self, topic: Topic, new_topic: bool) -> str:
        """The doctor's instruction for a question to the companion."""
        return P.DOC_TOPIC_COMPANION.format(transition=P.DOC_TRANSITION if new_topic else "",
                                            relation=self.who.relation, address=self.who.address,
                                            topic=topic.topic, ask=topic.ask or topic.topic)

    def after_interjection(self, topic: Topic) -> str:
        """The doctor's instruction after the companion cut in: check with the patient."""
        return P.DOC_AFTER_COMPANION.format(relation=self.who.called, topic=topic.topic)

    def opening(self) -> tuple[str, dict[str, Any]] | None:
        """After the patient's opening words, a companion may add what brought them here."""
        if self.rng.random() >= self.cfg.p_interject:
            return None
        self.interjections += 1
        n = self._budget("interject_budget")
        facts = self._mine(self.lay.text(self.case.present_illness, self.who.pron))
        instruction = P.COMPANION_INTERJECT.format(pron=self.who.pron, how=P.COMPANION_ADD, length=P.length_words(n))
        return instruction, self._context(clip(facts, 200), n, interject=True, correct=False)

    def _context(self, facts: str, budget: int, *, interject: bool, correct: bool) -> dict[str, Any]:
        return {"facts": facts, "budget": budget, "interject": interject, "correct": correct,
                "pron": self.who.pron, "relation": self.who.relation, "said": "".join(self.said)}


def addressee(topic: Topic, companion: Companion | None, rng: random.Random, p_either: float) -> str:
    """Who the doctor asks about ``topic``: patient or companion."""
    if companion is None or topic.audience == "patient":
        return "patient"
    if topic.audience == "companion":
        return "companion"
    return "companion" if rng.random() < p_either else "patient"
