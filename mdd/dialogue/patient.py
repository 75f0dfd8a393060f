"""The patient agent: what it is shown, turn by turn.

Everything the patient model sees from the case goes through the lay layer (``mdd/dialogue/lay.py``):
its system prompt tells its story in its own words (never the record's fields, never the mental-state
exam's labels), and each turn's instruction names what the doctor is asking about in lay words, the
answer's budget in characters and what the patient's speech style does on this turn.

Speech styles (``mdd/knowledge/styles.yaml``) are sampled per dialogue with its seed, weighted by the
case. A style sets the budget range, a tighter cap for yes/no questions, topics denied at first and
admitted when asked again, and whether the doctor's empathy makes the patient open up.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.cases import Case
from mdd.dialogue import prompts as P
from mdd.dialogue.guards import containment
from mdd.dialogue.lay import Lay, clip, lay, split_clauses
from mdd.tree import Topic, mentions

FACTS_LIMIT = 360
FACTS_SHOWN = 160  # the facts named in a turn's instruction
OPENING_SHOWN = 60  # what the patient names as the reason for coming (the opening's instruction)
SAID_SHARE = 0.6  # a fact clause whose character 4-grams were mostly said already is not shown again
_FACT_SPLIT = re.compile(r"([。；;，,]+)")


# --- styles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    id: str
    label: str
    describe: str
    budget: tuple[int, int]
    yes_no: int
    withhold: tuple[str, ...] = ()
    opens_up: bool = False
    weight: float = 1.0
    boost: tuple[dict[str, Any], ...] = ()
    requires: dict[str, Any] = field(default_factory=dict)
    excludes: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StyleBook:
    styles: dict[str, Style]
    categories: dict[str, dict[str, Any]]
    modifiers: tuple[dict[str, Any], ...]
    open_factor: float
    min_budget: int
    evasive: tuple[str, ...]
    scripted: dict[str, Any]


_CUE_KEYS = {"icd", "diagnosis_any", "exam_any", "personality_any", "age_min", "age_max", "psychosis"}


def _check_cue(cond: Any, where: str) -> dict[str, Any]:
    if not isinstance(cond, dict) or set(cond) - _CUE_KEYS - {"factor", "budget_factor"}:
        raise knowledge.KnowledgeError(f"styles.yaml {where}: a cue is a mapping of {sorted(_CUE_KEYS)}, got {cond!r}")
    return cond


@lru_cache(maxsize=None)
def style_book() -> StyleBook:
    data = knowledge.load_yaml("styles.yaml")
    styles = {}
    for sid, d in (data.get("styles") or {}).items():
        lo, hi = (int(x) for x in d["budget"])
        if not 0 < lo <= hi:
            raise knowledge.KnowledgeError(f"styles.yaml {sid}.budget: expected [low, high] with 0 < low <= high")
        unknown = set(d.get("withhold") or ()) - set(data.get("categories") or {})
        if unknown:
            raise knowledge.KnowledgeError(f"styles.yaml {sid}.withhold: unknown categories {sorted(unknown)}")
        styles[sid] = Style(
            id=sid, label=str(d.get("label", sid)), describe=str(d["describe"]), budget=(lo, hi),
            yes_no=int(d.get("yes_no", hi)), withhold=tuple(d.get("withhold") or ()),
            opens_up=bool(d.get("opens_up", False)), weight=float(d.get("weight", 1.0)),
            boost=tuple(_check_cue(b, f"{sid}.boost") for b in d.get("boost") or ()),
            requires=_check_cue(d.get("requires") or {}, f"{sid}.requires"),
            excludes=tuple(_check_cue(b, f"{sid}.excludes") for b in d.get("excludes") or ()),
        )
    if not styles:
        raise knowledge.KnowledgeError("styles.yaml: no styles")
    return StyleBook(
        styles=styles, categories=dict(data.get("categories") or {}),
        modifiers=tuple(_check_cue(m, "modifiers") for m in data.get("modifiers") or ()),
        open_factor=float(data.get("open_factor", 1.5)), min_budget=int(data.get("min_budget", 2)),
        evasive=tuple(data.get("evasive") or ()), scripted=dict(data.get("scripted") or {}),
    )


@dataclass(frozen=True)
class Cues:
    """What the case says that a style may depend on."""

    icd: tuple[str, ...]
    diagnosis: str
    exam: str
    personality: str
    age: int
    psychosis: bool

    @classmethod
    def of(cls, case: Case) -> "Cues":
        exam = case.get("精神检查")
        perception, thought = case.section("精神检查", "感知"), case.section("精神检查", "思维")
        psychotic = any(c.startswith("F2") for c in case.icd_codes) or "精神病性" in case.diagnosis or \
            mentions(perception, ("幻听", "幻视", "幻觉")) or mentions(thought, ("妄想",))
        return cls(icd=case.icd_codes, diagnosis=case.diagnosis, exam=exam,
                   personality=case.section("个人史", "病前性格"), age=case.age, psychosis=psychotic)

    def hold(self, cond: dict[str, Any]) -> bool:
        """Every key of the cue holds (an empty cue holds)."""
        checks = {
            "icd": lambda v: any(c.startswith(tuple(v)) for c in self.icd),
            "diagnosis_any": lambda v: any(w in self.diagnosis for w in v),
            "exam_any": lambda v: mentions(self.exam, v),
            "personality_any": lambda v: any(w in self.personality for w in v),
            "age_min": lambda v: self.age >= int(v),
            "age_max": lambda v: self.age <= int(v),
            "psychosis": lambda v: self.psychosis == bool(v),
        }
        return all(checks[k](v) for k, v in cond.items() if k in checks)


def style_weights(case: Case) -> dict[str, float]:
    """Each style's sampling weight for this case (0: ruled out)."""
    cues = Cues.of(case)
    out = {}
    for s in style_book().styles.values():
        w = s.weight
        if not cues.hold(s.requires) or any(cues.hold(x) for x in s.excludes):
            w = 0.0
        for b in s.boost:
            if cues.hold(b):
                w *= float(b["factor"])
        out[s.id] = w
    return out


