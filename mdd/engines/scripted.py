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
from typing import Any

from mdd.dialogue.ops import short_point, triple_phrase
from mdd.engines.base import Completion, EngineBase, Request
from mdd.engines.scripted_speech import patient_answer

_GREETINGS = ("你好，我是{s}医生，今天由我来给你看诊。", "你好，请坐，我是{s}医生。", "你好，我姓{s}，是今天的接诊医生。")
_OPEN_ASK = ("这次来主要是哪里不舒服？可以慢慢说。", "最近有什么困扰你的地方吗？", "能说说这次来看病的主要原因吗？")
_LEADS = ("", "我想了解一下，", "接下来想问问你，", "我们聊聊", "关于")
_FOLLOW = ("你刚才说的这个情况，能再具体说说吗？", "这种情况大概多久出现一次？持续多长时间？",
           "它对你的生活和学习工作影响有多大？", "这个情况是从什么时候开始的？")
_EMPATHY = ("听起来这段时间你真的很不容易。", "我能理解你的感受，说出来已经很不容易了。", "谢谢你愿意告诉我这些。")
_EXPLAIN = ("问这个是因为它和情绪状态关系很密切。", "这能帮助我更全面地判断你的情况。")
_REASK_GENTLE = ("很多人一开始都不太愿意谈这个，没关系。我换个问法：这方面最近有没有让你不好受的时候？",
                 "这个话题可能不太好开口，你慢慢说就行。能具体说说吗？")
_REASK_PLAIN = ("我再问具体一点：有还是没有？", "换个问法：最近一周里有没有出现过？")


def _chars(request: Request) -> int:
    return sum(len(m.content) for m in request.messages)


class ScriptedEngine(EngineBase):
    name = "scripted"

    def __init__(self, model: str = "scripted"):
        self.model = model

    @classmethod
    def launch(cls, cfg: Any) -> "ScriptedEngine":
        return cls(model=getattr(cfg, "model", "scripted") or "scripted")

    async def generate(self, request: Request) -> Completion:
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
        fast = ctx.get("speed") == "fast"
        if ctx.get("opening"):
            return rng.choice(_GREETINGS).format(s=ctx.get("surname", "李")) + rng.choice(_OPEN_ASK)
        parts = []
        if ctx.get("empathy"):
            parts.append(rng.choice(_EMPATHY))
        if ctx.get("reask"):
            parts.append(rng.choice(_REASK_GENTLE if ctx.get("empathic") else _REASK_PLAIN))
        elif ctx.get("followup"):
            parts.append(rng.choice(_FOLLOW))
        else:
            topic, ask = ctx.get("topic", ""), ctx.get("ask", "")
            lead = rng.choice(_LEADS)
            if ctx.get("kind") == "experience":
                parts.append(f"你刚才提到{topic}，能具体讲讲当时发生了什么、你现在怎么看这件事吗？")
            elif any(e.get("topic") == topic for e in ctx.get("exemplars") or []):
                # asks the way the best-scored earlier question on this topic did (its question sentence)
                q = next(e["question"] for e in ctx["exemplars"] if e.get("topic") == topic)
                parts.append([x for x in re.split(r"(?<=[。！])", q) if x.strip()][-1])
            elif fast or not ask:
                parts.append(f"{lead}{topic}方面，最近怎么样？")
            else:
                parts.append(f"{lead}{topic}方面的情况，比如{ask}，最近怎么样？")
        if not fast and ctx.get("explain") in ("sometimes", "often") and rng.random() < 0.6:
            parts.append(rng.choice(_EXPLAIN))
        return "".join(parts)

    # --- patient ----------------------------------------------------------------------

    def _PatGen(self, ctx: dict[str, Any], rng: random.Random) -> str:
        return patient_answer(ctx, rng)

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
