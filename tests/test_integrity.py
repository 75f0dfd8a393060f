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
    import re

    log_line = re.compile(r"^(\d{4}-\d\d-\d\d [0-9:,]+\s+(INFO|WARNING)\b|\(\w+(, |\s)?pid=)")  # ours, Ray's
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not log_line.search(ln)]
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
        # the holder released the lock when its work was written (it may still be shutting Ray down)
        first.wait(timeout=300)
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


# --- a failed report, card or export replaces nothing ---------------------------------------------


def _snapshot(out: Path, rels: list[str]) -> dict[str, bytes]:
    files = {}
    for rel in rels:
        p = out / rel
        for f in ([p] if p.is_file() else sorted(p.rglob("*"))):
            if f.is_file():
                files[str(f.relative_to(out))] = f.read_bytes()
    return files


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture
def run_copy(main_run, tmp_path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(main_run, out, ignore=shutil.ignore_patterns("rounds"))
    return out


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("damaged", ["synth", "eval/dialogues"])
def test_a_failed_report_keeps_the_last_good_report_and_card(run_copy, capsys, damaged):
    """Once one truncated shard turned a 900 KB report.html into 421 KB of 'panel failed', and the card too."""
    from jobs.report import main as report_main

    out = run_copy
    rels = ["report.html", "report", "README.md", "run.json"]
    before = _snapshot(out, rels)
    assert before["report.html"] and any(k.startswith("report/") for k in before)
    shard = sorted((out / damaged).glob("*.parquet"))[0]
    _truncate(shard)
    capsys.readouterr()
    assert report_main(["--out", str(out)]) == 2
    line = _err_line(capsys)
    assert str(shard.relative_to(out)) in line or shard.name in line, line
    assert _snapshot(out, rels) == before
    assert not (out / ".staging").exists() and not list(out.rglob("*.tmp"))


def test_a_failed_export_keeps_the_last_good_export_and_card(run_copy, capsys):
    from jobs.export import main as export_main

    out = run_copy
    assert export_main(["--out", str(out), "--format", "sft"]) == 0
    rels = ["export", "README.md", "run.json"]
    before = _snapshot(out, rels)
    assert "export/sft.jsonl" in before and "export/sft/part-00000.parquet" in before
    _truncate(sorted((out / "eval" / "dialogues").glob("*.parquet"))[0])
    capsys.readouterr()
    assert export_main(["--out", str(out), "--format", "sft", "--min-quality", "0.5"]) == 2
    line = _err_line(capsys)
    assert line.startswith("error:") and "eval/dialogues/part-" in line and "mdd evaluate" in line, line
    assert _snapshot(out, rels) == before
    assert not (out / ".staging").exists()


# --- read-only and full output folders ---------------------------------------------------------


def _can_mount() -> str | None:
    """Why a real read-only mount or a tiny tmpfs cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "not root: a read-only bind mount and a tmpfs need root (and as root chmod does not stop writes)"
    probe = Path("/tmp") / f"mdd-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True)
        if r.returncode:
            return f"mount refused here: {r.stderr.decode().strip()[:120]}"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    finally:
        probe.rmdir()


MOUNT_SKIP = _can_mount()
needs_mount = pytest.mark.skipif(MOUNT_SKIP is not None, reason=str(MOUNT_SKIP))


@pytest.fixture
def mounted(tmp_path):
    """``mount(kind, src)``: ``ro`` bind-mounts ``src`` read-only; ``full`` makes a tmpfs holding a copy of ``src``
    with ``free`` bytes left. Unmounted after the test."""
    import shutil

    points = []

    def mount(kind: str, src: Path, free: int = 0) -> Path:
        point = tmp_path / f"mnt-{kind}-{len(points)}"
        point.mkdir()
        if kind == "ro":
            subprocess.run(["mount", "--bind", str(src), str(point)], check=True)
            points.append(point)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(point)], check=True)
        else:
            used = sum(f.stat().st_size + 8192 for f in src.rglob("*") if f.is_file())
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={used + free + (1 << 20)}", "tmpfs", str(point)],
                           check=True)
            points.append(point)
            shutil.copytree(src, point, dirs_exist_ok=True)
            with open(point / "filler", "wb") as f:  # fill the disk up to ``free`` bytes
                try:
                    while os.statvfs(point).f_bavail * os.statvfs(point).f_frsize > free:
                        f.write(b"\0" * min(1 << 20, os.statvfs(point).f_bavail * os.statvfs(point).f_frsize - free
                                            or 4096))
                        f.flush()
                except OSError:
                    pass
        return point

    yield mount
    for p in reversed(points):
        subprocess.run(["umount", "-l", str(p)])


def _commands(out: Path, cases: Path, ref: Path) -> dict[str, list[str]]:
    config = str(ROOT / "configs" / "local.yaml")
    return {
        "synthesize": ["synthesize", "--config", config, "--cases", str(cases), "--out", str(out), "--variants", "1",
                       "--no-progress"],
        "evaluate": ["evaluate", "--config", config, "--out", str(out), "--full"],
        "run": ["run", "--config", config, "--cases", str(cases), "--out", str(out), "--variants", "1",
                "--no-progress"],
        "report": ["report", "--out", str(out)],
        "export": ["export", "--out", str(out), "--format", "sharegpt"],
        "compare": ["compare", "--out", str(out), "--reference", str(ref), "--quiet"],
    }


@needs_mount
def test_a_read_only_output_is_one_line_exit_2_for_every_command(run_copy, mounted, tmp_path):
    cases = tmp_path / "cases.json"
    samples = json.loads((ROOT / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    cases.write_text(json.dumps(samples[:2], ensure_ascii=False), encoding="utf-8")
    ro = mounted("ro", run_copy)
    before = _snapshot(run_copy, ["report.html", "README.md", "run.json"])
    for name, argv in _commands(ro, cases, run_copy).items():
        r = _mdd(*argv, timeout=600)
        assert r.returncode == 2, (name, r.stderr[-3000:])
        line = _one_line(r.stderr)
        assert "read-only" in line and str(ro) in line and "--out" in line, (name, line)
    # search only reads: a read-only folder is no obstacle
    r = _mdd("search", "--out", str(ro), "-k", "2", "睡眠")
    assert r.returncode == 0 and "score=" in r.stdout, r.stderr[-2000:]
    assert _snapshot(run_copy, ["report.html", "README.md", "run.json"]) == before


@needs_mount
@pytest.mark.parametrize("command", ["report", "export", "synthesize", "evaluate", "compare"])
def test_a_full_output_is_one_line_exit_2_and_keeps_the_last_good_files(run_copy, mounted, tmp_path, command):
    """A disk with room for the lock but not for the outputs: one line naming the path and the fix, exit 2;
    the report, card, export and run.json as they were; no temporary file left behind."""
    cases = tmp_path / "cases.json"
    samples = json.loads((ROOT / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    cases.write_text(json.dumps(samples[:3], ensure_ascii=False), encoding="utf-8")
    (run_copy / "export").mkdir(exist_ok=True)
    full = mounted("full", run_copy, free=16 * 1024)
    rels = ["report.html", "report", "README.md", "run.json", "export", "synth", "eval"]
    before = _snapshot(full, rels)
    argv = _commands(full, cases, run_copy)[command]
    if command == "synthesize":  # new dialogues to write
        argv = [a if a != "1" else "3" for a in argv]
    r = _mdd(*argv, timeout=600)
    assert r.returncode == 2, r.stderr[-3000:]
    line = _one_line(r.stderr)
    assert "no space left" in line and str(full) in line, line
    after = _snapshot(full, rels)
    if command == "synthesize":  # whole shards only: what fitted is kept, nothing half-written
        assert {k: v for k, v in after.items() if not k.startswith("synth/")} == \
            {k: v for k, v in before.items() if not k.startswith("synth/")}
    else:
        assert after == before
    assert not [p for p in full.rglob("*.tmp")] and not (full / LOCK).exists()


@pytest.mark.parametrize("argv,flag", [(["synthesize", "--variants", "0"], "--variants 0"),
                                       (["synthesize", "--in-flight", "0"], "--in-flight 0"),
                                       (["evaluate", "--batch-size", "-1"], "--batch-size -1")])
def test_a_bad_flag_value_is_blamed_on_the_flag_not_the_config_file(tmp_path, capsys, argv, flag):
    import importlib

    module = importlib.import_module(f"jobs.{argv[0]}")
    capsys.readouterr()
    rc = module.main(["--config", str(ROOT / "configs" / "local.yaml"), "--out", str(tmp_path / "o"), *argv[1:]])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid command line: " + flag in err and "local.yaml" not in err, err
    assert not (tmp_path / "o").exists()


# every command that writes under an output folder, as a new user runs it; search only reads (tested above)
WRITERS = {
    "compare": lambda out, ref: ["compare", "--out", str(out), "--reference", str(ref), "--quiet"],
    "utility": lambda out, ref: ["utility", "--out", str(out), "--reference", str(ref), "--quiet"],
    "import-mdd5k": lambda out, ref: ["import-mdd5k", "--dialogues", str(ref), "--out", str(out)],
    "cases synthesize": lambda out, ref: ["cases", "synthesize", "--n", "2", "--out", str(out)],
    "cases check": lambda out, ref: ["cases", "check", str(ROOT / "data" / "cases"), "--out", str(out)],
}


def test_every_command_that_writes_under_out_takes_the_lock(tmp_path):
    """A second writer of one --out, whatever the command, exits 2 with one line naming the holder and
    writes nothing; every command that writes under --out offers --wait (and run, synthesize, evaluate,
    report, export are tested above)."""
    from mdd.cli import COMMANDS

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        for name, argv in WRITERS.items():
            r = _mdd(*argv(out, ROOT.parent / "shared" / "mdd5k"))
            assert r.returncode == 2, (name, r.stderr[-2000:])
            line = _one_line(r.stderr)
            assert f"pid {proc.pid}" in line and "synthesize" in line and "--wait" in line, (name, line)
            assert sorted(p.name for p in out.iterdir()) == before, name
    finally:
        proc.kill()
        proc.wait()
    for name, argv in WRITERS.items():
        r = _mdd(*argv(out, out)[:2 if name.startswith("cases") else 1], "--help")
        assert r.returncode == 0 and "--wait" in r.stdout, name
    assert {n for n in COMMANDS if "run_lock(" in (ROOT / (COMMANDS[n][0].replace(".", "/") + ".py")).read_text(
        encoding="utf-8")} == {"synthesize", "evaluate", "run", "report", "export", "compare", "utility",
                               "import-mdd5k", "cases"}


def test_duplicate_rows_and_first_rows():
    import pyarrow as pa

    assert storage.duplicate_rows({"b": ["x", "y", "x"], "a": ["y", "z"]}) == {"b": [1, 2]}
    t = pa.table({"dialogue_id": ["a", "b", "a", "c", "b"], "turn": [0, 0, 0, 0, 1]})
    one, n = storage.first_rows(t, ["dialogue_id"])
    assert one.column("dialogue_id").to_pylist() == ["a", "b", "c"] and n == 2
    two, n = storage.first_rows(t, ["dialogue_id", "turn"])
    assert two.column("turn").to_pylist() == [0, 0, 0, 1] and n == 1
    assert storage.without_rows(t, [0, 4]).column("dialogue_id").to_pylist() == ["b", "a", "c"]


def test_dialogue_ids_duplicated_on_disk_by_an_older_run_are_read_once(run_copy, caplog):
    """An output that already holds a dialogue twice (two runs at once before the lock, or an older
    version): evaluate, the index, export and report each carry every dialogue id once, and say how
    many rows they skipped."""
    import logging
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.evaluate import main as evaluate_main
    from jobs.export import main as export_main
    from jobs.report import main as report_main

    out = run_copy
    shards = sorted((out / "synth").glob("*.parquet"))
    n = pl.read_parquet(out / "synth" / "*.parquet")["dialogue_id"].n_unique()
    whole = pq.read_metadata(shards[0]).num_rows
    shutil.copy(shards[0], out / "synth" / "zz-older-run.parquet")  # a whole shard again
    t = pq.read_table(shards[-1])
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), shards[-1])  # and one row twice within a shard
    copies = pl.read_parquet(out / "synth" / "*.parquet").height - n
    assert copies == whole + 1
    config = str(ROOT / "configs" / "local.yaml")
    with caplog.at_level(logging.WARNING, logger="mdd.storage"):
        assert evaluate_main(["--config", config, "--out", str(out), "--quiet"]) == 0
        assert export_main(["--out", str(out), "--format", "sharegpt"]) == 0
        assert report_main(["--config", config, "--out", str(out)]) == 0
    said = [m for m in caplog.messages if "repeat a dialogue id" in m]
    assert said and f": {copies} row(s) repeat" in said[0], caplog.messages
    for folder in ("eval/dialogues", "eval/turns", "eval/rules"):
        df = pl.read_parquet(out / folder / "*.parquet")
        key = {"eval/dialogues": ["dialogue_id"], "eval/turns": ["dialogue_id", "turn"],
               "eval/rules": ["dialogue_id", "rule"]}[folder]
        assert df.select(key).is_duplicated().sum() == 0, folder
        assert df["dialogue_id"].n_unique() == n, folder
    assert pl.read_parquet(out / "eval" / "dialogues" / "*.parquet").height == n
    exported = [json.loads(x) for x in (out / "export" / "sharegpt.jsonl").read_text(encoding="utf-8").splitlines()]
    ids = [r.get("id") or r.get("dialogue_id") for r in exported]
    assert len(ids) == len(set(ids)) and None not in ids
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["evaluate"]["dialogues"] == n