def choose_style(case: Case, seed: int) -> Style:
    weights = style_weights(case)
    ids = [k for k, w in weights.items() if w > 0]
    pick = random.Random(seed).choices(ids, weights=[weights[k] for k in ids])[0]
    return style_book().styles[pick]


def budget_factor(case: Case) -> float:
    """The case's scaling of every answer budget (slowed thinking, severe illness → shorter)."""
    cues, f = Cues.of(case), 1.0
    for m in style_book().modifiers:
        if cues.hold(m):
            f *= float(m["budget_factor"])
    return f


_WH = re.compile(r"什么|怎么|怎样|多久|多长|多少|哪|为什么|几|如何|讲讲|说说|谈谈|描述")
_YES_NO = re.compile(r"有没有|是不是|会不会|能不能|要不要|是否|有无|对不对|吗[？?]")


def is_yes_no(question: str) -> bool:
    """A closed question (有没有… / …吗？) without an open one beside it."""
    return bool(_YES_NO.search(question or "")) and not _WH.search(question or "")


def evasive(answer: str) -> bool:
    """An answer that dodges the question (还好吧 / 不记得了 …): the doctor re-asks gently."""
    a = (answer or "").strip()
    return len(a) <= 12 and any(e in a for e in style_book().evasive)


# an answer that opens by denying (没有 / 这个倒没有 / 应该没有吧 / 不会 …): what the patient said no to
_DENIES = re.compile(r"^(?:[嗯哎唉]|这个|倒|真|应该|好像|其实|说实话|[，,…。 ])*(?:没有|没|不会|不是|从来没有|从没)")
_SINCE = re.compile(r"(?:\d+|[一二两三四五六七八九十半]+)\s*(?:多|余)?(?:个月|年|周|天|个星期)(?:多)?")


def denies(answer: str) -> bool:
    return bool(_DENIES.match(answer or ""))


def since(complaint: str) -> str:
    """How long the complaint has lasted, as the record says it (the last duration in it: 1年, 6个月), or ""."""
    found = _SINCE.findall(complaint or "")
    return found[-1] if found else ""


def category(topic: Topic) -> str | None:
    text = f"{topic.topic} {topic.ask} {topic.lay}"
    for name, c in style_book().categories.items():
        if any(w in text for w in c.get("any") or ()):
            return name
    return None


# --- the role ----------------------------------------------------------------------------------


