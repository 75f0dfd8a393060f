"""Coherent experiences: every sampled (time, people, event) triple of the sample cases fits itself,
the patient's age, gender and situation, and the illness timeline."""
from pathlib import Path

import pytest

from mdd.cases import load_cases
from mdd.dialogue import ops
from mdd.dialogue.experience import SELF, life_situations, onset_months, triple_fits

ROOT = Path(__file__).resolve().parents[1]
SCHOOL_TIMES = ("初一", "初三", "高一", "高三", "小学", "小时候", "上大学")
WORK_WORDS = ("公司", "领导", "同事", "裁员", "产假", "职称", "客户", "房贷", "丈夫", "妻子", "婆婆", "辞退", "加班")
DATED = {"上个月": 1, "三个月前": 3, "最近几个月": 3, "半年前": 6, "去年": 12, "两年前": 24, "三年前": 36,
         "五年前": 60, "十年前": 120}


@pytest.fixture(scope="module")
def cases():
    return {c.case_id: c for c in load_cases(ROOT / "data" / "cases")[0]}


def test_known_misfits_are_rejected(cases):
    s23, s11, s04, s12, s09 = cases["S23"], cases["S11"], cases["S04"], cases["S12"], cases["S09"]
    bad = [
        (s23, "去年", "保姆", "老房子拆迁，被迫搬到陌生的小区"),  # the person is not in the event
        (s09, "上个月", "父亲", "从小被父亲打骂长大"),  # a childhood event last month
        (cases["S02"], "初一那年", SELF, "中考失利只能上职高"),  # 中考 is years after 初一
        (s12, "怀孕期间", SELF, "备孕多年一直没有成功"),
        (s11, "去年", "老板", "公司裁员，我被辞退了"),  # names nobody: the patient's own
        (s04, "上个学期", "继母", "继母进门后在家里待不下去"),  # no stepmother in the record
        (cases["S08"], "上大学时", SELF, "公司裁员，我被辞退了"),  # a work event at university
        (cases["S01"], "五年前", "父母", "父母经常当着我的面吵架摔东西"),  # long before an 8-month illness
    ]
    for case, time, person, event in bad:
        ok, why = triple_fits(case, time, person, event, ["保姆", "父亲", "老板", "继母", "父母"])
        assert not ok and why, (case.case_id, time, person, event)
    assert triple_fits(s11, "去年", SELF, "公司裁员，我被辞退了")[0]


def test_every_sampled_triple_of_the_sample_cases_fits(cases):
    """Checked with rules of the test's own, independent of the fitting code."""
    n = 0
    for case in cases.values():
        situations = life_situations(case)
        onset = onset_months(case)
        triples = ops.sample_triples(case, 20250225, 10)
        assert len({e for _, _, e in triples}) == 10  # variants still differ
        for time, person, event in triples:
            n += 1
            where = (case.case_id, time, person, event)
            assert person == SELF or person in event or any(w in person for w in ("女生", "同学")) and \
                any(w in event for w in ("女生", "同学")), where
            if person in ("丈夫", "妻子", "婆婆", "公公"):
                assert "married" in situations or "parent" in situations, where
            if person.startswith("继"):
                assert "继" in case.family_history + case.present_illness + case.get("个人史"), where
            if time.startswith(SCHOOL_TIMES):
                assert not any(w in event for w in WORK_WORDS), where
            if case.age <= 18:
                assert not any(w in event for w in WORK_WORDS), where
            if time in DATED and onset is not None:
                assert DATED[time] <= onset + 24, where
            if time.startswith(("小时候", "小学")):
                assert not any(w in event for w in WORK_WORDS + ("高考", "中考", "大学")), where
    assert n == 270
