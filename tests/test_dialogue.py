"""The dialogue state machine end to end on the scripted engine (and on a misbehaving one)."""
import asyncio
import re
import json
from pathlib import Path

import pytest

from mdd.cases import load_cases
from mdd.config import DialogueConfig, LayoutConfig
from mdd.dialogue import ops
from mdd.dialogue.loop import run_dialogue
from mdd.engines.base import Completion, EngineBase, Message, Request
from mdd.dialogue.dryrun.engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"
SEED = 11


@pytest.fixture(scope="module")
def pa20():
    cases, rejects = load_cases(PA20)
    assert not rejects
    return cases[0]


@pytest.fixture(scope="module")
def samples():
    return load_cases(ROOT / "data" / "cases")[0]


class Recording(EngineBase):
    """Wraps an engine and keeps every request."""

    def __init__(self, inner: EngineBase):
        self.inner, self.name, self.model = inner, inner.name, inner.model
        self.requests: list[Request] = []

    async def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        return await self.inner.generate(request)


class Garbage(ScriptedEngine):
    """Scripted speech, but every tool verdict is off-format."""

    async def generate(self, request: Request) -> Completion:
        if request.agent == "tool" and request.op != "FicExpGen":
            return Completion(text="嗯……不好说", prompt_tokens=5, output_tokens=3)
        return await super().generate(request)


def dialogue(case, variant, engine=None, cfg=DialogueConfig(), seed=SEED):
    personas = ops.all_personas()
    persona = ops.choose_persona(personas, seed, case.case_id, variant)
    triple = ops.sample_triples(case, seed, variant + 1)[variant]
    return asyncio.run(run_dialogue(case, variant, seed, engine or ScriptedEngine(), cfg, persona, triple))


def test_dialogue_shape_and_labels(pa20):
    row, acct = dialogue(pa20, 0)
    turns = row["turns"]
    assert row["n_turns"] >= 10 and row["engine"] == "scripted"
    assert [t["speaker"] for t in turns[:-1]] == ["doctor", "patient"] * row["n_exchanges"]
    last = turns[-1]
    # the closing is spoken: the diagnosis named and explained, no ICD code, no prescription text;
    # the labels stay exact in their columns
    assert last["speaker"] == "doctor" and pa20.diagnosis in last["text"]
    assert pa20.icd_code not in last["text"] and "50mg" not in last["text"] and "舍曲林" in last["text"]
    assert (row["diagnosis"], row["icd_code"], row["treatment"]) == (pa20.diagnosis, pa20.icd_code, pa20.treatment)
    assert row["topics"] and all(t["text"] for t in turns)
    assert row["llm_calls"] == sum(acct.calls.values())
    assert row["llm_calls"] / row["n_exchanges"] <= 3.0


def test_same_seed_same_dialogue(pa20):
    assert dialogue(pa20, 2)[0] == dialogue(pa20, 2)[0]
    assert dialogue(pa20, 2)[0]["turns"] != dialogue(pa20, 2, seed=SEED + 1)[0]["turns"]


def test_variants_differ_in_persona_experience_and_order(samples):
    for case in samples[:6]:
        rows = [dialogue(case, v)[0] for v in range(5)]
        assert len({r["doctor_persona"] for r in rows}) == 5
        assert len({r["experience"] for r in rows}) == 5
        assert len({tuple(r["topics"]) for r in rows}) == 5


def test_triples_fit_the_case(samples):
    for case in samples:
        situations = ops.life_situations(case)
        for time, people, event in ops.sample_triples(case, SEED, 5):
            assert time and people and event
        if case.age >= 60:
            assert "student" not in situations


def test_fast_personas_make_shorter_dialogues(samples):
    personas = {p.speed: p for p in ops.all_personas()}
    lengths = {}
    for speed in ("fast", "slow"):
        total = 0
        for case in samples[:8]:
            triple = ops.sample_triples(case, SEED, 1)[0]
            row, _ = asyncio.run(run_dialogue(case, 0, SEED, ScriptedEngine(), DialogueConfig(), personas[speed], triple))
            total += row["n_exchanges"]
        lengths[speed] = total
    assert lengths["fast"] < lengths["slow"]


