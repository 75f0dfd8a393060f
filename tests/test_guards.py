"""Turn guards (mdd/dialogue/guards.py): each catches the collapse it is named for (the shapes a trained
1.5B model wrote, issue 23), passes real MDD-5k dialogues (the negative control) and the scripted dry
run; a failing turn is regenerated, and a turn that keeps failing ends its dialogue as a counted failure."""
import asyncio
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mdd.cases import load_cases
from mdd.config import DialogueConfig, GuardConfig, load_config
from mdd.dialogue import guards as G
from mdd.dialogue import ops
from mdd.dialogue.loop import GuardFailure, run_dialogue
from mdd.engines.base import Completion, Request
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.cases import case_fields
from mdd.mdd5k import read_mdd5k

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "mdd5k"
T = G.Turn


@pytest.fixture(scope="module")
def samples():
    return {c.case_id: c for c in load_cases(ROOT / "data" / "cases")[0]}


def names(t: G.Turn) -> list[str]:
    return [f.guard for f in G.check(t)]


# --- each guard on the collapse it is named for, and on its clean counterpart ------------------------


@pytest.mark.parametrize("bad, good", [
    (T("doctor", "孙医生您好，我最近感觉很疲惫，晚上也睡不好。"), T("doctor", "你好，我是孙医生。最近哪里不舒服？")),
    (T("doctor", "你好，林医生。我想问一下最近怎么样"), T("doctor", "你好，我姓林，是今天的接诊医生，这次来主要是哪里不舒服？")),
    (T("doctor", "我最近感觉很疲惫，心情不好。"), T("doctor", "我想了解一下，你最近是不是感觉很疲惫？")),
    (T("doctor", "林医生：林医生：最近睡眠怎么样？"), T("doctor", "最近睡眠怎么样？")),
    (T("patient", "谢谢您的反馈，我会认真考虑并帮助您解决问题"), T("patient", "谢谢医生，我回去试试。")),
    (T("patient", "你好，我是一名精神科医生，今天来……"), T("patient", "我是来看病的，最近一直睡不好。")),
    (T("patient", "嗯，我睡不好。\n医生：那多久了？\n患者：三个月。"), T("patient", "嗯，我睡不好，有三个月了。")),
])
def test_role(bad, good):
    assert "role" in names(bad) and "role" not in names(good)


def test_echo_of_the_other_side_and_of_itself():
    q = "你好，唐医生。我最近感觉很疲惫，你能说说最近的睡眠情况吗？"
    assert "echo" in names(T("patient", "你好，唐医生。我最近感觉很疲惫，睡眠不好。", previous=q))
    assert "echo" in names(T("patient", "嗯，你好唐医生我最近感觉很疲惫", previous=q))  # fillers and punctuation skipped
    copied = "最近睡眠怎么样，晚上能睡几个小时，早上几点醒"
    assert "echo" in names(T("patient", "晚上能睡几个小时早上几点醒，最近睡眠怎么样", previous=copied))
    assert "echo" not in names(T("patient", "不太好，一晚上也就睡四五个小时，凌晨三点多就醒。", previous=copied))
    earlier = "我开始怀疑自己被监视跟踪，手机里装了监控软件"
    assert "echo" in names(T("patient", "我开始怀疑自己被监视跟踪，手机里装了监控软件。", own=(earlier,)))
    assert "echo" not in names(T("patient", "有三个月了。", own=("有三个月了。",)))  # short turns may recur
    # a doctor may pick up the patient's words; only a near-copy is an echo
    ans = "她发脾气的时候我就躲开，不敢说话"
    assert "echo" not in names(T("doctor", "她发脾气的时候，你通常会怎么应对？", previous=ans))
    assert "echo" in names(T("doctor", "她发脾气的时候我就躲开不敢说话", previous=ans))


def test_loop():
    assert "loop" in names(T("patient", "我开始怀疑自己被监视跟踪，" * 5))
    assert "loop" in names(T("story", "那段时间我很难受，不知道跟谁说。那段时间我很难受，不知道跟谁说。后来慢慢好了。"))
    assert "loop" not in names(T("patient", "我很难受，真的很难受，不知道该怎么办。"))


@pytest.mark.parametrize("text", [
    "医生请你说说这次为什么来看病。用自己的话说说最让你难受的一两件事。这次最多说14个字。",
    "【回答要求】医生在问你睡得怎么样。",
    "他刚才的回答漏了一些你看到的事，你忍不住插一句",
    "我的主诉是失眠。",
    "你在这方面的实际情况：入睡困难。",
])
def test_leak(text):
    assert "leak" in names(T("patient", text))


