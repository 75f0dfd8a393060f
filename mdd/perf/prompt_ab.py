"""Prompt layouts and sampling under A/B on a real model: the same dialogues, every arm in flight at once.

Each arm is a set of overrides of ``synth.dialogue`` (``layout.instruction=before``,
``sampling.family=none`` …). Every arm writes the same (case, variant) dialogues — the same persona,
patient style, companion, agenda and experience, all drawn from the run seed — on one engine at the
same time, so load and engine state are shared and the arms differ only by their overrides. Per arm:
the turn guards' first-attempt failure rate by speaker and guard (how often the layout makes the model
fail before any regeneration), dialogues written clean, clean without any regeneration, failed (by
guard), exchanges, turn lengths, output tokens and calls. Written as JSON; a few failed attempts per arm
are kept as examples.

    python -m jobs.bench_prompts --config configs/local-real.yaml --cases data/cases --limit 5 --variants 2 \\
        --max-exchanges 12 --out out/bench-prompts.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mdd.config import Config, DialogueConfig, load_config

log = logging.getLogger(__name__)

LAYOUTS: dict[str, dict[str, Any]] = {
    "after": {"layout.instruction": "after", "layout.labels": "companion"},
    "after+labels": {"layout.instruction": "after", "layout.labels": "always"},
    "before+labels": {"layout.instruction": "before", "layout.labels": "always"},
    "system+labels": {"layout.instruction": "system", "layout.labels": "always"},
}
SAMPLING: dict[str, dict[str, Any]] = {
    "family": {},  # the model family's recommendation (Qwen: 0.7 / 0.8 / top_k 20 / repetition 1.05)
    "mdd-defaults": {"sampling.temperature": 0.8, "sampling.top_p": 0.9, "sampling.top_k": 0,  # mdd's own defaults
                     "sampling.repetition_penalty": 1.0, "sampling.frequency_penalty": 0.3},
}
PRESETS = {"layouts": LAYOUTS, "sampling": SAMPLING}


def arm_config(base: DialogueConfig, overrides: dict[str, Any]) -> DialogueConfig:
    """``base`` with dotted overrides applied and validated (``layout.instruction``: ``before`` …)."""
    data = base.model_dump()
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return DialogueConfig.model_validate(data)


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    """``name=key=value,key=value`` → (name, overrides); values are read as YAML scalars."""
    import yaml

    name, _, rest = text.partition("=")
    overrides = {}
    for pair in filter(None, rest.split(",")):
        k, _, v = pair.partition("=")
        overrides[k.strip()] = yaml.safe_load(v)
    return name.strip(), overrides


async def _one(case: Any, variant: int, seed: int, engine: Any, cfg: DialogueConfig, personas: list[Any],
               arm: str) -> dict[str, Any]:
    from mdd.dialogue.loop import Dialogue, GuardFailure
    from mdd.dialogue.setting import setting

    persona, triple = setting(personas, case, seed, variant)
    # each arm's dialogue has its own session: the pool keeps its calls together, arms never share a prefix
    d = Dialogue(case, variant, seed, engine, cfg, persona, triple)
    d.id = f"{d.id}@{arm}"
    try:
        row = await d.run()
        return {"ok": True, "row": row, "acct": d.acct}
    except GuardFailure as exc:
        return {"ok": False, "guard": exc, "acct": d.acct, "turns": list(d.turns)}
    finally:
        await engine.close_session(d.id, True)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures (see the module docstring)."""
    from mdd.dialogue.guards import GuardTally

    tally = GuardTally()
    examples: list[dict[str, Any]]
    exchanges, doctor_len, patient_len, out_tokens, calls, examples = [], [], [], 0, 0, []
    for r in results:
        acct = r["acct"]
        out_tokens += sum(acct.output_tokens.values())
        calls += sum(acct.calls.values())
        if r["ok"]:
            row = r["row"]
            tally.add(acct.generated, row["guard_events"])
            exchanges.append(row["n_exchanges"])
            turns = row["turns"]
            doctor_len += [len(t["text"]) for t in turns[:-1] if t["speaker"] == "doctor"]
            patient_len += [len(t["text"]) for t in turns if t["speaker"] == "patient"]
            events = row["guard_events"]
        else:
            exc = r["guard"]
            tally.add(exc.generated, exc.events, (exc.speaker, exc.guards))
            events = exc.events
        examples += [e for e in events if len(examples) < 12]
    s = tally.summary()
    first = sum(n for by in tally.first_attempt.values() for n in by.values())
    turns = sum(v for k, v in tally.generated.items())
    return {
        **s,
        "first_attempt_failure_rate": round(first / turns, 4) if turns else None,
        "clean_share": round((s["dialogues_clean_first_time"] + s["dialogues_clean_after_regeneration"])
                             / max(1, s["dialogues"]), 3),
        "exchanges_mean": round(statistics.mean(exchanges), 2) if exchanges else None,
        "doctor_chars_mean": round(statistics.mean(doctor_len), 1) if doctor_len else None,
        "patient_chars_mean": round(statistics.mean(patient_len), 1) if patient_len else None,
        "output_tokens": out_tokens,
        "calls": calls,
        "examples": [{k: e.get(k) for k in ("speaker", "guard", "attempt", "reason", "text")} for e in examples],
    }