def personal_text(case: Case, l: Lay, who: str = "我") -> str:
    labels = knowledge.load_yaml("lay_terms.yaml").get("personal_labels") or {}
    if isinstance(case.personal, str):
        return l.text(case.personal, who)
    parts = []
    for key, label in labels.items():
        v = l.text(case.personal.get(key, ""), who)
        if v and v not in ("无", "无。"):
            parts.append(f"{label}：{v.rstrip('。')}")
    return "；".join(parts) or "没什么特别的"


def lay_facts(case: Case, topic: Topic, l: Lay, who: str = "我", limit: int = FACTS_LIMIT) -> str:
    """What the case says on a topic, in lay words: every clause of the topic's narrow fields (a
    personal-history sub-field, the family history …) and the clauses of the broad ones (主诉, 现病史,
    the exam's 思维 … : ``broad_fields`` in lay_terms.yaml) that name the topic by one of its specific
    keywords (a ``weak_keywords`` word such as 以前 or 药 counts only for a topic that has no other).
    Whole clauses, at most ``limit`` characters. Empty: the case says nothing on it."""
    terms = knowledge.load_yaml("lay_terms.yaml")
    words = lay_keywords(topic, l)
    strong = tuple(k for k in words if k not in set(terms.get("weak_keywords") or ())) or words
    broad = set(terms.get("broad_fields") or ())
    out: list[str] = []
    for f in topic.case_fields:
        text = l.text(case.get(f), who).rstrip("。；;，, ")
        if not text or text in ("无", "无特殊", "没什么特别的"):
            continue
        clauses = [c + sep[:1] for c, sep in split_clauses(text + "。", _FACT_SPLIT) if c.strip("。；;，, ")]
        if f in broad:
            clauses = [c for c in clauses if any(k in c for k in strong)]
        out.extend(c for c in clauses if c not in out)
    return clip("".join(out).rstrip("，,；;"), limit)


def lay_keywords(topic: Topic, l: Lay) -> tuple[str, ...]:
    """A topic's keywords and their lay forms (早醒 → 天不亮就醒)."""
    out = list(topic.keywords)
    for k in topic.keywords:
        t = l.term_pattern.sub(lambda m: l.terms[m.group(0)], k)
        if t and t != k:
            out.append(t)
    return tuple(dict.fromkeys(out))


