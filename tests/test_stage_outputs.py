"""Stages and their outputs, end to end on Ray: a failed evaluation (bad setting, crash, unreadable
shard) leaves the previous eval/, index/ and run.json["evaluate"] as they were and says so in one
line; synthesis quarantines an unreadable shard and writes its dialogues again, byte for byte; a
foreign Parquet file in synth/ is refused by both stages and left where it is."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.evaluate import main as evaluate_main
from jobs.synthesize import main as synthesize_main

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def _snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] in ("eval", "index", "run.json", "synth")}


def _synthesize(cases: Path, out: Path) -> int:
    return synthesize_main(["--config", "configs/local.yaml", "--cases", str(cases), "--out", str(out),
                            "--variants", "2", "--no-progress"])


@pytest.fixture(scope="module")
def evaluated(ray_session, tmp_path_factory):
    """Two cases x 2 variants, synthesized and evaluated once; returns (cases, out, snapshot)."""
    tmp = tmp_path_factory.mktemp("stages")
    cases = tmp / "cases.json"
    cases.write_text(json.dumps(json.loads(SAMPLES.read_text(encoding="utf-8"))[:2], ensure_ascii=False),
                     encoding="utf-8")
    out = tmp / "out"
    assert _synthesize(cases, out) == 0
    assert evaluate_main(["--config", "configs/local.yaml", "--out", str(out), "--quiet"]) == 0
    return cases, out, _snapshot(out)


def _one_line_error(capsys) -> str:
    """The command's own error line (log records of the run may come before it); no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith(("evaluate:", "error:"))]
    assert len(ours) == 1, err
    return ours[0]


def test_bad_setting_is_refused_before_anything_is_touched(evaluated, capsys):
    _, out, before = evaluated
    capsys.readouterr()
    assert evaluate_main(["--config", "configs/local.yaml", "--out", str(out), "--embedder", "nope", "--quiet"]) == 1
    err = _one_line_error(capsys)
    assert "evaluate.embedder" in err and "unknown embedder 'nope'" in err
    assert _snapshot(out) == before


def test_crash_mid_stage_keeps_the_previous_outputs(evaluated, capsys, monkeypatch):
    from mdd.evaluate import stage

    _, out, before = evaluated

    def crash(*a, **kw):  # the workers wrote eval/turns, rules, dialogues (to the staging area) by now
        raise OSError("No space left on device")

    monkeypatch.setattr(stage.aggregate, "coverage_of", crash)
    capsys.readouterr()
    assert evaluate_main(["--config", "configs/local.yaml", "--out", str(out), "--quiet"]) == 2  # one line, exit 2
    err = _one_line_error(capsys)
    assert "no space left on the device" in err.lower()
    assert f"{out}/eval/, {out}/index/ and run.json['evaluate'] are unchanged" in err
    assert _snapshot(out) == before and not (out / ".staging").exists()


def test_unreadable_shard_fails_evaluation_then_synthesis_redoes_it(evaluated, capsys, caplog, tmp_path):
    cases, first, before = evaluated
    out = tmp_path / "out"
    shutil.copytree(first, out)
    shard = sorted((out / "synth").glob("*.parquet"))[0]
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])  # a truncated copy
    capsys.readouterr()
    assert evaluate_main(["--config", "configs/local.yaml", "--out", str(out), "--quiet"]) == 2  # one line, exit 2
    err = _one_line_error(capsys)
    assert shard.name in err and "cannot be read" in err
    assert (out / "eval").exists() and shard.exists()  # evaluation moves nothing
    assert _synthesize(cases, out) == 0
    assert (out / "quarantine" / "synth" / shard.name).read_bytes() == good[: len(good) // 2]
    assert shard.read_bytes() == good  # its dialogues written again, byte for byte
    assert [r for r in caplog.records if "quarantined" in r.getMessage() and shard.name in r.getMessage()]
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert run["counts"]["dialogues_run"] == pq.read_metadata(shard).num_rows
    assert run["quarantined_shards"][0]["shard"] == f"synth/{shard.name}"


def test_foreign_parquet_is_refused_by_both_stages(evaluated, capsys, tmp_path):
    import pyarrow as pa

    cases, first, _ = evaluated
    out = tmp_path / "out"
    shutil.copytree(first, out)
    pq.write_table(pa.table({"name": ["a"], "score": [0.5]}), out / "synth" / "scores.parquet")
    before = _snapshot(out)
    capsys.readouterr()
    assert _synthesize(cases, out) == 2
    assert "scores.parquet is not a dialogue shard" in _one_line_error(capsys)
    assert evaluate_main(["--config", "configs/local.yaml", "--out", str(out), "--quiet"]) == 2  # one line, exit 2
    assert "scores.parquet is not a dialogue shard" in _one_line_error(capsys)
    assert _snapshot(out) == before and not (out / "quarantine").exists()
