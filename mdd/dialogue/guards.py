"""Turn guards: what a generated turn must not do, one named function per failure.

A trained model in a long dialogue loop can lose its role (a doctor who greets the patient as a
doctor, a patient who answers like an assistant), copy the other side, loop on one clause, say its
prompt's instructions aloud, stop at the token limit mid-sentence, ask the same question again,
drift out of spoken Chinese, or contradict the case record (deny the suicidal thoughts the record
documents, invent drinking). The dialogue loop checks every generated turn with ``check`` and
regenerates a failing one (``mdd/dialogue/loop.py``); the evaluator runs the same checks over any
dialogue as signals (``mdd/evaluate/``).

Each guard takes a ``Turn`` (the text and what it is checked against) and returns a ``Failure``
(its name and a one-line reason) or ``None``. Thresholds and word lists are data
(``mdd/knowledge/guards.yaml``). A guard never sees the model or the engine: it is a pure function
of text, so the same checks hold for any model and any prompt layout.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from mdd import knowledge
from mdd.config import GUARDS  # noqa: F401 (the guard names: the config checks guards.enabled against them)

SPEAKERS = ("doctor", "patient", "companion")
_PUNCT = re.compile(r"[\s，,。.、；;：:！!？?…“”\"'‘’（）()《》〈〉【】\[\]~～—\-]+")
_CLAUSE = re.compile(r"[，,。；;！!？?…\n]+")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True, slots=True)
class Failure:
    guard: str
    reason: str
    detail: str = ""  # what a corrective note names (faithfulness: thoughts, acts, invented:<kind>, ruled_out)

    def __str__(self) -> str:
        return f"{self.guard}: {self.reason}"


@dataclass(frozen=True)
class RecordFacts:
    """What the case record says that a turn can contradict: the risks it documents (``thoughts`` of
    dying, self-harm ``acts``: the clauses that document them), the risks it rules out (否认消极观念),
    and the substances or earlier hospital stays it documents."""

    risks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ruled_out: frozenset[str] = frozenset()
    documented: frozenset[str] = frozenset()

    @classmethod
    def of(cls, fields: dict[str, str]) -> "RecordFacts":
        """``fields``: the record's text by field path (``现病史``, ``精神检查.思维`` …)."""
        f = _book()["faithfulness"]
        keep = tuple(f["record_fields"])
        clauses = _clauses("。".join(v for k, v in fields.items() if k.split(".", 1)[0] in keep and v))
        risks: dict[str, tuple[str, ...]] = {}
        ruled_out = set()
        for kind, words in f["risk"].items():
            hits = [c for c in clauses if _named(c, words["record"]) is True]
            if hits:
                risks[kind] = tuple(hits)
            elif any(_named(c, words["record"]) is False for c in clauses) and not any(
                    re.search(f["uncertain"], c) and _named(c, words["record"], uncertain=True) for c in clauses):
                ruled_out.add(kind)  # denied, and not even suspected elsewhere
        documented = {kind for kind, words in f["kinds"].items()
                      if any(_named(c, words["record"]) is True for c in clauses)}
        return cls(risks=risks, ruled_out=frozenset(ruled_out), documented=frozenset(documented))


@dataclass(frozen=True)
class Turn:
    """A generated turn and what it is checked against."""

    speaker: str  # doctor | patient | companion | story (the fictitious experience)
    text: str
    finish_reason: str | None = "stop"  # None: the engine did not say
    previous: str = ""  # the other side's last turn (the doctor: the last answer; the others: the question)
    own: tuple[str, ...] = ()  # the speaker's earlier turns in this dialogue
    asked: tuple[str, ...] = ()  # the doctor's earlier turns (for the doctor's repeat guard)
    topic_risk: bool = False  # the question asks about thoughts of dying (its answer must not open with a no)
    record: RecordFacts | None = None  # None: nothing to check faithfulness against


# --- the data ---------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _book() -> dict[str, Any]:
    return knowledge.load_yaml("guards.yaml")


