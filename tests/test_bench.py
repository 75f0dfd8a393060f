"""The benchmark's pieces: the reference layout it replays, the shaped baseline, occupancy, and a
whole run on the scripted engine (the vLLM figures themselves come from ``jobs.benchmark``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdd.perf import replay
from mdd.config import load_config
from mdd.engines.base import launch_engine

REPO = Path(__file__).resolve().parent.parent
REPO_CFG = REPO / "configs" / "local.yaml"
CASES = {"synth.cases": str(REPO / "data" / "cases")}


@pytest.fixture(scope="module")
def recorded():
    """One real dialogue's calls (scripted engine), as the pipeline sent them: the first sample
    case's that reaches a topic-end verdict (a dialogue whose required topics fill its length
    target, as a minor's with a parent in the room may, asks for none)."""
    import asyncio

    from mdd.cases import load_cases
    from mdd.synthesize.worker import DialogueWorker

    cfg = load_config(REPO_CFG, CASES)
    cases, _ = load_cases(cfg.synth.cases)
    for case in cases[:4]:
        rec = replay.Recording(launch_engine(cfg.engine))
        worker = DialogueWorker({case.case_id: case}, rec, cfg.synth.dialogue, cfg.synth.seed)
        result = asyncio.run(worker.run(case.case_id, 0))
        assert result["ok"], result
        (calls,) = rec.calls.values()
        if any(r.op == "IsTopicEnd" for r, _ in calls):
            return calls
    raise AssertionError("none of the first 4 sample cases' dialogues reached a topic-end verdict")


def test_reference_layout_pastes_a_window_of_turns(recorded):
    doc = [r for r, _ in recorded if r.op == "DocGen"]
    late = doc[-1]
    assert len(late.messages) > 2 * replay.REF_WINDOW  # a long append-only history
    ref = replay.reference_layout(late)
    (msg,) = ref.messages
    assert msg.role == "user"
    assert msg.content.startswith(late.messages[0].content)  # persona and case first
    turns = [ln for ln in msg.content.split("\n") if ln.startswith(("医生：", "患者："))]
    assert 0 < len(turns) <= replay.REF_WINDOW
    # the call's own instruction comes last; earlier turns' instructions are not pasted
    instruction = late.messages[-1].content.rpartition("\n\n")[2]
    assert instruction and msg.content.endswith("\n\n" + instruction)
    earlier = [m.content.rpartition("\n\n")[2] for m in late.messages[1:-1] if m.role == "user" and "\n\n" in m.content]
    assert earlier and not any(e in msg.content for e in earlier if e != instruction)


def test_reference_topic_end_covers_the_topic_turns(recorded):
    verdicts = [r for r, _ in recorded if r.op == "IsTopicEnd"]
    assert verdicts
    for r in verdicts:
        ref = replay.reference_layout(r)
        assert [m.role for m in ref.messages] == ["system", "user"]
        turns = [ln for ln in ref.messages[1].content.split("\n") if ln.startswith(("医生：", "患者："))]
        assert len(turns) <= 2 * int(r.context.get("exchanges", 1) or 1)


def test_prefill_only_keeps_the_prompt():
    from mdd.engines.base import Message, Request, Sampling

    r = Request(messages=(Message("user", "你好"),), sampling=Sampling(temperature=0.8, max_tokens=64, seed=3))
    p = replay.prefill_only(r)
    assert p.messages == r.messages and p.sampling.max_tokens == 1 and p.sampling.seed == 3


def test_shaped_prompts_reproduce_lengths_and_cache_behaviour():
    # two chains (7 and 9): each call's cached part is a prefix of its own chain's sequence
    shapes = [replay.CallShape(100, 64, 5, chain=7), replay.CallShape(40, 0, 3, chain=9),
              replay.CallShape(300, 288, 9, chain=7), replay.CallShape(80, 32, 2, chain=9)]
    prompts, primers = replay.shaped_prompts(shapes, vocab=8000, seed=1)
    assert [len(p) for p in prompts] == [100, 40, 300, 80]
    assert prompts[0][:64] == prompts[2][:64]  # one chain's cached parts share its sequence ...
    assert prompts[3][:32] != prompts[0][:32]  # ... and another chain's do not
    assert prompts[0][64:] != prompts[2][64:100]  # the uncached parts are fresh
    # one primer per chain with a cached part: the chain's longest cached prefix, so every call hits as logged
    assert sorted(len(p) for p in primers) == [32, 288]
    assert all(any(p[: s.cached_tokens] == pr[: s.cached_tokens] for pr in primers) for p, s in zip(prompts, shapes))
    assert all(10 <= t < 8000 for p in prompts for t in p)
    # the earlier layout: one sequence shared by every call, nothing to prime
    shared, none = replay.shaped_prompts(shapes, vocab=8000, seed=1, per_chain=False)
    assert shared[3][:32] == shared[0][:32] and none == []
    assert replay.CallShape.from_log((100, 64, 5, 1.0, 2.0, "doctor", 7)) == shapes[0]
    assert replay.CallShape.from_log((100, 64, 5, 1.0, 2.0)) == replay.CallShape(100, 64, 5)


