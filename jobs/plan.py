"""Capacity plan: ``python -m jobs.plan --config configs/gpu.yaml [--gpu h100-80gb] [--json FILE]`` (also ``mdd plan``).

Prints, for the config's model and engine settings on the named GPU: KV bytes per token, tokens
per dialogue, dialogues that fit per engine, the expected throughput range (a projection), and
whether ``synth.in_flight`` and ``engine.vllm`` fit. Offline: known models are a table in
``mdd/perf/plan.py``; a local model folder is read from its ``config.json``.
"""
from __future__ import annotations

import argparse
import json
import sys

from mdd.config import load_config
from mdd.errors import entry_point


@entry_point("plan")
def main(argv: list[str] | None = None) -> int:
    from mdd.perf.plan import GPUS, DialogueShape, plan_pools, render

    p = argparse.ArgumentParser(prog="mdd plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/gpu.yaml")
    p.add_argument("--gpu", default="h100-80gb", help=f"one of: {', '.join(GPUS)}")
    p.add_argument("--fill", type=float, help="share of the KV cache to plan for (default: engine.vllm.admission.fill)")
    p.add_argument("--exchanges", type=float, help=f"exchanges per dialogue (default {DialogueShape.exchanges})")
    p.add_argument("--json", help="also write the plan as JSON to this file")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    shape = DialogueShape(exchanges=args.exchanges) if args.exchanges else DialogueShape()
    try:
        plan = plan_pools(cfg, args.gpu, args.fill, shape)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, pool in plan.items():
        if len(plan) > 1 or name != "engine":
            print(f"== engines.{name}" + (f" (roles: {', '.join(pool['roles'])})" if "roles" in pool else ""))
        print(pool["skipped"] if "skipped" in pool else render(pool))
    if list(plan) == ["engine"]:
        plan = plan["engine"]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(plan, f, ensure_ascii=False, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