@lru_cache(maxsize=None)
def _compiled() -> dict[str, Any]:
    b = _book()
    r, f = b["role"], b["faithfulness"]
    return {
        "doctor_addresses_doctor": re.compile(r["doctor_addresses_doctor"]),
        "doctor_complains": re.compile(r["doctor_complains"]),
        "patient_as_doctor": _alternation(r["patient_as_doctor"]),
        "assistant": _alternation(r["assistant"]),
        "assistant_patient": _alternation(r["assistant_patient"]),
        "label": re.compile(r["label"]),
        "leak": _alternation(list(b["leak"]["markers"]) + list(template_fragments(int(b["leak"]["fragment_chars"])))),
        "markup": _alternation(b["language"]["markup"]),
        "risk": {k: _alternation(v["turn"]) for k, v in f["risk"].items()},
        "no_thoughts": re.compile(f["no_thoughts"]),
        "denial_start": re.compile(f["denial_start"]),
        "turn_negation": re.compile(f["turn_negation"]),
        "others": re.compile(f["others"]),
        "companion_patient": re.compile(f["companion_patient"]),
        "kinds": {k: _alternation(v["turn"]) for k, v in f["kinds"].items()},
    }


def _alternation(terms: Iterable[str]) -> re.Pattern:
    terms = sorted({str(t) for t in terms if str(t)}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in terms) or r"(?!x)x")


def template_fragments(min_chars: int) -> tuple[str, ...]:
    """The fixed wording of every prompt template (``mdd/dialogue/prompts.py``): the parts between
    placeholders and line breaks, cut at clause marks, of ``min_chars`` or more characters. A spoken
    turn that holds one says its instructions aloud."""
    from mdd.dialogue import prompts as P

    out: set[str] = set()
    for name in dir(P):
        value = getattr(P, name)
        if not (name.isupper() and isinstance(value, str)):
            continue
        # examples the template gives in brackets or quotes are meant to be said: not prompt text
        value = re.sub(r"（[^（）]*）|“[^“”]*”|\([^()]*\)", "", value)
        for part in re.split(r"\{[^}]*\}|\n", value):
            for piece in re.split(r"[，,。；;：:！!？?（）()“”「」【】、]", part):
                piece = piece.strip()
                if len(piece) >= min_chars and _CJK.search(piece):
                    out.add(piece)
    return tuple(sorted(out))


# --- text helpers -------------------------------------------------------------------------------


def _bare(text: str) -> str:
    return _PUNCT.sub("", text or "")


def _clauses(text: str) -> list[str]:
    return [c for c in _CLAUSE.split(text or "") if c.strip()]


def _grams(text: str, n: int) -> list[str]:
    t = _bare(text)
    return [t[i:i + n] for i in range(len(t) - n + 1)] if len(t) >= n else ([t] if t else [])


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def containment(text: str, other: str, n: int = 4) -> float:
    """The share of ``text``'s character n-grams that occur in ``other`` (punctuation ignored)."""
    grams = _grams(text, n)
    if not grams or not other:
        return 0.0
    pool = set(_grams(other, n))
    return sum(1 for g in grams if g in pool) / len(grams)


def _named(clause: str, words: Sequence[str], uncertain: bool = False) -> bool | None:
    """Whether ``clause`` names one of ``words`` without a negation before it (True), only negated
    (False), or not at all (None)."""
    f = _book()["faithfulness"]
    if re.search(f["uncertain"], clause) and not uncertain:
        return None
    neg = re.compile(f["negation_before"])
    seen = False
    for w in words:
        start = clause.find(w)
        while start >= 0:
            seen = True
            if not neg.search(clause[:start]):
                return True
            start = clause.find(w, start + 1)
    return False if seen else None


# --- the guards -------------------------------------------------------------------------------------


