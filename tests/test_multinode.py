"""A multi-node run proven on one machine (tests/multinode_run.py in its own process): engine actors
land one per "GPU node", dialogue workers spread over the nodes, a GPU node removed mid-run costs
retries and nothing else, and the output is complete, exactly once, and the same shards (every
row, every column) as a single-process scripted run writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from mdd.config import load_config
from mdd.synthesize.run import run_synthesis

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def test_engine_node_lost_mid_run_loses_nothing(ray_session, tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(json.loads(SAMPLES.read_text(encoding="utf-8"))[:16], ensure_ascii=False),
                     encoding="utf-8")
    out, report = tmp_path / "cluster", tmp_path / "report.json"
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "multinode_run.py"), str(cases), str(out), str(report)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(report.read_text())
    why = json.dumps(rep, indent=1)

    assert sorted(rep["engine_nodes"]) == sorted(rep["gpu_nodes"]), why  # one engine per GPU node, none on the head
    workers = rep["placement"]["dialogue_workers"]
    assert len(workers) == 4 and len(set(workers)) >= 2, why  # spread over the nodes
    assert rep["removed"] in rep["engine_nodes"] and rep["removed_after_requests"] > 0, why  # it was serving
    c = rep["counts"]
    assert c["dialogue_retries"] >= 1 and c["dialogues_failed"] == 0, why  # its dialogues ran again elsewhere
    assert c["dialogues_in_output"] == c["dialogues_planned"] == 48 and rep["engine"] == "scripted", why

    df = pl.read_parquet(out / "synth" / "*.parquet")
    assert df.height == 48 and df["dialogue_id"].n_unique() == 48

    local = tmp_path / "local"
    cfg = load_config(ROOT / "configs" / "local.yaml", {"synth.cases": str(cases), "synth.out": str(local),
                                                        "synth.variants": 3, "synth.shard_size": 6})
    run_synthesis(cfg, progress=False)
    names = sorted(p.name for p in (local / "synth").glob("*.parquet"))
    assert names == sorted(p.name for p in (out / "synth").glob("*.parquet"))
    for name in names:  # the file metadata (provenance) may name the engine: the rows must not differ
        assert pq.read_table(out / "synth" / name).equals(pq.read_table(local / "synth" / name)), name
