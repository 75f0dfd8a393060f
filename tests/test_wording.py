"""Doctor turns that do not repeat themselves: overused openers avoided, empathy varied and not on
every turn, safe wording on suicide; measured against the MDD-5k slice (21% repeated openers)."""
import asyncio
from pathlib import Path

from mdd.cases import load_cases
from mdd.config import DialogueConfig
from mdd.dialogue import ops, wording
from mdd.dialogue.loop import run_dialogue
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.record.speech import SpeechTally, opener

ROOT = Path(__file__).resolve().parents[1]


def test_main_job_doctor_openers_repeat_less_than_mdd5k(sample_run):
    """README: the share of doctor turns that open with the same three characters as an earlier turn
    of the dialogue: 20.9% on the MDD-5k slice (tests/test_speech.py), under 10% in the main job;
    no doctor turn opens with an overused opener."""
    tally = SpeechTally()
    for r in sample_run["rows"]:
        tally.add(r)
    share = tally.summary()["doctor_repeated_opener_share"]
    assert share < 0.10, share
    overused = wording.wording()["overused"]
    doctor = [t["text"] for r in sample_run["rows"] for t in r["turns"] if t["speaker"] == "doctor"]
    assert not [t for t in doctor if t.startswith(tuple(overused))]
    assert not [t for t in doctor if wording.unsafe_in(t)]


def test_instructions_name_used_openers_and_empathy_is_never_on_two_turns_in_a_row():
    from tests.test_patient import Recording

    case = load_cases(ROOT / "data" / "cases")[0][0]  # S01: distress in many answers
    warm = next(p for p in ops.all_personas() if p.empathy)
    cued_total, cues = 0, set()
    for v in range(5):
        eng = Recording(ScriptedEngine())
        asyncio.run(run_dialogue(case, v, 9, eng, DialogueConfig(), warm, ops.sample_triples(case, 9, v + 1)[v]))
        doc = [r for r in eng.requests if r.op == "DocGen"]
        system = doc[0].messages[0].content
        assert all(f"“{w}”" in system for w in wording.wording()["overused"])
        instructions = [r.messages[-1].content.rpartition("\n\n【")[2] for r in doc]
        assert all("前面用过的开头" in i for i in instructions[1:])
        cued = [bool(r.context.get("empathy")) for r in doc]
        assert not any(a and b for a, b in zip(cued, cued[1:]))  # never two turns in a row
        cued_total += sum(cued)
        cues |= {r.context["empathy"].split("。", 1)[1] for r in doc if r.context.get("empathy")}
    assert cued_total >= 5 and len(cues) >= 3  # there is empathy, worded differently


def test_suicide_questions_follow_safe_wording():
    from mdd.tree import parse_node

    t = parse_node({"id": "self_harm", "topic": "自伤、自杀想法或行为", "ask": "是否有消极念头"}, "t")
    p = ops.all_personas()[0]
    for kw in ({"followup": False}, {"followup": True}, {"followup": False, "reask": True}):
        instr = ops.prompt_gen(p, t, new_topic=True, empathy="", **kw)
        assert "不带评判" in instr and "做傻事" in instr  # the note names what not to say
    sleep = parse_node({"id": "sleep", "topic": "睡眠", "ask": "入睡困难"}, "t")
    assert "不带评判" not in ops.prompt_gen(p, sleep, followup=False, new_topic=True, empathy="")
    assert wording.unsafe_in("你不会想不开做傻事吧？") == ["想不开", "做傻事", "你不会"]
    for q in wording.wording()["scripted"]["suicide"]:
        assert not wording.unsafe_in(q) and opener(q)


def test_empathy_cue_known_answers():
    import random

    assert wording.empathy_cue("最近睡得还行") == ""
    cue = wording.empathy_cue("我真的好难受", random.Random(1))
    assert cue.startswith("患者说到了「难受」。") and "听起来" not in cue.replace("不要用“听起来”开头", "")
    warm = next(p for p in ops.all_personas() if p.empathy)
    assert ops.empath_gen(warm, "我真的好难受", recent=True) == ""
