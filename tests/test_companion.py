"""A third speaker: who a topic's question goes to (``audience``)."""
import pytest

import json
import random
from pathlib import Path

from mdd import knowledge
from mdd.tree import for_audience, parse_node, rand_visit

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
    from mdd.record import exchanges

    ex = exchanges(THREE)
    assert [(e.question_text[:4], e.answer_text[:4]) for e in ex] == [("你好，这", "还好吧。"), ("妈妈，您", "大概半年"),
                                                                      ("你自己觉", "不太好。")]
    two = [t for t in THREE if t["speaker"] != "companion"]  # two-speaker data reads as before
    assert len(exchanges(two)) == 2


def test_rules_see_the_companion_and_can_test_its_presence():
    from mdd.evaluate.rule_set import parse_rule_set
    from mdd.evaluate.rule_view import DialogueView
    from mdd.evaluate.rules import evaluate_rules

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
    from mdd.evaluate.rule_set import parse_rule_set
    from mdd.evaluate.rules import evaluate_rules

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


# --- who comes along, and what they say ------------------------------------------------------

import asyncio
from collections import Counter
from pathlib import Path

from mdd.cases import load_cases
from mdd.config import CompanionConfig, DialogueConfig
from mdd.dialogue import ops
from mdd.dialogue.companion import CompanionRole, choose_companion
from mdd.dialogue.loop import run_dialogue
from mdd.engines.base import Message
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.record.speech import leak_pattern

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def samples():
    return {c.case_id: c for c in load_cases(ROOT / "data" / "cases")[0]}


def test_who_comes_along_fits_the_case(samples):
    cfg = CompanionConfig()
    for cid, case in samples.items():
        love = case.section("个人史", "婚恋情况")
        seen = Counter(getattr(choose_companion(case, s, cfg), "relation", None) for s in range(40))
        if case.age <= cfg.minor_age:
            assert None not in seen and set(seen) <= {"母亲", "父亲"}, (cid, seen)
        if "未婚" in love or "丧偶" in love or "离异" in love:
            assert not {"丈夫", "妻子"} & set(seen), (cid, love, seen)
        if not any(w in love for w in ("子", "女")):
            assert not {"儿子", "女儿"} & set(seen), (cid, love, seen)
        if case.age >= 60:
            assert not {"母亲", "父亲"} & set(seen), (cid, seen)
        if case.age > cfg.minor_age and case.age < 60 and "陪同" not in case.present_illness \
                and not _psychotic(case) and "重度" not in case.diagnosis:
            assert set(seen) == {None}, (cid, seen)  # an ordinary adult comes alone
    # the record decides when it says who came: 由母亲陪同 / 由儿子、女儿陪同
    assert {choose_companion(samples["S01"], s, cfg).relation for s in range(10)} == {"母亲"}
    assert {choose_companion(samples["S27"], s, cfg).relation for s in range(20)} == {"儿子", "女儿"}
    # a minor living with the mother after a divorce comes with her
    assert {choose_companion(samples["S02"], s, cfg).relation for s in range(10)} == {"母亲"}
    assert choose_companion(samples["S01"], 1, CompanionConfig(enabled=False)) is None


def _psychotic(case):
    from mdd.dialogue.patient import Cues

    return Cues.of(case).psychosis


def test_the_companion_prompt_is_lay_and_only_a_parent_knows_the_early_years(samples):
    cfg = CompanionConfig()
    mother = CompanionRole(samples["S01"], choose_companion(samples["S01"], 1, cfg), cfg, 1)
    prompt = mother.system_prompt()
    assert not leak_pattern().search(prompt), leak_pattern().findall(prompt)
    assert "出生和小时候：足月剖宫产" in prompt and "被我发现伤痕" in prompt  # the record's 母亲 is 我
    son = CompanionRole(samples["S27"], choose_companion(samples["S27"], 0, cfg), cfg, 1)
    assert "出生和小时候" not in son.system_prompt() and not leak_pattern().search(son.system)
    dev = next(t for t in rand_visit(for_audience(build(samples["S01"]), True), random.Random(0))
               if t.id == "dev_history")  # the development module's question (modules/development.yaml)
    assert mother.knows(dev) and not son.knows(dev)


def build(case):
    from mdd.tree import build_tree

    return build_tree(case)


