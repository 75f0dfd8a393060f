"""The main job: synthesize, then evaluate. ``python -m jobs.run --config configs/local.yaml [--out DIR]``."""
from __future__ import annotations

import argparse
import sys

from jobs import evaluate, synthesize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd run", description="Synthesize dialogues, then run the evaluation stage.")
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--cases")
    p.add_argument("--out")
    p.add_argument("--variants", type=int)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    common = ["--config", args.config] + (["--out", args.out] if args.out else [])
    synth_args = common + (["--cases", args.cases] if args.cases else []) + (
        ["--variants", str(args.variants)] if args.variants else []) + (["--no-progress"] if args.no_progress else [])
    rc = synthesize.main(synth_args)
    if rc != 0:
        return rc
    if not args.out:
        from mdd.config import load_config

        common += ["--out", load_config(args.config).synth.out]
    return evaluate.main(common)


if __name__ == "__main__":
    sys.exit(main())
