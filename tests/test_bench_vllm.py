"""The benchmark's vLLM-only paths on the real engine (tiny model): the engine ceiling replays,
utilisation, prefix-cache counters and resets, the prefill replay, and admission switched at run time."""
from __future__ import annotations

from pathlib import Path

import pytest

from mdd.config import load_config
from mdd.engines.base import Message, Request, Sampling

REPO = Path(__file__).resolve().parent.parent

SHORT = {  # short dialogues: the paths matter here, not the figures
    "synth.cases": str(REPO / "data" / "cases"), "synth.limit": 2, "synth.variants": 1,
    "synth.dialogue.max_exchanges": 10, "synth.dialogue.sampling.doctor_max_tokens": 12,
    "synth.dialogue.sampling.patient_max_tokens": 12, "synth.dialogue.sampling.story_max_tokens": 16,
}


def short_cfg(tiny_model_dir: Path, **extra):
    return load_config(REPO / "configs" / "local-vllm.yaml",
                       {**SHORT, "engine.model": f"tiny:{tiny_model_dir}", **extra})


def test_standard_profile_vllm_paths(vllm_engine, tiny_model_dir, tmp_path):
    from jobs.benchmark import run_standard

    cfg = short_cfg(tiny_model_dir)
    # 4 dialogues, 3 in flight: the 4th is admitted when a slot frees (the steady part ends there)
    res = run_standard(cfg, tmp_path, sequential=2, in_flight=3, waves=1.0, repeats=1, seed=3, engine=vllm_engine)
    (rep,) = res["repeats"]
    assert rep["concurrent"]["dialogues"] == res["set"]["dialogues"] == 4 and rep["concurrent"]["failed"] == 0
    # the ceiling replays the very calls each phase made: one request per logged call
    assert rep["engine_in_flight"]["requests"] >= 4 * 10  # >= 10 calls per dialogue
    assert rep["engine_one_in_flight"]["requests"] >= 2 * 10
    for key in ("engine_ceiling", "engine_utilization", "engine_utilization_one_in_flight", "speedup_share_of_ceiling"):
        assert rep[key] > 0, key
    assert rep["speedup_share_of_ceiling"] == pytest.approx(
        rep["pipeline_output_tok_s"]["in_flight"] / rep["pipeline_output_tok_s"]["one_in_flight"]
        / rep["engine_ceiling"], rel=0.01)
    # vLLM's own counters over the concurrent phase: append-only prompts hit the cache
    assert rep["prefix_cache"]["queries"] > 0 and 0.3 < rep["prefix_cache_hit_rate"] <= 1.0
    assert res["summary"]["engine_utilization"]["n"] == 1
    # the per-chain replay, primed, hits as the pipeline's calls did (the cached tokens vLLM reported
    # for them, within a block per call); the first repeat also ran the shared-prefix replay
    logged = rep["prefix_cache"]["hits"]
    got = rep["engine_in_flight"]["cached_tokens"]
    assert rep["engine_in_flight"]["cached_prefixes"] == "per chain, primed"
    assert abs(got - logged) <= 32 * rep["engine_in_flight"]["requests"] and got >= 0.8 * logged, (got, logged)
    assert rep["engine_in_flight_shared_prefix"]["requests"] == rep["engine_in_flight"]["requests"]
    # every request carries its role: the engine's busy time is charged to the dialogue's roles only
    by_role = rep["engine_time_by_role"]
    assert {"doctor", "patient", "tool"} <= set(by_role["seconds"]) <= {"doctor", "patient", "companion", "tool"}
    assert sum(by_role["time_share"].values()) == pytest.approx(1.0, abs=0.01)
    assert 0 < rep["engine_utilization_steady"] and 0 < rep["steady_share_of_phase"] <= 1
    # the prefill replay: both layouts counted from a reset cache, the reference recomputes more
    pf = res["prefill_detail"]
    assert pf["dialogues"] == 2 and pf["pipeline"]["calls"] == pf["reference"]["calls"] > 0
    assert 0 < pf["pipeline"]["uncached_tokens"] < pf["reference"]["uncached_tokens"]
    assert all(s.get("prefix_cache_source") == "vllm" for s in vllm_engine.engine_stats())


async def test_cache_reset_forgets_prefixes(vllm_engine):
    long = "你是一名精神科医生。" * 40
    req = Request(messages=(Message("system", long), Message("user", "最近睡得怎么样？")),
                  sampling=Sampling(temperature=0.0, max_tokens=2), session="reset-check")
    await vllm_engine.generate(req)
    again = await vllm_engine.generate(req)
    assert again.cached_tokens > 0
    assert vllm_engine.reset_prefix_cache()
    cold = await vllm_engine.generate(req)
    assert cold.cached_tokens == 0