def test_main_job_companions(sample_run):
    """README: companion turns in every minor's dialogue and in few others; the doctor asks them for
    collateral history; they interject and the doctor checks with the patient; at most 3 LLM calls
    per exchange in their dialogues too."""
    rows = sample_run["rows"]
    # the tables hold the age in tens (issue 24); who is a minor is decided on the exact age of the case
    exact = {c["患者"]: c["年龄"] for c in json.loads((Path(__file__).resolve().parents[1] / "data/cases/sample_cases.json")
                                                    .read_text(encoding="utf-8"))}
    assert all(r["age"] % 10 == 0 for r in rows)
    minors = [r for r in rows if exact[r["case_id"]] <= 17]
    adults = [r for r in rows if exact[r["case_id"]] > 17]
    assert minors and all(any(t["speaker"] == "companion" for t in r["turns"]) and r["companion"] for r in minors)
    with_companion = [r for r in adults if any(t["speaker"] == "companion" for t in r["turns"])]
    assert len(with_companion) / len(adults) <= 0.25
    assert all(r["companion"] for r in with_companion) and all(
        r["companion"] is None for r in adults if r not in with_companion)
    asked = interjected = checked = 0
    for r in [r for r in rows if r["companion"]]:
        t = r["turns"]
        asked += any(a["speaker"] == "doctor" and b["speaker"] == "companion" and "collateral" not in a["topic"]
                     for a, b in zip(t, t[1:])) or any(a["topic"] in ("家人看到的起病与变化", "家中安全与看护")
                                                       and a["speaker"] == "companion" for a in t)
        for a, b, c in zip(t, t[1:], t[2:]):
            if a["speaker"] == "patient" and b["speaker"] == "companion":
                interjected += 1
                checked += c["speaker"] == "doctor" and c["topic"] == b["topic"]
        # every exchange: a doctor question answered by the patient or the companion
        assert r["n_exchanges"] == sum(1 for a, b in zip(t, t[1:]) if a["speaker"] == "doctor"
                                       and b["speaker"] in ("patient", "companion"))
    accompanied = [r for r in rows if r["companion"]]
    n = len(accompanied)
    # the interjections take the place of topic-end verdicts: no more calls per exchange than the run's bar
    assert sum(r["llm_calls"] for r in accompanied) / sum(r["n_exchanges"] for r in accompanied) <= 3.0
    assert asked == n and interjected >= n // 2 and checked / max(interjected, 1) > 0.8, (asked, interjected, checked)
    assert all(not leak_pattern().search(t["text"]) for r in rows for t in r["turns"] if t["speaker"] == "companion")
    # the rule judge tests the companion's presence: every accompanied dialogue is judged, no other
    from mdd.evaluate.rule_set import load_rules
    from mdd.evaluate.rules import evaluate_rules

    rule = [r for r in load_rules("psychiatric") if r.name == "collateral_history_when_accompanied"]
    got = {x["dialogue_id"]: (x["triggered"], x["score"]) for x in evaluate_rules(rows, rule)}
    assert {got[r["dialogue_id"]] for r in accompanied} == {(True, 1.0)}
    assert {got[r["dialogue_id"]] for r in rows if not r["companion"]} == {(False, None)}


def test_three_speaker_views_are_append_only(samples):
    """A minor's dialogue: the doctor's, the patient's and the companion's prompts each extend that
    agent's previous prompt and its own answer (the prefix cache covers them)."""
    from tests.test_patient import Recording

    case = samples["S01"]
    eng = Recording(ScriptedEngine())
    # a seed whose companion speaks often enough (it cuts in only with something the family saw happen)
    persona = ops.choose_persona(ops.all_personas(), 8, case.case_id, 0)
    row, acct = asyncio.run(run_dialogue(case, 0, 8, eng, DialogueConfig(), persona, ops.sample_triples(case, 8, 1)[0]))
    assert row["companion"] == "母亲" and acct.calls["companion"] > 2
    for op, speaker in (("DocGen", "doctor"), ("PatGen", "patient"), ("CompanionGen", "companion")):
        calls = [r.messages for r in eng.requests if r.op == op]
        said = [t["text"] for t in row["turns"] if t["speaker"] == speaker]
        assert len(calls) == len(said) - (speaker == "doctor")  # the closing is no call
        for i, (prev, nxt) in enumerate(zip(calls, calls[1:])):
            assert nxt[: len(prev) + 1] == (*prev, Message("assistant", said[i]))
    companion_calls = [r.messages for r in eng.requests if r.op == "CompanionGen"]
    assert "母亲" not in companion_calls[0][0].content.split("\n")[0][:3]  # its own system prompt
    assert companion_calls[0][0].content.startswith("你是一位母亲")
    assert "医生：" in companion_calls[0][1].content and "女儿：" in companion_calls[0][1].content
