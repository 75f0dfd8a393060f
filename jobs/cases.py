"""Synthetic case records and the clinical consistency checker.

    python -m jobs.cases synthesize --n 1000 --profile mdd5k --out DIR [--seed S]   (or mdd cases synthesize …)
    python -m jobs.cases check PATH --out DIR                                        (or mdd cases check …)

``check`` exits 0 when every case passes, 1 when any fails (validation or a consistency rule; the rows of
``DIR/rejects.parquet`` name case id, rule, field and reason), 2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from jobs import add_wait_flag
from mdd.errors import entry_point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mdd cases", description="synthetic case records and the consistency checker")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synthesize", help="case records drawn from a profile's priors, written, checked, repaired")
    s.add_argument("--n", type=int, required=True, help="number of cases")
    s.add_argument("--profile", default="mdd5k", help="profile name (mdd/knowledge/profiles/) or a YAML path")
    s.add_argument("--out", required=True,
                   help="output folder: cases.jsonl, plans.jsonl, rejects.parquet, synthesis.json")
    s.add_argument("--seed", type=int, default=0, help="run seed (the same seed writes the same cases)")
    s.add_argument("--writer", choices=("scripted", "engine"), default="scripted",
                   help="who writes the records: the offline scripted writer (default), or the engine of --config "
                        "(one generate call per record, a second one told the failed rules)")
    s.add_argument("--config", default="configs/local.yaml", help="with --writer engine: the run config whose "
                   "engine writes (scripted, vllm, openai)")
    add_wait_flag(s)
    c = sub.add_parser("check", help="run the clinical consistency checker over a case file or folder")
    c.add_argument("path", help="cases file or folder (JSON array, JSONL or Parquet)")
    c.add_argument("--out", required=True, help="output folder for rejects.parquet")
    add_wait_flag(c)
    return p


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def synthesize(args: argparse.Namespace) -> int:
    from mdd.cases.synth import synthesize_cases

    if args.n <= 0:
        return _error("--n must be a positive number of cases")
    engine = writer = None
    try:
        if args.writer == "engine":
            engine, writer = _engine_writer(args.config)
        result = synthesize_cases(args.n, args.profile, args.out, seed=args.seed, writer=writer)
    except (ValueError, OSError) as exc:  # an MddError (a profile, the writer's engine gone) reaches entry_point
        return _error(str(exc))
    finally:
        if engine is not None:
            engine.shutdown()
    d = result.diversity
    if writer is not None:
        print(f"writer: engine {engine.name} ({engine.model}): {dict(writer.usage)}")
    print(f"{result.written} of {result.requested} cases written to {Path(args.out) / 'cases.jsonl'} "
          f"({result.repaired} repaired, {result.rejected} rejected) in {result.seconds} s")
    if result.rejected_by_rule:
        print("rejected by rule: " + ", ".join(f"{k} {v}" for k, v in sorted(result.rejected_by_rule.items())))
    print("Jensen-Shannon distance to the profile: " + ", ".join(f"{k} {v}" for k, v in d["js_distance"].items()))
    nd = d["near_duplicates"]
    print(f"near-duplicates (5-char shingle Jaccard >= {nd['threshold']}): {nd['share']:.1%} of cases; "
          f"nearest neighbour median {nd.get('median_nearest', 0)}, max {nd['max_jaccard']}")
    print("distinct symptom sets per first diagnosis: " + ", ".join(
        f"{k} {v['distinct']}/{v['cases']}" for k, v in list(d["symptom_sets"].items())[:8]))
    return 0


def _engine_writer(config: str):
    """The engine of ``config`` (started; the caller shuts it down) and a case writer on it."""
    from mdd.cases.write import EngineCaseWriter
    from mdd.config import ConfigError, load_config
    from mdd.engines.base import EngineError, launch_engine, preflight_engine

    try:
        cfg = load_config(config)
        preflight_engine(cfg.engine)
        if cfg.engine.name.split("/", 1)[0] != "scripted":  # engines that run as Ray actors
            from mdd.raylib import init_ray

            init_ray(cfg.ray)
        engine = launch_engine(cfg.engine)
    except (ConfigError, EngineError) as exc:
        raise ValueError(f"--writer engine: {exc}") from None
    return engine, EngineCaseWriter(engine, in_flight=cfg.synth.in_flight)


def check(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mdd.cases import load_cases
    from mdd.cases.check import check_cases
    from mdd.cases.synth import REJECT_SCHEMA

    cases, problems = load_cases(args.path)
    rows = [{"case_id": r.case_id, "rule": "validation", "field": r.field, "reason": r.reason} for r in problems]
    rows += [f.as_row() for f in check_cases(cases)]
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=REJECT_SCHEMA), out / "rejects.parquet")
    except OSError as exc:
        return _error(f"{out}: cannot write ({exc.strerror or type(exc).__name__})")
    failed = {r["case_id"] for r in rows}
    by_rule = Counter(r["rule"] for r in rows)
    print(f"{len(cases) + len({r.position for r in problems if r.case_id is None})} cases read, "
          f"{len(cases) - len(failed & {c.case_id for c in cases})} pass every rule; "
          f"{len(rows)} findings"
          + (": " + json.dumps(dict(sorted(by_rule.items())), ensure_ascii=False) if rows else ""))
    return 1 if rows else 0


@entry_point("cases")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mdd.storage import StorageError, run_lock

    try:
        with run_lock(args.out, f"cases {args.command}", wait=args.wait):  # one writer of --out at a time
            return synthesize(args) if args.command == "synthesize" else check(args)
    except StorageError as exc:
        return _error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