def role(t: Turn) -> Failure | None:
    """A turn spoken from the wrong side: the doctor greets the patient as a doctor or complains like a
    patient; the patient or companion speaks as the clinician or as a chat assistant; any turn that
    writes speaker labels (more than one speaker's lines)."""
    c = _compiled()
    text = t.text or ""
    m = c["label"].search(text)
    if m:
        return Failure("role", f"speaker label {m.group(0).strip()!r} in the turn")
    if t.speaker == "doctor":
        m = c["doctor_addresses_doctor"].search(text)
        if m:
            return Failure("role", f"the doctor addresses the patient as a doctor ({m.group(0).strip()!r})")
        m = c["doctor_complains"].search(text)
        if m and not re.search(r"[？?吗]", text):
            return Failure("role", f"the doctor speaks as a patient ({m.group(0)!r}) and asks nothing")
    elif t.speaker in ("patient", "companion"):
        m = c["patient_as_doctor"].search(text)
        if m:
            return Failure("role", f"the {t.speaker} speaks as a clinician ({m.group(0)!r})")
        m = c["assistant_patient"].search(text)
        if m:
            return Failure("role", f"the {t.speaker} speaks as an assistant ({m.group(0)!r})")
    m = c["assistant"].search(text)
    if m:
        return Failure("role", f"the {t.speaker} speaks as an assistant ({m.group(0)!r})")
    return None


def echo(t: Turn) -> Failure | None:
    """A turn that copies the other side's last turn (starts with its first characters, or most of it is
    theirs), or repeats one of the speaker's own earlier turns."""
    e = _book()["echo"]
    text = _bare(t.text)
    if len(text) < int(e["min_chars"]):
        return None
    n = int(e["ngram"])
    prev = _bare(t.previous)
    fillers = re.compile(e["fillers"])
    same = _common_prefix(fillers.sub("", text), fillers.sub("", prev))
    k = int(e["doctor_prefix_chars"] if t.speaker == "doctor" else e["prefix_chars"])
    if same >= max(int(e["min_prefix"]), min(k, len(fillers.sub("", prev)))):
        return Failure("echo", f"starts with the other side's words ({fillers.sub('', prev)[:same]!r})")
    share = float(e["doctor_other_share"] if t.speaker == "doctor" else e["other_share"])
    if prev and containment(text, prev, n) >= share:
        return Failure("echo", f"{containment(text, prev, n):.0%} of it copies the other side's last turn")
    for earlier in t.own if len(text) >= int(e["own_min_chars"]) else ():
        if containment(text, earlier, n) >= float(e["own_share"]):
            return Failure("echo", f"repeats an earlier turn of its own ({_bare(earlier)[:12]!r}…)", "own")
    return None


def loop(t: Turn) -> Failure | None:
    """A repeated run: a unit of a few characters back to back, or one clause said again and again."""
    lp = _book()["loop"]
    text = _bare(t.text)
    unit, times = int(lp["min_unit"]), int(lp["back_to_back"])
    m = re.search(r"(.{%d,40}?)\1{%d,}" % (unit, times - 1), text) or \
        re.search(r"(.{%d,80}?)\1" % int(lp["long_unit"]), text) or \
        re.search(r"(.{2,3}?)\1{%d,}" % (int(lp["short_repeats"]) - 1), text)
    if m:
        return Failure("loop", f"{m.group(1)!r} {len(m.group(0)) // len(m.group(1))} times in a row")
    counts: dict[str, int] = {}
    for c in _clauses(t.text):
        b = _bare(c)
        if len(b) >= int(lp["clause_chars"]):
            counts[b] = counts.get(b, 0) + 1
    for b, n in counts.items():
        if n >= int(lp["clause_repeats"]) or (len(b) >= int(lp["long_clause_chars"])
                                              and n >= int(lp["long_clause_repeats"])):
            return Failure("loop", f"the clause {b[:16]!r} {n} times")
    return None


def leak(t: Turn) -> Failure | None:
    """The prompt said aloud: bracketed instructions, answer budgets, the record's field names, the
    templates' own wording."""
    m = _compiled()["leak"].search(t.text or "")
    return Failure("leak", f"prompt text in the turn ({m.group(0)!r})") if m else None


def truncation(t: Turn) -> Failure | None:
    """Stopped at the token limit in the middle of a sentence."""
    if t.finish_reason != "length":
        return None
    end = _book()["truncation"]["sentence_end"]
    text = (t.text or "").rstrip()
    if text and text[-1] in end:
        return None
    return Failure("truncation", f"cut at the token limit mid-sentence (…{text[-8:]!r})")


