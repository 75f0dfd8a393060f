"""The real vLLM engine actor (CPU build, tiny model) killed in the middle of a run.

The session's engine (one start for the whole suite): Ray restarts the killed actor with its own
arguments, so the tests after this one get a fresh engine of the same settings. The run admits
dialogues by KV-cache usage, so a retried dialogue is admitted again on the new actor. The killed
engine's dialogues are retried from their start; the output holds every (case, variant) exactly once
and the failures table names whatever could not be redone.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import polars as pl

from mdd.config import load_config

REPO = Path(__file__).resolve().parent.parent


def test_real_engine_killed_mid_run_is_restarted_and_its_dialogues_redone(vllm_engine, tiny_model_dir, tmp_path):
    import ray

    from mdd.synthesize.run import run_synthesis
    from mdd.perf.pressure import set_admission

    cfg = load_config(REPO / "configs" / "local-vllm.yaml", {
        "engine.model": f"tiny:{tiny_model_dir}",
        "synth.cases": str(REPO / "data" / "cases"), "synth.limit": 3, "synth.variants": 2,
        "synth.out": str(tmp_path / "out"), "synth.in_flight": 6, "synth.shard_size": 2,
        "synth.max_attempts": 6, "synth.retry_backoff_s": 5.0,
        "synth.dialogue.max_exchanges": 10, "synth.dialogue.sampling.doctor_max_tokens": 12,
        "synth.dialogue.sampling.patient_max_tokens": 12, "synth.dialogue.sampling.story_max_tokens": 16,
    })
    actor = vllm_engine.actors[0]
    assert cfg.engine.vllm.max_restarts >= 1
    first_pid = ray.get(actor.ready.remote())["pid"]
    start = vllm_engine.engine_stats()[0].get("requests", 0)
    set_admission(vllm_engine, "kv")
    result: dict = {}
    run = threading.Thread(target=lambda: result.update(run_synthesis(cfg, engine=vllm_engine, progress=False)))
    try:
        run.start()
        deadline = time.monotonic() + 300
        while vllm_engine.engine_stats()[0].get("requests", 0) - start < 40:  # mid-run: dialogues under way
            assert time.monotonic() < deadline and run.is_alive(), "the run ended before the engine was killed"
            time.sleep(0.5)
        ray.kill(actor, no_restart=False)  # Ray restarts it (max_restarts)
        run.join(timeout=600)
        assert not run.is_alive()
        restarted = ray.get(actor.ready.remote(), timeout=120)
        assert restarted["pid"] != first_pid
    finally:
        try:  # the restarted actor starts with the config's admission; a failure before the kill does not
            set_admission(vllm_engine, "fixed")
        except Exception:
            pass
    counts = result["counts"]
    assert counts["dialogue_retries"] >= 1  # the killed engine's dialogues were redone
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    expected = {f"{c}-v{v}" for c in df["case_id"].unique() for v in (0, 1)}
    failures = tmp_path / "out" / "failures.parquet"
    failed = set(pl.read_parquet(failures)["dialogue_id"]) if failures.exists() else set()
    # every (case, variant) exactly once: written, or named in failures.parquet with its error
    assert df["dialogue_id"].n_unique() == df.height
    assert set(df["dialogue_id"]) | failed == expected and not set(df["dialogue_id"]) & failed
    assert df.height + len(failed) == 6 and counts["dialogues_failed"] == len(failed)
    assert not failed, f"dialogues not redone: {failed}"