def test_engine_time_is_split_among_the_requests_in_flight():
    # a doctor call over [0, 10] and a tool call over [5, 10]: alone, then sharing the engine
    recs = [(900, 800, 40, 0.0, 10.0, "doctor", 1), (300, 280, 2, 5.0, 10.0, "tool", 2)]
    got = replay.time_by_role(recs)
    assert got["seconds"] == {"doctor": 7.5, "tool": 2.5} and got["busy_s"] == 10.0
    assert got["time_share"] == {"doctor": 0.75, "tool": 0.25}
    assert got["uncached_prompt_token_share"] == {"doctor": round(100 / 120, 4), "tool": round(20 / 120, 4)}
    # idle time is nobody's: a gap between two requests is not charged
    gap = replay.time_by_role([(10, 0, 1, 0.0, 1.0, "doctor", 1), (10, 0, 1, 3.0, 4.0, "patient", 2)])
    assert gap["busy_s"] == 2.0 and gap["time_share"] == {"doctor": 0.5, "patient": 0.5}
    # output tokens per second of the requests that ended inside a window
    assert replay.tok_s_within(recs, (0.0, 10.0)) == 4.2 and replay.tok_s_within(recs, (0.0, 5.0)) is None


def test_occupancy_is_time_weighted():
    # 2 requests over [0, 10], a third over [0, 5]: mean 2.5, at least 90% of 3 for half the time
    occ = replay.occupancy([(0.0, 10.0), (0.0, 10.0), (0.0, 5.0)], target=3)
    assert occ == {"mean_in_flight": 2.5, "share_near_target": 0.5}
    assert replay.occupancy([], 4) == {"mean_in_flight": 0.0, "share_near_target": 0.0}


def test_check_targets_directions():
    from jobs.benchmark import TARGETS, check_targets

    ok = {"speedup_vs_sequential": 8.0, "engine_utilization": 0.85, "prefix_cache_hit_rate": 0.9,
          "prefill_ratio_vs_reference": 0.4, "llm_calls_per_exchange": 3.0}
    assert check_targets(ok) == {k: True for k in TARGETS}
    bad = {**ok, "speedup_vs_sequential": 7.9, "prefill_ratio_vs_reference": 0.41}
    got = check_targets(bad)
    assert not got["speedup_vs_sequential"] and not got["prefill_ratio_vs_reference"]
    assert check_targets({})["engine_utilization"] is False  # a missing figure is not a pass


def test_spread_and_sample():
    from mdd.synthesize.plan import Item
    from mdd.perf.phases import sample
    from mdd.perf.throughput import spread, summarise

    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert summarise([{"speedup_vs_sequential": 2.0}, {"speedup_vs_sequential": 4.0}]) == {
        "speedup_vs_sequential": {"min": 2.0, "median": 3.0, "max": 4.0, "n": 2}}
    items = [Item(f"c{i}", v) for i in range(10) for v in range(3)]
    picked = sample(items, 6, seed=1)
    assert picked == sample(items, 6, seed=1) != sample(items, 6, seed=2)  # seeded, stated in the JSON
    assert len(set(picked)) == 6 and set(picked) <= set(items)


def test_concurrent_set_defaults_to_at_least_128_in_flight():
    from jobs.benchmark import concurrent_set

    assert concurrent_set(27, 1, None, 1.5) == (128, 8)  # at least 128, even with fewer cases x variants
    assert concurrent_set(27, 1, None, 1.5)[1] * 27 >= 1.5 * 128  # 1.5 waves of them over the cases
    assert concurrent_set(100, 2, None, 1.0) == (200, 2)  # cases x variants when that is more
    assert concurrent_set(27, 1, 32, 2.0) == (32, 3)


def test_benchmark_runs_end_to_end_on_the_scripted_engine(tmp_path, ray_session):
    from jobs.benchmark import run

    cfg = load_config(REPO_CFG, {**CASES, "synth.variants": 1})
    out = tmp_path / "replay.json"
    res = run(cfg, out, sequential=4, in_flight=32, eval_embedders=[], waves=1.5, repeats=2, seed=7)
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["speedup_vs_sequential"] == res["speedup_vs_sequential"] > 0
    s = saved["set"]
    assert s["in_flight"] == 32
    # 1.5 waves of 32 over the cases: enough variants per case
    assert s["variants_per_case"] * s["cases"] == s["dialogues"] >= 48
    assert len(saved["repeats"]) == 2 and saved["set"]["sample_seeds"] == [7, 8]
    for rep in saved["repeats"]:
        assert rep["concurrent"]["dialogues"] == s["dialogues"] and rep["concurrent"]["failed"] == 0
        # the one-in-flight phase: a sample of the same set, two before the concurrent phase and two after
        assert rep["one_in_flight"]["dialogues"] == 4 and len(rep["sample"]) == 4
        assert len(rep["one_in_flight"]["dialogues_per_min_before_and_after"]) == 2
        assert all(int(d.rsplit("-v", 1)[1]) < s["variants_per_case"] for d in rep["sample"])
    assert saved["repeats"][0]["sample"] != saved["repeats"][1]["sample"]
    summ = saved["summary"]["speedup_vs_sequential"]
    assert summ["n"] == 2 and summ["min"] <= summ["median"] <= summ["max"]
    assert 2.0 <= saved["llm_calls_per_exchange"] <= 3.5
    assert set(saved["targets"]) == {"speedup_vs_sequential", "engine_utilization", "prefix_cache_hit_rate",
                                     "prefill_ratio_vs_reference", "llm_calls_per_exchange"}
    # vLLM-only figures are left out, not faked
    assert "engine_utilization" not in saved and "engine_ceiling" not in saved["summary"]
    assert saved["projection_h100"]["kind"].startswith("projection")
    assert "prefix_cache_hit_rate" in saved["sources"]
