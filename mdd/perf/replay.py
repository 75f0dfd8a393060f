"""Benchmark pieces: the reference implementation's prompt layout, call-for-call replays, and
engine-capacity baselines. ``jobs/benchmark.py`` runs them in one process on one engine.
"""
from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from mdd.engines.base import Completion, EngineBase, Message, Request, Sampling

REF_WINDOW = 8  # the reference pastes the last 6-8 turns; 8 is the generous end
TOOL_SYSTEM = "你是医患对话分析助手，请根据给出的对话内容完成判断。"


class Recording(EngineBase):
    """Wraps an engine and keeps every request with its completion, per dialogue."""

    def __init__(self, inner: EngineBase):
        self.inner, self.name, self.model = inner, inner.name, inner.model
        self.calls: dict[str, list[tuple[Request, Completion]]] = {}

    async def generate(self, request: Request) -> Completion:
        c = await self.inner.generate(request)
        self.calls.setdefault(request.session, []).append((request, c))
        return c

    async def close_session(self, session: str, finished: bool = True) -> None:
        await self.inner.close_session(session, finished)


def _split_instruction(text: str) -> tuple[str, str]:
    """A user message is "<history turn>\n\n<instruction>" (see ops.with_instruction; an instruction
    holds no blank line)."""
    head, sep, tail = text.rpartition("\n\n")
    return (head, tail) if sep else (text, "")


_LABELLED = re.compile(r"^[\u4e00-\u9fff]{1,3}：")


def _turns(messages: tuple[Message, ...], agent: str) -> tuple[list[str], str]:
    """(history turns as "医生：…/患者：…" lines, the current call's instruction) from an
    append-only prompt; the instructions earlier turns answered are not part of the history.
    With a companion in the room the other speakers' turns already carry their labels."""
    instruction = ""
    doctor_role = "assistant" if agent not in ("patient", "companion") else "user"
    own = {"patient": "患者", "companion": "家属"}.get(agent, "医生")
    lines = []
    body = messages[1:]
    for i, m in enumerate(body):
        content = m.content
        if m.role == "user":
            content, instr = _split_instruction(content)
            if i == len(body) - 1:
                instruction = instr
        if content.startswith("（") and content.endswith("）"):
            continue  # the stage direction that opens the doctor's view
        if m.role == "user" and _LABELLED.match(content):
            lines.extend(content.split("\n"))
            continue
        who = own if m.role == "assistant" else ("医生" if m.role == doctor_role else "患者")
        lines.append(f"{who}：{content}")
    return lines, instruction


def reference_layout(request: Request) -> Request:
    """The same call as the reference implementation lays it out.

    Doctor and patient calls: one fresh user message pasting the persona (and case) and the
    last 6-8 turns, then the instruction. Topic-end verdicts: a fresh prompt over the
    current topic's turns. Other tool calls: a fresh prompt over the recent turns.
    """
    if request.op == "FicExpGen":  # already a fresh prompt in both layouts
        return request
    msgs = request.messages
    if request.op in ("DocGen", "PatGen", "CompanionGen") or request.agent in ("doctor", "patient", "companion"):
        lines, instruction = _turns(msgs, request.agent)
        text = f"{msgs[0].content}\n\n最近的对话：\n" + "\n".join(lines[-REF_WINDOW:]) + f"\n\n{instruction}"
        return replace(request, messages=(Message("user", text),))
    lines, instruction = _turns(msgs, "patient" if request.op == "TriggerExp" else "doctor")
    if request.op == "IsTopicEnd":
        n = 2 * int(request.context.get("exchanges", 1) or 1)
        lines = lines[-n:]
    else:
        lines = lines[-REF_WINDOW:]
    text = "对话内容：\n" + "\n".join(lines) + f"\n\n{instruction}"
    return replace(request, messages=(Message("system", TOOL_SYSTEM), Message("user", text)))


def prefill_only(request: Request) -> Request:
    """The call with one output token: a replay measures prompt processing only."""
    s = request.sampling
    return replace(request, sampling=Sampling(temperature=0.0, top_p=1.0, max_tokens=1, seed=s.seed))


async def replay(engine: EngineBase, dialogues: dict[str, list[Request]], concurrency: int) -> float:
    """Each dialogue's calls in order (a dialogue is sequential), dialogues side by side."""
    sem = asyncio.Semaphore(concurrency)

    async def one(reqs: list[Request]) -> None:
        async with sem:
            for r in reqs:
                await engine.generate(r)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(r) for r in dialogues.values()))
    return time.perf_counter() - t0


@dataclass(frozen=True)
class CallShape:
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    chain: int = 0

    @classmethod
    def from_log(cls, entry: tuple[Any, ...]) -> "CallShape":
        chain = int(entry[6]) if len(entry) > 6 else 0
        return cls(int(entry[0]), int(entry[1]), int(entry[2]), chain=chain)


