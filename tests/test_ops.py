"""Each tool-agent operation on its own, with a fake LLM call."""
import json
import random

import pytest

from mdd.dialogue import ops
from mdd.dialogue.agenda import TopicAgenda
from mdd.engines.base import Completion, Message, Sampling
from mdd.tree import parse_node, rand_visit

TREE = {
    "id": "root", "topic": "精神状况",
    "children": [
        {"id": "event", "topic": "事件询问", "order": "fixed", "children": [
            {"id": "parents", "topic": "父母知情", "ask": "父母是否知道", "keywords": ["父母"], "case_fields": ["现病史"]},
            {"graft": "experience"},
            {"id": "study", "topic": "学习情况", "keywords": ["学习"], "case_fields": ["个人史.工作、学习情况"]},
        ]},
        {"id": "symptoms", "topic": "病情判断", "children": [
            {"id": f"s{i}", "topic": f"症状{i}", "keywords": [f"词{i}", f"语{i}"], "case_fields": ["现病史"],
             "probes": [{"id": f"p{i}", "topic": f"追问{i}", "if_answer": ["经常"], "keywords": ["多久"]}]}
            for i in range(6)
        ]},
        {"id": "family", "topic": "家族史", "keywords": ["家族"], "case_fields": ["家族史"]},
    ],
}


class FakeCall:
    """Answers with the queued texts and records every call."""

    def __init__(self, *answers: str):
        self.answers = list(answers)
        self.calls: list[tuple[str, str, list[Message], Sampling]] = []

    async def __call__(self, agent, op, messages, sampling, context):
        self.calls.append((agent, op, messages, sampling))
        text = self.answers.pop(0) if self.answers else ""
        return Completion(text=text, prompt_tokens=10, output_tokens=len(text))


def persona(**kw) -> ops.Persona:
    base = dict(id="p", surname="王", age=40, gender="女", speciality="抑郁", speed="normal", style="温和",
                empathy=True, explain="often")
    return ops.Persona(**{**base, **kw})


def test_derive_seed_is_stable_and_distinct():
    assert ops.derive_seed(1, "A", 0) == ops.derive_seed(1, "A", 0)
    seeds = {ops.derive_seed(1, c, v) for c in ("A", "B") for v in range(5)} | {ops.derive_seed(2, "A", 0)}
    assert len(seeds) == 11


def test_rand_visit_groups_fixed_leaves_shuffled_none_twice():
    root = parse_node(TREE, "t")
    orders = set()
    for seed in range(20):
        leaves = rand_visit(root, random.Random(seed))
        ids = [t.id for t in leaves]
        assert len(ids) == len(set(ids)) == 10
        # groups in their fixed order; the event group keeps its own order
        assert ids[:3] == ["parents", "graft_experience", "study"] and ids[-1] == "family"
        orders.add(tuple(ids[3:9]))
    assert len(orders) > 10


def test_agenda_graft_probe_and_removal():
    agenda = TopicAgenda(parse_node(TREE, "t"), random.Random(0))
    first = agenda.next()
    assert first.id == "parents"
    assert agenda.insert_next([parse_node({"id": "x", "topic": "经历"}, "t")])[0].id == "x"
    assert agenda.insert_next([parse_node({"id": "x", "topic": "经历"}, "t")]) == []  # never twice
    assert agenda.next().id == "x"
    gone = agenda.remove(["study", "family"])
    assert {t.id for t in gone} == {"study", "family"} and "family" not in [t.id for t in agenda.pending]


def test_open_probes_skip_logic():
    s0 = parse_node(TREE, "t").children[1].children[0]
    assert [p.id for p in ops.open_probes(s0, "我经常这样")] == ["p0"]
    assert ops.open_probes(s0, "没有") == []


def test_persona_caps_make_fast_dialogues_shorter():
    topic = parse_node({"id": "a", "topic": "睡眠", "max_exchanges": 2}, "t")
    assert persona(speed="fast").cap(topic, 3) == 1
    assert persona(speed="normal").cap(topic, 3) == 2
    assert persona(speed="slow").cap(topic, 3) == 3
    assert persona(speed="slow").cap(topic, 2) == 2


def test_choose_persona_variants_differ():
    ps = [persona(id=f"p{i}") for i in range(8)]
    chosen = [ops.choose_persona(ps, 7, "case", v).id for v in range(5)]
    assert len(set(chosen)) == 5
    assert chosen == [ops.choose_persona(ps, 7, "case", v).id for v in range(5)]


def test_empath_gen_only_for_empathic_personas():
    assert "难受" in ops.empath_gen(persona(), "我最近特别难受")
    assert ops.empath_gen(persona(empathy=False), "我最近特别难受") == ""