def test_leak_spares_what_the_template_asks_to_be_said():
    # REASK_GENTLE gives (很多人一开始都不太愿意谈这个) as an example of what the doctor may say
    assert "leak" not in names(T("doctor", "很多人一开始都不太愿意谈这个，没关系。最近有没有让你不好受的时候？"))
    assert G.template_fragments(8) and all(len(f) >= 8 for f in G.template_fragments(8))


def test_truncation_and_language():
    assert "truncation" in names(T("patient", "晚上总是睡不着，翻来覆去", finish_reason="length"))
    assert "truncation" not in names(T("patient", "晚上总是睡不着。", finish_reason="length"))
    assert "truncation" not in names(T("patient", "晚上总是睡不着，翻来覆去", finish_reason="stop"))
    assert "language" in names(T("patient", "```python\nprint('hi')\n```"))
    assert "language" in names(T("patient", "I have been feeling very tired lately and cannot sleep."))
    assert "language" in names(T("patient", "   "))
    assert "language" not in names(T("patient", "血钾偏低（3.3mmol/L），医生说要复查。"))
    assert "language" not in names(T("patient", "吃了SSRI类的药，好一点。"))


def test_repeat():
    asked = ("最近睡眠怎么样？晚上能睡几个小时？",)
    assert "repeat" in names(T("doctor", "最近睡眠怎么样？晚上能睡几个小时呢？", asked=asked))
    assert "repeat" not in names(T("doctor", "白天精神怎么样？会不会犯困？", asked=asked))


# --- faithfulness against the record ----------------------------------------------------------------


def record(samples, cid):
    return G.RecordFacts.of(case_fields(samples[cid]))


def test_record_facts_of_the_sample_cases(samples):
    s10 = record(samples, "S10")  # "不如和孩子一起消失"的念头, 有消极观念
    assert "thoughts" in s10.risks and any("一起消失" in c for c in s10.risks["thoughts"])
    s15 = record(samples, "S15")  # 否认自杀想法; 吸烟5年; 很少饮酒; 否认吸毒史
    assert not s15.risks and "thoughts" in s15.ruled_out
    assert {"tobacco", "alcohol"} <= s15.documented and "drugs" not in s15.documented
    s03 = record(samples, "S03")  # 偶有“不如消失算了”的想法: 不如 is no negation
    assert "thoughts" in s03.risks and "thoughts" not in s03.ruled_out
    s19 = record(samples, "S19")  # 曾有疑似消极行为: a suspicion documents nothing and rules nothing out
    assert "acts" not in s19.risks and "acts" not in s19.ruled_out


def test_faithfulness(samples):
    s10, s15 = record(samples, "S10"), record(samples, "S15")
    fails = lambda text, rec, **kw: "faithfulness" in names(T("patient", text, record=rec, **kw))  # noqa: E731
    # the postpartum patient whose record says 不如和孩子一起消失
    assert fails("没有，我没有想过死。", s10)
    assert fails("没有。", s10, topic_risk=True)
    assert fails("没有那种念头。", s10)
    assert not fails("有时候会想，不如和孩子一起消失算了。", s10, topic_risk=True)
    assert not fails("嗯……觉得没什么盼头、不想活的念头。", s10, topic_risk=True)
    assert not fails("没有伤害过自己，也没有具体的打算。", s10)  # acts are not in her record
    # invented substances, and someone else's
    assert fails("我平时抽烟，也喝点酒，睡不着就吃安眠药。", s10)
    assert not fails("我不抽烟也不喝酒。", s10) and not fails("烟酒都不沾。", s10)
    assert not fails("我父亲有长期饮酒史。", s10)
    assert not fails("我抽烟，一天十来根，偶尔喝点酒。", s15)  # documented
    assert fails("我以前吸过毒。", s15)
    # a risk the record rules out, affirmed
    assert fails("有时候会想死。", s15)
    # no record: nothing to check
    assert not fails("我每天喝酒。", None)


def test_note_names_the_fix(samples):
    s10 = record(samples, "S10")
    f = G.check(T("patient", "没有。", record=s10, topic_risk=True))[0]
    note = G.note(f, "patient", lambda kind: "不如和孩子一起消失")
    assert "一起消失" in note and "不要说没有" in note
    f = G.check(T("patient", "我每天喝酒。", record=s10))[0]
    assert "喝酒" in G.note(f, "patient") and "不要编" in G.note(f, "patient")
    assert "医生" in G.note(G.Failure("role", "x"), "doctor")


# --- negative controls: real dialogues and the scripted dry run pass ---------------------------------


def test_real_mdd5k_dialogues_trip_almost_no_guard():
    rows, _, _ = read_mdd5k(SHARED / "dialogues", SHARED / "labels")
    turns = failed = 0
    for r in rows:
        turns += sum(t["speaker"] in G.SPEAKERS for t in r["turns"])
        failed += len(G.check_dialogue(r["turns"]).failures)
    assert turns > 4000
    assert failed / turns < 0.01, f"{failed} of {turns} real turns trip a guard"


