"""Judges for the multi-turn rules (:mod:`mdd.evaluate.rules`).

A judge answers two questions, both as coroutines:

* ``find_anchor(view, cond, rule) -> Anchor``: the first exchange by which the
  precondition's text test holds (reading the dialogue cumulatively), or ``None``;
* ``check(view, cond, rule, start, end) -> Verdict``: whether the criterion holds at
  exchange ``start`` (``start == end``) or at some exchange of ``start..end``.

``KeywordJudge`` is offline and deterministic (the rule's keyword hints). ``LLMJudge`` asks
the engine with Chinese prompts and structured outputs (a ``是``/``否`` choice for criteria,
a JSON schema ``{"turn": int}`` for anchors), bounds its concurrent calls, and falls back to
the keyword judge on malformed answers, counting them in ``judge.fallbacks``.

Engine ops: ``RulePrecondition`` (anchor, JSON) and ``RuleCriterion`` (verdict, choice); the
request context carries ``rule``, ``dialogue_id`` and ``keyword_answer`` (what the keyword
judge says, in the expected answer format), which a scripted engine can simply return.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from mdd.evaluate.rule_set import Condition, Rule
from mdd.evaluate.rule_view import Anchor, DialogueView, Hits, Verdict, decide, keyword_hits

log = logging.getLogger(__name__)


class KeywordJudge:
    """Offline judge: a condition holds when the speaker's text matches its keyword hints."""

    name = "keyword"

    def __init__(self) -> None:
        self.anchor_calls = 0
        self.check_calls = 0

    # synchronous cores (also used by the LLM judge as its fallback)
    def _turn_hits(self, view: DialogueView, cond: Condition, i: int) -> Hits:
        ex = view.exchanges[i]
        if cond.answered and ex.patient is None and ex.companion is None:
            return Hits()
        return keyword_hits(cond, view.text(i, cond.speaker))

    def anchor_sync(self, view: DialogueView, cond: Condition) -> Anchor:
        """The first exchange by which the keyword test holds (cumulatively unless
        ``scope: turn``)."""
        self.anchor_calls += 1
        acc = Hits()
        for i in range(len(view)):
            h = self._turn_hits(view, cond, i)
            acc = acc | h if cond.scope == "cumulative" else h
            ok, ev = decide(cond, acc)
            if ok:
                return Anchor(i, {"judge": self.name, **ev})
        return Anchor(None, {"judge": self.name})

    def check_sync(self, view: DialogueView, cond: Condition, kind: str, start: int, end: int) -> Verdict:
        """``ask``: the exchange's text; ``conv``: everything up to the exchange."""
        self.check_calls += 1
        acc = Hits()
        if kind == "conv":
            for i in range(start):
                acc = acc | self._turn_hits(view, cond, i)
        ev: dict[str, Any] = {}
        for i in range(start, end + 1):
            h = self._turn_hits(view, cond, i)
            acc = acc | h if kind == "conv" else h
            ok, ev = decide(cond, acc)
            if ok:
                return Verdict(True, i, {"judge": self.name, **ev})
        return Verdict(False, None, {"judge": self.name, **ev})

    async def find_anchor(self, view: DialogueView, cond: Condition, rule: Rule) -> Anchor:
        return self.anchor_sync(view, cond)

    async def check(self, view: DialogueView, cond: Condition, rule: Rule, start: int, end: int) -> Verdict:
        return self.check_sync(view, cond, rule.kind, start, end)

    def stats(self) -> dict[str, int]:
        return {"anchor_calls": self.anchor_calls, "check_calls": self.check_calls}


# --- the LLM judge ---------------------------------------------------------------------------

CHOICES = ("是", "否")

SYSTEM = (
    "你是一名严谨的对话质量评估员，负责检查{doctor}与{patient}的多轮对话是否符合给定规则。"
    "只依据对话原文判断，不要猜测或补充对话中没有的信息，并严格按要求的格式作答。"
)

