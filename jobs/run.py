"""The main job: synthesize, evaluate, then write the report and the dataset card.

    python -m jobs.run --config configs/local.yaml [--out DIR] [--reference REF] [--exemplars DIR] [--rounds N]
        [--utility REF]

Exit codes are synthesize's (``python -m jobs.synthesize --help``); the evaluation runs after a
synthesis that exits 0 or 3 (``--strict``, partial), and its own failure wins.

``--rounds N`` closes the loop: round r < N writes to ``OUT/rounds/r/`` (synthesis, evaluation, its
index), and each round's doctor is shown exemplars from the previous round's index (round 1 from
``--exemplars`` when given); the last round writes to OUT itself, which gets the report and card.
"""
from __future__ import annotations

import argparse
import posixpath
import sys

from jobs import evaluate, report, synthesize
from mdd import signals
from mdd.errors import entry_point


def round_out(out: str, r: int, rounds: int) -> str:
    """Where round ``r`` (1-based) of ``rounds`` writes: the last one to OUT itself."""
    return out if r == rounds else posixpath.join(out.rstrip("/"), "rounds", str(r))


@entry_point("run")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd run", description="Synthesize dialogues, evaluate them, write the report "
                                "and the dataset card.", epilog=synthesize.EXIT_CODES)
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--cases")
    p.add_argument("--out")
    p.add_argument("--variants", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--reference",
                   help="dialogue table the report compares with (default: the published MDD-5k figures)")
    p.add_argument("--utility", metavar="REF", help="labelled real dialogues (a jobs.import_mdd5k folder): train a "
                   "diagnosis classifier on this run's dialogues and test on them before the report (mdd utility)")
    p.add_argument("--exemplars", help="a run folder whose index/ gives the doctor exemplars (round 1 with --rounds)")
    p.add_argument("--rounds", type=int, default=1, help="synthesize-evaluate rounds; each round after the first "
                   "takes exemplars from the previous round's index")
    synthesize.add_run_flags(p)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    from mdd.config import load_config

    cfg = load_config(args.config)
    out = args.out or cfg.synth.out
    from mdd.storage import run_lock

    with run_lock(out, "run", wait=args.wait):  # synthesize, evaluate and report take it again (re-entrant)
        return _rounds(args, cfg, out)


def _rounds(args: argparse.Namespace, cfg, out: str) -> int:
    exemplars, synth_rc = args.exemplars, 0
    for r in range(1, args.rounds + 1):
        where = round_out(out, r, args.rounds)
        if args.rounds > 1:
            print(f"round {r}/{args.rounds} -> {where}" + (f" (exemplars from {exemplars})" if exemplars else ""))
        common = ["--config", args.config, "--out", where]
        synth_args = common + ["--resume", args.resume]
        for flag, value in (("--cases", args.cases), ("--variants", args.variants), ("--seed", args.seed),
                            ("--exemplars", exemplars)):
            if value is not None:
                synth_args += [flag, str(value)]
        synth_args += (["--strict"] * args.strict + ["--no-progress"] * args.no_progress
                       + ["--allow-mixed-sources"] * args.allow_mixed_sources)
        synth_rc = synthesize.main(synth_args)
        if synth_rc not in (0, 3):
            return synth_rc
        try:
            rc = evaluate.main(common)
            if rc == 0 and r == args.rounds and args.utility:
                from jobs import utility

                rc = utility.main(["--out", out, "--reference", args.utility])
            if rc == 0 and r == args.rounds and cfg.publish.report:
                rc = report.publish(cfg, out, args.reference)
        except KeyboardInterrupt:
            print("interrupted after the synthesis; the dialogues are kept, rerun to evaluate", file=sys.stderr)
            return signals.exit_code()
        if rc:
            return rc
        exemplars = where
    return synth_rc


if __name__ == "__main__":
    sys.exit(main())
