"""The pools profile (mdd/perf/pools.py): shared engine vs split pools, the engine time by role;
and routing recorded at the engine: a router over one real vLLM engine (the doctor's) and one
scripted engine (every other role)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mdd.config import load_config
from mdd.perf import pools

REPO = Path(__file__).resolve().parent.parent


def test_split_halves_the_resources_and_routes_the_doctor_alone():
    cfg = load_config(REPO / "configs" / "local-vllm.yaml")
    cs = pools.configs(cfg)
    shared, split = cs["shared"].engine.vllm, cs["split"].engines
    assert set(split) == {"doctor", "rest"}
    for e in split.values():  # two halves make the whole
        assert 2 * e.vllm.cpu_threads == shared.cpu_threads and 2 * e.vllm.kv_cache_space_gib == shared.kv_cache_space_gib
    rm = cs["split"].role_map()
    assert rm.engine_for("doctor", "S01-v0", 0) == "doctor"
    assert {rm.engine_for(r, "S01-v0", 0) for r in ("patient", "companion", "tool")} == {"rest"}
    with pytest.raises(ValueError, match="single vllm engine"):
        pools.configs(load_config(REPO / "configs" / "local.yaml"))


def test_busy_seconds_is_the_union_of_spans():
    from mdd.perf import replay

    recs = [(1, 0, 1, 0.0, 2.0), (1, 0, 1, 1.0, 3.0), (1, 0, 1, 5.0, 6.0), (1, 0, 1, 5.5, 5.8)]
    assert replay.time_by_role(recs)["busy_s"] == 4.0 and replay.time_by_role([])["busy_s"] == 0.0


def test_router_calls_reach_their_engine_and_are_charged_to_their_roles(vllm_engine, tiny_model_dir, ray_session):
    from mdd.cases import load_cases
    from mdd.engines.router import RoleRouter
    from mdd.dialogue.dryrun.engine import ScriptedEngine
    from mdd.perf.phases import items_for

    cfg = load_config(REPO / "configs" / "local-roles.yaml", {
        "engines.big": {"name": "vllm", "model": f"tiny:{tiny_model_dir}"},
        "synth.dialogue.max_exchanges": 10, "synth.dialogue.sampling.doctor_max_tokens": 12,
        "synth.dialogue.sampling.patient_max_tokens": 12, "synth.dialogue.sampling.story_max_tokens": 16,
        "synth.dialogue.guards.enabled": []})  # the tiny model's random text would fail every guard
    cases, _ = load_cases(REPO / "data" / "cases")
    cases = cases[:2]
    router = RoleRouter({"big": vllm_engine, "small": ScriptedEngine("scripted-small")}, cfg.role_map(), cfg.synth.seed)
    got = pools.measure(cfg, cases, items_for(cases, 2), 3, "routed", router)
    assert got["dialogues"] == 4 and got["failed"] == 0
    big = got["pools"]["big"]
    # the vLLM engine's own log: every request it served was a doctor's, and it served every doctor turn
    assert big["roles"] == ["doctor"] and big["requests"] >= 4 * 10
    assert got["pools"]["small"]["requests"] == 0  # the scripted engine keeps no engine log
    assert big["prefix_cache_hit_rate"] > 0.3  # the doctor's append-only prompts hit its pool's cache
    assert got["engine_time_share_by_role"] == {"doctor": 1.0}
    assert 0 < big["busy_s"] <= got["wall_s"] + 1
