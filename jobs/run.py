"""The main job: synthesize, evaluate, then write the report and the dataset card.

    python -m jobs.run --config configs/local.yaml [--out DIR] [--reference REF]
"""
from __future__ import annotations

import argparse
import sys

from jobs import evaluate, report, synthesize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd run", description="Synthesize dialogues, evaluate them, write the report and the dataset card.")
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--cases")
    p.add_argument("--out")
    p.add_argument("--variants", type=int)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--reference", help="dialogue table the report compares with (default: the published MDD-5k figures)")
    args = p.parse_args(argv)
    common = ["--config", args.config] + (["--out", args.out] if args.out else [])
    synth_args = common + (["--cases", args.cases] if args.cases else []) + (
        ["--variants", str(args.variants)] if args.variants else []) + (["--no-progress"] if args.no_progress else [])
    rc = synthesize.main(synth_args)
    if rc != 0:
        return rc
    from mdd.config import load_config

    cfg = load_config(args.config)
    out = args.out or cfg.synth.out
    if not args.out:
        common += ["--out", out]
    rc = evaluate.main(common)
    if rc != 0 or not cfg.publish.report:
        return rc
    return report.publish(cfg, out, args.reference)


if __name__ == "__main__":
    sys.exit(main())
