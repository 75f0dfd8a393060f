"""Roles on named engines (mdd/engines/roles.py, mdd/engines/router.py): config errors, routing,
mixes drawn per dialogue, and accounting by model in the dialogue table and run.json."""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import yaml

from mdd.config import ConfigError, load_config
from mdd.engines.roles import SYNTH_ROLES, RoleMap

REPO = Path(__file__).resolve().parent.parent
TWO = {"big": {"name": "scripted", "model": "scripted-big"}, "small": {"name": "scripted", "model": "scripted-small"}}


def write_cfg(tmp_path: Path, **top) -> Path:
    base = yaml.safe_load((REPO / "configs" / "local-roles.yaml").read_text(encoding="utf-8"))
    base.update(top)
    base["synth"] = {**base["synth"], "cases": str(REPO / "data" / "cases"), "out": str(tmp_path / "out")}
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(base, allow_unicode=True), encoding="utf-8")
    return p


@pytest.mark.parametrize("roles, key", [
    ({"doctor": "huge", "default": "small"}, "roles.doctor: unknown engine 'huge'"),
    ({"doctor": "big", "patient": "small", "companion": "small"}, "roles.tool: no engine for this role"),
    ({"doctor": "big", "patient": "small", "tool": "small"}, "roles.companion: no engine for this role"),
    ({"default": "small"}, "engines.big: no role uses this engine"),
    ({"surgeon": "big", "default": "small"}, "roles.surgeon: unknown role"),
    ({"doctor": {"big": 0, "small": 1}, "default": "small"}, "roles.doctor.big: the weight must be > 0"),
    ({"judge": ["big", "small"], "default": "small"}, "roles.judge: the judge takes one engine"),
])
def test_config_errors_name_the_key(tmp_path, roles, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(")", r"\)")):
        load_config(write_cfg(tmp_path, roles=roles))


def test_an_unknown_engine_exits_2_naming_the_key(tmp_path, capsys):
    from jobs.synthesize import main

    assert main(["--config", str(write_cfg(tmp_path, roles={"doctor": "huge", "default": "small"}))]) == 2
    assert "roles.doctor: unknown engine 'huge'" in capsys.readouterr().err


def test_engine_and_engines_together_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="engine: and engines: are both given"):
        load_config(write_cfg(tmp_path, engine={"name": "scripted"}))


def test_judge_without_an_engine_when_the_evaluation_asks_an_llm(tmp_path):
    roles = {"doctor": "big", "patient": "small", "companion": "small", "tool": "small"}
    keyword = load_config(write_cfg(tmp_path, roles=roles))  # keyword judge: no judge role needed
    assert keyword.engine_for("judge") is None
    from mdd.evaluate import incremental  # the evaluation's fingerprint names no judge engine then
    assert incremental.components(keyword, "record", 8)["judge_engine"] is None
    with pytest.raises(ConfigError, match="roles.judge: no engine for this role"):
        load_config(write_cfg(tmp_path, roles=roles, evaluate={"judge": "llm"}))
    cfg = load_config(write_cfg(tmp_path, roles={**roles, "judge": "big"}, evaluate={"judge": "llm"}))
    assert cfg.engine_for("judge").model == "scripted-big"  # --judge llm and LLM faithfulness use it


def test_a_mix_is_drawn_per_dialogue_in_its_shares():
    rm = RoleMap.build({"doctor": {"big": 3, "small": 1}, "default": "small"}, TWO, ("doctor", "patient", "tool"))
    draws = Counter(rm.engine_for("doctor", f"case{i}-v{v}", 7) for i in range(100) for v in range(5))
    assert 0.70 <= draws["big"] / 500 <= 0.80  # 3:1
    # the same dialogue always draws the same engine; another run seed draws anew
    assert rm.engine_for("doctor", "case1-v0", 7) == rm.engine_for("doctor", "case1-v0", 7)
    assert [rm.engine_for("doctor", f"c{i}", 7) for i in range(40)] != [rm.engine_for("doctor", f"c{i}", 8)
                                                                        for i in range(40)]


async def test_router_sends_each_role_to_its_engine_recorded_at_the_engine():
    from mdd.cases import load_cases
    from mdd.synthesize.worker import DialogueWorker
    from mdd.engines.router import RoleRouter
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    big, small = ScriptedEngine("scripted-big"), ScriptedEngine("scripted-small")
    rm = RoleMap.build({"doctor": "big", "default": "small"}, TWO, SYNTH_ROLES)
    router = RoleRouter({"big": big, "small": small}, rm, run_seed=1)
    cfg = load_config(REPO / "configs" / "local.yaml")
    cases = load_cases(REPO / "data" / "cases")[0][:3]
    worker = DialogueWorker({c.case_id: c for c in cases}, router, cfg.synth.dialogue, 1)
    results = await asyncio.gather(*(worker.run(c.case_id, 0) for c in cases))
    assert all(r["ok"] for r in results)
    assert set(big.served) == {"doctor"} and {"patient", "tool"} <= set(small.served) <= {"patient", "companion", "tool"}
    assert sum(big.served.values()) == sum(r["calls_by_role"]["doctor"] for r in results)


