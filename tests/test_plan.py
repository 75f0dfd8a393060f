"""The capacity planner (mdd/perf/plan.py, `mdd plan`) and the configs it sets."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdd.config import load_config
from mdd.perf import plan

REPO = Path(__file__).resolve().parent.parent


def test_kv_bytes_per_token_of_a_known_model():
    qwen7 = plan.model_shape("Qwen/Qwen2.5-7B-Instruct")
    # 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 bytes (bf16): the ~56 KB per token of the issue
    assert qwen7.kv_bytes_per_token() == 57_344
    assert qwen7.kv_bytes_per_token(plan.kv_dtype_bytes("fp8_e4m3", qwen7)) == 28_672
    assert plan.model_shape("qwen2.5-7b-instruct") is qwen7  # without the organisation, any case


def test_a_local_model_folder_is_read_from_its_config(tiny_model_dir):
    m = plan.model_shape(str(tiny_model_dir))
    c = json.loads((tiny_model_dir / "config.json").read_text())
    assert (m.layers, m.kv_heads, m.head_dim) == (c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"])
    assert 0 < m.params_b < 0.1


def test_unknown_model_names_the_key():
    with pytest.raises(ValueError, match="engine.model: unknown model"):
        plan.model_shape("no-such/model")


def test_dialogue_footprint_grows_per_exchange():
    s = plan.DialogueShape(exchanges=10)
    d0, p0 = s.chains_at(0)
    d10, p10 = s.chains_at(10)
    assert d10 - d0 == 10 * (s.doctor_instruction + s.doctor_turn + s.patient_turn)
    assert s.peak_tokens == d10 + p10 and s.mean_tokens == (d0 + p0 + d10 + p10) / 2


def test_gpu_config_fits_an_h100_and_the_7b_plan_is_sane():
    cfg = load_config(REPO / "configs" / "gpu.yaml")
    p = plan.plan_config(cfg, "h100-80gb")
    e = p["engine"]
    # the dialogues in flight must fit the KV cache at their time-averaged footprint
    assert e["dialogues_in_flight"] * e["dialogue"]["mean_tokens"] <= e["kv_tokens_per_engine"] * e["fill"]
    assert 50 <= e["dialogues_in_flight"] <= 400
    assert p["synth_in_flight"]["fits"], p["synth_in_flight"]  # configs/gpu.yaml is set from the plan
    assert cfg.engine.vllm.max_num_seqs >= p["max_num_seqs"]["recommended_at_least"]
    assert e["max_model_len_ok"]
    lo, hi = e["dialogues_per_hour"]
    assert 0 < lo <= hi
    # fp8 KV doubles what fits
    fp8 = plan.plan_engine(plan.model_shape(cfg.engine.model), plan.GPUS["h100-80gb"], kv_cache_dtype="fp8_e4m3")
    assert fp8["dialogues_in_flight"] >= 2 * e["dialogues_in_flight"] - 1


def test_a10g_config_fits_an_a10g():
    cfg = load_config(REPO / "configs" / "gpu-a10g.yaml")
    p = plan.plan_config(cfg, "a10g-24gb")
    assert p["engine"]["fits"] and p["synth_in_flight"]["fits"], p["synth_in_flight"]
    # the H100 settings would not fit there
    h100_cfg = load_config(REPO / "configs" / "gpu.yaml")
    assert not plan.plan_config(h100_cfg, "a10g-24gb")["synth_in_flight"]["fits"]


def test_a_model_too_big_for_the_gpu_does_not_fit():
    big = plan.plan_engine(plan.model_shape("Qwen/Qwen2.5-72B-Instruct"), plan.GPUS["a10g-24gb"])
    assert not big["fits"] and big["kv_tokens_per_engine"] == 0


def test_plan_command(capsys, tmp_path):
    from mdd.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(REPO / "configs" / "gpu.yaml"), "--gpu", "h100-80gb",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "KV bytes per token" in text and "dialogues in flight / engine" in text
    assert json.loads(out.read_text())["engine"]["kv_bytes_per_token"] == 57_344
    assert main(["plan", "--config", str(REPO / "configs" / "gpu.yaml"), "--gpu", "tpu-v9"]) == 2
    assert "--gpu: unknown GPU" in capsys.readouterr().err


def test_production_profile_config():
    from mdd.perf.pressure import production_config

    cfg = production_config(load_config(REPO / "configs" / "local-vllm.yaml"))
    s = cfg.synth.dialogue.sampling
    assert (s.doctor_min_tokens, s.doctor_max_tokens, s.patient_min_tokens, s.patient_max_tokens) == (74, 74, 98, 98)
    assert cfg.synth.dialogue.max_exchanges == 60
    assert cfg.synth.dialogue.max_context_tokens < cfg.engine.vllm.max_model_len
    assert cfg.engine.vllm.extra["hf_overrides"]["max_position_embeddings"] == cfg.engine.vllm.max_model_len


def test_min_tokens_config_is_checked():
    from mdd.config import ConfigError

    with pytest.raises(ConfigError, match="doctor_min_tokens"):
        load_config(None, {"synth.dialogue.sampling.doctor_min_tokens": 500})
    with pytest.raises(ConfigError, match="kv_cache_tokens needs block_size"):
        load_config(None, {"engine.vllm.kv_cache_tokens": 9000})
    with pytest.raises(ConfigError, match="kv_cache_tokens .* must hold one prompt of max_model_len"):
        load_config(None, {"engine.vllm.kv_cache_tokens": 4096, "engine.vllm.block_size": 16})


def test_every_pool_is_sized_for_the_views_its_roles_keep(tmp_path):
    import yaml

    big = {"name": "vllm", "model": "Qwen/Qwen2.5-72B-Instruct", "vllm": {"tensor_parallel_size": 4}}
    small = {"name": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct"}
    p = tmp_path / "pools.yaml"
    p.write_text(yaml.safe_dump({"engines": {"big": big, "small": small},
                                 "roles": {"doctor": "big", "patient": "small", "companion": "small",
                                           "tool": "small"}}))
    pools = plan.plan_pools(load_config(p), "h100-80gb")
    assert pools["big"]["roles"] == ["doctor"] and set(pools["small"]["roles"]) == {"patient", "companion", "tool"}
    d_big, d_small = pools["big"]["engine"]["dialogue"], pools["small"]["engine"]["dialogue"]
    # the doctor's engine keeps only the doctor's view; the tool's verdicts need both views on `small`
    assert d_big["mean_tokens"] < d_small["mean_tokens"]
    assert d_small["mean_tokens"] == plan.DialogueShape().mean_tokens
    assert pools["big"]["engine"]["tensor_parallel_size"] == 4 and pools["big"]["engine"]["fits"]
