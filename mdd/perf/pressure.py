"""The production-shaped profile: dialogues that end by the dialogue logic, MDD-5k's turn lengths,
and a KV cache sized to what a real GPU holds per dialogue in flight, so that it must evict.

* Shape: ``max_exchanges`` well above where the dialogue logic ends a dialogue, doctor and patient
  answers of exactly 74 and 98 tokens (MDD-5k's 99 and 131 characters at 0.75 Qwen tokens per
  character; the random-weight tiny model is held to them with ``min_tokens``), and a context long
  enough that no dialogue ends on it.
* Pressure: ``mdd plan``'s KV tokens per engine for ``configs/gpu.yaml``'s model on an H100, divided
  by the dialogues per engine a config asks for (``--pressure-per-engine``, 256 by default: what
  ``configs/gpu.yaml`` asked before it was planned), times the dialogues in flight here.

One engine without the cap (``unpressured``) and one with it run the same set of dialogues; the
capped one runs it twice per repeat, with a fixed number in flight and with KV-aware admission
(in alternating order), so the two admissions meet the same drift. Each phase reports throughput,
the prefix-cache hit rate, preemptions and the uncached prompt tokens per exchange.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mdd.config import Config, load_config
from mdd.perf import replay
from mdd.perf.phases import PhaseResult, Phases
from mdd.perf.throughput import summarise

log = logging.getLogger(__name__)

DOCTOR_TOKENS, PATIENT_TOKENS = 74, 98  # MDD-5k turn lengths on a Qwen tokenizer
GPU_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "gpu.yaml"


def production_config(cfg: Config, max_model_len: int = 16384) -> Config:
    """``cfg`` with the production dialogue shape (the engine's context widened to hold it)."""
    d = cfg.synth.dialogue
    sampling = d.sampling.model_copy(update={
        "doctor_max_tokens": DOCTOR_TOKENS, "doctor_min_tokens": DOCTOR_TOKENS,
        "patient_max_tokens": PATIENT_TOKENS, "patient_min_tokens": PATIENT_TOKENS})
    dialogue = d.model_copy(update={"max_exchanges": 60, "max_context_tokens": max_model_len - 512,
                                    "sampling": sampling})
    engine = cfg.engine
    if engine.name == "vllm":
        extra = dict(engine.vllm.extra)
        # the tiny model's config says 8192 positions; its random weights do not care past that
        extra.setdefault("hf_overrides", {"max_position_embeddings": max_model_len})
        engine = engine.model_copy(update={"vllm": engine.vllm.model_copy(
            update={"max_model_len": max_model_len, "extra": extra})})
    return cfg.model_copy(update={"engine": engine,
                                  "synth": cfg.synth.model_copy(update={"dialogue": dialogue})})


def kv_tokens_per_dialogue(per_engine: int, gpu: str = "h100-80gb") -> dict[str, Any]:
    """What one dialogue in flight gets of a real GPU's KV cache, from ``mdd plan``."""
    from mdd.perf.plan import plan_config

    p = plan_config(load_config(GPU_CONFIG), gpu)["engine"]
    return {"gpu": gpu, "model": p["model"], "kv_tokens_per_engine": p["kv_tokens_per_engine"],
            "dialogues_per_engine": per_engine, "tokens_per_dialogue": p["kv_tokens_per_engine"] // per_engine}


def _figures(phase: PhaseResult, m0: dict[str, float], m1: dict[str, float]) -> dict[str, Any]:
    d = replay.sum_counters(m0, m1)
    prompt = sum(c[0] for c in phase.calls)
    cached = sum(c[1] for c in phase.calls)
    return {**phase.summary(),
            "prefix_cache_hit_rate": replay.hit_rate(d),
            "preemptions": d.get("preemptions", 0.0),
            "uncached_prompt_tokens_per_exchange": round((prompt - cached) / max(1, phase.exchanges), 1),
            "mean_requests_in_flight": replay.occupancy([c[3:5] for c in phase.calls], phase.in_flight)[
                "mean_in_flight"],
            "exchanges_per_dialogue": round(phase.exchanges / max(1, phase.dialogues), 2)}


def _phase(phases: Phases, name: str, items: list[Any], in_flight: int) -> dict[str, Any]:
    phases.reset_cache()
    m0 = phases.engine.metrics()
    ph = phases.run(name, items, in_flight)
    m1 = phases.engine.metrics()
    out = _figures(ph, m0, m1)
    out["engine"] = {k: v for k, v in phases.engine.engine_stats()[0].items()
                     if k.startswith(("kv_", "expected_", "admission", "footprint", "mean_peak", "sessions_"))}
    return out


def set_admission(engine: Any, mode: str) -> None:
    import ray

    ray.get([a.set_admission.remote(mode) for a in engine.actors])


def run_unpressured(cfg: Config, cases: list[Any], items: list[Any], in_flight: int, repeats: int) -> list[dict]:
    from mdd.engines.base import launch_engine

    engine = launch_engine(cfg.engine)
    try:
        phases = Phases(cfg, cases, engine, in_flight)
        out = []
        for r in range(repeats):
            log.info("production profile, no KV cap, repeat %d/%d: %d dialogues, %d in flight", r + 1, repeats,
                     len(items), in_flight)
            out.append(_phase(phases, "unpressured", items, in_flight))
        phases.close()
        return out
    finally:
        engine.shutdown()


def run_pressured(cfg: Config, cases: list[Any], items: list[Any], in_flight: int, repeats: int,
                  kv_tokens: int) -> list[dict[str, dict]]:
    from mdd.engines.base import launch_engine

    o = cfg.engine.vllm
    capped = cfg.engine.model_copy(update={"vllm": o.model_copy(update={"kv_cache_tokens": kv_tokens})})
    engine = launch_engine(capped)
    try:
        phases = Phases(cfg, cases, engine, in_flight)
        out = []
        for r in range(repeats):
            order = ("fixed", "kv") if r % 2 == 0 else ("kv", "fixed")
            rep: dict[str, dict] = {}
            for mode in order:
                log.info("production profile, KV cap %d tokens, repeat %d/%d: %s admission", kv_tokens, r + 1,
                         repeats, mode)
                set_admission(engine, mode)
                rep[mode] = _phase(phases, mode, items, in_flight)
            set_admission(engine, "fixed")
            out.append(rep)
        phases.close()
        return out
    finally:
        engine.shutdown()


def ratios(unpressured: list[dict], pressured: list[dict[str, dict]]) -> dict[str, Any]:
    per = []
    for r, p in enumerate(pressured):
        u = unpressured[min(r, len(unpressured) - 1)]
        f, k = p["fixed"], p["kv"]
        per.append({
            "kv_vs_fixed_dialogues_per_min": round(k["dialogues_per_min"] / f["dialogues_per_min"], 4),
            "kv_vs_fixed_output_tok_s": round(k["output_tok_s"] / f["output_tok_s"], 4),
            "kv_minus_fixed_hit_rate": round((k["prefix_cache_hit_rate"] or 0) - (f["prefix_cache_hit_rate"] or 0), 4),
            "fixed_vs_unpressured_dialogues_per_min": round(f["dialogues_per_min"] / u["dialogues_per_min"], 4),
            "kv_vs_unpressured_dialogues_per_min": round(k["dialogues_per_min"] / u["dialogues_per_min"], 4),
            "fixed_prefill_vs_unpressured": round(f["uncached_prompt_tokens_per_exchange"]
                                                  / max(1e-9, u["uncached_prompt_tokens_per_exchange"]), 3),
            "kv_prefill_vs_unpressured": round(k["uncached_prompt_tokens_per_exchange"]
                                               / max(1e-9, u["uncached_prompt_tokens_per_exchange"]), 3),
            "hit_rate_unpressured": u["prefix_cache_hit_rate"],
            "hit_rate_fixed": f["prefix_cache_hit_rate"],
            "hit_rate_kv": k["prefix_cache_hit_rate"],
        })
    keys = tuple(per[0]) if per else ()
    return {"repeats": per, "summary": summarise(per, keys)}
