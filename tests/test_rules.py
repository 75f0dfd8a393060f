"""The multi-turn rule judge: ids, auto anchors, skips, caching, rule sets, the LLM judge."""
from __future__ import annotations

import asyncio
import glob
import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from mdd.engines.base import Completion
from mdd.evaluate.judges import KeywordJudge, LLMJudge, make_judge, parse_choice, parse_turn
from mdd.evaluate.rule_set import RuleError, load_rules, parse_rule_id, parse_rule_set
from mdd.evaluate.rule_view import DialogueView
from mdd.evaluate.rules import evaluate_rules
from mdd.schema import RULE_RESULT

MDD5K = Path(__file__).resolve().parents[2] / "shared" / "mdd5k" / "dialogues"  # ../shared beside the checkout


def dialogue(pairs, did="d0", **meta):
    """[(doctor, patient|None), ...] -> an evaluate_rules dialogue record."""
    turns = []
    for doc, pat in pairs:
        turns.append({"speaker": "doctor", "text": doc, "topic": None})
        if pat is not None:
            turns.append({"speaker": "patient", "text": pat, "topic": None})
    return {"dialogue_id": did, "turns": turns, "age": meta.get("age"), "gender": meta.get("gender"),
            "diagnosis": None, "icd_code": None}


def rules_from(rules, preconditions=None, name="t"):
    data = {"name": name, "rules": rules}
    if preconditions:
        data["preconditions"] = preconditions
    return parse_rule_set(data)


SELFHARM = {"text": "患者提到自杀", "speaker": "patient", "any": ["自杀"]}


def crit(*kw):
    return {"text": "医生做到某事", "speaker": "doctor", "any": list(kw)}


def by_rule(rows):
    return {r["rule"]: r for r in rows}


# --- ids and loading -----------------------------------------------------------------------


def test_parse_rule_id():
    assert parse_rule_id("multi_turn:N_th:ask:ask_wechat") == ("N_th", "ask", "ask_wechat")
    assert parse_rule_id("multi_turn:FIRST_N:conv:family_history") == ("FIRST_N", "conv", "family_history")
    for bad in ("multi_turn:Nth:ask:x", "multi_turn:N_th:talk:x", "single:N_th:ask:x", "multi_turn:N_th:ask:"):
        with pytest.raises(RuleError, match="rule"):
            parse_rule_id(bad)


def test_shipped_rule_sets_load():
    psy = load_rules("psychiatric")
    con = load_rules(["consultation"])
    assert len(psy) >= 8 and len({r.id for r in psy}) == len(psy)
    ids = {r.id for r in con}
    assert {"multi_turn:N_th:ask:ask_wechat", "multi_turn:N_th:ask:final_detainment",
            "multi_turn:FIRST_N:ask:ask_phone_early", "multi_turn:N_th:ask:no_repeat_after_refusal"} <= ids
    assert any(r.precondition and r.precondition.meta for r in psy)  # metadata preconditions
    assert any(not r.auto and r.mode == "FIRST_N" for r in psy)  # an int N
    fam = next(r for r in psy if r.name == "family_history")
    assert fam.n == 30 and fam.precondition is None
    wechat = next(r for r in con if r.name == "ask_wechat")
    assert wechat.auto and wechat.offset == 1 and wechat.role_labels["doctor"] == "咨询助手"


