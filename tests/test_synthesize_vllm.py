"""A whole small synthesis on the real vLLM CPU engine under Ray (the session's one engine)."""
import json
from pathlib import Path

import polars as pl
import pytest

from mdd.config import load_config
from mdd.synthesize.run import run_synthesis

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.vllm


def test_synthesis_on_vllm(vllm_engine, tmp_path):
    cases = json.loads((ROOT / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    f = tmp_path / "cases.json"
    f.write_text(json.dumps(cases[:2], ensure_ascii=False), encoding="utf-8")
    cfg = load_config(ROOT / "configs" / "local-vllm.yaml", {
        "synth.cases": str(f), "synth.out": str(tmp_path / "out"), "synth.variants": 2, "synth.in_flight": 4,
        "synth.dialogue.max_exchanges": 14,
    })
    before = vllm_engine.metrics()
    summary = run_synthesis(cfg, engine=vllm_engine, progress=False)
    after = vllm_engine.metrics()

    df = pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet")
    assert df.height == 4 and summary["counts"]["dialogues_failed"] == 0
    assert set(df["engine"]) == {"vllm"} and df["model"][0] == vllm_engine.model
    for row in df.iter_rows(named=True):
        assert 10 <= row["n_turns"] <= 15
        assert row["diagnosis"] in row["turns"][-1]["text"]
        # real tokens from the real tokenizer, every role
        assert all(row["prompt_tokens_by_role"][r] > 0 for r in ("doctor", "patient", "tool"))
        assert row["output_tokens"] > 0
    calls = summary["llm_calls"]
    assert calls["total"] == df["llm_calls"].sum()
    # one doctor call per exchange, one call per patient or companion turn (both cases are minors: a
    # parent is in the room); tool verdicts bounded (short dialogues amortise the once-per-dialogue
    # calls, FicExpGen and ParseExp, over few exchanges)
    said = pl.Series([t["speaker"] for ts in df["turns"] for t in ts]).value_counts()
    said = dict(said.rows())
    assert calls["by_role"]["doctor"] == df["n_exchanges"].sum()
    assert calls["by_role"]["patient"] == said["patient"] and calls["by_role"]["companion"] == said["companion"]
    assert set(df["companion"]) <= {"母亲", "父亲"}
    assert calls["by_role"]["tool"] <= 2 * df["n_exchanges"].sum()
    # every call went through the engine, and the append-only prompts hit its prefix cache
    assert after["requests"] - before["requests"] == calls["total"]
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    queries = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    assert queries > 0 and hits / queries > 0.5
    run = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert run["engine"]["name"] == "vllm" and run["engine"]["metrics"]["prefix_cache_queries"] > 0
