"""What exemplar retrieval costs and what it buys, side by side in one run on one engine.

Three phases on the same cases and variants, one after the other on the same engine, each with a
cold prefix cache:

- ``without``: no exemplars; its evaluation writes the index the other two phases draw from;
- ``with``: exemplars before each topic's first question, kept in the doctor's history (the
  project's placement: every later prompt extends the one that carried them);
- ``with_dropped``: the same exemplars, dropped from the history after their turn (the placement
  a "retrieval in the prompt, not in the history" design gives: the cached prefix breaks there).

Per phase: prompt tokens, uncached prompt tokens (vLLM's prefix-cache queries − hits) and the hit
rate (vLLM engines; the scripted engine has no cache and reports none), doctor prompt tokens per
dialogue, the evaluation's mean ``doctor_quality``, high-quality share and rule pass rate. Ratios
compare each exemplar phase with ``without``.

    python -m mdd.perf.exemplars --config configs/local-vllm.yaml --out out/bench-exemplars.json [--limit 6]

``jobs.benchmark`` calls :func:`exemplar_comparison` too (its ``exemplars`` section).
"""
from __future__ import annotations

import argparse
import json
import logging
import posixpath
import sys
from typing import Any

from mdd.config import Config

log = logging.getLogger(__name__)

PHASES = (("without", None), ("with", True), ("with_dropped", False))


def _phase_cfg(cfg: Config, out: str, index: str | None, keep: bool | None, limit: int | None,
               variants: int) -> Config:
    d = cfg.synth.dialogue
    ex = d.exemplars.model_copy(update={"index": index, "keep_in_history": bool(keep) if keep is not None else True})
    synth = cfg.synth.model_copy(update={"out": out, "limit": limit, "variants": variants,
                                         "dialogue": d.model_copy(update={"exemplars": ex})})
    return cfg.model_copy(update={"synth": synth})


def _rule_pass_rate(rules: dict[str, dict[str, int]]) -> float | None:
    trig = sum(r.get("triggered", 0) for r in rules.values())
    return round(sum(r.get("passed", 0) for r in rules.values()) / trig, 4) if trig else None


def _exemplar_turns(out: str) -> dict[str, float]:
    from mdd.storage import open_store

    t = open_store(out).read_table("synth", ["turns"])
    doctor = shown = ids = 0
    for turns in t.column("turns").to_pylist():
        for turn in turns or []:
            if turn and turn.get("speaker") == "doctor":
                doctor += 1
                n = len(turn.get("exemplars") or [])
                shown += n > 0
                ids += n
    return {"doctor_turns": doctor, "doctor_turns_with_exemplars": shown, "exemplars_shown": ids}


def run_phase(cfg: Config, engine: Any) -> dict[str, Any]:
    from mdd.evaluate.stage import run_evaluate
    from mdd.perf.replay import sum_counters
    from mdd.synthesize.run import run_synthesis

    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()  # every phase starts cold
    m0 = engine.metrics()
    s = run_synthesis(cfg, engine=engine, progress=False)
    d = sum_counters(m0, engine.metrics())
    ev = run_evaluate(cfg, cfg.synth.out, quiet=True)
    n = max(1, s["counts"]["dialogues_run"])
    prompt = sum(s["tokens"]["prompt_by_role"].values())
    out: dict[str, Any] = {
        "dialogues": s["counts"]["dialogues_run"],
        "exchanges_per_dialogue": round(s["counts"]["exchanges_run"] / n, 2),
        "prompt_tokens": prompt,
        "doctor_prompt_tokens_per_dialogue": round(s["tokens"]["prompt_by_role"].get("doctor", 0) / n, 1),
        "llm_calls_per_exchange": s["llm_calls"]["per_exchange"],
        "doctor_quality": round(ev["metric_means"].get("doctor_quality", 0.0), 4),
        "overall": round(ev["metric_means"].get("overall", 0.0), 4),
        "high_quality_share": round(ev["high_quality_share"], 4),
        "rule_pass_rate": _rule_pass_rate(ev.get("rules") or {}),
        "index_size": ev["index"]["size"],
        **_exemplar_turns(cfg.synth.out),
    }
    if d.get("prefix_cache_queries"):
        q, h = d["prefix_cache_queries"], d.get("prefix_cache_hits", 0.0)
        out.update({"prefix_cache_queries": q, "prefix_cache_hits": h, "uncached_prompt_tokens": q - h,
                    # dialogues differ in length from phase to phase (vLLM's CPU build drops seeds): per exchange
                    "uncached_prompt_tokens_per_exchange": round((q - h) / max(1, s["counts"]["exchanges_run"]), 1),
                    "prefix_cache_hit_rate": round(h / q, 4), "counters": "vLLM prefix_cache_queries/hits"})
    return out


def exemplar_comparison(cfg: Config, engine: Any, work: str, *, limit: int | None = 6,
                        variants: int = 1) -> dict[str, Any]:
    """The three phases (see the module docstring) under ``work``; returns figures and ratios."""
    phases: dict[str, dict[str, Any]] = {}
    index = posixpath.join(str(work), "without")
    for name, keep in PHASES:
        out = posixpath.join(str(work), name)
        log.info("exemplars: phase %s (%s cases x %d variants)", name, limit or "all", variants)
        phases[name] = run_phase(_phase_cfg(cfg, out, None if keep is None else index, keep, limit, variants), engine)
    base = phases["without"]
    ratios: dict[str, dict[str, float | None]] = {}
    for name in ("with", "with_dropped"):
        p = phases[name]
        r: dict[str, float | None] = {}
        for key in ("prompt_tokens", "uncached_prompt_tokens", "uncached_prompt_tokens_per_exchange",
                    "doctor_prompt_tokens_per_dialogue"):
            if p.get(key) is not None and base.get(key):
                r[f"{key}_vs_without"] = round(p[key] / base[key], 4)
        for key in ("doctor_quality", "high_quality_share", "rule_pass_rate", "prefix_cache_hit_rate"):
            if p.get(key) is not None and base.get(key) is not None:
                r[f"{key}_minus_without"] = round(p[key] - base[key], 4)
        ratios[name] = r
    return {"engine": getattr(engine, "name", None), "model": getattr(engine, "model", None), "cases": limit,
            "variants": variants, "exemplar_config": cfg.synth.dialogue.exemplars.model_dump(exclude={"index"}),
            "phases": phases, "compared": ratios}


def main(argv: list[str] | None = None) -> int:
    import tempfile
    from pathlib import Path

    from mdd.config import load_config
    from mdd.engines.base import launch_engine
    from mdd.raylib import init_ray

    p = argparse.ArgumentParser(prog="python -m mdd.perf.exemplars", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/local-vllm.yaml")
    p.add_argument("--out", default="out/bench-exemplars.json")
    p.add_argument("--limit", type=int, default=6, help="cases")
    p.add_argument("--variants", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config)
    init_ray(cfg.ray)
    engine = launch_engine(cfg.engine)
    try:
        res = exemplar_comparison(cfg, engine, tempfile.mkdtemp(prefix="mdd-exemplars-"), limit=args.limit,
                                  variants=args.variants)
    finally:
        engine.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, ensure_ascii=False, indent=2), encoding="utf-8")
    print(json.dumps({"compared": res["compared"]}, ensure_ascii=False, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
