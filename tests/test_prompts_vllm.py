"""What the agents are shown on the real engine path: the requests of whole dialogues recorded on
the vLLM CPU engine (the session's one engine, tiny model: its text is noise, the prompts are real)
and rendered with the model's chat template. A real case (pa20) and a minor with a parent."""
import asyncio
import random
import re
from pathlib import Path

import pytest

from mdd.cases import load_cases
from mdd.config import CompanionConfig, DialogueConfig, GuardConfig
from mdd.dialogue import ops
from mdd.dialogue.loop import run_dialogue
from mdd.record.speech import leak_pattern
from mdd.perf.replay import Recording
from mdd.tree import build_tree, for_audience, rand_visit
from mdd.dialogue.prompts import LENGTHS

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"
BUDGET = re.compile("|".join(words for _, words in LENGTHS))  # the answer's length, said in words
STORY = re.compile(r"(你过去的一段经历（[^）]*）：).*?(?=(今天是你的\S{1,6}陪你来的|你说话的样子：))", re.S)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def recorded(vllm_engine):
    real = load_cases(PA20)[0][0]
    minor = next(c for c in load_cases(ROOT / "data" / "cases")[0] if c.case_id == "S01")
    rec = Recording(vllm_engine)
    # short dialogues; the parent speaks up right after the opening (its prompt is then certain to be
    # recorded even when the short agenda never reaches the collateral topics)
    # random weights: every guard would reject the noise (configs/local-vllm.yaml runs them unguarded too)
    cfg = DialogueConfig(max_exchanges=12, companion=CompanionConfig(p_interject=1.0), guards=GuardConfig(enabled=()))

    async def both():
        runs = []
        for case in (real, minor):
            persona = ops.choose_persona(ops.all_personas(), 1, case.case_id, 0)
            runs.append(run_dialogue(case, 0, 1, rec, cfg, persona, ops.sample_triples(case, 1, 1)[0]))
        return await asyncio.gather(*runs)

    rows = [row for row, _ in asyncio.run(both())]
    return {"rows": {r["case_id"]: r for r in rows}, "calls": rec.calls, "cases": {"1": real, "S01": minor}}


def _authored(messages):
    """The parts of a prompt the project wrote: the system prompt and the call's instruction (after the
    other side's words and a blank line; an instruction holds no blank line). Every earlier turn's
    instruction was the instruction of an earlier recorded call."""
    head, sep, tail = messages[-1].content.rpartition("\n\n")
    return [messages[0].content] + ([tail] if sep else [])


def test_the_patient_is_shown_no_record_fields_or_exam_terms(recorded, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir / "tokenizer"))
    for cid, case in recorded["cases"].items():
        calls = recorded["calls"][f"{cid}-v0"]
        system = next(req.messages[0].content for req, _ in calls if req.op == "PatGen")
        patient = [req for req, _ in calls if req.messages[0].content == system]  # PatGen and TriggerExp
        assert len(patient) > 10
        labels = {t.topic for t in rand_visit(for_audience(build_tree(case), True), random.Random(0))
                  if len(t.topic) >= 4}
        for req in patient:
            rendered = tok.apply_chat_template([{"role": m.role, "content": m.content} for m in req.messages],
                                               tokenize=False, add_generation_prompt=True)
            for part in _authored(req.messages):
                assert part in rendered  # what we check is what the model reads
                # the experience story is the model's own words, not ours: the tiny model's random
                # tokens include the knowledge's words (its vocabulary has them), e.g. 担心与紧张
                part = STORY.sub(r"\1", part)
                assert not leak_pattern().search(part), (cid, req.op, leak_pattern().findall(part))
                assert not any(label in part for label in labels), (cid, [lb for lb in labels if lb in part])
            if req.op == "PatGen":
                assert BUDGET.search(req.messages[-1].content)  # the style's budget, every turn
        # the raw record would fail the same check: it is what the system prompt used to paste
        assert leak_pattern().search(case.get("精神检查"))
    assert "被诊断为" in recorded["cases"]["1"].present_illness


def test_a_minor_comes_with_a_parent_who_has_its_own_prompt(recorded):
    calls = recorded["calls"]["S01-v0"]
    row = recorded["rows"]["S01"]
    companion = [req for req, _ in calls if req.agent == "companion"]
    assert row["companion"] == "母亲" and companion
    assert {req.messages[0].content for req in companion} == {companion[0].messages[0].content}  # one cached prefix
    assert companion[0].messages[0].content.startswith("你是一位母亲")
    assert not any(leak_pattern().search(p) for req in companion for p in _authored(req.messages))
    doctor_system = next(req.messages[0].content for req, _ in calls if req.op == "DocGen")
    assert "由母亲陪同" in doctor_system
    assert sum(t["speaker"] == "companion" for t in row["turns"]) == len(companion)
    # the real adult case came alone
    assert recorded["rows"]["1"]["companion"] is None
    assert not [req for req, _ in recorded["calls"]["1-v0"] if req.agent == "companion"]


def test_closing_is_spoken_on_the_engine_path(recorded):
    from mdd.dialogue.closing import PRESCRIPTION

    for row in recorded["rows"].values():
        assert not PRESCRIPTION.search(row["turns"][-1]["text"]) and row["diagnosis"] in row["turns"][-1]["text"]
