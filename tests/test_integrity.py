"""Integrity of one output folder: one run at a time (a lock, --wait, stale locks), dialogue ids
unique whatever --variants says, failed reports and exports that replace nothing, leftover
temporary files, a checksummed index, read-only and full folders, cases folders."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from mdd import storage
from mdd.storage import LOCK, LockHeld, run_lock

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAY_ADDRESS": ""}


def _slow_config(tmp_path: Path) -> Path:
    """configs/local.yaml with small shards: a run that lasts a while on the scripted engine."""
    config = tmp_path / "slow.yaml"
    config.write_text((ROOT / "configs" / "local.yaml").read_text(encoding="utf-8").replace(
        "shard_size: 50", "shard_size: 2"), encoding="utf-8")
    return config


def _mdd(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mdd", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=kw.pop("timeout", 300), **kw)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.strip() and " WARNING " not in ln and " INFO " not in ln]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_two_real_runs_on_one_out(tmp_path, scaled_cases):
    """While one synthesize runs, a second synthesize, an export and a report on the same --out exit 2
    naming the holder; with --wait the second synthesize (other --variants) runs after the first,
    and every dialogue id is in the output once."""
    cases = scaled_cases(8, "L")
    out = tmp_path / "out"
    config = _slow_config(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "mdd", "synthesize", "--config", str(config), "--cases",
                              str(cases), "--out", str(out), "--variants", "3", "--in-flight", "1", "--no-progress"],
                             cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out / LOCK).exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.05)
        holder = json.loads((out / LOCK).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        assert holder["command"] == "synthesize" and holder["started"]
        for argv in (["synthesize", "--config", str(config), "--cases", str(cases), "--variants", "2"],
                     ["export", "--format", "sft"], ["report"], ["evaluate", "--config", str(config)]):
            second = _mdd(*argv, "--out", str(out), timeout=120)
            assert second.returncode == 2, (argv, second.stderr[-3000:])
            line = _one_line(second.stderr)
            assert f"pid {first.pid}" in line and "mdd synthesize" in line and "--wait" in line, line
        waiting = _mdd("synthesize", "--config", str(config), "--cases", str(cases), "--out", str(out),
                       "--variants", "2", "--no-progress", "--wait", timeout=600)
        assert first.poll() is not None, "the --wait run finished before the holder"
        assert first.returncode == 0, first.communicate()[1][-3000:]
        assert waiting.returncode == 0, waiting.stderr[-3000:]
        assert "waiting for `mdd synthesize` (pid" in waiting.stderr
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    df = pl.read_parquet(out / "synth" / "*.parquet")
    assert df.height == 24 and df["dialogue_id"].n_unique() == 24
    assert not (out / LOCK).exists()  # released by the last run
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))["synthesize"]["counts"]
    assert run["dialogues_in_output"] == 24 and run["dialogues_run"] == 0


HOLD = "import sys, time\nfrom mdd.storage import run_lock\nwith run_lock(sys.argv[1], 'synthesize'):\n" \
       "    print('held', flush=True)\n    time.sleep(600)\n"


def test_a_killed_runs_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld, match=f"pid {proc.pid} on {socket.gethostname()}"):
        with run_lock(out, "export"):
            pass
    proc.send_signal(signal.SIGKILL)  # kill -9: the lock file stays behind
    proc.wait()
    assert (out / LOCK).exists()
    with run_lock(out, "export"):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert "taking over the stale lock" in caplog.text and not (out / LOCK).exists()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """The lock names the holder's process start time: a live process with the same pid is another one."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"command": "run", "pid": os.getppid(), "host": socket.gethostname(),
                                        "pid_start": "1", "started": "earlier"}))
    with run_lock(out, "report"):
        pass
    (out / LOCK).write_text(json.dumps({"command": "run", "pid": os.getppid(), "host": socket.gethostname(),
                                        "pid_start": storage._proc_start(os.getppid()), "started": "earlier"}))
    with pytest.raises(LockHeld, match=r"`mdd run` \(pid"):
        with run_lock(out, "report"):
            pass


def test_the_lock_is_reentrant_in_one_process_and_removes_leftover_tmp_files(tmp_path):
    out = tmp_path / "out"
    (out / "synth").mkdir(parents=True)
    (out / "report").mkdir()
    for rel in ("synth/.part-x.parquet.tmp", ".report.html.tmp", "report/.00-a.png.tmp"):
        (out / rel).write_bytes(b"half")
    with run_lock(out, "run"):
        assert not [p for p in out.rglob("*.tmp")]
        with run_lock(out, "synthesize"):  # mdd run calls synthesize in-process
            pass
        assert (out / LOCK).exists()
    assert not (out / LOCK).exists()
