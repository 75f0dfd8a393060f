"""Timed benchmark phases: a set of (case, variant) dialogues run with a given number in flight
on warm dialogue workers, the clock covering the dialogues only.

The driver's ``run_synthesis`` also starts worker actors and writes shards; a benchmark phase
timed through it carries those costs on both sides of a ratio, in different shares. Here the
workers are started (and one dialogue run on them) before any clock starts, the rows are kept
in memory, and a phase's wall time runs from its first submission to its last result.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from mdd.cases import Case
from mdd.config import Config
from mdd.synthesize.plan import Item, submission_order
from mdd.synthesize.worker import DialogueWorker


@dataclass
class PhaseResult:
    name: str
    in_flight: int
    wall_s: float
    dialogues: int
    failed: int
    exchanges: int
    output_tokens: int
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)
    calls: list[tuple[Any, ...]] = field(default_factory=list, repr=False)  # the engine's call log, if any
    # the steady part, on the engine log's clock (time.monotonic): from the first submission to the
    # last admission, while every slot was kept busy (after it, the last dialogues finish: the tail)
    steady: tuple[float, float] = (0.0, 0.0)
    calls_by_pool: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict, repr=False)

    @property
    def dialogues_per_min(self) -> float:
        return self.dialogues / self.wall_s * 60.0 if self.wall_s else 0.0

    @property
    def exchanges_per_min(self) -> float:
        return self.exchanges / self.wall_s * 60.0 if self.wall_s else 0.0

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "dialogues": self.dialogues, "failed": self.failed,
                "exchanges": self.exchanges, "wall_s": round(self.wall_s, 2),
                "dialogues_per_min": round(self.dialogues_per_min, 2),
                "exchanges_per_min": round(self.exchanges_per_min, 1),
                "output_tok_s": round(self.output_tok_s, 1)}


def items_for(cases: list[Case], variants: int) -> list[Item]:
    return [Item(c.case_id, v) for c in cases for v in range(variants)]


def engine_actors(engine: Any) -> dict[str, list[Any]]:
    """The vLLM engine actors behind ``engine`` by pool name: a router's named engines, or one
    pool (named "")."""
    if hasattr(engine, "engines"):
        return {name: list(getattr(e, "actors", [])) for name, e in engine.engines.items()}
    return {"": list(getattr(engine, "actors", []))}


def sample(items: list[Item], k: int, seed: int) -> list[Item]:
    """A seeded random sample of ``items`` (the one-in-flight phase's share of the set)."""
    return random.Random(seed).sample(items, min(k, len(items)))


class Phases:
    """Warm dialogue workers on ``engine``; ``run`` times one phase."""

    def __init__(self, cfg: Config, cases: list[Case], engine: Any, max_in_flight: int) -> None:
        import ray

        self.cfg, self.engine = cfg, engine
        self.cases = {c.case_id: c for c in cases}
        self.actors = engine_actors(engine)
        self.is_vllm = any(self.actors.values())  # vLLM engine actors (with call logs) behind the engine
        n = max(1, cfg.synth.num_workers)
        per = max(1, math.ceil(max_in_flight / n))
        Worker = ray.remote(DialogueWorker).options(num_cpus=0, max_concurrency=per)
        cases_ref = ray.put({c.case_id: c for c in cases})
        # actor handles: Ray's hints do not give their methods' ``.remote``
        self.workers: list[Any] = [Worker.remote(cases_ref, engine, cfg.synth.dialogue, cfg.synth.seed)
                                   for _ in range(n)]
        ray.get([w.ready.remote() for w in self.workers])
        # warm: the first dialogue compiles kernels and fills allocator pools; not timed
        ray.get([w.run.remote(cases[k % len(cases)].case_id, 0) for k, w in enumerate(self.workers)])
        self.take_log()

    def take_logs(self) -> dict[str, list[tuple[Any, ...]]]:
        """Each pool's call log since the last take (vLLM: one ``CallRecord`` per request)."""
        if not self.is_vllm:
            return {}
        import ray

        return {pool: [e for logs in ray.get([a.take_log.remote() for a in actors]) for e in logs]
                for pool, actors in self.actors.items()}

    def take_log(self) -> list[tuple[Any, ...]]:
        return [e for logs in self.take_logs().values() for e in logs]

    def reset_cache(self) -> None:
        if self.is_vllm:
            for e in getattr(self.engine, "engines", {"": self.engine}).values():
                if hasattr(e, "reset_prefix_cache"):
                    e.reset_prefix_cache()

    def run(self, name: str, items: list[Item], in_flight: int) -> PhaseResult:
        """``items`` with ``in_flight`` dialogues at a time, each finished one's slot going to the next,
        submitted in the order the driver would (``synth.tail_order``); the order is set before the clock."""
        import ray

        queue = list(reversed(submission_order(items, self.cases, self.cfg.synth, in_flight)))
        inflight: dict[Any, Item] = {}
        rows: list[dict[str, Any]] = []
        failed = rr = 0
        self.take_log()
        t0, m0 = time.perf_counter(), time.monotonic()
        steady = (m0, m0)
        while queue or inflight:
            while queue and len(inflight) < in_flight:
                it = queue.pop()
                inflight[self.workers[rr % len(self.workers)].run.remote(it.case_id, it.variant)] = it
                rr += 1
                if not queue:
                    steady = (m0, time.monotonic())
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                inflight.pop(ref)
                res = ray.get(ref)
                if res["ok"]:
                    rows.append(res["row"])
                else:
                    failed += 1
        wall = time.perf_counter() - t0
        logs = self.take_logs()
        return PhaseResult(name=name, in_flight=in_flight, wall_s=wall, dialogues=len(rows), failed=failed,
                           exchanges=sum(r["n_exchanges"] for r in rows),
                           output_tokens=sum(r["output_tokens"] for r in rows), rows=rows,
                           calls=[e for log in logs.values() for e in log], steady=steady, calls_by_pool=logs)

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