def test_prompt_gen_opening_topic_followup():
    p = persona(explain="never")
    assert "王" in ops.prompt_gen(p, None, followup=False, new_topic=False, empathy="")
    t = parse_node({"id": "a", "topic": "睡眠", "ask": "入睡困难"}, "t")
    new = ops.prompt_gen(p, t, followup=False, new_topic=True, empathy="")
    assert "睡眠" in new and "入睡困难" in new and "过渡" in new and "解释" not in new
    assert "追问" in ops.prompt_gen(p, t, followup=True, new_topic=False, empathy="")
    assert "解释" in ops.prompt_gen(persona(explain="often"), t, followup=False, new_topic=False, empathy="")


def test_is_dial_end():
    agenda = TopicAgenda(parse_node(TREE, "t"), random.Random(0))
    assert not ops.is_dial_end(agenda, 3, 60)
    assert ops.is_dial_end(agenda, 60, 60)
    gone = agenda.remove([t.id for t in list(agenda.pending)])
    assert [t.id for t in agenda.pending] == ["graft_experience"]  # required: DupDetect cannot remove it
    assert "graft_experience" not in {t.id for t in gone} and not ops.is_dial_end(agenda, 0, 60)
    agenda.next()
    assert ops.is_dial_end(agenda, 0, 60)


async def test_is_topic_end_cap_verdict_and_fallback():
    t = parse_node({"id": "a", "topic": "睡眠"}, "t")
    sp = Sampling(choice=("是", "否"), max_tokens=4)
    history = [Message("system", "s"), Message("user", "患者的回答")]
    call = FakeCall()
    assert await ops.is_topic_end(call, history, t, 2, 2, "x", sp, {}) and call.calls == []  # hard cap
    call = FakeCall("否")
    assert not await ops.is_topic_end(call, history, t, 1, 2, "x", sp, {})
    agent, op, msgs, sampling = call.calls[0]
    assert (agent, op) == ("tool", "IsTopicEnd") and sampling.choice == ("是", "否")
    assert msgs[:-1] == history[:-1] and msgs[-1].content.startswith("患者的回答")  # prefix kept, question last
    fb: dict = {}
    assert await ops.is_topic_end(FakeCall("maybe"), history, t, 1, 2, "没有。", sp, fb)
    assert fb == {"IsTopicEnd": 1}


async def test_dup_detect_one_structured_call_and_fallback():
    root = parse_node(TREE, "t")
    cands = list(root.children[1].children[:3])
    call = FakeCall(json.dumps({"covered": ["症状1", "不在列表"]}, ensure_ascii=False))
    assert await ops.dup_detect(call, [Message("user", "x")], cands, "", Sampling(), {}) == ["s1"]
    assert len(call.calls) == 1 and call.calls[0][3].json_schema["properties"]["covered"]["items"]["enum"] == [
        "症状0", "症状1", "症状2"]
    fb: dict = {}
    got = await ops.dup_detect(FakeCall('{"covered": '), [Message("user", "x")], cands, "我有词2也有语2", Sampling(), fb)
    assert got == ["s2"] and fb == {"DupDetect": 1}


async def test_parse_exp_grafts_points_or_falls_back():
    triple = ("两年前", "班主任", "当众贬低")
    call = FakeCall(json.dumps({"points": ["被班主任训斥", "之后害怕上学"]}, ensure_ascii=False))
    topics = await ops.parse_exp(call, [Message("user", "x")], triple, "故事", Sampling(), {}, group="event")
    assert [t.topic for t in topics] == ["被班主任训斥", "之后害怕上学"]
    assert all(t.kind == "experience" and t.group == "event" for t in topics)
    fb: dict = {}
    topics = await ops.parse_exp(FakeCall('{"points": ["   ", "!!"]}'), [Message("user", "x")], triple, "",
                                 Sampling(), fb, group="event")
    assert fb == {"ParseExp": 1} and "班主任当众贬低" in topics[0].topic


async def test_trigger_exp_only_in_the_event_branch():
    root = parse_node(TREE, "t")
    graft = root.children[0].children[1]
    symptom = root.children[1].children[0]
    sp = Sampling(choice=("是", "否"))
    call = FakeCall()
    assert await ops.trigger_exp(call, [], graft, sp, {}) is True
    assert await ops.trigger_exp(call, [], symptom, sp, {}) is False
    assert call.calls == []
    from dataclasses import replace

    event_leaf = replace(root.children[0].children[0], group="event")
    call = FakeCall("否")
    assert await ops.trigger_exp(call, [Message("user", "q")], event_leaf, sp, {}) is False
    assert call.calls[0][1] == "TriggerExp"