def test_scripted_dry_run_passes_its_guards(samples):
    cfg = DialogueConfig()
    personas = ops.all_personas()
    tally = G.GuardTally()
    for case in samples.values():
        for v in range(2):
            persona, triple = ops.choose_persona(personas, 5, case.case_id, v), ops.sample_triples(case, 5, v + 1)[v]
            row, acct = asyncio.run(run_dialogue(case, v, 5, ScriptedEngine(), cfg, persona, triple))
            tally.add(acct.generated, row["guard_events"])
            # what the guards let through holds up when checked again whole
            rec = G.RecordFacts.of(case_fields(case))
            assert not G.check_dialogue(row["turns"], rec, G.is_thought_topic).failures
    s = tally.summary()
    assert s["dialogues_failed"] == 0 and s["dialogues"] == 54
    assert s["dialogues_clean_after_regeneration"] <= 6  # the dry-run writer rarely needs a second try


# --- regeneration and failure in the loop ---------------------------------------------------------------


class Echoing(ScriptedEngine):
    """Scripted, but the patient's first ``bad`` attempts at every answer echo the doctor's question."""

    def __init__(self, bad: int):
        super().__init__()
        self.bad = bad
        self.notes: list[str] = []

    async def generate(self, request: Request) -> Completion:
        if request.op == "PatGen":
            attempt = request.context.get("attempt", 0)
            if attempt:
                self.notes.append(request.messages[-1].content)
            if attempt < self.bad:
                question = next(m.content for m in reversed(request.messages) if m.role == "user")
                return Completion(text=question.split("\n\n")[0], prompt_tokens=10, output_tokens=10)
        return await super().generate(request)


def _run(case, engine, cfg=DialogueConfig()):
    persona, triple = ops.choose_persona(ops.all_personas(), 3, case.case_id, 0), ops.sample_triples(case, 3, 1)[0]
    return asyncio.run(run_dialogue(case, 0, 3, engine, cfg, persona, triple))


def test_a_failing_turn_is_regenerated_with_a_note(samples):
    eng = Echoing(bad=1)
    row, acct = _run(samples["S08"], eng)
    first = {e["turn"] for e in row["guard_events"] if e["guard"] == "echo" and e["attempt"] == 0}
    patient_turns = {i for i, t in enumerate(row["turns"]) if t["speaker"] == "patient"}
    assert first == patient_turns  # every first attempt echoed, and was asked again
    assert all(e["speaker"] == "patient" for e in row["guard_events"])
    assert row["regenerations"] == len({(e["turn"], e["attempt"]) for e in row["guard_events"]})
    assert any("不要重复对方的话" in n for n in eng.notes)  # the corrective note reached the model
    assert not G.check_dialogue(row["turns"]).failures  # the echoes never reached the table
    assert acct.generated["patient"] == sum(t["speaker"] == "patient" for t in row["turns"])


def test_a_turn_that_keeps_failing_ends_the_dialogue(samples):
    cfg = DialogueConfig(guards=GuardConfig(max_regenerations=2))
    with pytest.raises(GuardFailure) as err:
        _run(samples["S08"], Echoing(bad=10), cfg)
    exc = err.value
    assert exc.guards == ["echo"] and exc.speaker == "patient" and exc.retriable is False
    assert [e["attempt"] for e in exc.events if e["turn"] == exc.turn] == [0, 1, 2]
    # with the guards off the same engine writes the echoes into the dialogue
    row, _ = _run(samples["S08"], Echoing(bad=10), DialogueConfig(guards=GuardConfig(enabled=())))
    assert G.check_dialogue(row["turns"]).failures


def test_tally_counts_before_and_after_regeneration():
    t = G.GuardTally()
    t.add({"patient": 10, "doctor": 10}, [{"turn": 3, "speaker": "patient", "guard": "echo", "attempt": 0},
                                          {"turn": 3, "speaker": "patient", "guard": "echo", "attempt": 1}])
    t.add({"patient": 5, "doctor": 5}, [{"turn": 4, "speaker": "patient", "guard": "loop", "attempt": a}
                                        for a in range(4)], ("patient", ["loop"]))
    t.add({"patient": 10, "doctor": 10}, [])
    s = t.summary()
    assert s["dialogues"] == 3 and s["dialogues_clean_first_time"] == 1
    assert s["dialogues_clean_after_regeneration"] == 1 and s["dialogues_failed"] == 1
    assert s["rate_before_regeneration"]["patient"] == {"echo": 0.04, "loop": 0.04}
    assert s["rate_after_regeneration"]["patient"] == {"loop": 0.04}
    assert s["failed_attempts"]["patient"] == {"echo": 2, "loop": 4}


