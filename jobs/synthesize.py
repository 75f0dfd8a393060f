"""Synthesis job: ``python -m jobs.synthesize --config configs/local.yaml [--cases PATH] [--out DIR] [--variants N]``.

The entry point for ``ray job submit``; also ``mdd synthesize``.
"""
from __future__ import annotations

import argparse
import logging
import sys

from mdd.cases import CaseFileError
from mdd.config import ConfigError, load_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mdd synthesize", description="Synthesize diagnostic dialogues from patient cases.")
    p.add_argument("--config", default="configs/local.yaml", help="YAML run configuration")
    p.add_argument("--cases", help="cases file or folder (JSON array, JSONL or Parquet); overrides synth.cases")
    p.add_argument("--out", help="output folder; overrides synth.out")
    p.add_argument("--variants", type=int, help="dialogues per case; overrides synth.variants")
    p.add_argument("--limit", type=int, help="only the first N valid cases")
    p.add_argument("--in-flight", type=int, dest="in_flight", help="dialogues in flight; overrides synth.in_flight")
    p.add_argument("--seed", type=int, help="run seed; overrides synth.seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mdd.privacy import install_log_filter

    install_log_filter()
    try:
        cfg = load_config(args.config, {
            "synth.cases": args.cases, "synth.out": args.out, "synth.variants": args.variants,
            "synth.limit": args.limit, "synth.in_flight": args.in_flight, "synth.seed": args.seed,
        })
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from mdd.driver import run_synthesis
    from mdd.storage import StorageError

    try:
        summary = run_synthesis(cfg, progress=not args.no_progress)
    except CaseFileError as exc:
        print(f"error: cannot read cases: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    c = summary["counts"]
    print(
        f"synthesized {c['dialogues_run']} dialogues ({c['dialogues_already_written']} already there, "
        f"{c['dialogues_failed']} failed) from {c['cases_valid']} cases; {c['cases_rejected']} cases rejected "
        f"-> {cfg.synth.out}/synth/ in {summary['wall_time_s']:.1f} s"
    )
    return 1 if c["dialogues_failed"] and not c["dialogues_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
