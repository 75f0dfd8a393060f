"""``scripted``: an offline dry-run engine that needs no model.

It writes doctor questions from the topic and the persona, patient answers from the case
fields that bear on the topic and from the fictitious experience, and tool-agent verdicts
by rule. Deterministic (seeded by each request's seed) and fast. Token counts are the
characters of the prompt and the answer: a dry run's stand-in, not a tokenizer's figure.
Every row it produces says ``engine = scripted``.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from typing import Any

from mdd.dialogue.dryrun.speech import TIME, clauses, companion_answer, patient_answer
from mdd.dialogue.ops import short_point, triple_phrase
from mdd.dialogue.patient import evasive
from mdd.dialogue.wording import wording
from mdd.engines.base import Completion, EngineBase, Request, register_engine
from mdd.record.speech import opener

_GREETINGS = ("你好，我是{s}医生，今天由我来给你看诊。", "你好，请坐，我是{s}医生。",
              "你好，我姓{s}，是今天的接诊医生。")
_OPEN_ASK = ("这次来主要是哪里不舒服？可以慢慢说。", "最近有什么困扰你的地方吗？", "能说说这次来看病的主要原因吗？")
def _fresh(rng: random.Random, options: list[str], used: set[str], fill: dict[str, str] | None = None,
           asked: tuple[str, ...] = ()) -> str:
    """A phrase whose opener was not used yet in this dialogue, and never one the doctor already said
    whole (``asked``); any unsaid one when all openers were used."""
    texts = [o.format(**fill) if fill else o for o in options]
    unsaid = [t for t in texts if not any(t in q for q in asked)] or texts
    new = [t for t in unsaid if opener(t) not in used]
    return rng.choice(new or unsaid)


_NOT_ABOUT = re.compile(r"[没不未无]|说过|刚才|说了|这样|这个|那样|还有别的")  # nothing a follow-up could name


def _followup(rng: random.Random, ph: dict[str, Any], used: set[str], last: str, asked: tuple[str, ...] = ()) -> str:
    """What the last answer left open: how long or how often when it named no time, else its impact or a
    detail; the question names what was said when that is short (你说凌晨四点就醒，…)."""
    kinds = ["impact", "detail"] if TIME.search(last) else ["time", "time", "impact", "detail"]
    said = [c for c in clauses(last) if 4 <= len(c) <= 14 and not _NOT_ABOUT.search(c) and not evasive(c)]
    about = ph["followup_about"].format(what=said[0].replace("我", "你")) if said else ""
    rng.shuffle(kinds)
    # the first kind with a question not asked yet (the bare question too: 这样有多长时间了？ asked before)
    for kind in kinds:
        options = [about + q for q in ph["followup"][kind]]
        if any(not any(o in a or q in a for a in asked) for o, q in zip(options, ph["followup"][kind])):
            break
    return _fresh(rng, options, used, asked=asked)


def _chars(request: Request) -> int:
    return sum(len(m.content) for m in request.messages)


@register_engine("scripted")
class ScriptedEngine(EngineBase):
    name = "scripted"

    def __init__(self, model: str = "scripted"):
        self.model = model
        self.served: Counter = Counter()  # calls by agent (this process): what a routing test checks

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.served = Counter()

    @classmethod
    def launch(cls, cfg: Any) -> "ScriptedEngine":
        return cls(model=getattr(cfg, "model", "scripted") or "scripted")

    async def generate(self, request: Request) -> Completion:
        self.served[request.agent] += 1
        rng = random.Random(request.sampling.seed if request.sampling.seed is not None else 0)
        handler = getattr(self, f"_{request.op}", None)
        if handler is None:
            raise ValueError(f"scripted engine: no script for operation {request.op!r}")
        text: str = handler(request.context, rng)
        if request.sampling.choice is not None and text not in request.sampling.choice:
            text = request.sampling.choice[0]
        text = text[: request.sampling.max_tokens * 4] if request.sampling.json_schema is None else text
        return Completion(text=text, prompt_tokens=_chars(request), output_tokens=len(text))

    # --- doctor -----------------------------------------------------------------------

    def _DocGen(self, ctx: dict[str, Any], rng: random.Random) -> str:
        ph = wording()["scripted"]
        used = set(ctx.get("openers") or ())
        asked = tuple(ctx.get("asked") or ())
        fast = ctx.get("speed") == "fast"
        if ctx.get("opening"):
            extra = ph["opening_companion"].format(address=ctx["companion"]) if ctx.get("companion") else ""
            return rng.choice(_GREETINGS).format(s=ctx.get("surname", "李")) + extra + rng.choice(_OPEN_ASK)
        parts = []
        if ctx.get("empathy"):
            parts.append(_fresh(rng, ph["empathy"], used))
        lay = ctx.get("lay_topic") or ctx.get("topic", "")
        if ctx.get("after_companion"):
            parts.append(_fresh(rng, ph["after_companion"], used, {"relation": ctx.get("relation") or "家里人"}))
        elif ctx.get("reask"):
            parts.append(_fresh(rng, ph["reask_gentle" if ctx.get("empathic") else "reask_plain"], used, asked=asked))
        elif ctx.get("followup"):
            parts.append(_followup(rng, ph, used, ctx.get("last_answer") or "", asked))
        elif ctx.get("addressee") == "companion":
            parts.append(_fresh(rng, ph["companion"], used, {"address": ctx.get("companion") or "您", "lay": lay}))
        elif ctx.get("kind") == "experience":
            parts.append(_fresh(rng, ph["experience"], used, {"lay": lay}))
        else:
            same = [e["question"] for e in ctx.get("exemplars") or [] if e.get("topic") == ctx.get("topic")]
            if same:  # asks the way the best-scored earlier question on this topic did (its question sentence)
                parts.append([x for x in re.split(r"(?<=[。！])", same[0]) if x.strip()][-1])
            else:
                # what the topic asks (the tree's words carry what the checklist needs), or its lay phrase
                body = (ctx.get("ask") or lay).rstrip("。？?")
                form = rng.choice(ph["ask_forms"][:1] if fast else ph["ask_forms"]).format(lay=body)
                if ctx.get("suicide"):  # safe wording: normalise first, then ask plainly
                    parts.append(_fresh(rng, ph["suicide"], used))
                # the whole turn's opener is what must be new: the lead's, or the question's without one
                options = [lead + form for lead in ph["leads"]]
                parts.append(options[0] if parts else _fresh(rng, options, used))
        if not fast and ctx.get("addressee") != "companion" and ctx.get("explain") in ("sometimes", "often") \
                and rng.random() < 0.5:
            parts.append(rng.choice(ph["explain"]))
        return "".join(parts)

    # --- patient ----------------------------------------------------------------------

    def _PatGen(self, ctx: dict[str, Any], rng: random.Random) -> str:
        return patient_answer(ctx, rng)

    def _CompanionGen(self, ctx: dict[str, Any], rng: random.Random) -> str:
        return companion_answer(ctx, rng)

    # --- tool agent -------------------------------------------------------------------

    def _FicExpGen(self, ctx: dict[str, Any], rng: random.Random) -> str:
        t = ctx["triple"]
        feel = rng.choice(("很委屈", "特别无助", "又生气又难过", "很害怕"))
        return (f"{t['time']}，{triple_phrase(t['people'], t['event'])}。那段时间我{feel}，不知道该跟谁说，"
                f"晚上常常一个人想这件事。后来虽然表面上过去了，但我一直没真正放下，"
                f"现在一遇到类似的情况，心里就会发紧。")

    def _IsTopicEnd(self, ctx: dict[str, Any], rng: random.Random) -> str:
        answer = ctx.get("answer", "")
        if answer.startswith(("没有", "不会", "这个没有", "这个倒没有")) or len(answer) > 60:
            return "是"
        return "是" if rng.random() < 0.65 else "否"

    def _TriggerExp(self, ctx: dict[str, Any], rng: random.Random) -> str:
        return "是" if ctx.get("kind") == "experience" or rng.random() < 0.3 else "否"

    def _DupDetect(self, ctx: dict[str, Any], rng: random.Random) -> str:
        text = ctx.get("patient_text", "")
        covered = [c["topic"] for c in ctx.get("candidates", [])
                   if sum(1 for k in set(c.get("keywords", [])) if k and k in text) >= 2]
        return json.dumps({"covered": covered}, ensure_ascii=False)

    def _ParseExp(self, ctx: dict[str, Any], rng: random.Random) -> str:
        t = ctx["triple"]
        points = [short_point(triple_phrase(t["people"], t["event"])), "这件事带来的影响", "当时的感受和应对"]
        return json.dumps({"points": points[: rng.choice((2, 3))]}, ensure_ascii=False)

    # --- case writer (mdd.cases.write.EngineCaseWriter) ---------------------------------

    def _CaseWrite(self, ctx: dict[str, Any], rng: random.Random) -> str:
        """The scripted case writer's record for the plan in ``context`` (mended for ``failed``), as JSON."""
        from mdd.cases.check import Finding
        from mdd.cases.plan import CasePlan
        from mdd.cases.write import ScriptedCaseWriter

        plan = CasePlan.from_dict(ctx["plan"])
        failed = [Finding(**f) for f in ctx.get("failed") or []]
        return json.dumps(ScriptedCaseWriter().write(plan, failed), ensure_ascii=False)
