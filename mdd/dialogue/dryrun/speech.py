"""The scripted engine's patient and companion speech: the dry run honours the speech styles.

A patient answer is put together from the lay facts the patient role passes in the request context
(never the record itself), shaped by the style (its lead-ins and tails, and how it shapes an answer:
``scripted.behaviour`` in ``styles.yaml``, read as a :class:`Behaviour`), and fitted to the turn's
budget in characters: a terse patient says a word or two, a rambling one goes
on past the question, a guarded one says 还好吧 until asked again.

It is a deterministic stand-in, not a model, but it answers in kind and stays consistent: a denial
names what it denies and never ends on a complaint; a follow-up on how long or how often gets a time
(from the record's clauses on the topic, else the complaint's duration); asked again about what it
already told, the patient refers to it instead of denying it; after the companion spoke, it agrees
(a guarded patient plays it down) or, having denied or dodged before, admits it; no remark is said
twice in a dialogue.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from mdd.dialogue.companion import book as companion_book
from mdd.dialogue.lay import split_clauses
from mdd.dialogue.ops import triple_phrase
from mdd.dialogue.patient import denies, style_book
from mdd.knowledge import KnowledgeError

_SPLIT = re.compile(r"([。；;，,\n！!？?]+)")
_STRIP = " ，,。；;:：、"
TIME = re.compile(r"[0-9一二两三四五六七八九十半几]+\s*多?个?多?(?:天|周|星期|月|年|小时|次|分钟)|"
                   r"去年|今年|前年|上个?月|上周|从小|每天|每周|每晚|凌晨|半夜|小时候")
_DURATION = re.compile(r"[0-9一二两三四五六七八九十半几]+\s*多?个?多?(?:天|周|星期|月|年|小时|分钟)")
_WH = re.compile(r"什么|怎么|多少|多久|哪|几")
_POLAR = (("有没有", "没有"), ("会不会", "不会"), ("是不是", "不是"), ("能不能", "不能"), ("知不知道", "不知道"),
          ("需不需要", "不需要"), ("离不离得开", "离得开"), ("抽不抽", "不抽"), ("喝不喝", "不喝"),
          ("用没用过", "没用过"), ("害不害怕", "不害怕"), ("玩不玩", "不玩"), ("吃不吃", "不吃"))


_SHAPES = ("plain", "body_first", "ramble", "tail_inside", "first_two", "first_only")


@dataclass(frozen=True)
class Behaviour:
    """How a style shapes a dry-run answer (``styles.yaml`` ``scripted.behaviour.<style>``, explained there)."""

    deny_bare: bool = False
    deny_adds: str = ""
    trails_off: bool = False
    agree_adds: bool = False
    opening_tail: bool = False
    blur_numbers: bool = False
    yes_short: bool = False
    shape: str = "plain"
    tail_chance: float = 0.0


@lru_cache(maxsize=None)
def behaviour(style: str) -> Behaviour:
    """The style's :class:`Behaviour` (plain for a style the table leaves out); a bad entry is a
    ``KnowledgeError`` naming the style, the key and why."""
    book = style_book()
    table = book.scripted.get("behaviour") or {}
    for sid, d in table.items():
        where = f"styles.yaml scripted.behaviour.{sid}"
        if sid not in book.styles:
            raise KnowledgeError(f"{where}: no such style; styles: {', '.join(book.styles)}")
        if not isinstance(d, dict):
            raise KnowledgeError(f"{where}: expected a mapping of behaviour keys, got {type(d).__name__}")
        known = {f.name: f for f in fields(Behaviour)}
        for k, v in d.items():
            if k not in known:
                raise KnowledgeError(f"{where}.{k}: unknown key; known: {', '.join(known)}")
            if type(v) is not type(known[k].default) and not (k == "tail_chance" and type(v) is int):
                raise KnowledgeError(f"{where}.{k}: expected {type(known[k].default).__name__}, got {v!r}")
        if d.get("shape", "plain") not in _SHAPES:
            raise KnowledgeError(f"{where}.shape: {d['shape']!r} is none of {', '.join(_SHAPES)}")
        if d.get("deny_adds") and not book.scripted.get(d["deny_adds"]):
            raise KnowledgeError(f"{where}.deny_adds: {d['deny_adds']!r} names no phrase list of scripted:")
        if not 0 <= d.get("tail_chance", 0) <= 1:
            raise KnowledgeError(f"{where}.tail_chance: expected a chance in [0, 1], got {d['tail_chance']!r}")
    return Behaviour(**table.get(style, {}))


def clauses(text: str) -> list[str]:
    """The clauses of ``text`` (a separator inside quotation marks does not end one)."""
    return [c.strip(_STRIP) for c, _ in split_clauses(text or "", _SPLIT) if c.strip(_STRIP)]


def fit(parts: list[str], budget: int, joiner: str = "，") -> str:
    """Clauses joined up to ``budget`` characters. When not even the first one fits, the shortest one is
    said if it is near the budget (a denial only when all are denials: 没有具体计划 never stands for 有不想活
    的念头); else "" (the caller says something short instead)."""
    parts = list(dict.fromkeys(p for p in parts if p))
    out = ""
    for p in parts:
        nxt = f"{out}{joiner}{p}" if out else p
        if len(nxt) + 1 > budget:
            break
        out = nxt
    if not out and parts:  # not even the first fits: the shortest, if near the budget, else nothing; a denial
        pool = [p for p in parts if not denies(p)] or parts  # only when there is nothing but denials
        p = min(pool, key=len)
        out = p if len(p) <= max(2 * budget, 8) else ""
    return (out.rstrip(_STRIP) + "。") if out and out[-1] not in "。！？…" else out


def fit_first(parts: list[str], budget: int) -> str:
    """As :func:`fit`, but the first clause is always said whole, whatever the budget."""
    return fit(parts, max(budget, len(parts[0]) + 2)) if parts else ""


def _pick(rng: random.Random, options: list[str] | None, default: str = "") -> str:
    return rng.choice(options) if options else default


def _fresh(rng: random.Random, options: list[str] | None, said: str) -> str:
    """A remark not said yet in this dialogue ("" when all were)."""
    new = [o for o in options or () if o.strip(_STRIP) not in said]
    return rng.choice(new) if new else ""


def _styled(ph: dict[str, Any], key: str, style: str) -> list[str]:
    table = ph.get(key) or {}
    return table.get(style) or table.get("default") or []


def negated(what: str) -> str:
    """What a topic's lay phrase asks, said as a denial: 有没有听到别人听不到的声音 → 没有听到别人听不到的声音;
    "" when the phrase asks no yes/no question."""
    for c in clauses(what):
        bits = c.split("、")
        for i, bit in enumerate(bits):
            for ask, no in _POLAR:
                if ask in bit:  # the yes/no part and what it lists after it (没有特别兴奋、话多)
                    rest = "、".join([bit.replace(ask, no, 1)] + [b for b in bits[i + 1:] if not _WH.search(b)])
                    return rest.replace("或者", "也没")
    return ""


def _denial(ctx: dict[str, Any], rng: random.Random, ph: dict[str, Any], style: str, budget: int) -> str:
    """No, naming what is denied when the budget leaves room; never followed by a complaint."""
    opener = _pick(rng, _styled(ph, "no", style), "没有").rstrip("。")
    if behaviour(style).deny_bare or ctx.get("attempt"):  # asked again by a guard (it restated the question): just no
        return opener + ("" if opener.endswith(("。", "！", "…")) else "。")
    what = negated(ctx.get("what", ""))
    if not what and ctx.get("what") and not _WH.search(ctx["what"]):
        what = ph.get("no_topic", "{what}").format(what=ctx["what"].removesuffix("的情况"))
    said = ctx.get("said") or ""
    parts = [opener.rstrip("！!…。"), what]
    if behaviour(style).deny_adds:
        parts.append(_fresh(rng, ph.get(behaviour(style).deny_adds), said))
    text = fit(parts, max(budget, len(opener) + 2))
    return text or opener + "。"


def _time_answer(ctx, rng, ph, style, facts, lead, budget) -> str:
    """A follow-up on how long or how often: a time from the record's clauses on the topic, else the
    complaint's duration; a topic the patient denied stays denied."""
    if ctx.get("stance") == "no" or not (facts or ctx.get("told")):
        return _pick(rng, ph.get("never"), "一直都没有过。")
    timed = [c for c in facts if TIME.search(c)]
    new = [c for c in timed if c not in (ctx.get("said") or "") and c not in (ctx.get("question") or "")]
    since = ctx.get("since") or ""
    if new:  # a time already said (or quoted by the doctor) is not said again: the duration instead
        text = fit_first([lead + new[0]] + new[1:2], budget)
        if since and not _DURATION.search(text):  # 凌晨四点醒 says when, not for how long
            text = text.rstrip("。") + f"，这样有{since}了。"
        return text
    said = ctx.get("said") or ""
    options = [o.format(since=since).rstrip("。") for o in _styled(ph, "since", style)] if since \
        else list(ph.get("since_unknown") or ())
    again = [o.format(since=since or "一阵子") for o in ph.get("time_again") or ()]
    text = _fresh(rng, options, said) or _fresh(rng, again, said) or _pick(rng, again)
    return (text or "有一阵子了").rstrip("。…") + ("……" if behaviour(style).trails_off else "。")