def test_run_counts_every_role_under_its_model(ray_session, tmp_path):
    from mdd.synthesize.run import run_synthesis

    cfg = load_config(write_cfg(tmp_path), {"synth.variants": 2})
    run_synthesis(cfg, progress=False)
    run = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["synthesize"]
    by_role, by_model = run["llm_calls"]["by_role"], run["llm_calls"]["by_model"]
    small = ("patient", "companion", "tool")  # the companion: roles.default
    assert by_role["companion"] > 0  # some dialogues have a family member in the room
    assert by_model == {"scripted-big": by_role["doctor"], "scripted-small": sum(by_role[r] for r in small)}
    t = run["tokens"]
    assert t["output_by_model"]["scripted-big"] == t["output_by_role"]["doctor"]
    assert t["prompt_by_model"]["scripted-small"] == sum(t["prompt_by_role"][r] for r in small)
    assert run["roles"]["map"]["doctor"] == [["big", 1.0]]
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    models = df["models"].struct.unnest()
    assert (models["doctor"] == "scripted-big").all()
    assert (models["patient"] == "scripted-small").all() and (models["tool"] == "scripted-small").all()
    came = df["companion"].is_not_null()
    assert came.any() and (models["companion"].filter(came) == "scripted-small").all()
    assert models["companion"].filter(~came).is_null().all()  # no companion, no call, no model
    calls = df["calls_by_role"].struct.unnest()
    assert (calls["doctor"] == df["n_exchanges"]).all()
    usage = df.select("dialogue_id", "calls_by_role", "usage_by_model").explode("usage_by_model")
    for row in usage.iter_rows(named=True):
        u, c = row["usage_by_model"], row["calls_by_role"]
        want = c["doctor"] if u["model"] == "scripted-big" else sum(c[r] or 0 for r in small)
        assert u["calls"] == want
    # the dataset card and the report's cost panel show the same per-model figures, over every dialogue
    from mdd.publish.card import write_card
    from mdd.publish.report import Context, _cost
    from mdd.publish.run_data import RunData, usage_by_model

    rows = {r["model"]: r for r in usage_by_model(RunData(tmp_path / "out"))}
    assert rows["scripted-big"]["roles"] == "doctor" and rows["scripted-big"]["dialogues"] == df.height
    assert set(rows["scripted-small"]["roles"].split(", ")) == set(small)
    assert rows["scripted-small"]["calls"] == by_model["scripted-small"]  # one invocation: run.json agrees
    write_card(tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert f"| scripted-big | doctor | {df.height} | {by_model['scripted-big']} |" in card
    panel = "".join(_cost(Context(RunData(tmp_path / "out"), {})).blocks)
    assert "every dialogue of the run" in panel and "scripted-small" in panel


def test_doctor_mix_gives_both_models_a_quarter_or_more(ray_session, tmp_path):
    from mdd.synthesize.run import run_synthesis

    cfg = load_config(write_cfg(tmp_path, roles={"doctor": ["big", "small"], "patient": "small", "tool": "small",
                                                 "default": "small"}), {"synth.variants": 2})
    run_synthesis(cfg, progress=False)
    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    share = df["models"].struct.field("doctor").value_counts(normalize=True)
    got = dict(zip(share["doctor"], share["proportion"]))
    assert set(got) == {"scripted-big", "scripted-small"} and min(got.values()) >= 0.25
    # each dialogue's doctor calls all went to the model its row names
    for row in df.iter_rows(named=True):
        usage = {u["model"]: u["calls"] for u in row["usage_by_model"]}
        assert usage[row["models"]["doctor"]] >= row["calls_by_role"]["doctor"]


def test_a_single_engine_config_is_unchanged(ray_session, tmp_path):
    from mdd.synthesize.run import run_synthesis

    cfg = load_config(REPO / "configs" / "local.yaml", {"synth.cases": str(REPO / "data" / "cases"),
                                                        "synth.out": str(tmp_path / "out"), "synth.limit": 2,
                                                        "synth.variants": 1})
    assert cfg.engines is None and cfg.role_map() is None and cfg.engine_for("judge") == cfg.engine
    s = run_synthesis(cfg, progress=False)
    assert s["engine"]["name"] == "scripted" and s["roles"] is None
    assert s["llm_calls"]["by_model"] == {"scripted": s["llm_calls"]["total"]}


async def test_doctor_on_real_vllm_patient_and_tool_on_scripted(vllm_engine):
    """One real vLLM pool and one scripted engine: each role's calls reach its engine (counted at
    the engine), and the prefix-cache counters are per pool."""
    from mdd.cases import load_cases
    from mdd.synthesize.worker import DialogueWorker
    from mdd.engines.router import RoleRouter
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    engines = {"big": vllm_engine, "small": ScriptedEngine("scripted-small")}
    rm = RoleMap.build({"doctor": "big", "default": "small"}, engines, SYNTH_ROLES)
    router = RoleRouter(engines, rm, run_seed=3)
    cfg = load_config(REPO / "configs" / "local-vllm.yaml", {"synth.dialogue.max_exchanges": 10,
                                                              "synth.dialogue.sampling.doctor_max_tokens": 12})
    cases = load_cases(REPO / "data" / "cases")[0][:2]
    before = await vllm_engine.ametrics()
    worker = DialogueWorker({c.case_id: c for c in cases}, router, cfg.synth.dialogue, 3)
    results = await asyncio.gather(*(worker.run(c.case_id, 0) for c in cases))
    after = await vllm_engine.ametrics()
    assert all(r["ok"] for r in results), results
    doctor_calls = sum(r["calls_by_role"]["doctor"] for r in results)
    assert after["requests"] - before["requests"] == doctor_calls  # every doctor call, and only those
    assert {"patient", "tool"} <= set(engines["small"].served) <= {"patient", "companion", "tool"}
    for r in results:
        models = r["row"]["models"]
        assert models.pop("doctor") == vllm_engine.model and set(models.values()) == {"scripted-small"}
    per_pool = router.metrics()
    assert per_pool["big.prefix_cache_queries"] > before["prefix_cache_queries"]
    assert per_pool["big.prefix_cache_hits"] > before["prefix_cache_hits"]  # the doctor's prefix, reused
    assert not any(k.startswith("small.") for k in per_pool)  # the scripted engine has no cache
