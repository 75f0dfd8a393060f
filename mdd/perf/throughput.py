"""Speedup, engine ceiling and utilisation, on the same work, repeated.

One repeat, on one engine (the concurrent set is every (case, variant) of the run):

1. one in flight, the first half of a seeded random sample of the set;
2. ``in_flight`` in flight, the whole set (a finished dialogue's slot goes to the next);
3. one in flight, the sample's second half (a shared machine's load drifts over a run: the
   one-in-flight phase brackets the concurrent one);
4. the engine's ceiling: the calls of phases 1+3 replayed as independent requests one at a time,
   and the calls of phase 2 replayed with ``in_flight`` in flight (same prompt, cache-hit and output
   lengths, no dialogue logic). Each prompt chain (a dialogue's doctor, patient or tool view) gets
   its own cached prefix, primed before the clock. The first repeat also replays phase 2 the way
   earlier benchmarks did, every cached part a prefix of one sequence shared by all calls: 135
   requests reading the same KV blocks run faster on a CPU than any real batch (measured: the
   per-chain replay of the same calls took 1.24x its wall time), which inflated the ceiling.

Per repeat: ``speedup`` (dialogues/min, concurrent ÷ one in flight), the same per exchange and per
output token, ``engine_ceiling`` (the engine's own output tok/s at ``in_flight`` ÷ at 1, on those
calls), ``speedup_share_of_ceiling`` (the per-token speedup ÷ the ceiling), ``engine_utilization``
(pipeline output tok/s ÷ the engine's on the same calls, concurrent phase), the same over the
phase's steady part only (``engine_utilization_steady``: until the last dialogue is admitted; after
it the slots empty as the last dialogues finish, a tail a run of thousands pays once) and at one in
flight, the prefix-cache hit rate of the concurrent phase, and the engine's busy time charged to
roles (``replay.time_by_role``). ``summarise`` gives each figure's min / median / max over the
repeats.
"""
from __future__ import annotations

import asyncio
import logging
import statistics
from typing import Any, Sequence

from mdd.perf import replay
from mdd.perf.phases import PhaseResult, Phases, sample

log = logging.getLogger(__name__)

RATIOS = ("speedup_vs_sequential", "speedup_exchanges_per_min", "speedup_output_tok_s", "engine_ceiling",
          "speedup_share_of_ceiling", "engine_utilization", "engine_utilization_steady",
          "engine_utilization_one_in_flight", "prefix_cache_hit_rate")


def spread(values: Sequence[float | None]) -> dict[str, float]:
    vs = [v for v in values if v is not None]
    if not vs:
        return {}
    return {"min": round(min(vs), 4), "median": round(statistics.median(vs), 4), "max": round(max(vs), 4),
            "n": len(vs)}


def summarise(repeats: list[dict[str, Any]], keys: tuple[str, ...] = RATIOS) -> dict[str, dict[str, float]]:
    return {k: spread([r.get(k) for r in repeats]) for k in keys if any(r.get(k) is not None for r in repeats)}


def engine_tok_s(phases: Phases, calls: list[tuple[Any, ...]], concurrency: int, temperature: float,
                 per_chain: bool = True) -> dict[str, Any]:
    """The calls of a phase as independent requests on the engine, ``concurrency`` in flight, each
    prompt chain's cached prefix primed before the clock (``replay.shaped_prompts``)."""
    import ray

    actor = phases.engine.actors[0]
    shapes = [replay.CallShape.from_log(e) for e in calls]
    prompts, primers = replay.shaped_prompts(shapes, ray.get(actor.vocab_size.remote()), per_chain=per_chain)
    phases.reset_cache()
    if primers:
        asyncio.run(replay.run_shapes(actor, primers, [1] * len(primers), concurrency, temperature))
    raw = asyncio.run(replay.run_shapes(actor, prompts, [s.output_tokens for s in shapes], concurrency, temperature))
    return {"requests": len(shapes), "wall_s": round(raw["wall_s"], 2), "output_tok_s": round(raw["output_tok_s"], 1),
            "occupancy": raw["occupancy"], "cached_prefixes": "per chain, primed" if per_chain else "one shared",
            "cached_tokens": raw["cached_tokens"]}


def _hit_rate(before: dict[str, float], after: dict[str, float]) -> tuple[float | None, dict[str, float]]:
    d = replay.sum_counters(before, after)
    return replay.hit_rate(d), {"queries": d.get("prefix_cache_queries", 0.0), "hits": d.get("prefix_cache_hits", 0.0)}


