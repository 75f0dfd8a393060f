"""The patient agent: lay prompts, speech styles sampled from the case, budgets, withholding and
re-asking, opening up after empathy; and the README main job's patient figures."""
import asyncio
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from mdd.cases import load_cases
from mdd.config import DialogueConfig
from mdd.dialogue import ops
from mdd.dialogue.loop import run_dialogue
from mdd.dialogue.patient import (PatientRole, budget_factor, choose_style, evasive, is_yes_no, style_book,
                                  style_weights)
from mdd.engines.base import Completion, EngineBase, Request
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.record.speech import leak_pattern, length_stats
from mdd.tree import build_tree, rand_visit
from mdd.dialogue.prompts import LENGTHS

import random

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"
BUDGET = re.compile("|".join(words for _, words in LENGTHS))  # the answer's length, said in words


class Recording(EngineBase):
    def __init__(self, inner: EngineBase):
        self.inner, self.name, self.model = inner, inner.name, inner.model
        self.requests: list[Request] = []

    async def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        return await self.inner.generate(request)


@pytest.fixture(scope="module")
def samples():
    return {c.case_id: c for c in load_cases(ROOT / "data" / "cases")[0]}


def _instructions(messages) -> list[str]:
    """The parts of an agent's messages that we wrote: the system prompt and each turn's instruction
    (what follows the last blank line before 【); generated turns are the models' own words."""
    out = [messages[0].content]
    for m in messages[1:]:
        head, sep, tail = m.content.rpartition("\n\n【")
        if sep:
            out.append("【" + tail)
        elif m.content.startswith("【"):
            out.append(m.content)
    return out


def test_styles_follow_the_case(samples):
    book = style_book()
    psychotic = {"S15", "S27"}  # paranoid schizophrenia; severe depression with psychotic features
    for cid, case in samples.items():
        w = style_weights(case)
        for sid in ("disorganised", "poor_insight"):
            assert (w[sid] > 0) == (cid in psychotic), (cid, sid)
        if "思维迟缓" in case.get("精神检查"):  # slowed thinking: never rambling, shorter budgets
            assert w["rambling"] == 0 and budget_factor(case) < 1
            assert w["terse"] > book.styles["terse"].weight
    # a teen with tears in the exam leans tearful; an elderly patient leans poor recall
    assert style_weights(samples["S01"])["tearful"] > book.styles["tearful"].weight
    assert style_weights(samples["S24"])["poor_recall"] >= 4 * book.styles["poor_recall"].weight
    # seeded: the same dialogue seed gives the same style
    assert choose_style(samples["S08"], 7) == choose_style(samples["S08"], 7)


def test_yes_no_and_evasive_known_answers():
    assert is_yes_no("最近有没有想过伤害自己？") and is_yes_no("睡得好吗？")
    assert not is_yes_no("有没有想过伤害自己？具体是什么时候？") and not is_yes_no("最近心情怎么样？")
    assert evasive("还好吧。") and evasive("嗯……不记得了") and not evasive("还好吧，就是晚上睡不着，一躺下脑子就停不下来。")


def test_patient_prompts_are_lay_with_a_budget_on_every_turn(samples):
    """Everything we write to the patient agent, for every sample case and style: no record field
    names, no exam or diagnosis terms, no topic's clinical label; each turn names its budget."""
    real = load_cases(PA20)[0]
    for case in list(samples.values()) + real:
        for v in range(2):
            eng = Recording(ScriptedEngine())
            persona = ops.choose_persona(ops.all_personas(), 3, case.case_id, v)
            triple = ops.sample_triples(case, 3, v + 1)[v]
            row, _ = asyncio.run(run_dialogue(case, v, 3, eng, DialogueConfig(), persona, triple))
            pat = [r for r in eng.requests if r.agent == "patient"]
            labels = {t.topic for t in rand_visit(build_tree(case), random.Random(0)) if len(t.topic) >= 4}
            for r in pat:
                for text in _instructions(r.messages):
                    assert not leak_pattern().search(text), (case.case_id, leak_pattern().findall(text), text[:80])
                    assert not any(label in text for label in labels), text
                assert BUDGET.search(r.messages[-1].content), r.messages[-1].content[-80:]
            assert row["jargon_turns"] == 0 and row["patient_style"] in style_book().styles