def test_auto_without_precondition_names_the_rule(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(
        'name: bad\nrules:\n  - id: "multi_turn:N_th:ask:lonely_auto"\n    n: auto\n'
        "    criterion: {text: 医生问候, speaker: doctor, any: [你好]}\n",
        encoding="utf-8",
    )
    with pytest.raises(RuleError, match=r"multi_turn:N_th:ask:lonely_auto.*precondition"):
        load_rules([p])


@pytest.mark.parametrize(
    "rule, field",
    [
        ({"id": "multi_turn:N_th:ask:x", "n": 1, "criterion": crit("a"), "bogus": 1}, "bogus"),
        ({"id": "multi_turn:N_th:ask:x", "n": {"value": "auto", "window": 2}, "precondition": SELFHARM,
          "criterion": crit("a")}, "n.window"),
        ({"id": "multi_turn:FIRST_N:ask:x", "n": "auto", "precondition": SELFHARM, "criterion": crit("a")},
         "n.window"),
        ({"id": "multi_turn:N_th:ask:x", "n": -1, "criterion": crit("a")}, ".n"),
        ({"id": "multi_turn:N_th:ask:x", "n": 1, "criterion": {"text": "无关键词"}}, "criterion"),
        ({"id": "multi_turn:N_th:ask:x", "n": 1, "criterion": {**crit("a"), "speaker": "nurse"}}, "criterion.speaker"),
        ({"id": "multi_turn:N_th:ask:x", "n": 1, "precondition": "nope", "criterion": crit("a")}, "precondition"),
    ],
)
def test_validation_errors_name_rule_and_field(rule, field):
    with pytest.raises(RuleError) as e:
        rules_from([rule])
    assert "multi_turn:N_th:ask:x" in str(e.value) or "multi_turn:FIRST_N:ask:x" in str(e.value)
    assert field in str(e.value)


def test_unknown_rule_set_name():
    with pytest.raises(RuleError, match="psychiatric"):
        load_rules("no_such_set")


# --- resolution ----------------------------------------------------------------------------

PAIRS = [
    ("你好，最近怎么样？", "还行。"),  # 0
    ("睡眠如何？", "不好，我有过自杀的想法。"),  # 1: anchor
    ("甲：这种想法出现多久了？", "几周了。"),  # 2
    ("乙：有没有具体的计划？", "没有。"),  # 3
    ("丙：家人知道吗？", "不知道。"),  # 4
]


@pytest.mark.parametrize("offset, turn, kw", [(0, 1, "睡眠"), (1, 2, "甲"), (2, 3, "乙")])
def test_auto_offsets(offset, turn, kw):
    rules = rules_from([
        {"id": "multi_turn:N_th:ask:hit", "n": {"value": "auto", "offset": offset}, "precondition": SELFHARM,
         "criterion": crit(kw)},
        # the same criterion keyword is absent at every other turn: judged at exactly that turn
        {"id": "multi_turn:N_th:ask:other", "n": {"value": "auto", "offset": offset}, "precondition": SELFHARM,
         "criterion": crit("丙")},
    ])
    rows = by_rule(evaluate_rules([dialogue(PAIRS)], rules))
    hit, other = rows["multi_turn:N_th:ask:hit"], rows["multi_turn:N_th:ask:other"]
    assert hit["triggered"] and hit["score"] == 1.0 and hit["n"] == turn
    kw_ = json.loads(hit["kwargs"])
    assert kw_["anchor"] == 1 and kw_["offset"] == offset and kw_["resolved_n"] == turn
    assert other["triggered"] and other["score"] == 0.0 and other["n"] == turn


def test_auto_default_offset_is_one():
    (r,) = rules_from([{"id": "multi_turn:N_th:ask:x", "n": "auto", "precondition": SELFHARM, "criterion": crit("甲")}])
    assert r.offset == 1
    (row,) = evaluate_rules([dialogue(PAIRS)], [r])
    assert row["n"] == 2 and row["score"] == 1.0


def test_first_n_window_after_anchor():
    rules = rules_from([
        {"id": "multi_turn:FIRST_N:ask:in_window", "n": {"value": "auto", "offset": 1, "window": 2},
         "precondition": SELFHARM, "criterion": crit("计划")},  # at turn 3 = anchor + 2
        {"id": "multi_turn:FIRST_N:ask:too_late", "n": {"value": "auto", "offset": 1, "window": 2},
         "precondition": SELFHARM, "criterion": crit("家人")},  # at turn 4: outside
        {"id": "multi_turn:FIRST_N:ask:int_n", "n": 2, "criterion": crit("睡眠")},
        {"id": "multi_turn:FIRST_N:conv:int_conv", "n": 3, "criterion": crit("多久")},
    ])
    rows = by_rule(evaluate_rules([dialogue(PAIRS)], rules))
    r = rows["multi_turn:FIRST_N:ask:in_window"]
    assert r["score"] == 1.0 and json.loads(r["kwargs"])["matched_turn"] == 3 and r["n"] == 3
    assert json.loads(r["kwargs"])["window"] == [2, 3]
    assert rows["multi_turn:FIRST_N:ask:too_late"]["score"] == 0.0
    assert rows["multi_turn:FIRST_N:ask:int_n"]["score"] == 1.0
    assert rows["multi_turn:FIRST_N:conv:int_conv"]["score"] == 1.0


def test_compound_precondition_across_turns():
    both = {"text": "患者先后提到失眠和食欲差", "speaker": "patient", "all": [["失眠"], ["胃口差"]]}
    pairs = [
        ("最近怎么样？", "我失眠很严重。"),  # 0: only the first part
        ("还有呢？", "也没什么。"),  # 1
        ("饮食呢？", "胃口差，吃不下。"),  # 2: both have appeared by now
        ("A这两种情况哪个先出现？", "失眠先。"),  # 3
    ]
    rules = rules_from([
        {"id": "multi_turn:N_th:ask:compound", "n": "auto", "precondition": both, "criterion": crit("A")},
        {"id": "multi_turn:N_th:ask:same_turn_only", "n": "auto",
         "precondition": {**both, "scope": "turn"}, "criterion": crit("A")},
    ])
    rows = by_rule(evaluate_rules([dialogue(pairs)], rules))
    r = rows["multi_turn:N_th:ask:compound"]
    assert json.loads(r["kwargs"])["anchor"] == 2 and r["n"] == 3 and r["score"] == 1.0
    # with scope: turn, both parts must come in one exchange: never here
    s = rows["multi_turn:N_th:ask:same_turn_only"]
    assert not s["triggered"] and s["score"] is None


def test_negated_mentions_do_not_trigger():
    pairs = [("有没有想过自杀？", "没有，我从来没有自杀的想法。"), ("好的，计划呢？", "没有。")]
    (r,) = evaluate_rules([dialogue(pairs)], rules_from([
        {"id": "multi_turn:N_th:ask:x", "n": "auto", "precondition": SELFHARM, "criterion": crit("计划")}]))
    assert not r["triggered"] and r["score"] is None


def test_precondition_never_met_is_skipped_not_passed(caplog):
    pairs = [("你好", "你好"), ("心情怎样？", "还可以。")]
    rules = rules_from([
        # a criterion that *would* pass at every turn: still never counted as passed
        {"id": "multi_turn:N_th:ask:x", "n": "auto", "precondition": SELFHARM, "criterion": crit("你", "心情")},
        {"id": "multi_turn:N_th:ask:int_with_pre", "n": 1, "precondition": SELFHARM, "criterion": crit("心情")},
    ])
    with caplog.at_level(logging.INFO, logger="mdd.evaluate.rules"):
        rows = evaluate_rules([dialogue(pairs)], rules)
    for r in rows:
        assert r["triggered"] is False and r["score"] is None
        assert "precondition" in r["reason"] and r["reason"]
    assert rows[0]["n"] is None
    # said once per rule at INFO (the stage's summary warns with the count over the run)
    assert any("skipped" in rec.message and rec.levelno == logging.INFO for rec in caplog.records)


def test_n_beyond_dialogue_is_skipped():
    pairs = [("你好", "你好"), ("睡眠？", "我想过自杀。")]  # anchor at the last exchange
    rules = rules_from([
        {"id": "multi_turn:N_th:ask:far", "n": 10, "criterion": crit("你好")},
        {"id": "multi_turn:N_th:ask:auto_far", "n": "auto", "precondition": SELFHARM, "criterion": crit("计划")},
        {"id": "multi_turn:FIRST_N:ask:auto_far_window", "n": {"value": "auto", "offset": 1, "window": 3},
         "precondition": SELFHARM, "criterion": crit("计划")},
    ])
    rows = by_rule(evaluate_rules([dialogue(pairs)], rules))
    far = rows["multi_turn:N_th:ask:far"]
    assert not far["triggered"] and far["score"] is None and "beyond" in far["reason"] and far["n"] == 10
    for rid in ("multi_turn:N_th:ask:auto_far", "multi_turn:FIRST_N:ask:auto_far_window"):
        r = rows[rid]
        assert not r["triggered"] and r["score"] is None and "beyond" in r["reason"] and r["n"] == 2


def test_final_doctor_only_turn_is_an_exchange():
    pairs = [("你好", "我想过自杀。"), ("综合来看，诊断为抑郁发作，建议药物治疗。", None)]
    view = DialogueView.from_record(dialogue(pairs))
    assert len(view) == 2 and view.exchanges[1].patient is None
    (r,) = evaluate_rules([dialogue(pairs)], rules_from([
        {"id": "multi_turn:N_th:ask:dx", "n": "auto", "precondition": SELFHARM, "criterion": crit("诊断")}]))
    assert r["n"] == 1 and r["score"] == 1.0


def test_metadata_preconditions():
    teen = {"text": "未成年患者或提到上学", "speaker": "patient", "meta": {"age_max": 18}, "combine": "any",
            "any": ["上学"]}
    female_and = {"text": "女性且提到月经", "speaker": "patient", "meta": {"gender": "女"}, "any": ["月经"]}
    rules = rules_from([
        {"id": "multi_turn:FIRST_N:ask:teen", "n": {"value": "auto", "offset": 1, "window": 3},
         "precondition": teen, "criterion": crit("父母")},
        {"id": "multi_turn:N_th:ask:fem", "n": {"value": "auto", "offset": 1},
         "precondition": female_and, "criterion": crit("周期")},
    ])
    pairs = [("你好", "你好"), ("最近怎样", "月经前特别烦。"), ("和周期有关吗？父母知道吗？", "不知道。")]
    young_f = by_rule(evaluate_rules([dialogue(pairs, age=15, gender="female")], rules))
    assert json.loads(young_f["multi_turn:FIRST_N:ask:teen"]["kwargs"])["anchor"] == 0  # metadata: from the start
    assert young_f["multi_turn:FIRST_N:ask:teen"]["score"] == 1.0
    assert young_f["multi_turn:N_th:ask:fem"]["score"] == 1.0 and young_f["multi_turn:N_th:ask:fem"]["n"] == 2
    adult_m = by_rule(evaluate_rules([dialogue(pairs, age=40, gender="男")], rules))
    assert adult_m["multi_turn:FIRST_N:ask:teen"]["score"] is None  # no school mention either
    assert adult_m["multi_turn:N_th:ask:fem"]["score"] is None  # gender test fails (combine: all)
    unknown = by_rule(evaluate_rules([dialogue(pairs)], rules))  # age/gender unknown: not satisfied
    assert unknown["multi_turn:FIRST_N:ask:teen"]["triggered"] is False


# --- caching -------------------------------------------------------------------------------


class SpyJudge(KeywordJudge):
    def __init__(self):
        super().__init__()
        self.anchor_log = []

    async def find_anchor(self, view, cond, rule):
        self.anchor_log.append((view.dialogue_id, cond.text))
        await asyncio.sleep(0)  # let concurrent rules race for the same precondition
        return await super().find_anchor(view, cond, rule)


def test_precondition_is_judged_once_per_dialogue():
    other = {"text": "患者提到失眠", "speaker": "patient", "any": ["失眠"]}
    rules = rules_from(
        [
            {"id": "multi_turn:N_th:ask:a", "n": "auto", "precondition": "selfharm", "criterion": crit("甲")},
            {"id": "multi_turn:N_th:ask:b", "n": {"value": "auto", "offset": 2}, "precondition": "selfharm",
             "criterion": crit("乙")},
            {"id": "multi_turn:FIRST_N:ask:c", "n": {"value": "auto", "offset": 0, "window": 3},
             "precondition": "selfharm", "criterion": crit("丙")},
            {"id": "multi_turn:N_th:ask:d", "n": "auto", "precondition": other, "criterion": crit("丙")},
            {"id": "multi_turn:N_th:ask:e", "n": 0, "criterion": crit("你好")},
        ],
        preconditions={"selfharm": SELFHARM},
    )
    spy = SpyJudge()
    dialogues = [dialogue(PAIRS, did=f"d{i}") for i in range(3)]
    rows = evaluate_rules(dialogues, rules, spy)
    assert len(rows) == 15
    assert sorted(spy.anchor_log) == sorted([(f"d{i}", t) for i in range(3) for t in ("患者提到自杀", "患者提到失眠")])
    # deterministic order: dialogue-major, rules in order
    assert [(r["dialogue_id"], r["rule"]) for r in rows] == [(d["dialogue_id"], r.id) for d in dialogues for r in rules]


# --- the consultation set ------------------------------------------------------------------


@pytest.fixture(scope="module")
def consultation():
    return load_rules("consultation")


GOOD_BOT = [
    ("您好，这里是安心诊所线上咨询，请问您想咨询什么问题？", "我最近总是失眠。"),
    ("了解了。方便留个电话吗？医生稍后联系您。", "电话不方便，不想留。"),
    ("没关系，那加个微信可以吗？微信上医生可以详细解答。", "微信也不方便。"),
    ("好的，理解您的顾虑。您可以随时关注我们的公众号，或直接预约到院面诊。", "好的，谢谢。"),
]
BAD_BOT = [
    ("您好，请问您想咨询什么问题？", "我最近总是失眠。"),
    ("方便留个电话吗？", "电话不方便，不想留。"),
    ("请留下您的电话号码，我们会尽快回电。", "我说了不留。"),
]


def test_consultation_good_bot_passes(consultation):
    rows = by_rule(evaluate_rules([dialogue(GOOD_BOT, "good")], consultation))
    for rid in ("multi_turn:N_th:ask:ask_wechat", "multi_turn:N_th:ask:no_repeat_after_refusal",
                "multi_turn:N_th:ask:final_detainment", "multi_turn:FIRST_N:ask:ask_phone_early",
                "multi_turn:FIRST_N:ask:ask_need_early"):
        assert rows[rid]["triggered"] and rows[rid]["score"] == 1.0, (rid, rows[rid]["reason"])
    assert rows["multi_turn:N_th:ask:ask_wechat"]["n"] == 2
    assert json.loads(rows["multi_turn:N_th:ask:final_detainment"]["kwargs"])["anchor"] == 2  # compound: both refused
    assert rows["multi_turn:N_th:ask:price_answered"]["triggered"] is False  # the user never asked the price


def test_consultation_bad_bot_fails(consultation):
    rows = by_rule(evaluate_rules([dialogue(BAD_BOT, "bad")], consultation))
    assert rows["multi_turn:N_th:ask:ask_wechat"]["score"] == 0.0
    assert rows["multi_turn:N_th:ask:no_repeat_after_refusal"]["score"] == 0.0
    ev = json.loads(rows["multi_turn:N_th:ask:no_repeat_after_refusal"]["kwargs"])["evidence"]
    assert ev["forbidden_found"]
    fin = rows["multi_turn:N_th:ask:final_detainment"]  # WeChat was never refused: not applicable
    assert fin["triggered"] is False and fin["score"] is None and fin["reason"]


# --- the psychiatric set on MDD-5k ---------------------------------------------------------


def _mdd5k_dialogues():
    out = []
    for f in sorted(glob.glob(str(MDD5K / "patient_*.json"))):
        for i, rec in enumerate(json.loads(Path(f).read_text(encoding="utf-8"))):
            pairs = [(t["doctor"], t.get("patient")) for t in rec["conversation"]]
            out.append(dialogue(pairs, did=f"{Path(f).stem}#{i}"))
    return out


def test_psychiatric_set_on_mdd5k():
    dialogues = _mdd5k_dialogues()
    assert len(dialogues) == 100
    rules = load_rules("psychiatric")
    rows = evaluate_rules(dialogues, rules, "keyword")
    assert len(rows) == 100 * len(rules)
    per = {}
    for r in rows:
        per.setdefault(r["dialogue_id"], []).append(r["rule"])
        if not r["triggered"]:
            assert r["score"] is None and r["reason"].strip()
        else:
            assert r["score"] in (0.0, 1.0) and r["n"] is not None
        json.loads(r["kwargs"])
    assert all(v == [x.id for x in rules] for v in per.values())
    triggered = {r["rule"] for r in rows if r["triggered"]}
    passed = {r["rule"] for r in rows if r["score"] == 1.0}
    assert len(triggered) >= 6 and len(passed) >= 6
    table = pa.Table.from_pylist(rows, schema=RULE_RESULT)  # rows fit the output schema
    assert table.num_rows == len(rows)


# --- the LLM judge -------------------------------------------------------------------------


class FakeEngine:
    """Answers from a script: a function of the request, recording what it was asked."""

    name = "fake"
    model = "fake"

    def __init__(self, answer):
        self.answer = answer
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def generate(self, request):
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        return Completion(text=self.answer(request), prompt_tokens=10, output_tokens=2)


def test_parsers():
    assert parse_turn('{"turn": 2}', 5) == 2
    assert parse_turn('```json\n{"turn": -1}\n```', 5) == -1
    assert parse_turn('答案：{"turn": "3"}', 5) == 3
    assert parse_turn('{"turn": 9}', 5) is None and parse_turn("不知道", 5) is None
    assert parse_turn('{"turn": true}', 5) is None
    assert parse_choice("是") is True and parse_choice("否。") is False and parse_choice("“是”") is True
    assert parse_choice("不是") is False and parse_choice("也许") is None and parse_choice("") is None


def test_llm_judge_structured_calls_and_fallbacks():
    def answer(req):
        did = req.session
        if req.sampling.json_schema is not None:
            assert req.op == "RulePrecondition" and req.agent == "judge"
            return {"d0": '{"turn": 1}', "d1": '{"turn": -1}', "d2": "第一轮吧"}[did]  # d2: malformed
        assert req.sampling.choice == ("是", "否") and req.op == "RuleCriterion"
        return {"d0": "是", "d1": "是", "d2": "嗯……"}[did]  # d2: malformed again

    engine = FakeEngine(answer)
    judge = make_judge("llm", engine, concurrency=2)
    assert isinstance(judge, LLMJudge)
    rules = rules_from([
        {"id": "multi_turn:N_th:ask:a", "n": "auto", "precondition": SELFHARM, "criterion": crit("甲")},
        {"id": "multi_turn:FIRST_N:ask:b", "n": {"value": "auto", "offset": 1, "window": 2},
         "precondition": SELFHARM, "criterion": crit("不存在的关键词")},
        {"id": "multi_turn:FIRST_N:ask:c", "n": 3, "criterion": crit("你好")},
    ])
    dialogues = [dialogue(PAIRS, did=f"d{i}") for i in range(3)]
    rows = evaluate_rules(dialogues, rules, judge)
    got = {(r["dialogue_id"], r["rule"].rsplit(":", 1)[1]): r for r in rows}
    # d0: the LLM anchors at 1 and says yes
    assert got["d0", "a"]["n"] == 2 and got["d0", "a"]["score"] == 1.0
    assert got["d0", "b"]["score"] == 1.0  # the LLM said yes (keywords would have failed)
    assert json.loads(got["d0", "a"]["kwargs"])["evidence"]["judge"] == "llm"
    # d1: the LLM says the precondition is never met -> skipped, never passed
    assert got["d1", "a"]["triggered"] is False and got["d1", "a"]["score"] is None
    assert got["d1", "c"]["score"] == 1.0
    # d2: malformed anchor -> keyword anchor (turn 1); malformed verdicts -> keyword verdicts
    assert json.loads(got["d2", "a"]["kwargs"])["precondition_evidence"]["judge"] == "keyword-fallback"
    assert got["d2", "a"]["score"] == 1.0  # 甲 is asked at turn 2
    assert got["d2", "b"]["score"] == 0.0  # the keyword is absent
    assert got["d2", "c"]["score"] == 1.0  # 你好 at turn 0
    assert judge.fallbacks == 4  # 1 anchor + 3 verdicts of d2
    # one anchor call per dialogue x precondition, one verdict per triggered rule
    anchor_calls = [r for r in engine.requests if r.sampling.json_schema is not None]
    assert len(anchor_calls) == 3
    assert len(engine.requests) == 3 + 3 + 1 + 3  # anchors; d0: a b c; d1: c; d2: a b c
    assert engine.max_in_flight <= 2
    assert judge.stats()["calls"] == len(engine.requests)
    schema = anchor_calls[0].sampling.json_schema
    assert schema["properties"]["turn"]["maximum"] == len(PAIRS) - 1
    assert "累积" in anchor_calls[0].messages[-1].content  # the Chinese prompt reads cumulatively


def test_llm_judge_launches_engine_lazily(monkeypatch):
    import mdd.engines.base as base

    launched = []
    engine = FakeEngine(lambda req: '{"turn": -1}' if req.sampling.json_schema else "否")

    def fake_launch(cfg):
        launched.append(cfg)
        return engine

    monkeypatch.setattr(base, "launch_engine", fake_launch)
    judge = make_judge("llm", engine_cfg={"name": "scripted"})
    assert launched == []
    (r,) = evaluate_rules([dialogue(PAIRS)], rules_from([{"id": "multi_turn:N_th:ask:x", "n": 0, "criterion": crit("你好")}]), judge)
    assert launched and r["score"] == 0.0


async def test_evaluate_rules_inside_a_running_loop():
    (r,) = evaluate_rules([dialogue(PAIRS)], rules_from([{"id": "multi_turn:N_th:ask:x", "n": 0, "criterion": crit("你好")}]))
    assert r["score"] == 1.0


def test_make_judge_unknown():
    with pytest.raises(ValueError, match="keyword"):
        make_judge("oracle")


def test_llm_judge_context_carries_keyword_answer():
    # an engine that echoes the keyword answer gives the keyword judge's results
    engine = FakeEngine(lambda req: req.context["keyword_answer"])
    rules = load_rules("consultation")
    dialogues = [dialogue(GOOD_BOT, "good"), dialogue(BAD_BOT, "bad")]
    llm = evaluate_rules(dialogues, rules, LLMJudge(engine=engine))
    kw = evaluate_rules(dialogues, rules, KeywordJudge())
    strip = lambda rows: [(r["dialogue_id"], r["rule"], r["n"], r["triggered"], r["score"]) for r in rows]  # noqa: E731
    assert strip(llm) == strip(kw)
    assert all(r.context["rule"] and r.session in ("good", "bad") for r in engine.requests)