def one_repeat(phases: Phases, items: list[Any], in_flight: int, sequential: int, seed: int,
               temperature: float, shared_prefix_too: bool = False) -> dict[str, Any]:
    picked = sample(items, sequential, seed)
    half = max(1, len(picked) // 2)
    parts: list[PhaseResult] = []
    phases.reset_cache()
    log.info("one in flight: %d of the set's %d dialogues (sample seed %d)", half, len(items), seed)
    parts.append(phases.run("one-before", picked[:half], 1))
    phases.reset_cache()
    m0 = phases.engine.metrics() if phases.is_vllm else {}
    log.info("%d in flight: all %d dialogues", in_flight, len(items))
    conc = phases.run("concurrent", items, in_flight)
    m1 = phases.engine.metrics() if phases.is_vllm else {}
    if len(picked) > half:
        phases.reset_cache()
        log.info("one in flight: the sample's other %d", len(picked) - half)
        parts.append(phases.run("one-after", picked[half:], 1))
    seq_wall = sum(p.wall_s for p in parts)
    seq = PhaseResult(name="one", in_flight=1, wall_s=seq_wall, dialogues=sum(p.dialogues for p in parts),
                      failed=sum(p.failed for p in parts), exchanges=sum(p.exchanges for p in parts),
                      output_tokens=sum(p.output_tokens for p in parts),
                      calls=[c for p in parts for c in p.calls])
    out: dict[str, Any] = {
        "sample": [f"{it.case_id}-v{it.variant}" for it in picked],
        "one_in_flight": {**seq.summary(), "dialogues_per_min_before_and_after": [round(p.dialogues_per_min, 2)
                                                                                   for p in parts]},
        "concurrent": conc.summary(),
        "speedup_vs_sequential": round(conc.dialogues_per_min / seq.dialogues_per_min, 3) if seq.wall_s else None,
        "speedup_exchanges_per_min": (round(conc.exchanges_per_min / seq.exchanges_per_min, 3)
                                      if seq.exchanges else None),
        "speedup_output_tok_s": round(conc.output_tok_s / seq.output_tok_s, 3) if seq.output_tokens else None,
    }
    if phases.is_vllm:
        out["prefix_cache_hit_rate"], out["prefix_cache"] = _hit_rate(m0, m1)
        out["preemptions"] = replay.sum_counters(m0, m1).get("preemptions", 0.0)
        out["pipeline_occupancy"] = replay.occupancy([e[3:5] for e in conc.calls], in_flight)
        log.info("engine ceiling: the same calls as independent requests, at 1 and at %d in flight", in_flight)
        at1 = engine_tok_s(phases, seq.calls, 1, temperature)
        atn = engine_tok_s(phases, conc.calls, in_flight, temperature)
        out["engine_one_in_flight"], out["engine_in_flight"] = at1, atn
        if shared_prefix_too:  # the earlier baseline, for comparison: every cached part one shared prefix
            out["engine_in_flight_shared_prefix"] = engine_tok_s(phases, conc.calls, in_flight, temperature,
                                                                 per_chain=False)
        out["engine_time_by_role"] = replay.time_by_role(conc.calls)
        # the pipeline's tokens as the engine counted them (the rows count the same tokens)
        seq_tok_s = sum(c[2] for c in seq.calls) / seq.wall_s
        conc_tok_s = sum(c[2] for c in conc.calls) / conc.wall_s
        out["pipeline_output_tok_s"] = {"one_in_flight": round(seq_tok_s, 1), "in_flight": round(conc_tok_s, 1)}
        out["engine_ceiling"] = round(atn["output_tok_s"] / at1["output_tok_s"], 3)
        out["engine_utilization"] = round(conc_tok_s / atn["output_tok_s"], 4)
        steady = replay.tok_s_within(conc.calls, conc.steady)
        if steady is not None:  # while every slot was busy (before the last dialogues' tail)
            out["pipeline_output_tok_s"]["in_flight_steady"] = round(steady, 1)
            out["steady_share_of_phase"] = round((conc.steady[1] - conc.steady[0]) / conc.wall_s, 3)
            out["engine_utilization_steady"] = round(steady / atn["output_tok_s"], 4)
        out["engine_utilization_one_in_flight"] = round(seq_tok_s / at1["output_tok_s"], 4)
        out["speedup_share_of_ceiling"] = round(conc_tok_s / seq_tok_s / out["engine_ceiling"], 4)
    return out


def run_repeats(phases: Phases, items: list[Any], in_flight: int, sequential: int, repeats: int, seed: int,
                temperature: float) -> dict[str, Any]:
    per = []
    for r in range(repeats):
        log.info("repeat %d/%d", r + 1, repeats)
        per.append(one_repeat(phases, items, in_flight, sequential, seed + r, temperature, shared_prefix_too=r == 0))
    return {"repeats": per, "summary": summarise(per)}
