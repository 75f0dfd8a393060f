"""Faithfulness without an LLM: negation-aware stances, contradictions with the record, the
grounding fields, unknown records, and the records a synthesis writes."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from mdd.evaluate.faithfulness import (
    RecordStances,
    faith_lexicon,
    record_text,
    score_answer,
    score_record_faithfulness,
    stances,
)

RECORD = {
    "主诉": "情绪低落、失眠3月",
    "现病史": "患者3月前出现情绪低落，入睡困难，早醒。否认兴奋话多、花钱多，否认凭空听到声音及被人害的感觉。",
    "精神检查.感知": "未引出幻觉",
    "精神检查.情感": "情绪低落",
}


def test_negation_aware_stances():
    lex = faith_lexicon()
    assert stances("否认兴奋话多、花钱多", lex) == {"mania": -1}
    assert stances("没有兴奋话多、幻听及被害感。", lex) == {"mania": -1, "hallucination": -1, "persecution": -1}
    assert stances("我一直失眠，心情低落。", lex) == {"insomnia": 1, "low_mood": 1}
    assert stances("没有特别兴奋、话特别多、花钱多。", lex) == {"mania": -1}  # a negated list of lay items
    assert stances("我不知道为什么总是失眠。", lex) == {"insomnia": 1}  # a negation far before is no negation
    assert stances("近2月来无明显诱因出现情绪低落", lex) == {"low_mood": 1}
    assert stances("", lex) == {}


def test_contradictions_and_support():
    rec = RecordStances(RECORD, faith_lexicon())
    assert score_answer("最近心情很低落，晚上睡不着。", rec) == 1.0  # supported
    assert score_answer("我经常听到有声音在议论我。", rec) == 0.0  # the record denies it
    assert score_answer("我没有失眠，睡得挺好。", rec) == 0.0  # the record affirms insomnia
    assert score_answer("没有，从来没听到过什么声音。", rec) == 1.0  # a denial the record shares
    assert score_answer("最近常常心慌。", rec) == 0.75  # not in the record: unsupported, not contradicted
    assert score_answer("最近常常心慌。", rec, experience="那天我心慌得厉害") == 1.0  # the experience covers it
    assert score_answer("我叫小王，今年二十岁。", rec) == 1.0  # nothing to check
    # the grounding fields decide first: the record's exam says no hallucination
    assert score_answer("有时候有声音。", rec, grounding=["精神检查.感知"]) == 0.0
    assert record_text(RECORD, ["精神检查"]) == "未引出幻觉；情绪低落"


def test_unknown_records_are_none():
    out = score_record_faithfulness(["睡不着。", "睡不着。"], ["known", "other"], [None, None], [None, None],
                                    {"known": RECORD})
    assert out == [1.0, None]
    assert score_record_faithfulness(["睡不着。"], ["x"], [None], [None], None) == [None]


def test_a_synthesis_writes_its_records_and_groundings(tmp_path):
    from _evaldata import synthesize_scripted
    from mdd.schema import CASE
    from mdd.evaluate.scoring import load_records

    table = synthesize_scripted(tmp_path, n_cases=3, variants=1)
    cases = pq.read_table(tmp_path / "cases.parquet")
    assert cases.schema.equals(CASE, check_metadata=False) and cases.num_rows == 3
    records = load_records(tmp_path)
    assert set(records) == set(table.column("case_id").to_pylist())
    assert all("现病史" in r and "主诉" in r for r in records.values())
    for d in table.to_pylist():
        for t in d["turns"]:
            if t["speaker"] in ("patient", "companion"):  # a companion answers from the record too
                assert t["grounding"] and all(g.split(".")[0] in
                                              ("主诉", "现病史", "个人史", "精神检查", "家族史", "重要或相关躯体疾病史")
                                              for g in t["grounding"])
            else:
                assert t["grounding"] is None
    # a second synthesis into the same folder keeps the earlier cases
    synthesize_scripted(tmp_path, n_cases=1, variants=1)
    assert pq.read_table(tmp_path / "cases.parquet").num_rows == 3


def test_broken_lexicon_section(tmp_path):
    path = tmp_path / "lex.yaml"
    path.write_text("doctor: {}\npatient: {}\nscoring: {}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="faithfulness"):
        faith_lexicon(str(path))


def test_the_llm_judge_and_the_seed_constant_stay_available(tmp_path):
    from _evaldata import synthesize_scripted
    from mdd.engines.base import Completion
    from mdd.index.embedders import make_embedder
    from mdd.evaluate.scoring import ExchangeScorer, load_records

    class Judge:
        calls = 0

        async def generate(self, request):
            Judge.calls += 1
            assert request.op == "Faithfulness" and "现病史" not in request.messages[0].content
            return Completion(text="否", prompt_tokens=1, output_tokens=1)

    table = synthesize_scripted(tmp_path, n_cases=2, variants=1)
    llm = ExchangeScorer(make_embedder("hashing"), faithfulness="llm", judge_engine=Judge(),
                         records=load_records(tmp_path)).score(table)
    assert Judge.calls == llm.num_rows and set(llm.column("faithfulness").to_pylist()) == {0.0}
    assert set(llm.column("hq_reason").to_pylist()) <= {"filler", "echo", "leak", "record_copy", "off_question",
                                                       "contradiction"}  # the judge said no to every answer
    seed = ExchangeScorer(make_embedder("hashing"), faithfulness="default").score(table)
    assert set(seed.column("faithfulness").to_pylist()) == {0.75}
    with pytest.raises(ValueError, match="judge engine"):
        ExchangeScorer(make_embedder("hashing"), faithfulness="llm")
