"""Figures of a run on a trained model, read back from its folder (mdd/perf/trained.py).

    python -m jobs.run --config configs/local-real.yaml --cases CASES --out out/real
    python -m jobs.bench_trained out/real [--one-in-flight out/real-1] --json bench/trained.json

``--one-in-flight``: a second run of some of the same dialogues with ``--in-flight 1``; its output
tokens per second set beside the first run's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mdd.perf.trained import figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mdd bench-trained", description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run folder (run.json, synth/, failures.parquet)")
    ap.add_argument("--one-in-flight", type=Path, default=None, help="a run of the same dialogues, one in flight")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args(argv)
    if not (a.run / "run.json").exists():
        print(f"bench-trained: {a.run} holds no run.json (not a run folder)", file=sys.stderr)
        return 2
    out = figures(a.run, a.one_in_flight)
    text = json.dumps(out, ensure_ascii=False, indent=1)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