def _agree(ctx, rng, ph, style, new, budget) -> str:
    """After the companion spoke: agree (guarded: play it down), or admit what was denied or dodged."""
    called = ctx.get("companion") or "家里人"
    if ctx.get("stance") != "yes":
        told = new or clauses(ctx.get("checking", ""))[-1:]
        admit = _pick(rng, ph.get("admit"), "其实是有，")
        return fit_first([admit + (told[0] if told else "")], budget)
    options = [o.format(called=called) for o in _styled(ph, "agree", style)]
    text = _fresh(rng, options, ctx.get("said") or "") or "嗯，是有点。"
    if new and behaviour(style).agree_adds and len(text) + len(new[0]) < budget:
        text = text.rstrip("。") + "，" + new[0] + "。"
    return text


_GIST_SPLIT = re.compile(r"([、，,。；;！!？?…]+)")


def _gist(clause: str, limit: int = 8) -> str:
    """What a clause said, referred to by its first words: 后来又出现头部紧箍感、后背… → 后来又出现头部紧箍感那些
    (never cut inside quotation marks)."""
    head = (split_clauses(clause, _GIST_SPLIT) or [(clause, "")])[0][0]
    if head == clause and len(head) <= limit:
        return head
    if len(head) > limit + 4 and not re.search(r"[“”\"「」『』]", head):
        head = head[:limit + 4]
    return head + "那些"


