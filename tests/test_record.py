"""The dialogue record (mdd/record/): one definition of an exchange for every stage, and the typed row."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from mdd.record import DialogueRecord, Turn, count_exchanges, exchanges, rounds
from mdd.schema import DIALOGUE

SHARED = Path(__file__).resolve().parents[2] / "shared" / "mdd5k"

# doctor asks, patient answers, the companion interjects; the doctor asks the companion, who answers;
# two doctor turns in a row (the first unanswered); the closing nobody answers
TURNS = [
    {"speaker": "doctor", "text": "你好，最近怎么样？", "topic": "开场"},
    {"speaker": "patient", "text": "不太好。", "topic": "开场"},
    {"speaker": "companion", "text": "她最近总哭。", "topic": "开场"},
    {"speaker": "doctor", "text": "妈妈，您觉得她多久了？", "topic": "病程"},
    {"speaker": "companion", "text": "大概半年。", "topic": "病程"},
    {"speaker": "doctor", "text": "好的。", "topic": "睡眠"},
    {"speaker": "doctor", "text": "睡得好吗？", "topic": "睡眠"},
    {"speaker": "patient", "text": "睡不着。", "topic": "睡眠"},
    {"speaker": "doctor", "text": "考虑抑郁发作。", "topic": "诊断结果"},
]


def test_an_exchange_is_an_answered_doctor_turn():
    ex = exchanges(TURNS)
    assert [(e.index, e.position, e.answer_position, e.answerer) for e in ex] == [
        (0, 0, 1, "patient"), (1, 3, 4, "companion"), (2, 6, 7, "patient")]
    assert [e.topic for e in ex] == ["开场", "病程", "睡眠"]
    # rounds keep every doctor turn: the unanswered one and the closing are rounds, not exchanges
    rs = rounds(TURNS)
    assert [r.position for r in rs] == [0, 3, 5, 6, 8]
    assert [r.answered for r in rs] == [True, True, False, True, False]
    assert rs[0].text("companion") == "她最近总哭。" and rs[0].text("patient") == "不太好。"
    # typed turns count the same as rows
    assert count_exchanges([Turn.from_row(t) for t in TURNS]) == 3


def test_patient_first_speaker_synonyms_and_missing_turns():
    turns = [{"speaker": "患者", "text": "医生我先说"}, {"speaker": "Doctor", "text": "请讲"},
             None, {"speaker": "user", "text": "好"}, {"speaker": "assistant", "text": "多久了？"},
             {"speaker": "用户", "text": "一年"}]
    rs = rounds(turns)
    assert rs[0].position is None and rs[0].text("patient") == "医生我先说"
    # a missing turn between a question and its answer breaks the exchange (as it always did)
    assert [(e.position, e.answer_text) for e in exchanges(turns)] == [(4, "一年")]


def test_every_reader_counts_exchanges_the_same(sample_run):
    """The loop's own counter, the evaluation, the comparison, the export and the self-check agree on the
    main job's dialogues; the rule judge's rounds hold the same answered doctor turns."""
    from mdd.evaluate.rule_view import DialogueView
    from mdd.evaluate.scoring import explode
    from mdd.evaluate.validity import _patient_slots
    from mdd.publish import compare
    from mdd.publish.export import _exchange_positions

    rows = sample_run["rows"][:40]
    table = pa.Table.from_pylist(rows, schema=DIALOGUE)
    exploded, _ = explode(table)
    assert exploded.num_rows == sum(r["n_exchanges"] for r in rows)
    for r in rows:
        n = r["n_exchanges"]
        assert count_exchanges(r["turns"]) == n == compare.exchanges(r)
        assert len(_exchange_positions(r["turns"])) == n == len(_patient_slots(r["turns"]))
        view = DialogueView.from_record(r)
        assert sum(1 for e in view.exchanges if e.patient is not None or e.companion is not None) == n
        assert DialogueRecord.from_row(r).counts() == (r["n_turns"], n)


def test_the_record_is_the_schema_and_round_trips(sample_run):
    from dataclasses import fields

    assert [f.name for f in fields(DialogueRecord)] == DIALOGUE.names
    row = pa.Table.from_pylist(sample_run["rows"][:1], schema=DIALOGUE).to_pylist()[0]  # every column, as read
    rec = DialogueRecord.from_row(row)
    assert isinstance(rec.turns[0], Turn) and rec.to_row() == row


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/mdd5k beside the checkout")
def test_mdd5k_import_counts_companion_answers_like_the_evaluation():
    """The importer counted doctor→patient pairs only; a companion's answer is an exchange everywhere."""
    from mdd import mdd5k

    row = mdd5k._row(1, 0, TURNS, "F32.1", "抑郁")
    assert row["n_exchanges"] == 3 and row["n_turns"] == 5
    rows, _, _ = mdd5k.read_mdd5k(SHARED / "dialogues", SHARED / "labels")
    assert rows and all(r["n_exchanges"] == count_exchanges(r["turns"]) for r in rows)


def test_the_run_summary_is_typed_and_round_trips(main_run):
    """run.json["synthesize"] is written from a SynthesisSummary and read back into one: every key, in order;
    a section of an older version (keys missing) reads with defaults."""
    import json

    from mdd.record.summary import SynthesisSummary

    section = json.loads((main_run / "run.json").read_text(encoding="utf-8"))["synthesize"]
    s = SynthesisSummary.from_json(section)
    assert s.to_json() == section and list(s.to_json()) == list(section)
    assert s.counts.dialogues_in_output == 12 and s.engine.name == "scripted"
    assert s.setting("synth", "variants") == 2 and s.setting("synth", "nothing") is None
    old = SynthesisSummary.from_json({"counts": {"dialogues_run": 3}, "engine": None})
    assert old.counts.dialogues_run == 3 and old.counts.cases_rejected == 0 and old.engine.name is None
    assert SynthesisSummary.from_json(None).llm_calls.per_exchange is None