ANCHOR_PROMPT = """以下是{doctor}与{patient}的对话，按轮次编号（从第0轮开始，每轮包含{doctor}的一次发言和{patient}随后的回答）：

{dialogue}

条件：{condition}
判断依据：{who}的发言。
{how}
请给出最早满足条件的轮次编号；如果整段对话都不满足条件，turn 填 -1。
只输出 JSON，例如 {{"turn": 3}} 或 {{"turn": -1}}。"""  # noqa: E501 (prompt text: its lines are the prompt's)

HOW_CUMULATIVE = (
    "请从第0轮开始逐轮阅读，并把到当前轮为止的全部内容累积起来考虑：条件可以由多轮内容共同满足"
    "（例如“提到过A和B”，在A和B都已出现的那一轮才算满足）。"
)
HOW_TURN = "条件必须在同一轮的发言中满足，不能跨轮拼凑。"

ASK_PROMPT = """以下是{doctor}与{patient}的对话（第0轮到第{end}轮）：

{dialogue}

请只评估第{start}轮{who}的发言：它是否满足以下要求？
要求：{condition}
只回答“是”或“否”。"""

ASK_WINDOW_PROMPT = """以下是{doctor}与{patient}的对话（第0轮到第{end}轮）：

{dialogue}

请评估第{start}轮到第{end}轮中{who}的发言：是否至少有一轮满足以下要求？
要求：{condition}
只回答“是”或“否”。"""

CONV_PROMPT = """以下是{doctor}与{patient}的对话（第0轮到第{end}轮）：

{dialogue}

请评估截至第{end}轮（含）为止的整段对话（重点看{who}的发言）是否满足以下要求{window}？
要求：{condition}
只回答“是”或“否”。"""


def turn_schema(n_exchanges: int) -> dict[str, Any]:
    """The JSON schema of an anchor answer: ``{"turn": -1 .. n_exchanges-1}``."""
    return {
        "type": "object",
        "properties": {"turn": {"type": "integer", "minimum": -1, "maximum": max(n_exchanges - 1, -1)}},
        "required": ["turn"],
        "additionalProperties": False,
    }


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.I)
_TURN_RE = re.compile(r"""["']?turn["']?\s*[:：=]\s*["']?(-?\d+)""", re.I)


def parse_turn(text: str, n_exchanges: int) -> int | None:
    """An anchor answer -> a turn index in ``-1 .. n_exchanges-1``; None when malformed."""
    t = _FENCE.sub("", (text or "").strip()).strip()
    v: Any = None
    try:
        obj = json.loads(t)
    except (json.JSONDecodeError, ValueError):
        obj = None
    if isinstance(obj, dict) and "turn" in obj:
        v = obj["turn"]
    elif isinstance(obj, int) and not isinstance(obj, bool):
        v = obj
    else:
        m = _TURN_RE.search(t)
        v = int(m.group(1)) if m else None
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v):
        v = int(v)
    if not isinstance(v, int) or v < -1 or v >= n_exchanges:
        return None
    return v


_STRIP = " \t\r\n\"'“”‘’「」『』。.,，!！:：*`"


def parse_choice(text: str) -> bool | None:
    """A ``是``/``否`` answer -> True/False; None when malformed or ambiguous."""
    t = (text or "").strip().strip(_STRIP)
    low = t.lower()
    if t == "是" or low in ("yes", "true"):
        return True
    if t == "否" or low in ("no", "false"):
        return False
    if t.startswith(("否", "不是", "不满足", "不符合")) or low.startswith("no"):
        return False
    if t.startswith("是") and "否" not in t and "不是" not in t:
        return True
    return None


