"""The scripted engine's patient and companion speech: the dry run honours the speech styles.

A patient answer is put together from the lay facts the patient role passes in the request context
(never the record itself), shaped by the style (its lead-ins and tails from ``styles.yaml``), and
fitted to the turn's budget in characters: a terse patient says a word or two, a rambling one goes
on past the question, a guarded one says 还好吧 until asked again.
"""
from __future__ import annotations

import random
import re
from typing import Any

from mdd.dialogue.companion import book as companion_book
from mdd.dialogue.ops import triple_phrase
from mdd.dialogue.patient import style_book

_SPLIT = re.compile(r"[。；;，,\n！!？?]")
_STRIP = " ，,。；;:：、"


def clauses(text: str) -> list[str]:
    return [c.strip(_STRIP) for c in _SPLIT.split(text or "") if c.strip(_STRIP)]


def fit(parts: list[str], budget: int, joiner: str = "，") -> str:
    """Clauses joined up to ``budget`` characters. When not even the first one fits, the shortest one
    is said if it is near the budget; else "" (the caller says something short instead)."""
    parts = [p for p in parts if p]
    out = ""
    for p in parts:
        nxt = f"{out}{joiner}{p}" if out else p
        if len(nxt) + 1 > budget:
            break
        out = nxt
    if not out and parts:  # not even the first fits: the shortest, if near the budget, else nothing
        p = min(parts, key=len)
        out = p if len(p) <= max(2 * budget, 8) else ""
    return (out.rstrip(_STRIP) + "。") if out and out[-1] not in "。！？…" else out


def _pick(rng: random.Random, options: list[str] | None, default: str = "") -> str:
    return rng.choice(options) if options else default


def patient_answer(ctx: dict[str, Any], rng: random.Random) -> str:
    ph = style_book().scripted
    style = ctx.get("style") or "cooperative"
    budget = int(ctx.get("budget") or 80)
    lead = _pick(rng, (ph.get("lead") or {}).get(style))
    tail = _pick(rng, (ph.get("tail") or {}).get(style))
    said = ctx.get("said") or ""

    if ctx.get("opening"):
        facts = [c for c in clauses(ctx.get("facts", "")) if c not in said]
        body = [f"我主要是{ctx.get('complaint', '').rstrip('。')}"] + facts[1:4]
        return fit([lead + body[0]] + body[1:] + ([tail] if style == "rambling" else []), budget) or \
            fit([ctx.get("complaint", "")], budget) or "就是心里难受。"
    if ctx.get("withhold"):
        return _pick(rng, ph.get("deny"), "还好吧。")

    hit = [c for c in clauses(ctx.get("facts", "")) if c not in said]  # the role passes what bears on the topic
    story = ""
    if ctx.get("trigger"):
        t = ctx.get("triple") or {}
        told = clauses(ctx.get("experience", ""))
        if ctx.get("kind") == "experience" and len(told) > 2:
            story = "，".join(rng.sample(told[1:], min(3, len(told) - 1)))
        else:
            story = f"{t.get('time', '')}，{triple_phrase(t.get('people', ''), t.get('event', ''))}，那之后我心里一直放不下"
    no = ph.get("no") or {}
    if not hit and not story:
        return _pick(rng, no.get(style) or no.get("default"), "没有。")
    if ctx.get("yes_no") and not ctx.get("affirmed", True) and not story:
        return _pick(rng, no.get(style) or no.get("default"), "没有。")
    if ctx.get("yes_no") and hit and style in ("terse", "irritable", "guarded"):
        return _pick(rng, ph.get("yes"), "有。")

    parts = list(hit[:4]) + ([story] if story else [])
    if ctx.get("admit"):
        lead = "其实……" + lead
    if ctx.get("yes_no"):
        parts = [_pick(rng, ph.get("yes"), "有。").rstrip("。")] + parts[:1]
    elif style == "somatising":
        body = [c for c in clauses(ctx.get("body", "")) if c not in said and c not in parts]
        parts = body[:2] + parts
    elif style == "rambling":
        extra = [c for c in clauses(ctx.get("experience", "")) if c not in said and c not in parts]
        parts += rng.sample(extra, min(3, len(extra))) + clauses(tail)
    elif style == "disorganised" and len(parts) > 1:
        parts.insert(1, tail)
    elif style == "poor_recall":
        parts = [re.sub(r"\d+", "好几", p) for p in parts[:2]]
    elif style == "terse":
        parts = parts[:1]
    more = (ph.get("more") or {}).get(style)
    if more and not ctx.get("yes_no"):
        parts += clauses(rng.choice(more))
    parts[0] = lead + parts[0]
    text = fit(parts, budget, "……" if style == "tearful" else "，")
    if not text:  # nothing fits the budget: a word or two
        text = _pick(rng, ph.get("yes"), "嗯。")
    if style in ("tearful", "irritable") and tail and len(text) + len(tail) <= budget and rng.random() < 0.5:
        text += tail
    return text


def companion_answer(ctx: dict[str, Any], rng: random.Random) -> str:
    """The companion: what it saw at home, as an answer, an addition or a correction."""
    ph = companion_book().get("scripted") or {}
    pron, budget, said = ctx.get("pron", "她"), int(ctx.get("budget") or 60), ctx.get("said") or ""
    facts = [c for c in clauses(ctx.get("facts", "")) if c not in said]
    if not facts:
        return _pick(rng, ph.get("unknown"), "这个我不太清楚。").format(pron=pron)
    if ctx.get("interject"):
        lead = _pick(rng, ph.get("correct" if ctx.get("correct") else "add")).format(pron=pron)
        return fit([lead + facts[0]] + facts[1:2], budget) or lead + facts[0] + "。"
    lead = _pick(rng, ph.get("answer_lead")).format(pron=pron)
    return fit([lead + facts[0]] + facts[1:4], budget) or lead + facts[0] + "。"
