"""The jobs as a user runs them: exit codes, one-line errors (never a traceback), --strict, Ctrl-C."""
from __future__ import annotations

import copy
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"
ENV = {**os.environ, "RAY_ADDRESS": ""}


def run_main(capsys, entry: str, *argv: str) -> tuple[int, str]:
    """``python -m <entry> argv`` in this process (an uncaught exception would fail the test): exit code and stderr."""
    module = importlib.import_module(entry)
    if "--config" not in argv:
        argv = ("--config", str(ROOT / "configs" / "local.yaml"), *argv)
    capsys.readouterr()
    rc = module.main(list(argv))
    return rc, capsys.readouterr().err


def one_line_error(stderr: str, *words: str) -> str:
    """The run's single ``error:`` line (asserting there is exactly one and no traceback)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def cases_file(path: Path, n: int, mutate=None) -> Path:
    cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:n]
    for c in cases:
        if mutate:
            mutate(c)
    path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    return path


def test_every_case_rejected_exits_2_and_says_why(tmp_path, capsys):
    f = cases_file(tmp_path / "c.json", 3, lambda c: c.__setitem__("性别", "13812345678"))
    rc, err = run_main(capsys, "jobs.synthesize", "--cases", str(f), "--out", str(tmp_path / "out"), "--no-progress")
    assert rc == 2
    line = one_line_error(err, "no usable case", "3 reject rows", "性别", "rejects.parquet")
    assert "13812345678" not in err and "mobile" in line
    assert pl.read_parquet(tmp_path / "out" / "rejects.parquet").height == 3


@pytest.mark.parametrize("entry, make, args, words", [
    ("jobs.synthesize", lambda d: (d / "afile").write_text("x"), ["--out", "{d}/afile"], ["is a file", "--out must name a folder"]),
    ("jobs.run", lambda d: (d / "afile").write_text("x"), ["--out", "{d}/afile"], ["is a file", "--out must name a folder"]),
    ("jobs.synthesize", lambda d: (d / "bad.yaml").write_text("synth:\n  variants: 0\n  in_flight: many\n"),
     ["--config", "{d}/bad.yaml"], ["synth.variants", "synth.in_flight", "bad.yaml"]),
    ("jobs.synthesize", lambda d: (d / "bad.yaml").write_text("synth: [1,\n"), ["--config", "{d}/bad.yaml"],
     ["not valid YAML", "line"]),
    ("jobs.run", lambda d: None, ["--config", "{d}/missing.yaml"], ["config file not found"]),
    ("jobs.run", lambda d: None, ["--variants", "0"], ["synth.variants"]),
    ("jobs.synthesize", lambda d: None, ["--cases", "{d}/nowhere.json"], ["no such file or folder"]),
])
def test_bad_usage_is_one_line_exit_2(tmp_path, capsys, make, args, words, entry):
    make(tmp_path)
    argv = [a.format(d=tmp_path) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    rc, err = run_main(capsys, entry, *argv, "--no-progress")
    assert rc == 2
    one_line_error(err, *words)


def test_openai_without_base_url_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "openai.yaml"
    cfg.write_text("engine:\n  name: openai\n  model: qwen\n", encoding="utf-8")
    monkeypatch.delenv("MDD_OPENAI_BASE_URL", raising=False)
    rc, err = run_main(capsys, "jobs.synthesize", "--config", str(cfg), "--cases", str(cases_file(tmp_path / "c.json", 1)),
                       "--out", str(tmp_path / "out"), "--no-progress")
    assert rc == 2
    one_line_error(err, "MDD_OPENAI_BASE_URL")


def test_strict_makes_a_partial_run_exit_3(ray_session, tmp_path, capsys):
    from mdd.config import load_config
    from mdd.synthesize.run import run_synthesis

    def one_bad(path: Path) -> Path:
        cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:2]
        bad = copy.deepcopy(cases[0])
        bad["患者"], bad["年龄"] = "X9", "old"
        path.write_text(json.dumps(cases + [bad], ensure_ascii=False), encoding="utf-8")
        return path

    f = one_bad(tmp_path / "c.json")
    first = run_synthesis(load_config(ROOT / "configs" / "local.yaml", {
        "synth.cases": str(f), "synth.out": str(tmp_path / "a"), "synth.variants": 1}), progress=False)
    assert first["counts"]["reject_rows"] == 1 and first["counts"]["dialogues_run"] == 2
    common = ("--cases", str(f), "--out", str(tmp_path / "a"), "--variants", "1", "--no-progress")
    rc, err = run_main(capsys, "jobs.synthesize", *common)
    assert rc == 0, err[-2000:]  # the same partial output, nothing left to run
    rc, err = run_main(capsys, "jobs.synthesize", *common, "--strict")
    assert rc == 3 and "strict: partial run (1 reject rows" in err
    assert pl.read_parquet(tmp_path / "a" / "synth" / "*.parquet").height == 2


@pytest.mark.parametrize("sig,code,group", [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)],
                         ids=["ctrl-c", "sigterm"])
def test_interrupt_keeps_finished_dialogues_and_the_rerun_completes(tmp_path, scaled_cases, sig, code, group):
    """Ctrl-C in a terminal signals the whole foreground group; ``kill``, ``ray job stop`` and a pod
    eviction send SIGTERM to the job's process."""
    f = scaled_cases(40, "C")
    # Small shards, so that the interrupt lands with most of the run still to do however fast the machine
    # (with two shards of 50 a quick machine had finished the second within the wait).
    config = tmp_path / "small-shards.yaml"
    config.write_text((ROOT / "configs" / "local.yaml").read_text(encoding="utf-8").replace(
        "shard_size: 50", "shard_size: 5"), encoding="utf-8")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "jobs.synthesize", "--config", str(config), "--cases", str(f), "--out", str(out),
           "--no-progress", "--in-flight", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list((out / "synth").glob("*.parquet")):
        assert proc.poll() is None, "the run ended before its first shard"
        time.sleep(0.05)
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted:" in stderr
    kept = pl.read_parquet(out / "synth" / "*.parquet")
    assert 5 <= kept.height < 200 and kept["dialogue_id"].n_unique() == kept.height
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert run["interrupted"] is True and run["counts"]["dialogues_in_output"] == kept.height
    rerun = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    df = pl.read_parquet(out / "synth" / "*.parquet")
    assert df.height == 200 and df["dialogue_id"].n_unique() == 200