@pytest.mark.parametrize("instruction", ["after", "before", "system"])
@pytest.mark.parametrize("labels", ["companion", "always"])
def test_prompts_are_append_only_per_agent(pa20, instruction, labels):
    eng = Recording(ScriptedEngine())
    row, _ = dialogue(pa20, 1, engine=eng, cfg=DialogueConfig(layout=LayoutConfig(instruction=instruction, labels=labels)))
    turns = {t["text"] for t in row["turns"]} | {"（患者走进诊室坐下）"}

    def spoken(text: str) -> bool:  # a turn of the dialogue (its speaker's label aside), not an instruction
        return re.sub(r"^(医生|患者)：", "", text) in turns
    for op, speaker in (("DocGen", "doctor"), ("PatGen", "patient")):
        calls = [r.messages for r in eng.requests if r.op == op and not r.context.get("attempt")]  # first attempts
        said = [t["text"] for t in row["turns"] if t["speaker"] == speaker]
        assert len(calls) > 5
        for i, (prev, nxt) in enumerate(zip(calls, calls[1:])):
            # the previous prompt, instruction included, then that call's own answer: a pure
            # extension, so the engine's prefix cache covers all of it, whatever the layout
            assert nxt[: len(prev) + 1] == (*prev, Message("assistant", said[i]))
            last = nxt[-1]
            if instruction == "system":  # its own message right before the reply
                assert last.role == "system" and nxt[-2].role == "user" and spoken(nxt[-2].content)
                assert not spoken(last.content)
            elif instruction == "before":  # the other side's words end the message
                head, _, tail = last.content.rpartition("\n\n")
                assert last.role == "user" and spoken(tail) and head and not spoken(head)
            else:
                head, _, tail = last.content.partition("\n\n")
                assert last.role == "user" and spoken(head) and tail and not spoken(tail)
        others = [m.content for m in calls[-1][1:] if m.role == "user" and "患者走进诊室" not in m.content]
        labelled = [bool(re.search(r"(^|\n)(医生|患者)：", m)) for m in others]
        assert (all(labelled) if labels == "always" else not any(labelled))  # pa20 came alone
    doctor_system = next(r.messages[0] for r in eng.requests if r.op == "DocGen")
    for r in eng.requests:
        if r.op in ("IsTopicEnd", "DupDetect", "ParseExp"):
            assert r.messages[0] == doctor_system  # verdicts reuse the doctor's cached prefix
            assert r.sampling.choice or r.sampling.json_schema


def test_bad_verdicts_fall_back_and_still_end(pa20):
    slow = next(p for p in ops.all_personas() if p.speed == "slow")
    triple = ops.sample_triples(pa20, SEED, 1)[0]
    row, acct = asyncio.run(run_dialogue(pa20, 0, SEED, Garbage(), DialogueConfig(), slow, triple))
    assert row["fallbacks"] > 0 and acct.fallbacks.get("IsTopicEnd", 0) > 0
    assert row["n_exchanges"] <= DialogueConfig().max_exchanges
    assert pa20.diagnosis in row["turns"][-1]["text"]


def test_dialogue_cap_is_hard(pa20):
    row, _ = dialogue(pa20, 0, cfg=DialogueConfig(max_exchanges=12))
    assert row["n_exchanges"] <= 12 and row["n_turns"] == row["n_exchanges"] + 1


def test_context_budget_ends_the_dialogue_early(pa20):
    full, _ = dialogue(pa20, 0)
    short, _ = dialogue(pa20, 0, cfg=DialogueConfig(max_context_tokens=2500))
    assert short["n_exchanges"] < full["n_exchanges"]
    assert pa20.diagnosis in short["turns"][-1]["text"]
