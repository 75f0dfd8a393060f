"""A third speaker: who a topic's question goes to (``audience``)."""
import pytest

from mdd import knowledge
from mdd.tree import for_audience, parse_node, rand_visit

import random

GROUP = {
    "id": "root", "topic": "根", "order": "fixed", "children": [
        {"id": "g", "topic": "组", "children": [
            {"id": "p", "topic": "患者话题"},
            {"id": "c", "topic": "家属话题", "audience": "companion",
             "probes": [{"id": "cp", "topic": "家属追问", "if_answer": ["是"]}]},
            {"id": "e", "topic": "谁都行", "audience": "either"},
        ]},
        {"id": "home", "topic": "家属组", "audience": "companion", "children": [
            {"id": "h1", "topic": "在家看到的"}, {"id": "h2", "topic": "看护", "audience": "either"}]},
    ],
}


def _ids(root):
    return {t.id: t.audience for t in rand_visit(root, random.Random(0))}


def test_audience_is_parsed_and_inherited():
    root = parse_node(GROUP, "t")
    assert _ids(root) == {"p": "patient", "c": "companion", "e": "either", "h1": "companion", "h2": "either"}
    probe = next(t for t in root.children[0].children if t.id == "c").probes[0]
    assert probe.audience == "companion"  # probes inherit their topic's audience


def test_companion_topics_are_dropped_when_the_patient_came_alone():
    root = parse_node(GROUP, "t")
    assert set(_ids(for_audience(root, companion_present=True))) == {"p", "c", "e", "h1", "h2"}
    # alone: companion-only topics go; `either` ones stay (asked of the patient), also inside a
    # companion group (a topic's own audience decides)
    assert set(_ids(for_audience(root, companion_present=False))) == {"p", "e", "h2"}


def test_bad_audience_is_a_clear_error():
    with pytest.raises(knowledge.KnowledgeError, match=r"t/x: audience must be one of"):
        parse_node({"id": "x", "topic": "话题", "audience": "nurse"}, "t")


# --- the evaluator and the rule judge read a third speaker -----------------------------------

THREE = [
    {"speaker": "doctor", "text": "你好，这次来主要是哪里不舒服？", "topic": "开场"},
    {"speaker": "patient", "text": "还好吧。", "topic": "开场"},
    {"speaker": "companion", "text": "医生，她其实半夜经常哭，还用小刀划过手。", "topic": "开场"},
    {"speaker": "doctor", "text": "妈妈，您在家里最早是什么时候发现她不对劲的？", "topic": "家人看到的变化"},
    {"speaker": "companion", "text": "大概半年前，她回家就关在房间里。", "topic": "家人看到的变化"},
    {"speaker": "doctor", "text": "你自己觉得呢？最近心情怎么样？", "topic": "情绪"},
    {"speaker": "patient", "text": "不太好。", "topic": "情绪"},
    {"speaker": "doctor", "text": "诊断结束。", "topic": "诊断结果"},
]


def test_exchanges_pair_doctor_turns_with_the_patient_or_the_companion():
    from mdd.evaluate.stage import exchanges_of

    ex = exchanges_of(THREE)
    assert [(q[:4], a[:4]) for _, _, q, a in ex] == [("你好，这", "还好吧。"), ("妈妈，您", "大概半年"),
                                                    ("你自己觉", "不太好。")]
    two = [t for t in THREE if t["speaker"] != "companion"]  # two-speaker data reads as before
    assert len(exchanges_of(two)) == 2


def test_rules_see_the_companion_and_can_test_its_presence():
    from mdd.evaluate.rules import DialogueView, evaluate_rules, parse_rule_set

    view = DialogueView.from_record({"dialogue_id": "d", "turns": THREE, "companion": "母亲"})
    assert view.text(0, "companion").startswith("医生，她其实") and view.text(0, "patient") == "还好吧。"
    assert view.text(1, "patient") == "" and "半年前" in view.text(1, "companion")
    assert "小刀" in view.text(0, "any") and view.companion == "母亲"
    rules = parse_rule_set({
        "name": "t",
        "preconditions": {"accompanied": {"text": "有家属陪同", "meta": {"companion": True}}},
        "rules": [
            {"id": "multi_turn:FIRST_N:conv:collateral", "n": {"value": "auto", "offset": 0, "window": 3},
             "precondition": "accompanied",
             "criterion": {"text": "家属讲了在家看到的情况", "speaker": "companion", "any": ["半年前"]}},
            {"id": "multi_turn:FIRST_N:conv:selfharm_heard", "n": 2,
             "criterion": {"text": "有人提到自伤", "speaker": "companion", "any": ["小刀"]}},
        ]})
    got = {(r["dialogue_id"], r["rule"].split(":")[-1]): (r["triggered"], r["score"]) for r in evaluate_rules(
        [{"dialogue_id": "with", "turns": THREE, "companion": "母亲"},
         {"dialogue_id": "alone", "turns": [t for t in THREE if t["speaker"] != "companion"]}], rules)}
    assert got[("with", "collateral")] == (True, 1.0)
    assert got[("alone", "collateral")] == (False, None)  # nobody came along: the rule does not apply
    assert got[("with", "selfharm_heard")] == (True, 1.0) and got[("alone", "selfharm_heard")] == (True, 0.0)
    with pytest.raises(Exception, match="meta.companion: expected true or false"):
        parse_rule_set({"name": "t", "preconditions": {"x": {"text": "x", "meta": {"companion": "yes"}}},
                        "rules": [{"id": "multi_turn:N_th:ask:x", "n": 0, "precondition": "x",
                                   "criterion": {"text": "x", "any": ["x"]}}]})


def test_the_llm_judge_shows_the_companion_lines():
    from mdd.engines.base import Completion
    from mdd.evaluate.judges import LLMJudge
    from mdd.evaluate.rules import evaluate_rules, parse_rule_set

    prompts = []

    class Echo:
        name = model = "echo"

        async def generate(self, request):
            prompts.append(request.messages[-1].content)
            return Completion(text="是", prompt_tokens=1, output_tokens=1)

    rules = parse_rule_set({"name": "t", "rules": [
        {"id": "multi_turn:FIRST_N:conv:x", "n": 3, "criterion": {"text": "家属说了", "speaker": "companion",
                                                                  "any": ["半年"]}}]})
    rows = evaluate_rules([{"dialogue_id": "d", "turns": THREE, "companion": "母亲"}], rules, LLMJudge(engine=Echo()))
    assert rows[0]["score"] == 1.0
    assert "家属：医生，她其实半夜经常哭" in prompts[0] and "患者：还好吧。" in prompts[0]
    assert "家属的发言" in prompts[0]  # the criterion names whose words are judged