def test_admission_switches_at_run_time_and_learns_footprints(vllm_engine, tiny_model_dir):
    from mdd.cases import load_cases
    from mdd.perf import pressure
    from mdd.perf.phases import Phases, items_for

    cfg = short_cfg(tiny_model_dir)
    cases = load_cases(cfg.synth.cases)[0][:2]
    phases = Phases(cfg, cases, vllm_engine, 2)
    try:
        pressure.set_admission(vllm_engine, "kv")
        before = vllm_engine.engine_stats()[0]
        got = pressure._phase(phases, "kv", items_for(cases, 1), 2)
        after = vllm_engine.engine_stats()[0]
    finally:
        pressure.set_admission(vllm_engine, "fixed")
        phases.close()
    assert got["dialogues"] == 2 and got["engine"]["admission"] == "kv"
    assert after["sessions_admitted"] >= before["sessions_admitted"] + 2
    # each finished dialogue taught its footprint: both of its prompt chains, as vLLM counted them
    assert after["footprint_learnt_from"] >= 2 and after["mean_peak_footprint_tokens"] > 100
    assert after["kv_capacity_tokens"] == (after["kv_blocks"] - 1) * after["block_size"]
    assert after["live_sessions"] == before["live_sessions"]  # every dialogue ended its session
    assert vllm_engine.engine_stats()[0]["admission"] == "fixed"


# ---- determinism, as the README states it -------------------------------------------------


def test_seeds_reach_vllm_where_they_are_sent():
    """On a GPU each call's seed goes into vLLM's SamplingParams (byte-identical reruns there)."""
    from mdd.engines.vllm import build_sampling_params, sampling_to_dict

    params = build_sampling_params(sampling_to_dict(Sampling(temperature=0.8, max_tokens=8, seed=1234)))
    assert params.seed == 1234 and params.temperature == 0.8


async def test_cpu_build_drops_seeds_so_reruns_differ(vllm_engine, tiny_model_dir):
    """The CPU build drops per-request seeds (its sampler fails on seeded batches): the same
    dialogue run twice does not come out byte-identical there."""
    from mdd.cases import load_cases
    from mdd.synthesize.worker import DialogueWorker

    assert {s["per_request_seed"] for s in vllm_engine.engine_stats()} == {False}
    cfg = short_cfg(tiny_model_dir)
    case = load_cases(cfg.synth.cases)[0][0]
    worker = DialogueWorker({case.case_id: case}, vllm_engine, cfg.synth.dialogue, cfg.synth.seed)
    a = await worker.run(case.case_id, 0)
    b = await worker.run(case.case_id, 0)
    assert a["ok"] and b["ok"]
    assert a["row"]["seed"] == b["row"]["seed"] and a["row"]["doctor_persona"] == b["row"]["doctor_persona"]
    texts = lambda r: [t["text"] for t in r["row"]["turns"]]  # noqa: E731
    assert texts(a) != texts(b)


def test_kv_cache_tokens_cap_vllms_block_count():
    """engine.vllm.kv_cache_tokens becomes vLLM's num_gpu_blocks_override (whole blocks plus the null
    block vLLM holds back); the actor reads the capacity back as (blocks - 1) x block size (the
    admission test above checks that on the real engine)."""
    from mdd.engines.vllm.actor import engine_args_kwargs

    opts = short_cfg(Path("tiny"), **{"engine.vllm.kv_cache_tokens": 8192}).engine.vllm.model_dump()
    assert engine_args_kwargs("tiny", opts)["num_gpu_blocks_override"] == 8192 // 32 + 1
    opts = short_cfg(Path("tiny"), **{"engine.vllm.kv_cache_tokens": 8200}).engine.vllm.model_dump()
    assert engine_args_kwargs("tiny", opts)["num_gpu_blocks_override"] == 257 + 1  # rounded up to a block


def test_batch_invariance_is_an_engine_setting():
    from mdd.config import load_config as load
    from mdd.engines.vllm.actor import engine_env

    gpu = load(REPO / "configs" / "gpu.yaml", {"engine.vllm.batch_invariant": True}).engine.vllm.model_dump()
    assert engine_env(gpu)["VLLM_BATCH_INVARIANT"] == "1"
    cpu = load(REPO / "configs" / "local-vllm.yaml").engine.vllm.model_dump()
    assert engine_env(cpu) == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