def test_unknown_guard_is_a_config_error(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("synth:\n  dialogue:\n    guards:\n      enabled: [echo, nonsense]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="nonsense"):
        load_config(bad)


def test_a_turn_cut_at_the_token_limit_keeps_its_whole_sentences():
    cut = "我最近睡不好，每天凌晨就醒。白天没精神，上班老是走神，领导说了我好几"
    assert G.trim_to_sentence(cut, "length") == "我最近睡不好，每天凌晨就醒。"
    assert G.trim_to_sentence(cut, "stop") is None  # finished on its own: left alone
    assert G.trim_to_sentence("嗯。我最近睡不好，每天凌晨就醒，白天", "length") is None  # too little left
    assert G.trim_to_sentence("我最近睡不好，每天凌晨就醒。", "length") is None  # nothing to cut


class Cut(ScriptedEngine):
    """Every patient answer runs on past the token limit; every call's temperature is kept."""

    def __init__(self, keep_failing: bool = False):
        super().__init__()
        self.keep_failing, self.temperatures = keep_failing, []

    async def generate(self, request: Request) -> Completion:
        c = await super().generate(request)
        if request.op != "PatGen":
            return c
        self.temperatures.append((request.context.get("attempt", 0), request.sampling.temperature))
        tail = "然后就" if self.keep_failing else "还有就是我那个时候一直在想，"
        text = ("还有" if self.keep_failing else c.text.rstrip("。") + "。") + tail
        return Completion(text=text, prompt_tokens=c.prompt_tokens, output_tokens=40, finish_reason="length")


def test_cut_turns_are_trimmed_and_counted(samples):
    row, _ = _run(samples["S08"], Cut())
    patient = [t["text"] for t in row["turns"] if t["speaker"] == "patient"]
    assert row["trimmed_turns"] == len(patient)
    # only an answer too short to keep on its own (没有。 + the cut tail) was asked again
    assert all(e["guard"] == "truncation" and len(e["text"].split("。")[0]) < 8 for e in row["guard_events"])
    assert all(not t.endswith("，") and "我那个时候一直在想" not in t for t in patient)
    # with trimming off, the same turns fail the truncation guard
    with pytest.raises(GuardFailure) as err:
        _run(samples["S08"], Cut(), DialogueConfig(guards=GuardConfig(trim=False)))
    assert "truncation" in err.value.guards


def test_a_regeneration_samples_hotter(samples):
    eng = Cut(keep_failing=True)
    cfg = DialogueConfig(guards=GuardConfig(max_regenerations=3, temperature_step=0.15, max_temperature=1.2))
    with pytest.raises(GuardFailure):
        _run(samples["S08"], eng, cfg)
    base = cfg.sampling.temperature
    temps = dict(eng.temperatures)
    assert temps[0] == base and temps[1] == pytest.approx(base + 0.15)
    assert temps[2] == pytest.approx(base + 0.3) and temps[3] == pytest.approx(min(1.2, base + 0.45)) == 1.2


class EchoOnFollowups(ScriptedEngine):
    """The patient answers the first ``n`` follow-ups by repeating the question, whatever it is told."""

    def __init__(self, n: int = 2):
        super().__init__()
        self.left, self.seen = n, set()

    async def generate(self, request: Request) -> Completion:
        key = request.context.get("question")
        if request.op == "PatGen" and request.context.get("followup") and (self.left > 0 or key in self.seen):
            if key not in self.seen:
                self.seen.add(key)
                self.left -= 1
            question = next(m.content for m in reversed(request.messages) if m.role == "user")
            return Completion(text=question.split("\n\n")[0], prompt_tokens=10, output_tokens=10)
        return await super().generate(request)


def test_an_answer_that_can_only_echo_takes_its_question_back(samples):
    cfg = DialogueConfig(guards=GuardConfig(max_regenerations=1, max_topics_skipped=2))
    row, _ = _run(samples["S08"], EchoOnFollowups(), cfg)
    assert row["topics_skipped"] == 2 and row["turns"][-1]["topic"] == "诊断结果"
    assert not G.check_dialogue(row["turns"]).failures  # the echoes and their questions are not in the table
    # every exchange left is a question and its answer
    speakers = [t["speaker"] for t in row["turns"][:-1]]
    assert all(a == "doctor" and b == "patient" for a, b in zip(speakers[::2], speakers[1::2]))
    # a third such answer ends the dialogue as a failure
    with pytest.raises(GuardFailure):
        _run(samples["S08"], EchoOnFollowups(3), cfg)