def test_a_guarded_patient_denies_then_admits_when_asked_again(samples):
    case = samples["S11"]  # drinks to fall asleep, with thoughts of death
    book = style_book()
    role = PatientRole(case, book.styles["guarded"], seed=1)
    visit = rand_visit(build_tree(case), random.Random(0))
    topic = next(t for t in visit if t.id == "substance_use")
    first, ctx1 = role.turn(topic, "平时喝酒吗？", followup=False, empathy=False, trigger=False,
                            story="", triple=("去年", "同学", "被孤立"))
    again, ctx2 = role.turn(topic, "很多人都会这样，能再说说吗？", followup=True, empathy=False, trigger=False,
                            story="", triple=("去年", "同学", "被孤立"))
    assert ctx1["withhold"] and "先含糊带过" in first
    assert ctx2["admit"] and "说出实情" in again
    # thoughts of dying are never withheld: a denial of what the record documents fails the turn guards
    harm = next(t for t in visit if t.id == "self_harm")
    said, ctx = role.turn(harm, "最近有没有想过伤害自己？", followup=False, empathy=False, trigger=False,
                          story="", triple=("去年", "同学", "被孤立"))
    assert not ctx["withhold"] and "先含糊带过" not in said and "死了也好" in said
    eng = ScriptedEngine()
    assert evasive(asyncio.run(eng.generate(Request(messages=(), agent="patient", op="PatGen", context=ctx1))).text)
    # an opener-up (tearful) relaxes after the doctor's empathy: longer budgets, nothing withheld
    topic = harm
    tearful = PatientRole(case, book.styles["tearful"], seed=1)
    before = [tearful.budget() for _ in range(200)]
    tearful.turn(topic, "听起来你真的很辛苦。", followup=False, empathy=True, trigger=False, story="",
                 triple=("去年", "同学", "被孤立"))
    assert tearful.opened and statistics.mean(tearful.budget() for _ in range(200)) > 1.3 * statistics.mean(before)


def test_the_doctor_re_asks_a_dodged_question(sample_run):
    dodged = reasks = answered = 0
    for row in sample_run["rows"]:
        t = row["turns"]
        for i in range(1, len(t) - 2):
            if t[i]["speaker"] == "patient" and evasive(t[i]["text"]):
                dodged += 1
                if t[i + 1]["speaker"] == "doctor" and t[i + 1]["topic"] == t[i]["topic"]:
                    reasks += 1
                    answered += not evasive(t[i + 2]["text"])
    # most dodges get a second question on the same topic (the rest hit the per-topic cap), and
    # most second questions get a real answer
    assert dodged > 60 and reasks / dodged > 0.7 and answered / reasks > 0.5, (dodged, reasks, answered)


def test_main_job_patients_figures(sample_run):
    """README: the main job's patient_style column holds at least five styles; patient turn lengths
    spread at least twice as much as MDD-5k's (CV >= 0.8) with at least 15% under 20 characters;
    styles differ as documented (terse short, rambling long); no jargon."""
    rows = sample_run["rows"]
    styles = Counter(r["patient_style"] for r in rows)
    assert len(styles) >= 5, styles
    lengths = [len(t["text"]) for r in rows for t in r["turns"] if t["speaker"] == "patient"]
    s = length_stats(lengths)
    assert s["cv"] >= 0.8 and s["share_under_20"] >= 0.15, s
    by = defaultdict(list)
    for r in rows:
        by[r["patient_style"]] += [len(t["text"]) for t in r["turns"] if t["speaker"] == "patient"]
    mean = {k: statistics.mean(v) for k, v in by.items()}
    assert mean["terse"] < mean["cooperative"] < mean["rambling"]
    assert sum(r["jargon_turns"] for r in rows) == 0
