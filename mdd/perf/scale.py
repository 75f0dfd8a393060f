"""The scale benchmark: synthesis and evaluation at several sizes, memory of every process.

    python -m jobs.bench_scale --scale 200,800 [--variants 5] [--config configs/local.yaml] --out out/bench-scale.json

Per size: a case file of N copies of the sample cases (``data/cases``; ids ``scale00000`` …), the
scripted engine, ``variants`` dialogues each. Synthesis, evaluation and a search each run as their
own job process (``jobs.synthesize``, ``jobs.evaluate``, a search probe) on a fresh local Ray,
sampled every 0.2 s with psutil over the job's whole process tree (the Ray processes and workers
it starts are its descendants): peak RSS of the driver and of all processes. Reported: wall time,
dialogues/s, those peaks, the index's bytes per pair, distinct pairs and type, search open time,
latency (median of 20 queries) and peak RSS; and the ratios between the largest and the smallest
size. The machine is shared: ratios within one run say more than absolute figures.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["最近睡眠怎么样", "心情低落多久了", "有没有想过伤害自己", "胃口和体重有变化吗", "家里有人得过类似的病吗"]


def scaled_cases(n: int, dst: Path, prefix: str = "scale", width: int = 5) -> Path:
    """A JSON file of ``n`` copies of the sample cases, ids ``prefix`` + the copy's number."""
    base = json.loads((ROOT / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    cases = []
    for i in range(n):
        c = copy.deepcopy(base[i % len(base)])
        c["患者"] = f"{prefix}{i:0{width}d}"
        cases.append(c)
    dst.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    return dst


def run_sampled(cmd: list[str], interval: float = 0.2) -> dict[str, Any]:
    """Run ``cmd``; wall time and peak RSS (bytes) of the process and of its whole tree."""
    import psutil

    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONPATH": str(ROOT)}
    # the job's output goes to a file: a pipe nobody reads until the end fills up (64 KiB of log lines at
    # 20,000 dialogues) and blocks the job for ever
    log_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak_driver = peak_all = 0
    while proc.poll() is None:
        try:
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            if p.pid == root.pid:
                peak_driver = max(peak_driver, rss)
        peak_all = max(peak_all, total)
        time.sleep(interval)
    proc.wait()
    wall = time.perf_counter() - t0
    log_file.seek(0)
    out = log_file.read()
    log_file.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed ({proc.returncode}):\n{out[-3000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_driver_mb": round(peak_driver / 2**20, 1),
            "peak_rss_all_mb": round(peak_all / 2**20, 1), "output": out}


def search_probe(out: str) -> dict[str, Any]:
    """In this (fresh) process: open the index, time the queries, report the peak RSS."""
    import resource
    import statistics

    from mdd.index import Searcher

    t0 = time.perf_counter()
    s = Searcher(out)
    opened = time.perf_counter() - t0
    lat = []
    for i in range(20):
        t = time.perf_counter()
        s.search(QUERIES[i % len(QUERIES)], 5)
        lat.append(time.perf_counter() - t)
    return {"open_s": round(opened, 3), "latency_ms_median": round(1000 * statistics.median(lat), 2),
            "latency_ms_max": round(1000 * max(lat), 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def one_size(n_cases: int, variants: int, config: str, tmp: Path) -> dict[str, Any]:
    out = tmp / f"out-{n_cases}"
    cases = scaled_cases(n_cases, tmp / f"cases-{n_cases}.json")
    py = sys.executable
    synth = run_sampled([py, "-m", "jobs.synthesize", "--config", config, "--cases", str(cases), "--out", str(out),
                         "--variants", str(variants), "--no-progress"])
    ev = run_sampled([py, "-m", "jobs.evaluate", "--config", config, "--out", str(out), "--quiet"])
    search = json.loads(subprocess.run([py, "-m", "mdd.perf.scale", "--search-probe", str(out)], cwd=ROOT,
                                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                                       check=True).stdout.strip().splitlines()[-1])
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))["evaluate"]
    meta = json.loads((out / "index" / "meta.json").read_text(encoding="utf-8"))
    dialogues = run["dialogues"]
    return {
        "cases": n_cases, "dialogues": dialogues, "exchanges": run["exchanges"],
        "synthesis": {k: v for k, v in synth.items() if k != "output"}
        | {"dialogues_per_s": round(dialogues / synth["wall_s"], 2)},
        "evaluation": {k: v for k, v in ev.items() if k != "output"}
        | {"dialogues_per_s": round(dialogues / ev["wall_s"], 2), "stage_wall_s": run["wall_s"]},
        "index": {"pairs": meta["pairs"], "distinct": meta["size"], "type": meta["type"], "nprobe": meta["nprobe"],
                  "bytes_per_pair": meta["bytes"]["per_pair"], "recall_at_10": meta["recall_at_10"]["value"],
                  "compaction_recall_at_10": meta["compaction_recall_at_10"].get("value"),
                  "near_duplicates": meta["near_duplicates"].get("share_with_near_duplicate")},
        "search": search,
        "high_quality_share": run["high_quality_share"],
        "validity_separated": run["validity"].get("separated"),
    }


def ratios(small: dict, large: dict) -> dict[str, float | None]:
    def r(path: tuple[str, ...]) -> float | None:
        a: Any = small
        b: Any = large
        for k in path:
            a, b = a[k], b[k]
        return round(b / a, 3) if a else None

    return {"dialogues": r(("dialogues",)),
            "evaluation_wall": r(("evaluation", "wall_s")),
            "evaluation_dialogues_per_s": r(("evaluation", "dialogues_per_s")),
            "evaluation_peak_rss_driver": r(("evaluation", "peak_rss_driver_mb")),
            "evaluation_peak_rss_all": r(("evaluation", "peak_rss_all_mb")),
            "synthesis_peak_rss_all": r(("synthesis", "peak_rss_all_mb")),
            "index_bytes_per_pair": r(("index", "bytes_per_pair")),
            "search_peak_rss": r(("search", "peak_rss_mb")),
            "search_latency": r(("search", "latency_ms_median"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="200,800", help="case counts, comma-separated")
    ap.add_argument("--variants", type=int, default=5)
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--out", default="out/bench-scale.json")
    ap.add_argument("--search-probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.search_probe:
        print(json.dumps(search_probe(args.search_probe)))
        return 0
    sizes = [int(x) for x in args.scale.split(",") if x.strip()]
    results = []
    with tempfile.TemporaryDirectory(prefix="mdd-scale-") as tmp:
        for n in sizes:
            res = one_size(n, args.variants, args.config, Path(tmp))
            results.append(res)
            print(json.dumps(res, ensure_ascii=False), flush=True)
    report = {"sizes": results, "ratios_largest_vs_smallest": ratios(results[0], results[-1]) if len(results) > 1
              else {}, "variants": args.variants, "config": args.config, "cpus": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8")
    print(json.dumps(report["ratios_largest_vs_smallest"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
