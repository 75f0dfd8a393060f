"""The synthesis driver on Ray with the scripted engine: outputs, rejects, determinism, resume."""
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from mdd.config import load_config
from mdd.synthesize.run import run_synthesis
from mdd.engines.base import Completion, Request
from mdd.dialogue.dryrun.engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def config(tmp: Path, cases: Path | str, **synth):
    return load_config(ROOT / "configs" / "local.yaml", {"synth.cases": str(cases), "synth.out": str(tmp),
                                                         **{f"synth.{k}": v for k, v in synth.items()}})


def subset(path: Path, n: int) -> Path:
    cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:n]
    path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    return path


def test_outputs_schema_labels_and_run_record(ray_session, tmp_path):
    cases = subset(tmp_path / "cases.json", 4)
    summary = run_synthesis(config(tmp_path / "out", cases), progress=False)
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    assert df.height == 20 and df["dialogue_id"].n_unique() == 20
    assert set(df["engine"]) == {"scripted"}
    assert (df["n_turns"] >= 10).all()
    for row in df.iter_rows(named=True):
        last = row["turns"][-1]
        assert last["speaker"] == "doctor" and row["diagnosis"] in last["text"] and row["treatment"] not in last["text"]
    by_case = df.group_by("case_id").agg(pl.col("experience").n_unique().alias("exp"),
                                         pl.col("topics").n_unique().alias("orders"))
    assert (by_case["exp"] == 5).all() and (by_case["orders"] == 5).all()
    run = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert run["counts"]["dialogues_run"] == 20 and run["config"]["synth"]["variants"] == 5
    assert run["llm_calls"]["by_role"]["doctor"] == df["n_exchanges"].sum()
    assert run["llm_calls"]["per_exchange"] <= 3.0
    assert "ray" in run["versions"] and summary["wall_time_s"] > 0
    # the speech figures: every patient turn scored for jargon, styles recorded per dialogue
    speech = run["speech"]
    assert speech["patient_turns"] == sum(1 for r in df.iter_rows(named=True) for t in r["turns"]
                                          if t["speaker"] == "patient")
    assert speech["patient_jargon_share"] == pytest.approx(df["jargon_turns"].sum() / speech["patient_turns"], abs=1e-4)
    assert sum(speech["patient_styles"].values()) == 20 and df["patient_style"].null_count() == 0
    iv = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["interview"]
    assert iv["dialogues"] == 20 and iv["exchanges"]["mean"] == round(df["n_exchanges"].mean(), 2)
    assert iv["required_items"]["asked"] == iv["required_items"]["required"] == df["required_items"].list.len().sum()
    assert set(iv["coverage"]) == {c.split(",")[0][:3] for c in df["icd_code"]}
    assert set(iv["variant_kendall_tau"]["per_case"]) == set(df["case_id"])


def test_same_config_same_dialogues_and_resume_writes_nothing(ray_session, tmp_path):
    cases = subset(tmp_path / "cases.json", 3)
    run_synthesis(config(tmp_path / "a", cases, in_flight=7, shard_size=4), progress=False)
    run_synthesis(config(tmp_path / "b", cases, in_flight=64, shard_size=4), progress=False)
    files_a = sorted(p.name for p in (tmp_path / "a" / "synth").glob("*.parquet"))
    files_b = sorted(p.name for p in (tmp_path / "b" / "synth").glob("*.parquet"))
    assert files_a == files_b and len(files_a) == 4
    for name in files_a:
        assert pq.read_table(tmp_path / "a" / "synth" / name).equals(pq.read_table(tmp_path / "b" / "synth" / name))
    again = run_synthesis(config(tmp_path / "a", cases, shard_size=4), progress=False)
    assert again["counts"]["dialogues_run"] == 0 and again["counts"]["dialogues_in_output"] == 15
    more = run_synthesis(config(tmp_path / "a", cases, shard_size=4, variants=6), progress=False)
    assert more["counts"]["dialogues_run"] == 3
    assert pl.read_parquet(tmp_path / "a" / "synth" / "*.parquet")["dialogue_id"].n_unique() == 18