def trim_to_sentence(text: str, finish_reason: str | None, min_chars: int = 8) -> str | None:
    """A turn stopped at the token limit, cut back to its last whole sentence (what a reader would keep);
    ``None`` when it was not cut, or when less than ``min_chars`` would be left (the truncation guard
    then judges it)."""
    if finish_reason != "length":
        return None
    end = _book()["truncation"]["sentence_end"]
    text = (text or "").rstrip()
    cut = max((i for i, ch in enumerate(text) if ch in end), default=-1)
    kept = text[:cut + 1] if cut >= 0 else ""
    return kept if len(_bare(kept)) >= min_chars and kept != text else None


def repeat(t: Turn) -> Failure | None:
    """The doctor asks again what it asked before."""
    if t.speaker != "doctor":
        return None
    r = _book()["repeat"]
    if len(_bare(t.text)) < int(r["min_chars"]):
        return None
    for q in t.asked:
        share = containment(t.text, q, int(r["ngram"]))
        if share >= float(r["share"]):
            return Failure("repeat", f"{share:.0%} of it repeats an earlier question ({_bare(q)[:12]!r}…)")
    return None


def language(t: Turn) -> Failure | None:
    """Not spoken Chinese: markup or code, Latin runs, too few Chinese characters."""
    lg = _book()["language"]
    text = t.text or ""
    if not _CJK.search(text):
        return Failure("language", "no Chinese words" if text.strip() else "an empty turn")
    m = _compiled()["markup"].search(text)
    if m:
        return Failure("language", f"markup in the turn ({m.group(0).strip()!r})")
    cjk = len(_CJK.findall(text))
    units = set(lg["units"])
    latin = sum(len(w) for w in _LATIN_WORD.findall(text) if w not in units)
    if cjk + latin and cjk / (cjk + latin) < float(lg["min_cjk_share"]):
        return Failure("language", f"{cjk} Chinese characters against {latin} Latin letters")
    run = re.search(r"(?:[A-Za-z]+[\s,.'-]+){%d,}[A-Za-z]+" % int(lg["max_latin_run"]), text)
    if run:
        return Failure("language", f"a run of Latin words ({run.group(0)[:20]!r})")
    return None


def faithfulness(t: Turn) -> Failure | None:
    """The patient or companion against the record: a risk the record documents denied (thoughts of dying,
    self-harm acts), a risk it rules out affirmed (the patient only: a relative may fear more than there
    is), a substance or an earlier hospital stay the record does not document affirmed."""
    if t.record is None or t.speaker not in ("patient", "companion"):
        return None
    c, rec = _compiled(), t.record
    text = t.text or ""
    clauses = _clauses(text)
    for kind, pattern in c["risk"].items():
        said = [cl for cl in clauses if pattern.search(cl)]
        affirmed = [cl for cl in said if not _denies_risk(cl, pattern)]
        denied = [cl for cl in clauses if _denies_risk(cl, pattern)]
        if kind in rec.risks:
            if denied and not affirmed:
                return Failure("faithfulness", f"denies {kind} the record documents ({denied[0][:16]!r})", kind)
            if kind == "thoughts" and t.topic_risk and c["denial_start"].match(text) and not affirmed:
                return Failure("faithfulness", "answers no to thoughts of dying the record documents", kind)
        elif kind in rec.ruled_out and affirmed and t.speaker == "patient":
            return Failure("faithfulness", f"affirms {kind} the record rules out ({affirmed[0][:16]!r})",
                           "ruled_out")
    own = [cl for cl in clauses if (c["companion_patient"].search(cl) if t.speaker == "companion"
                                    else not c["others"].search(cl))]
    for kind, pattern in c["kinds"].items():
        if kind in rec.documented:
            continue
        for cl in own:
            m = pattern.search(cl)
            if m and not c["turn_negation"].search(cl):
                return Failure("faithfulness", f"invents {kind} ({m.group(0)!r}) the record does not document",
                               f"invented:{kind}")
    return None


