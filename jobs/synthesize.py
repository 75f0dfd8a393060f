"""Synthesis job: ``python -m jobs.synthesize --config configs/local.yaml [--cases PATH] [--out DIR] [--variants N]``.

The entry point for ``ray job submit``; also ``mdd synthesize``.
"""
from __future__ import annotations

import argparse
import logging
import sys

from jobs import add_wait_flag
from mdd import signals
from mdd.config import load_config
from mdd.errors import entry_point

EXIT_CODES = """exit codes: 0 done (also with rejects or failed dialogues, unless --strict); 1 every dialogue that ran
failed; 2 nothing done: a bad config, flag or --out, no usable case, an engine that cannot start, or a resume
refused; 3 --strict and the run was partial (reject rows or failed dialogues); 130 interrupted (Ctrl-C), 143
terminated (SIGTERM: ray job stop, a pod eviction): the finished dialogues are kept, rerun the same command to
finish"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mdd synthesize",
                                description="Synthesize diagnostic dialogues from patient cases.",
                                epilog=EXIT_CODES)
    p.add_argument("--config", default="configs/local.yaml", help="YAML run configuration")
    p.add_argument("--cases", help="cases file or folder (JSON array, JSONL or Parquet); overrides synth.cases")
    p.add_argument("--out", help="output folder; overrides synth.out")
    p.add_argument("--variants", type=int, help="dialogues per case; overrides synth.variants")
    p.add_argument("--limit", type=int, help="only the first N valid cases")
    p.add_argument("--in-flight", type=int, dest="in_flight", help="dialogues in flight; overrides synth.in_flight")
    p.add_argument("--seed", type=int, help="run seed; overrides synth.seed")
    p.add_argument("--exemplars", help="a run folder whose index/ gives the doctor exemplars of good questions; "
                   "overrides synth.dialogue.exemplars.index")
    add_run_flags(p)
    return p


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared with ``jobs.run``."""
    from mdd.provenance import RESUME_POLICIES

    p.add_argument("--resume", choices=RESUME_POLICIES, default="if-possible",
                   help="dialogues already in --out: add to them only if made with the same settings (if-possible, "
                        "the default), whatever made them (always), or refuse any (never)")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when the run is partial (reject rows or failed dialogues)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_wait_flag(p)
    p.add_argument("--allow-mixed-sources", action="store_true",
                   help="run synthetic and real (or unstated) cases together; without it "
                        "(or synth.allow_mixed_sources) "
                        "such a case set is refused with exit 2")


@entry_point("synthesize")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mdd.privacy import install_log_filter

    install_log_filter()
    cfg = load_config(args.config, {
        "synth.cases": args.cases, "synth.out": args.out, "synth.variants": args.variants,
        "synth.limit": args.limit, "synth.in_flight": args.in_flight, "synth.seed": args.seed,
        "synth.dialogue.exemplars.index": args.exemplars,
        "synth.allow_mixed_sources": True if args.allow_mixed_sources else None,
    })
    from mdd.storage import run_lock
    from mdd.synthesize.run import run_synthesis

    try:
        with run_lock(cfg.synth.out, "synthesize", wait=args.wait):
            summary = run_synthesis(cfg, progress=not args.no_progress, resume=args.resume)
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to finish", file=sys.stderr)
        return signals.exit_code()
    c = summary["counts"]
    if summary["interrupted"]:
        print(f"interrupted: {c['dialogues_in_output']} dialogues in {cfg.synth.out}/synth/ ({c['dialogues_run']} "
              f"written by this run); rerun the same command to finish", file=sys.stderr)
        return signals.exit_code()
    print(
        f"synthesized {c['dialogues_run']} dialogues ({c['dialogues_already_written']} already there, "
        f"{c['dialogues_failed']} failed) from {c['cases_valid']} cases; {c['cases_rejected']} cases rejected "
        f"-> {cfg.synth.out}/synth/ in {summary['wall_time_s']:.1f} s"
    )
    if summary.get("interview"):
        from mdd.synthesize.interview import format_summary

        print(format_summary(summary["interview"]))
    if c["dialogues_failed"] and not c["dialogues_run"]:
        return 1
    if args.strict and (c["reject_rows"] or c["dialogues_failed"]):
        print(f"strict: partial run ({c['reject_rows']} reject rows, {c['dialogues_failed']} failed dialogues)",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