def _affirmed_first(parts: list[str]) -> list[str]:
    """An answer on an affirmed topic opens with what is there, not with what is not (没有具体计划 after
    有不想活的念头)."""
    return [c for c in parts if not denies(c)] + [c for c in parts if denies(c)]


def patient_answer(ctx: dict[str, Any], rng: random.Random) -> str:
    """The patient's answer; asked again by a guard for one it had said before, the answer points back
    to it instead of saying it over."""
    text = _answer(ctx, rng)
    said = ctx.get("said") or ""
    # (or what the doctor's question just quoted, e.g. the companion's words: said again it is an echo)
    if ctx.get("attempt") and _mostly_said(text, said + (ctx.get("question") or "")):
        ph = style_book().scripted
        again = [o.format(since=ctx.get("since") or "一阵子") for o in ph.get("time_again") or ()]
        text = _fresh(rng, again, said) or _pick(rng, ["还是那样。", "跟刚才一样。", "就是那样。"])  # short: may recur
        text = text.rstrip("。") + "。"
    return text


def _mostly_said(text: str, said: str, n: int = 4) -> bool:
    """Most of the text's character n-grams (punctuation and fillers aside) were said before."""
    bare, before = (re.sub(r"[^\u4e00-\u9fff0-9A-Za-z]|嗯", "", t) for t in (text, said))
    grams = [bare[i:i + n] for i in range(len(bare) - n + 1)] or [bare]
    return bool(bare) and sum(g in before for g in grams) >= 0.6 * len(grams)