def shaped_prompts(shapes: list[CallShape], vocab: int, seed: int = 0,
                   per_chain: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """Token prompts with the same lengths and the same cache behaviour as the logged calls, and
    the prompts that prime the cache before the clock.

    Each call's cached part is a prefix of its prompt chain's own sequence (a dialogue's doctor,
    patient or tool view), the rest fresh random tokens (it misses, as the original did); one
    priming request per chain computes the chain's longest cached prefix, so that every call hits
    exactly as much as it did in the pipeline. ``per_chain=False``: every cached part is a prefix
    of one sequence shared by all calls (no priming needed), the layout of earlier benchmarks:
    every request then reads the same KV blocks, which flatters a CPU engine's attention."""
    rng = random.Random(seed)
    lo = 10  # stay clear of special tokens at the bottom of the vocabulary
    longest: dict[int, int] = {}
    for s in shapes:
        key = s.chain if per_chain else 0
        longest[key] = max(longest.get(key, 0), s.cached_tokens)
    seqs = {k: [rng.randrange(lo, vocab) for _ in range(n)] for k, n in longest.items()}
    prompts = [seqs[s.chain if per_chain else 0][: s.cached_tokens]
               + [rng.randrange(lo, vocab) for _ in range(s.prompt_tokens - s.cached_tokens)] for s in shapes]
    primers = [seq for seq in seqs.values() if seq] if per_chain else []
    return prompts, primers


async def run_shapes(actor: Any, prompts: list[list[int]], outputs: list[int], concurrency: int,
                     temperature: float = 0.0) -> dict[str, Any]:
    """Independent requests with forced output lengths (ignore EOS), ``concurrency`` in flight,
    sampled at ``temperature`` (the pipeline's, so both pay the same sampler)."""
    sem = asyncio.Semaphore(concurrency)
    done = {"output_tokens": 0, "cached_tokens": 0}
    spans: list[tuple[float, float]] = []

    async def one(i: int) -> None:
        async with sem:
            t = time.monotonic()
            out = await actor.generate_tokens.remote(prompts[i], outputs[i], f"shape-{i}", temperature)
            spans.append((t, time.monotonic()))
            done["output_tokens"] += int(out["output_tokens"])
            done["cached_tokens"] += int(out.get("cached_tokens", 0))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "output_tokens": done["output_tokens"], "cached_tokens": done["cached_tokens"],
            "output_tok_s": done["output_tokens"] / wall,
            "occupancy": occupancy(spans, concurrency)}


def occupancy(spans: list[tuple[float, float]], target: int) -> dict[str, float]:
    """How full the engine was kept: the time-weighted mean of requests in flight over the
    spans' whole extent, and the share of that time with at least 90% of ``target`` in flight."""
    if not spans:
        return {"mean_in_flight": 0.0, "share_near_target": 0.0}
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    start, end = events[0][0], events[-1][0]
    level, last, near = 0, start, 0.0
    for t, step in events:
        if level >= 0.9 * target:
            near += t - last
        level, last = level + step, t
    wall = max(end - start, 1e-9)
    return {"mean_in_flight": round(sum(b - a for a, b in spans) / wall, 1),
            "share_near_target": round(near / wall, 3)}


def sum_counters(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after if isinstance(after.get(k), (int, float))}


def hit_rate(delta: dict[str, float], prefix: str = "") -> float | None:
    """vLLM's prefix-cache hit rate over counter deltas (``sum_counters``); ``prefix``: a router's
    ``<engine name>.`` for one pool's counters. None when nothing was queried."""
    q = delta.get(f"{prefix}prefix_cache_queries", 0.0)
    return round(delta.get(f"{prefix}prefix_cache_hits", 0.0) / q, 4) if q else None


def time_by_role(records: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The engine's busy time charged to roles: each moment's wall time split equally among the
    requests in flight then (a batched engine serves them in the same steps), from the call log's
    (start, end, role). Also each role's share of the uncached prompt and the output tokens."""
    events = sorted([(r[3], 1, i) for i, r in enumerate(records)] + [(r[4], -1, i) for i, r in enumerate(records)])
    live: set[int] = set()
    secs: dict[str, float] = {}
    last = events[0][0] if events else 0.0
    for t, step, i in events:
        if live and t > last:
            share = (t - last) / len(live)
            for j in live:
                role = records[j][5] if len(records[j]) > 5 and records[j][5] else "?"
                secs[role] = secs.get(role, 0.0) + share
        last = t
        (live.add if step > 0 else live.discard)(i)
    busy = sum(secs.values())
    prefill: dict[str, int] = {}
    output: dict[str, int] = {}
    for r in records:
        role = r[5] if len(r) > 5 and r[5] else "?"
        prefill[role] = prefill.get(role, 0) + int(r[0]) - int(r[1])
        output[role] = output.get(role, 0) + int(r[2])

    def shares(d: Mapping[str, float]) -> dict[str, float]:
        tot = sum(d.values()) or 1.0
        return {k: round(v / tot, 4) for k, v in sorted(d.items())}

    return {"busy_s": round(busy, 2), "seconds": {k: round(v, 2) for k, v in sorted(secs.items())},
            "time_share": shares(secs), "uncached_prompt_token_share": shares(prefill),
            "output_token_share": shares(output)}


def tok_s_within(records: list[tuple[Any, ...]], window: tuple[float, float]) -> float | None:
    """Output tokens per second of the requests that ended inside ``window`` (the log's clock)."""
    a, b = window
    ended = [int(r[2]) for r in records if a <= r[4] <= b]
    return sum(ended) / (b - a) if b > a and ended else None