class PatientRole:
    """One dialogue's patient: its system prompt, and per turn its instruction and the context a
    scripted engine answers from. Holds the style's state (opened up, topics asked, what was said)."""

    def __init__(self, case: Case, style: Style, seed: int):
        self.case, self.style, self.lay = case, style, lay()
        self.book = style_book()
        self.rng = random.Random(seed)
        self.factor = budget_factor(case)
        self.opened = False
        self.asked: Counter = Counter()
        self.withheld: set[str] = set()
        self.said: list[str] = []
        # per topic id: what the patient said on it, and whether that affirmed it (yes) or denied it (no)
        self.told: dict[str, list[str]] = {}
        self.stance: dict[str, str] = {}
        self.companion = ""  # how the patient calls the family member in the room (我妈, 我爱人 …)
        self.since = since(self.lay.text(case.complaint))
        self.system = ""

    # the stable part: built once the experience is told
    def system_prompt(self, triple: tuple[str, str, str], story: str, companion: str | None = None) -> str:
        c, l = self.case, self.lay
        time, people, event = triple
        withhold = "、".join(self.book.categories[w]["label"] for w in self.style.withhold)
        if companion:
            self.companion = str(knowledge.load_yaml("companions.yaml")["relations"][companion].get("mine", companion))
        self.system = P.PATIENT_SYSTEM.format(
            age=c.age_public, gender=P.gender_word(c.gender),
            work=l.text(c.section("个人史", "工作、学习情况") or c.section("个人史", "工作情况")) or "没说",
            complaint=l.text(c.complaint),
            physical=l.text(c.physical_history) or "没什么", family=l.text(c.family_history) or "没什么",
            personal=personal_text(c, l), appearance=l.appearance(c) or "看起来和平常差不多",
            time=time, people=people, event=l.text(event), story=l.text(story),
            companion=P.PAT_COMPANION.format(relation=companion) if companion else "",
            style=self.style.describe.format(withhold=withhold or "有些事"),
        )
        return self.system

    def budget(self, yes_no: bool = False) -> int:
        lo, hi = self.style.budget
        n = self.rng.randint(lo, hi) * self.factor
        if yes_no:
            n = min(n, self.style.yes_no * self.factor)
        if self.opened:
            n *= self.book.open_factor
        return max(self.book.min_budget, int(round(n)))

    def heard(self, answer: str, topic: Topic | None = None) -> None:
        """What the patient said (it is not repeated), and on ``topic`` whether it affirmed or denied it
        (once affirmed, a topic stays affirmed: the patient does not go back on it)."""
        self.said.append(answer)
        if topic is not None:
            self.told.setdefault(topic.id, []).append(answer)
            if self.stance.get(topic.id) != "yes" and not evasive(answer):
                self.stance[topic.id] = "no" if denies(answer) else "yes"

    def opening(self) -> tuple[str, dict[str, Any]]:
        n = self.budget()
        present = self.lay.text(self.case.present_illness)
        ctx = {"opening": True, "style": self.style.id, "budget": n, "complaint": self.lay.text(self.case.complaint),
               "facts": clip(present, 300)}
        reason = self.lay.text(self.case.complaint).rstrip("。") + "；" + clip(present, OPENING_SHOWN).rstrip("。")
        return P.PAT_OPENING.format(facts=reason, length=P.length_words(n)), ctx

    def unsaid(self, facts: str) -> tuple[str, str]:
        """The fact clauses not said yet in this dialogue (by containment of their character 4-grams in
        what the patient said), and the first words of one that was (named so it is not said again)."""
        said = "".join(self.said)
        fresh, told = [], ""
        for c, sep in split_clauses(facts):
            if not c.strip():
                continue
            if said and containment(c, said) >= SAID_SHARE:
                told = told or c.strip()[:12]
            else:
                fresh.append(c + sep)
        return "".join(fresh).strip("，,；; "), told

    def turn(self, topic: Topic, question: str, *, followup: bool, empathy: bool, trigger: bool,
             story: str, triple: tuple[str, str, str], checking: str = "") -> tuple[str, dict[str, Any]]:
        """The instruction for this answer and the scripted engine's context. ``checking``: the
        companion's words the doctor is checking with the patient."""
        if empathy and self.style.opens_up:
            self.opened = True
        facts = lay_facts(self.case, topic, self.lay)
        words = lay_keywords(topic, self.lay)
        affirmed = bool(facts) and (not words or mentions(facts, words))  # 没有听到… affirms nothing
        yes_no = is_yes_no(question)
        n = self.budget(yes_no)
        cat = category(topic)
        self.asked[topic.id] += 1
        withhold = affirmed and cat in self.style.withhold and not self.opened and self.asked[topic.id] == 1
        admit = not withhold and topic.id in self.withheld
        if withhold:
            self.withheld.add(topic.id)
        fresh, told = self.unsaid(facts)
        cues = [] if topic.kind in ("experience", "graft") else \
            [P.PAT_FACTS.format(facts=clip(fresh, FACTS_SHOWN).rstrip("。")) if fresh else
             P.PAT_SAID.format(said=told) if told else P.PAT_NO_FACTS]
        if withhold:
            cues.append(P.PAT_WITHHOLD)
        elif admit:
            cues.append(P.PAT_ADMIT)
        elif self.opened and self.style.opens_up:
            cues.append(P.PAT_OPENED)
        if yes_no:
            cues.append(P.PAT_YES_NO)
        if trigger:
            cues.append(P.PAT_EXPERIENCE)
        instruction = P.PAT_TOPIC.format(topic=self.lay.topic(topic), cues="".join(cues), length=P.length_words(n))
        ctx = {
            "topic": topic.topic, "keywords": list(words), "facts": facts, "affirmed": affirmed,
            "experience": self.lay.text(story), "trigger": trigger, "kind": topic.kind, "followup": followup,
            "triple": dict(zip(("time", "people", "event"), triple)), "style": self.style.id, "budget": n,
            "yes_no": yes_no, "withhold": withhold, "admit": admit, "opened": self.opened,
            "said": "".join(self.said), "body": self.lay.text(self.case.section("精神检查", "躯体症状")),
            "question": question, "what": self.lay.topic(topic).replace("你", "我"),
            "told": "".join(self.told.get(topic.id, ())), "stance": self.stance.get(topic.id, ""),
            "checking": checking, "companion": self.companion, "since": self.since,
            "story": self.lay.text(self.case.present_illness),
        }
        return instruction, ctx