def _answer(ctx: dict[str, Any], rng: random.Random) -> str:
    ph = style_book().scripted
    style = ctx.get("style") or "cooperative"
    b = behaviour(style)
    budget = int(ctx.get("budget") or 80)
    lead = _pick(rng, (ph.get("lead") or {}).get(style))
    said = ctx.get("said") or ""

    if ctx.get("opening"):
        facts = [c for c in clauses(ctx.get("facts", "")) if c not in said]
        body = [f"我主要是{ctx.get('complaint', '').rstrip('。')}"] + facts[1:4]
        return fit([lead + body[0]] + body[1:] + ([_fresh(rng, (ph.get("tail") or {}).get(style), said)]
                                                  if b.opening_tail else []), budget) or \
            fit([ctx.get("complaint", "")], budget) or "就是心里难受。"
    if ctx.get("withhold"):
        return _pick(rng, ph.get("deny"), "还好吧。")

    facts = clauses(ctx.get("facts", ""))  # the role passes what bears on the topic
    if b.blur_numbers:  # numbers blur (每晚好几毫克): compared with what was said as blurred
        facts = [re.sub(r"\d+", "好几", c) for c in facts]
    hit = [c for c in facts if c not in said]
    if ctx.get("affirmed") and hit and all(denies(c) for c in hit):
        hit = []  # only the record's denials are left unsaid (没有具体计划): what is there is referred to
    told = clauses(ctx.get("told", ""))
    if ctx.get("checking"):
        return _agree(ctx, rng, ph, style, hit, budget)
    asks = ph.get("asks") or {}
    question = ctx.get("question", "")
    kind = next((k for k, words in asks.items() if any(w in question for w in words)), "") \
        if ctx.get("followup") else ""
    if kind == "time":
        return _time_answer(ctx, rng, ph, style, facts, lead, budget)
    if ctx.get("followup") and ctx.get("stance") == "no" and not ctx.get("admit"):
        return _pick(rng, ph.get("never"), "一直都没有过。")  # a follow-up on a denied topic: still no

    story = ""
    if ctx.get("trigger"):
        t = ctx.get("triple") or {}
        lived = [c for c in clauses(ctx.get("experience", "")) if c not in said]
        if ctx.get("kind") == "experience" and len(lived) > 2:
            story = "，".join(rng.sample(lived[1:], min(3, len(lived) - 1)))
        elif ctx.get("kind") == "experience" or not lived:
            story = (f"{t.get('time', '')}，{triple_phrase(t.get('people', ''), t.get('event', ''))}，"
                     "那之后我心里一直放不下")
            if story in said:  # told once already: referred to
                story = f"还是{t.get('time', '')}那件事，到现在也没放下"
    if kind == "impact":
        words = ph.get("function_words") or ()
        daily = list(dict.fromkeys(c for c in hit + clauses(ctx.get("story", ""))  # a clause of both: once
                                   if any(w in c for w in words) and c not in said))
        if daily:
            return fit_first([lead + _pick(rng, ph.get("impact"), "影响挺大的，") + daily[0]] + daily[1:2], budget)
    if not hit and not story:
        if told or ctx.get("stance") == "yes" or (facts and ctx.get("affirmed")):
            # asked again on what was told (on this topic or another): referred to, never denied
            again = _pick(rng, _styled(ph, "again", style), "就是刚才说的，")
            said_on = [c for c in told if not denies(c)] or _affirmed_first(facts)
            # referred to by its first words (刚才说的头部紧箍感那些), not said over again; once referred to, just so
            gist = _gist(said_on[0]) if said_on else ""
            if not gist or gist.removesuffix("那些") in said:
                return "还是刚才说的那样。"
            return fit_first([again + gist], budget)
        return _denial(ctx, rng, ph, style, budget)
    if not ctx.get("affirmed", True) and not story:
        # what the record says on the topic is a denial ("没有具体计划"): said as such, without a complaint
        return fit_first([lead + hit[0]] + hit[1:2], budget) if hit else \
            _denial(ctx, rng, ph, style, budget)
    if ctx.get("yes_no") and hit and b.yes_short:
        short = min(_affirmed_first(hit)[:1] + [c for c in hit if not denies(c)], key=len)
        yes = _pick(rng, ph.get("yes"), "有。").rstrip("。")
        return fit([yes, short], budget + 4) if len(short) <= budget + 2 else yes + "。"

    parts = _affirmed_first(list(hit[:4])) + ([story] if story else [])
    if ctx.get("admit"):
        lead = "其实……" + lead
    if ctx.get("yes_no"):
        parts = [_pick(rng, ph.get("yes"), "有。").rstrip("。")] + parts[:1]
    elif b.shape == "body_first":
        body = [c for c in clauses(ctx.get("body", "")) if c not in said and c not in parts]
        parts = body[:2] + parts
    elif b.shape == "ramble":
        extra = [c for c in clauses(ctx.get("experience", "")) if c not in said and c not in parts]
        parts += rng.sample(extra, min(3, len(extra))) + clauses(_fresh(rng, (ph.get("tail") or {}).get(style), said))
    elif b.shape == "tail_inside" and len(parts) > 1:
        parts.insert(1, _fresh(rng, (ph.get("tail") or {}).get(style), said))
    elif b.shape == "first_two":
        parts = parts[:2]
        if b.blur_numbers:
            parts = [re.sub(r"\d+", "好几", p) for p in parts]
    elif b.shape == "first_only":
        parts = parts[:1]
    more = _fresh(rng, (ph.get("more") or {}).get(style), said)
    if more and not ctx.get("yes_no"):
        parts += clauses(more)
    parts[0] = lead + parts[0]
    text = fit(parts, budget, "……" if b.trails_off else "，")
    if not text:  # nothing fits the budget: a word or two
        text = _pick(rng, ph.get("yes"), "嗯。")
    tail = _fresh(rng, (ph.get("tail") or {}).get(style), said + text)
    if b.tail_chance and tail and len(text) + len(tail) <= budget and rng.random() < b.tail_chance:
        text += tail
    return text


def companion_answer(ctx: dict[str, Any], rng: random.Random) -> str:
    """The companion: what it saw at home, as an answer, an addition or a correction."""
    ph = companion_book().get("scripted") or {}
    pron, budget, said = ctx.get("pron", "她"), int(ctx.get("budget") or 60), ctx.get("said") or ""
    heard = said + (ctx.get("question") or "")  # not what it said, nor what the doctor just said
    facts = [c for c in clauses(ctx.get("facts", "")) if c not in heard]
    if not facts:
        options = [o.format(pron=pron) for o in ph.get("unknown") or ()]
        return _fresh(rng, options, said) or "这个我说不好。"
    if ctx.get("interject"):
        lead = _pick(rng, ph.get("correct" if ctx.get("correct") else "add")).format(pron=pron)
        return fit([lead + facts[0]] + facts[1:2], budget) or lead + facts[0] + "。"
    lead = _pick(rng, ph.get("answer_lead")).format(pron=pron)
    return fit([lead + facts[0]] + facts[1:4], budget) or lead + facts[0] + "。"