def test_bad_cases_are_rejected_and_the_good_one_runs(ray_session, tmp_path):
    good = json.loads(PA20.read_text(encoding="utf-8"))[0]
    broken = [copy.deepcopy(good) for _ in range(5)]
    del broken[0]["诊断结果"]
    broken[1]["年龄"] = "abc"
    broken[2]["性别"] = "X"
    broken[3]["主诉"] = ""
    broken[4]["现病史"] = 12345
    f = tmp_path / "mixed.json"
    f.write_text(json.dumps([broken[0], broken[1], good, *broken[2:]], ensure_ascii=False), encoding="utf-8")
    run_synthesis(config(tmp_path / "out", f), progress=False)
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert sorted(rejects["field"]) == sorted(["诊断结果", "年龄", "性别", "主诉", "现病史"])
    assert sorted(rejects["position"]) == [0, 1, 3, 4, 5] and (rejects["reason"].str.len_chars() > 3).all()
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    assert df.height == 5 and set(df["case_id"]) == {"1"}


class FailingForOneCase(ScriptedEngine):
    """Raises for one case's patient answers: those dialogues must fail alone."""

    async def generate(self, request: Request) -> Completion:
        if request.session.startswith("S02-") and request.op == "PatGen":
            raise ValueError("simulated malformed output")
        return await super().generate(request)


def test_failing_dialogues_are_recorded_and_the_rest_finish(ray_session, tmp_path):
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cases = subset(tmp_path / "cases.json", 3)
    summary = run_synthesis(config(tmp_path / "out", cases, max_attempts=2), engine=FailingForOneCase(),
                            progress=False)
    failures = pl.read_parquet(tmp_path / "out" / "failures.parquet")
    assert sorted(failures["dialogue_id"]) == [f"S02-v{v}" for v in range(5)]
    assert (failures["attempts"] == 2).all() and failures["error"].str.contains("simulated").all()
    assert summary["counts"]["dialogues_failed"] == 5 and summary["counts"]["dialogues_in_output"] == 10


def test_unparseable_cases_file_exits_nonzero(tmp_path):
    f = tmp_path / "cases.json"  # a plain file name: outputs name it (a personal-looking one is hashed)
    f.write_text("[{\"患者\": 1,", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "jobs.synthesize", "--config", "configs/local.yaml", "--cases", str(f),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cases.json" in proc.stderr and "not valid JSON" in proc.stderr


def test_kill_dash_nine_then_rerun_gives_every_dialogue_once(tmp_path, scaled_cases):
    f = scaled_cases(40, "K")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "jobs.synthesize", "--config", "configs/local.yaml", "--cases", str(f), "--out", str(out),
           "--no-progress", "--in-flight", "4"]
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "synth").glob("*.parquet")):
        assert proc.poll() is None, "the run ended before its first shard"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = len(list((out / "synth").glob("*.parquet")))
    assert 1 <= first < 4  # killed in the middle
    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    df = pl.read_parquet(out / "synth" / "*.parquet")
    assert df.height == 200 and df["dialogue_id"].n_unique() == 200
    assert not list((out / "synth").glob("*.tmp"))


def test_engine_actor_death_mid_run_is_retried(ray_session, tmp_path):
    """An engine actor that dies is restarted by Ray; its dialogues are retried from their start."""
    import ray

    from mdd.engines.vllm import VLLMPoolEngine

    @ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0, max_concurrency=100)
    class DiesOnce:
        """Answers any call generically; its first life ends abruptly on the 40th call."""

        def __init__(self, marker: str):
            self.first_life = not Path(marker).exists()
            Path(marker).touch()
            self.calls = 0

        async def generate(self, messages, sampling, rid, session="", role=""):
            self.calls += 1
            if self.first_life and self.calls == 40:
                os._exit(1)
            choice = sampling.get("choice")
            text = choice[0] if choice else ('{"covered": []}' if sampling.get("json_schema") else "嗯，是这样的。")
            return {"text": text, "prompt_tokens": 3, "output_tokens": 2, "cached_tokens": 0, "finish_reason": "stop"}

        def stats(self):
            return {"in_flight": 0, "requests": self.calls}

    actor = DiesOnce.remote(str(tmp_path / "lived"))
    pool = VLLMPoolEngine([actor], "dies-once", stats_refresh_s=1e9)
    cases = subset(tmp_path / "cases.json", 3)
    summary = run_synthesis(config(tmp_path / "out", cases, variants=2, max_attempts=3, retry_backoff_s=1.0),
                            engine=pool, progress=False)
    ray.kill(actor, no_restart=True)
    assert summary["counts"]["dialogue_retries"] >= 1
    assert summary["counts"]["dialogues_failed"] == 0
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    assert sorted(df["dialogue_id"]) == sorted(f"S0{i}-v{v}" for i in (1, 2, 3) for v in (0, 1))
