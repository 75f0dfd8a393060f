"""A run to ``s3://…`` end to end on a real S3 API (moto on 127.0.0.1): synthesis killed with
kill -9 and resumed from the URI holds every dialogue exactly once, then evaluation, the index,
``mdd search`` and the report work from the URI, and nothing is written to the local disk."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mdd.config import load_config
from mdd.synthesize.run import run_synthesis
from mdd.storage import Store

ROOT = Path(__file__).resolve().parents[1]


def test_run_to_object_storage_survives_kill_and_resumes_from_the_uri(s3_server, ray_session, tmp_path, capsys,
                                                                     scaled_cases):
    uri = s3_server()
    store = Store(uri)
    cases_file = scaled_cases(24, "O")
    conf = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text(encoding="utf-8"))
    conf["synth"].update(shard_size=12, variants=2, cases=str(cases_file), out=uri)
    config = tmp_path / "s3.yaml"
    config.write_text(yaml.safe_dump(conf, allow_unicode=True), encoding="utf-8")

    work = tmp_path / "cwd"  # the subprocess's working folder: it must stay empty
    work.mkdir()
    cmd = [sys.executable, "-m", "jobs.synthesize", "--config", str(config), "--no-progress", "--in-flight", "2"]
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline and not store.files("synth", ".parquet"):
        assert proc.poll() is None, "the run ended before its first shard"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = store.files("synth", ".parquet")
    assert 1 <= len(first) < 4, first  # killed in the middle: whole shards only

    summary = run_synthesis(load_config(config), progress=False)  # resume from the URI
    assert summary["counts"]["dialogues_already_written"] == 12 * len(first)
    synth = store.read_table("synth")
    assert synth.num_rows == 48 and len(set(synth.column("dialogue_id").to_pylist())) == 48
    assert len(store.files("synth", ".parquet")) == 4

    from jobs.evaluate import main as evaluate_main
    from jobs.report import main as report_main
    from jobs.search import main as search_main

    assert evaluate_main(["--config", str(config), "--out", uri, "--quiet"]) == 0
    turns = store.read_table("eval/turns")
    assert turns.num_rows == sum(synth.column("n_exchanges").to_pylist())
    run = store.read_run_json()
    assert run["evaluate"]["dialogues"] == 48 and run["synthesize"]["counts"]["dialogues_in_output"] == 48
    meta = store.read_json("index/meta.json")
    assert meta["pairs"] == run["evaluate"]["high_quality"] > 0 and 0 < meta["size"] <= meta["pairs"]
    assert not store.exists(".staging")

    capsys.readouterr()
    assert search_main(["--out", uri, "-k", "3", "最近睡眠怎么样"]) == 0
    hits = [line for line in capsys.readouterr().out.splitlines() if line[:2] in ("1.", "2.", "3.")]
    assert len(hits) == 3 and all("score=" in h for h in hits)

    assert report_main(["--config", str(config), "--out", uri]) == 0
    assert "<html" in store.read_text("report.html") and store.files("report", ".png")
    assert store.read_text("README.md").startswith("---")  # the dataset card
    assert not any(work.iterdir()) and not (ROOT / "s3:").exists()
