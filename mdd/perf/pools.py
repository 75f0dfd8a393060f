"""The pools profile: one engine shared by every role against split pools (the doctor on one
engine, the other roles on another), on the same work and the same total resources, side by side
in one run, and the engine time each role costs.

* Same resources: the config's single vLLM engine (its ``cpu_threads`` and KV space; on a GPU
  node, its GPUs) against two engines that each get half of them.
* Same work: the same (case, variant) set with the same number of dialogues in flight; the split
  run routes each role's calls to its pool (``mdd/engines/router.py``).
* Alternating order: repeat r runs shared then split when r is even, split then shared when odd,
  each with its engines launched for it and shut down after (a 2-core machine cannot hold three
  CPU engines' threads at once), so the two meet the same drift of a shared machine's load.

Each run reports throughput, each pool's prefix-cache hit rate and busy time, and the engine time
charged to roles (``replay.time_by_role``: each moment's time split among the requests in flight).
With one model for both pools (the tiny model here) the comparison prices the split itself: two
half-size batches and a pool idle while the other works. A real split pays off when the other
roles run on a cheaper model; ``mdd plan`` sizes each pool for that.
"""
from __future__ import annotations

import logging
from typing import Any

from mdd.config import Config, EngineConfig
from mdd.perf import replay
from mdd.perf.phases import PhaseResult, Phases
from mdd.perf.throughput import spread

log = logging.getLogger(__name__)

SPLIT_ROLES = {"doctor": "doctor", "default": "rest"}


def _half(e: EngineConfig) -> EngineConfig:
    v = e.vllm
    update: dict[str, Any] = {"num_engines": 1}
    if v.cpu_threads:
        update["cpu_threads"] = max(1, v.cpu_threads // 2)
    if v.kv_cache_space_gib:
        update["kv_cache_space_gib"] = v.kv_cache_space_gib / 2
    if v.kv_cache_tokens:
        update["kv_cache_tokens"] = v.kv_cache_tokens // 2
    if v.num_gpus_per_engine >= 2:
        update["num_gpus_per_engine"] = v.num_gpus_per_engine / 2
    return e.model_copy(update={"vllm": v.model_copy(update=update)})


def configs(cfg: Config) -> dict[str, Config]:
    """``shared``: the config's one engine for every role; ``split``: two engines with half its
    resources each, the doctor on one, every other role on the other."""
    if cfg.engines or cfg.engine.name != "vllm":
        raise ValueError("the pools profile needs a single vllm engine (it is split in two)")
    shared_engine = cfg.engine.model_copy(update={"vllm": cfg.engine.vllm.model_copy(update={"num_engines": 1})})
    half = _half(cfg.engine).model_dump()
    raw = {k: v for k, v in cfg.model_dump().items() if k != "engine"}
    split = Config.model_validate({**raw, "engines": {"doctor": half, "rest": half}, "roles": SPLIT_ROLES})
    return {"shared": cfg.model_copy(update={"engine": shared_engine}), "split": split}


def figures(phase: PhaseResult, m0: dict[str, float], m1: dict[str, float], threads: dict[str, int]) -> dict[str, Any]:
    """One run's throughput, per-pool figures, and the engine time by role in thread-seconds (a
    pool's seconds times its threads: a split pool's second costs half a shared engine's)."""
    d = replay.sum_counters(m0, m1)
    pools: dict[str, Any] = {}
    cost: dict[str, float] = {}
    for name, recs in phase.calls_by_pool.items():
        by_role = replay.time_by_role(recs)
        pools[name or "shared"] = {"requests": len(recs), "busy_s": by_role["busy_s"],
                                   "prefix_cache_hit_rate": replay.hit_rate(d, f"{name}." if name else ""),
                                   "roles": sorted({r[5] for r in recs if len(r) > 5 and r[5]}),
                                   "time_by_role": by_role}
        for role, sec in by_role["seconds"].items():
            cost[role] = cost.get(role, 0.0) + sec * threads.get(name, 1)
    total = sum(cost.values()) or 1.0
    return {**phase.summary(), "pools": pools,
            "engine_thread_seconds_by_role": {k: round(v, 1) for k, v in sorted(cost.items())},
            "engine_time_share_by_role": {k: round(v / total, 4) for k, v in sorted(cost.items())}}


def _threads(c: Config) -> dict[str, int]:
    if c.engines:
        return {n: int(e.vllm.cpu_threads or 1) for n, e in c.engines.items()}
    return {"": int(c.engine.vllm.cpu_threads or 1)}


def measure(c: Config, cases: list[Any], items: list[Any], in_flight: int, name: str, engine: Any) -> dict[str, Any]:
    """One timed run of ``items`` on a launched ``engine`` (one pool or a router over named ones)."""
    phases = Phases(c, cases, engine, in_flight)
    try:
        phases.reset_cache()
        m0 = engine.metrics()
        ph = phases.run(name, items, in_flight)
        m1 = engine.metrics()
    finally:
        phases.close()
    return figures(ph, m0, m1, _threads(c))


def run_one(c: Config, cases: list[Any], items: list[Any], in_flight: int, name: str) -> dict[str, Any]:
    from mdd.engines.router import launch_for

    engine = launch_for(c)
    try:
        return measure(c, cases, items, in_flight, name, engine)
    finally:
        engine.shutdown()


def run_pools(cfg: Config, cases: list[Any], items: list[Any], in_flight: int, repeats: int) -> dict[str, Any]:
    cs = configs(cfg)
    runs: list[dict[str, Any]] = []
    for r in range(repeats):
        order = ("shared", "split") if r % 2 == 0 else ("split", "shared")
        got = {}
        for name in order:
            log.info("pools repeat %d/%d: %s, %d dialogues, %d in flight", r + 1, repeats, name, len(items), in_flight)
            got[name] = run_one(cs[name], cases, items, in_flight, name)
        got["split_over_shared_dialogues_per_min"] = round(
            got["split"]["dialogues_per_min"] / got["shared"]["dialogues_per_min"], 3)
        runs.append(got)
    ratio = spread([g["split_over_shared_dialogues_per_min"] for g in runs])
    share = {side: {role: spread([g[side]["engine_time_share_by_role"].get(role) for g in runs])
                    for role in sorted({k for g in runs for k in g[side]["engine_time_share_by_role"]})}
             for side in ("shared", "split")}
    return {"dialogues": len(items), "in_flight": in_flight,
            "split": {"roles": SPLIT_ROLES, "each_pool": "half the engine's cpu_threads and KV space"},
            "repeats": runs,
            "summary": {"split_over_shared_dialogues_per_min": ratio, "engine_time_share_by_role": share}}