def _denies_risk(clause: str, pattern: re.Pattern) -> bool:
    """A clause that says there was none (没有那种念头 / 没想过死 / 不想自杀 / 没有伤害过自己)."""
    if _compiled()["no_thoughts"].search(clause):
        return True
    m = pattern.search(clause)
    return m is not None and bool(re.search(_book()["faithfulness"]["turn_negation_before"], clause[:m.start()]))


CHECKS: dict[str, Callable[[Turn], Failure | None]] = {
    "role": role, "echo": echo, "loop": loop, "leak": leak, "truncation": truncation, "repeat": repeat,
    "language": language, "faithfulness": faithfulness,
}


def check(t: Turn, enabled: Iterable[str] = GUARDS) -> list[Failure]:
    """Every enabled guard's failure on ``t`` (empty: the turn holds up)."""
    return [f for name in enabled if (f := CHECKS[name](t)) is not None]


def is_thought_topic(topic: str) -> bool:
    """A topic whose answer says whether there were thoughts of dying (its answer must not open with a
    no when the record documents them)."""
    return topic in _book()["faithfulness"]["thought_topics"]


def note(f: Failure, speaker: str, facts: Callable[[str], str] = lambda kind: "") -> str:
    """The corrective note for a turn asked again after ``f`` (``facts(kind)``: the record's words for
    a documented risk, in the speaker's own words)."""
    notes = _book()["notes"]
    n = notes[f.guard]
    if f.guard == "role":
        return n.get(speaker, n["patient"])
    if f.guard == "faithfulness":
        if f.detail.startswith("invented:"):
            return n["invented"].format(what=notes["kind_words"].get(f.detail.split(":", 1)[1], "这方面"))
        return n.get(f.detail, n["ruled_out"]).format(facts=facts(f.detail) or "")
    return n


def strip_label(text: str, speaker: str, names: Sequence[str] = ()) -> str:
    """The turn without one leading label of its own speaker (医生：…, 患者：…, 孙医生：…) and
    without wrapping quotes: formatting, not content."""
    own = {"doctor": ["医生", "大夫", *[f"{n}医生" for n in names]], "patient": ["患者", "病人", "我"],
           "companion": list(names)}.get(speaker, [])
    text = (text or "").strip()
    for label in sorted(own, key=len, reverse=True):
        for sep in ("：", ":"):
            if label and text.startswith(label + sep):
                text = text[len(label) + 1:].strip()
                break
    if len(text) >= 2 and text[0] in "“\"「" and text[-1] in "”\"」" and text.count(text[0]) <= 1:
        text = text[1:-1].strip()
    return text


# --- over whole dialogues (the evaluator, imports) -------------------------------------------------


@dataclass
class TurnVerdicts:
    """Each turn's failures by index (turns a guard does not apply to have none)."""

    failures: dict[int, list[Failure]] = field(default_factory=dict)

    def failed(self, i: int) -> bool:
        return bool(self.failures.get(i))


def check_dialogue(turns: Sequence[dict[str, Any]], record: RecordFacts | None = None,
                   risk_topic: Callable[[str], bool] | None = None,
                   enabled: Iterable[str] = GUARDS) -> TurnVerdicts:
    """Run the guards over a finished dialogue's turns (the closing turn is the project's template and
    is skipped; so are turns of speakers the guards do not know). ``risk_topic(topic)`` tells a
    suicide or self-harm topic by its name."""
    enabled = tuple(g for g in enabled if g != "truncation")  # a finished row keeps no finish reason
    out = TurnVerdicts()
    own: dict[str, list[str]] = {s: [] for s in SPEAKERS}
    last = {"doctor": "", "answer": ""}
    for i, t in enumerate(turns):
        sp, text = t.get("speaker"), str(t.get("text") or "")
        if sp not in SPEAKERS:
            continue
        if sp == "doctor" and t.get("topic") == "诊断结果":
            continue
        previous = last["answer"] if sp == "doctor" else last["doctor"]
        topic = str(t.get("topic") or "")
        fails = check(Turn(speaker=sp, text=text, previous=previous, own=tuple(own[sp]),
                           asked=tuple(own["doctor"]) if sp == "doctor" else (),
                           topic_risk=bool(risk_topic and risk_topic(topic)), record=record), enabled)
        if fails:
            out.failures[i] = fails
        own[sp].append(text)
        if sp == "doctor":
            last["doctor"] = text
        else:
            last["answer"] = text
    return out