def run(cfg: Config, arms: dict[str, dict[str, Any]], *, cases_path: str, limit: int, variants: int,
        max_exchanges: int | None, in_flight: int) -> dict[str, Any]:
    from mdd.cases import load_cases
    from mdd.dialogue import ops
    from mdd.engines.router import launch_for
    from mdd.raylib import init_ray

    cases = load_cases(cases_path)[0][:limit]
    base = cfg.synth.dialogue
    if max_exchanges:
        base = base.model_copy(update={"max_exchanges": max_exchanges})
    configs = {name: arm_config(base, o) for name, o in arms.items()}
    personas = ops.all_personas()
    init_ray(cfg.ray)
    t0 = time.monotonic()
    engine = launch_for(cfg)
    started = time.monotonic() - t0
    work = [(arm, c, v) for c in cases for v in range(variants) for arm in configs]  # arms interleaved
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in configs}

    async def go() -> None:
        sem = asyncio.Semaphore(in_flight)

        async def one(arm: str, case: Any, v: int) -> None:
            async with sem:
                results[arm].append(await _one(case, v, cfg.synth.seed, engine, configs[arm], personas, arm))
                log.info("%s %s-v%d done", arm, case.case_id, v)

        await asyncio.gather(*(one(a, c, v) for a, c, v in work))

    t1 = time.monotonic()
    try:
        asyncio.run(go())
        metrics = engine.metrics()
    finally:
        engine.shutdown()
    return {
        "model": e.model if (e := cfg.engine_for("doctor")) else None,
        "cases": [c.case_id for c in cases], "variants": variants, "max_exchanges": base.max_exchanges,
        "in_flight": in_flight, "seed": cfg.synth.seed, "engine_start_s": round(started, 1),
        "wall_s": round(time.monotonic() - t1, 1),
        "prefix_cache_hit_rate": round(metrics.get("prefix_cache_hits", 0) / metrics["prefix_cache_queries"], 4)
        if metrics.get("prefix_cache_queries") else None,
        "arms": {a: {"overrides": arms[a], "sampling": configs[a].sampling.model_dump(),
                     "layout": configs[a].layout.model_dump(), **summarize(results[a])} for a in configs},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--cases", default="data/cases")
    ap.add_argument("--limit", type=int, default=5, help="the first N valid cases")
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--max-exchanges", type=int, default=None, help="shorter dialogues (the hard cap)")
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="layouts")
    ap.add_argument("--arm", action="append", default=[], help="name=key=value,key=value (instead of --preset)")
    ap.add_argument("--out", default="out/bench-prompts.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.config)
    arms = dict(parse_arm(a) for a in args.arm) if args.arm else PRESETS[args.preset]
    res = run(cfg, arms, cases_path=args.cases, limit=args.limit, variants=args.variants,
              max_exchanges=args.max_exchanges, in_flight=args.in_flight)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, ensure_ascii=False, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"{'arm':<16}{'first-attempt fail':>20}{'clean':>8}{'clean 1st':>10}{'failed':>8}{'exchanges':>11}")
    for a, r in res["arms"].items():
        print(f"{a:<16}{r['first_attempt_failure_rate']!s:>20}{r['clean_share']!s:>8}"
              f"{r['dialogues_clean_first_time']!s:>10}{r['dialogues_failed']!s:>8}{r['exchanges_mean']!s:>11}")
    print(f"prefix-cache hit rate {res['prefix_cache_hit_rate']}; wall {res['wall_s']} s; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
