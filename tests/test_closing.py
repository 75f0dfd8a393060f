"""The spoken closing: the diagnosis in lay words, the plan as a doctor says it, no prescription text."""
import random
from pathlib import Path

import pytest

from mdd.cases import load_cases
from mdd.dialogue.closing import PRESCRIPTION, meaning, plan, spoken_closing

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"


@pytest.fixture(scope="module")
def cases():
    return load_cases(ROOT / "data" / "cases")[0] + load_cases(PA20)[0]


def test_every_closing_is_spoken(cases):
    raw_hits = 0
    for c in cases:
        raw_hits += bool(PRESCRIPTION.search(c.treatment))  # the record is prescription text
        text = spoken_closing(c, random.Random(0))
        assert not PRESCRIPTION.findall(text), (c.case_id, PRESCRIPTION.findall(text))
        assert c.diagnosis in text and meaning(c.icd_code) in text
        for code in c.icd_codes:
            assert code not in text
        assert "复诊" in text
        p = plan(c.treatment)
        for drug in p["drugs"]:
            assert drug in text and not PRESCRIPTION.search(drug)
    assert raw_hits >= 20


def test_known_plan_of_the_real_case(cases):
    pa20 = next(c for c in cases if c.case_id == "1")
    p = plan(pa20.treatment)
    assert p["drugs"] == ["舍曲林（左洛复），每天一次，每次一片", "曲唑酮（每素玉），每天晚上，每次一片"]
    assert p["tests"] and p["side_effects"] and p["risk"] and p["followup"] == "定期"
    text = spoken_closing(pa20, random.Random(0))
    assert "28片" not in text and "可以线上" not in text and "F32" not in text and "SCL" not in text
    assert "想伤害自己的念头" in text  # 防消极: safety advice
    s01 = next(c for c in cases if c.case_id == "S01")
    assert "两周后来复诊" in spoken_closing(s01, random.Random(0))
    s02 = next(c for c in cases if c.case_id == "S02")
    assert plan(s02.treatment)["drugs"] == [] and "暂时不用吃药" in spoken_closing(s02, random.Random(0))
    assert meaning("F41.000") != meaning("F41.100") and meaning("Z99.9") == meaning("")


def test_main_job_closings(sample_run):
    """README: every closing turn of the main job is free of prescription strings and ICD codes, and
    the labels stay exact in their columns."""
    for r in sample_run["rows"]:
        case = sample_run["cases"][r["case_id"]]
        last = r["turns"][-1]
        assert last["speaker"] == "doctor" and not PRESCRIPTION.search(last["text"])
        assert (r["diagnosis"], r["icd_code"], r["treatment"]) == (case.diagnosis, case.icd_code, case.treatment)
