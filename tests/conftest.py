"""Session-wide fixtures: one local Ray and one real vLLM CPU engine for the whole test run.

The vLLM engine takes ~45-100 s to start on 2 cores (the first start on a machine also
compiles the model; later starts reuse vLLM's compile cache), so it starts at most once per
session and only when a test asks for ``vllm_engine``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray (2 CPUs, no dashboard); reuses one that is already running."""
    import ray
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny random-weight Qwen2 model (built once into .cache/models/mdd-tiny; a stable
    path also lets vLLM reuse its compile cache across runs)."""
    from mdd.engines.tiny_model import build_tiny_model

    return build_tiny_model(os.environ.get("MDD_TINY_MODEL_DIR") or REPO / ".cache" / "models" / "mdd-tiny")


@pytest.fixture(scope="session")
def vllm_engine(ray_session, tiny_model_dir):
    """A launched ``VLLMPoolEngine`` configured as configs/local-vllm.yaml (tiny model)."""
    from mdd.config import load_config
    from mdd.engines.vllm import VLLMPoolEngine

    cfg = load_config(REPO / "configs" / "local-vllm.yaml").engine
    cfg = cfg.model_copy(update={"model": f"tiny:{tiny_model_dir}"})
    engine = VLLMPoolEngine.launch(cfg)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="session")
def sample_run():
    """The README main job's dialogues, made in-process: the 27 sample cases x 5 variants on the
    scripted engine with configs/local.yaml's seed (the same rows a run writes, without Ray)."""
    import asyncio

    from mdd.cases import load_cases
    from mdd.config import load_config
    from mdd.dialogue import ops
    from mdd.dialogue.loop import run_dialogue
    from mdd.engines.scripted import ScriptedEngine

    cfg = load_config(REPO / "configs" / "local.yaml")
    cases, _ = load_cases(REPO / cfg.synth.cases)
    personas, seed, rows = ops.all_personas(), cfg.synth.seed, []

    async def run_all():
        engine = ScriptedEngine()
        for case in cases:
            triples = ops.sample_triples(case, seed, cfg.synth.variants)
            for v in range(cfg.synth.variants):
                persona = ops.choose_persona(personas, seed, case.case_id, v)
                rows.append((await run_dialogue(case, v, seed, engine, cfg.synth.dialogue, persona, triples[v]))[0])

    asyncio.run(run_all())
    return {"cases": {c.case_id: c for c in cases}, "rows": rows}


@pytest.fixture(scope="session")
def main_run(ray_session, tmp_path_factory) -> Path:
    """The main job (jobs.run) on 6 sample cases x 2 variants, two rounds: round 1 in OUT/rounds/1/,
    round 2 (exemplars from round 1's index) in OUT, with its report and dataset card."""
    import json

    from jobs.run import main as run_main

    tmp = tmp_path_factory.mktemp("main-run")
    cases = tmp / "cases.json"
    samples = json.loads((REPO / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    cases.write_text(json.dumps(samples[:6], ensure_ascii=False), encoding="utf-8")
    out = tmp / "out"
    assert run_main(["--config", str(REPO / "configs" / "local.yaml"), "--cases", str(cases), "--out", str(out),
                     "--variants", "2", "--rounds", "2", "--no-progress"]) == 0
    return out