class LLMJudge:
    """Judge with an LLM engine (structured outputs, bounded concurrency, keyword fallback).

    ``engine_cfg`` is an :class:`mdd.config.EngineConfig` (launched lazily, on the first call,
    with :func:`mdd.engines.base.launch_engine`) or an already-launched engine object (anything
    with ``async generate(request)``).
    """

    name = "llm"

    def __init__(
        self,
        engine_cfg: Any = None,
        *,
        engine: Any = None,
        concurrency: int = 32,
        max_tokens_choice: int = 4,
        max_tokens_json: int = 32,
        max_chars_per_turn: int = 600,
    ) -> None:
        if engine is None and engine_cfg is not None and hasattr(engine_cfg, "generate"):
            engine, engine_cfg = engine_cfg, None
        if engine is None and engine_cfg is None:
            raise ValueError("LLMJudge: give an engine config (EngineConfig) or an engine object")
        if concurrency < 1:
            raise ValueError(f"LLMJudge: concurrency must be >= 1, got {concurrency}")
        self.engine_cfg = engine_cfg
        self._engine = engine
        self._owns_engine = False
        self.concurrency = concurrency
        self.max_tokens_choice = max_tokens_choice
        self.max_tokens_json = max_tokens_json
        self.max_chars_per_turn = max_chars_per_turn
        self.keyword = KeywordJudge()
        self.fallbacks = 0
        self.calls = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: Any = None

    # pickled to Ray workers without loop-bound state
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sem"] = None
        state["_sem_loop"] = None
        return state

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from mdd.engines.base import launch_engine

            self._engine = launch_engine(self.engine_cfg)
            self._owns_engine = True
        return self._engine

    def close(self) -> None:
        """Shut down the engine if this judge launched it."""
        if self._owns_engine and self._engine is not None and hasattr(self._engine, "shutdown"):
            self._engine.shutdown()
        if self._owns_engine:
            self._engine = None
            self._owns_engine = False

    def stats(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "fallbacks": self.fallbacks,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem = asyncio.Semaphore(self.concurrency)
            self._sem_loop = loop
        return self._sem

    async def _ask(self, prompt: str, rule: Rule, view: DialogueView, sampling: Any, op: str, context: dict) -> str:
        from mdd.engines.base import Message, Request

        roles = rule.role_labels
        req = Request(
            messages=(
                Message("system", SYSTEM.format(doctor=roles["doctor"], patient=roles["patient"])),
                Message("user", prompt),
            ),
            sampling=sampling,
            agent="judge",
            op=op,
            session=view.dialogue_id,
            context={"rule": rule.id, "dialogue_id": view.dialogue_id, **context},
        )
        engine = self.engine
        async with self._semaphore():
            comp = await engine.generate(req)
        self.calls += 1
        self.prompt_tokens += int(getattr(comp, "prompt_tokens", 0) or 0)
        self.output_tokens += int(getattr(comp, "output_tokens", 0) or 0)
        return str(getattr(comp, "text", "") or "")

    def _clip(self, text: str) -> str:
        t = (text or "").strip()
        return t if len(t) <= self.max_chars_per_turn else t[: self.max_chars_per_turn] + "……"

    def _dialogue(self, view: DialogueView, rule: Rule, end: int, last_answer: bool = True) -> str:
        roles = rule.role_labels
        lines = []
        for ex in view.exchanges[: end + 1]:
            lines.append(f"[第{ex.index}轮]")
            if ex.doctor:
                lines.append(f"{roles['doctor']}：{self._clip(ex.doctor)}")
            if last_answer or ex.index < end:
                for who in ("patient", "companion"):
                    text = getattr(ex, who)
                    if text is not None:
                        lines.append(f"{roles[who]}：{self._clip(text)}")
        return "\n".join(lines)

    @staticmethod
    def _who(cond: Condition, rule: Rule) -> str:
        roles = rule.role_labels
        return {"doctor": roles["doctor"], "patient": roles["patient"], "companion": roles["companion"]}.get(
            cond.speaker, f"{roles['doctor']}和{roles['patient']}"
        )

    async def find_anchor(self, view: DialogueView, cond: Condition, rule: Rule) -> Anchor:
        from mdd.engines.base import Sampling

        L = len(view)
        roles = rule.role_labels
        prompt = ANCHOR_PROMPT.format(
            doctor=roles["doctor"],
            patient=roles["patient"],
            dialogue=self._dialogue(view, rule, L - 1),
            condition=cond.text,
            who=self._who(cond, rule),
            how=HOW_CUMULATIVE if cond.scope == "cumulative" else HOW_TURN,
        )
        sampling = Sampling(temperature=0.0, top_p=1.0, json_schema=turn_schema(L), max_tokens=self.max_tokens_json)
        # the keyword answer: the fallback, and in the context so a scripted engine can echo it
        a = self.keyword.anchor_sync(view, cond)
        ctx = {"precondition": cond.text, "keyword_answer": json.dumps({"turn": -1 if a.turn is None else a.turn})}
        text = await self._ask(prompt, rule, view, sampling, "RulePrecondition", ctx)
        turn = parse_turn(text, L)
        if turn is None:
            self.fallbacks += 1
            log.info("llm judge: malformed anchor answer %r (rule %s, dialogue %s); keyword fallback",
                     text[:80], rule.id, view.dialogue_id)
            return Anchor(a.turn, {**a.evidence, "judge": "keyword-fallback", "llm_answer": text[:200]})
        return Anchor(None if turn < 0 else turn, {"judge": self.name, "llm_answer": text[:200]})

    async def check(self, view: DialogueView, cond: Condition, rule: Rule, start: int, end: int) -> Verdict:
        from mdd.engines.base import Sampling

        roles = rule.role_labels
        who = self._who(cond, rule)
        common = {"doctor": roles["doctor"], "patient": roles["patient"], "start": start, "end": end,
                  "condition": cond.text, "who": who}
        if rule.kind == "ask":
            tmpl = ASK_PROMPT if start == end else ASK_WINDOW_PROMPT
            # judging the doctor's question at `end`: do not show the answer it received
            dialogue = self._dialogue(view, rule, end, last_answer=cond.speaker != "doctor")
            prompt = tmpl.format(dialogue=dialogue, **common)
        else:
            window = "" if start == end else f"（判断窗口为第{start}轮到第{end}轮，只要在窗口内某一轮为止已满足即可）"
            prompt = CONV_PROMPT.format(dialogue=self._dialogue(view, rule, end), window=window, **common)
        sampling = Sampling(temperature=0.0, top_p=1.0, choice=CHOICES, max_tokens=self.max_tokens_choice)
        v = self.keyword.check_sync(view, cond, rule.kind, start, end)
        ctx = {"criterion": cond.text, "window": [start, end], "keyword_answer": CHOICES[0] if v.ok else CHOICES[1]}
        text = await self._ask(prompt, rule, view, sampling, "RuleCriterion", ctx)
        ok = parse_choice(text)
        if ok is None:
            self.fallbacks += 1
            log.info("llm judge: malformed verdict %r (rule %s, dialogue %s); keyword fallback",
                     text[:80], rule.id, view.dialogue_id)
            return Verdict(v.ok, v.turn, {**v.evidence, "judge": "keyword-fallback", "llm_answer": text[:200]})
        return Verdict(ok, start if start == end else None, {"judge": self.name, "llm_answer": text[:200]})


def make_judge(name: str, engine_cfg: Any = None, **kwargs: Any) -> KeywordJudge | LLMJudge:
    """``"keyword"`` -> :class:`KeywordJudge`; ``"llm"`` -> :class:`LLMJudge` over ``engine_cfg``
    (an EngineConfig, launched lazily, or an engine object). ``kwargs`` go to the judge."""
    key = (name or "").strip().lower()
    if key == "keyword":
        return KeywordJudge()
    if key == "llm":
        return LLMJudge(engine_cfg, **kwargs)
    raise ValueError(f"make_judge: unknown judge {name!r}; known: keyword, llm")


__all__ = ["KeywordJudge", "LLMJudge", "make_judge", "parse_choice", "parse_turn", "turn_schema"]
