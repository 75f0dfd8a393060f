"""The real vLLM engine actor (CPU build, tiny model) killed in the middle of a run.

Its own engine (the session's is shared by other tests), started with a capped KV cache and
KV-aware admission, so the same start also checks that the cap reaches vLLM. Ray restarts the
killed actor; the dialogues it was serving are retried from their start; the output holds every
(case, variant) exactly once and the failures table names whatever could not be redone.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import polars as pl

from mdd.config import load_config

REPO = Path(__file__).resolve().parent.parent
KV_TOKENS = 256 * 32  # 256 blocks of 32 tokens: a few short dialogues' prefixes (and one longest prompt)


def test_real_engine_killed_mid_run_is_restarted_and_its_dialogues_redone(ray_session, tiny_model_dir, tmp_path):
    import ray

    from mdd.driver import run_synthesis
    from mdd.engines.vllm import VLLMPoolEngine

    cfg = load_config(REPO / "configs" / "local-vllm.yaml", {
        "engine.model": f"tiny:{tiny_model_dir}", "engine.vllm.kv_cache_tokens": KV_TOKENS,
        "engine.vllm.max_model_len": 4096, "synth.dialogue.max_context_tokens": 3500,
        "engine.vllm.admission.mode": "kv", "engine.vllm.admission.prior_tokens": 256,
        "synth.cases": str(REPO / "data" / "cases"), "synth.limit": 3, "synth.variants": 2,
        "synth.out": str(tmp_path / "out"), "synth.in_flight": 6, "synth.shard_size": 2,
        "synth.max_attempts": 6, "synth.retry_backoff_s": 5.0,
        "synth.dialogue.max_exchanges": 10, "synth.dialogue.sampling.doctor_max_tokens": 12,
        "synth.dialogue.sampling.patient_max_tokens": 12, "synth.dialogue.sampling.story_max_tokens": 16,
    })
    engine = VLLMPoolEngine.launch(cfg.engine)
    try:
        stats = engine.engine_stats()[0]
        assert stats["kv_capacity_tokens"] == KV_TOKENS and stats["admission"] == "kv"  # the cap reached vLLM
        first_pid = ray.get(engine.actors[0].ready.remote())["pid"]
        result: dict = {}
        run = threading.Thread(target=lambda: result.update(run_synthesis(cfg, engine=engine, progress=False)))
        run.start()
        deadline = time.monotonic() + 300
        while engine.engine_stats()[0].get("requests", 0) < 40:  # mid-run: dialogues under way
            assert time.monotonic() < deadline and run.is_alive(), "the run ended before the engine was killed"
            time.sleep(0.5)
        ray.kill(engine.actors[0], no_restart=False)  # Ray restarts it (max_restarts: 1)
        run.join(timeout=600)
        assert not run.is_alive()
        restarted = ray.get(engine.actors[0].ready.remote(), timeout=60)
        assert restarted["pid"] != first_pid
    finally:
        engine.shutdown()
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