# --- a run's tally -----------------------------------------------------------------------------------


@dataclass
class GuardTally:
    """A run's guard figures (``run.json["guards"]``): turns generated by speaker; by speaker and guard
    the turns whose first attempt failed, every failed attempt, and the turns that still failed after
    every regeneration (each ended its dialogue); dialogues by outcome."""

    generated: dict[str, int] = field(default_factory=dict)
    first_attempt: dict[str, dict[str, int]] = field(default_factory=dict)
    attempts: dict[str, dict[str, int]] = field(default_factory=dict)
    final: dict[str, dict[str, int]] = field(default_factory=dict)
    failed_by_guard: dict[str, int] = field(default_factory=dict)
    dialogues: int = 0
    regenerated: int = 0  # dialogues written clean after at least one regeneration
    failed: int = 0  # dialogues a guard ended

    @staticmethod
    def _bump(d: dict[str, dict[str, int]], speaker: str, guard: str) -> None:
        d.setdefault(speaker, {})
        d[speaker][guard] = d[speaker].get(guard, 0) + 1

    def add(self, generated: dict[str, int], events: Sequence[dict[str, Any]],
            failed: tuple[str, Sequence[str]] | None = None) -> None:
        """One dialogue: its generated turns by speaker, its failed attempts and, when a guard ended it,
        the speaker and the guards of its last turn."""
        self.dialogues += 1
        for k, v in (generated or {}).items():
            self.generated[k] = self.generated.get(k, 0) + int(v)
        for _, speaker, guard in sorted({(e["turn"], e["speaker"], e["guard"]) for e in events or ()
                                         if e["attempt"] == 0}):
            self._bump(self.first_attempt, speaker, guard)
        for e in events or ():
            self._bump(self.attempts, e["speaker"], e["guard"])
        if failed is None:
            self.regenerated += bool(events)
            return
        self.failed += 1
        speaker, names = failed
        for g in names:
            self._bump(self.final, speaker, g)
            self.failed_by_guard[g] = self.failed_by_guard.get(g, 0) + 1

    def merge(self, other: "GuardTally") -> None:
        for k, v in other.generated.items():
            self.generated[k] = self.generated.get(k, 0) + v
        for mine, theirs in ((self.first_attempt, other.first_attempt), (self.attempts, other.attempts),
                             (self.final, other.final)):
            for sp, by in theirs.items():
                for g, n in by.items():
                    mine.setdefault(sp, {})
                    mine[sp][g] = mine[sp].get(g, 0) + n
        for g, n in other.failed_by_guard.items():
            self.failed_by_guard[g] = self.failed_by_guard.get(g, 0) + n
        self.dialogues += other.dialogues
        self.regenerated += other.regenerated
        self.failed += other.failed

    def summary(self) -> dict[str, Any]:
        def rates(d: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
            return {sp: {g: round(n / self.generated[sp], 4) for g, n in sorted(by.items())}
                    for sp, by in sorted(d.items()) if self.generated.get(sp)}

        return {
            "dialogues": self.dialogues,
            "dialogues_clean_first_time": self.dialogues - self.regenerated - self.failed,
            "dialogues_clean_after_regeneration": self.regenerated,
            "dialogues_failed": self.failed,
            "dialogues_failed_by_guard": dict(sorted(self.failed_by_guard.items())),
            "turns_generated": dict(sorted(self.generated.items())),
            "first_attempt_failures": self.first_attempt,
            "failed_attempts": self.attempts,
            "failures_after_regeneration": self.final,
            "rate_before_regeneration": rates(self.first_attempt),
            "rate_after_regeneration": rates(self.final),
        }
