"""The main job: synthesize, evaluate, then write the report and the dataset card.

    python -m jobs.run --config configs/local.yaml [--out DIR] [--reference REF]

Exit codes are synthesize's (``python -m jobs.synthesize --help``); the evaluation runs after a
synthesis that exits 0 or 3 (``--strict``, partial), and its own failure wins.
"""
from __future__ import annotations

import argparse
import sys

from jobs import evaluate, report, synthesize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd run", description="Synthesize dialogues, evaluate them, write the report "
                                "and the dataset card.", epilog=synthesize.EXIT_CODES)
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--cases")
    p.add_argument("--out")
    p.add_argument("--variants", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--reference", help="dialogue table the report compares with (default: the published MDD-5k figures)")
    synthesize.add_run_flags(p)
    args = p.parse_args(argv)
    common = ["--config", args.config] + (["--out", args.out] if args.out else [])
    synth_args = common + ["--resume", args.resume]
    for flag, value in (("--cases", args.cases), ("--variants", args.variants), ("--seed", args.seed)):
        if value is not None:
            synth_args += [flag, str(value)]
    synth_args += ["--strict"] * args.strict + ["--no-progress"] * args.no_progress
    synth_rc = synthesize.main(synth_args)
    if synth_rc not in (0, 3):
        return synth_rc
    from mdd.config import load_config

    cfg = load_config(args.config)
    out = args.out or cfg.synth.out
    if not args.out:
        common += ["--out", out]
    try:
        rc = evaluate.main(common)
        if rc == 0 and cfg.publish.report:
            rc = report.publish(cfg, out, args.reference)
    except KeyboardInterrupt:
        print("interrupted after the synthesis; the dialogues are kept, rerun to evaluate", file=sys.stderr)
        return 130
    return rc or synth_rc


if __name__ == "__main__":
    sys.exit(main())
