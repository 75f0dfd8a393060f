"""Issue 24: the de-identification measured on a labelled probe set (tests/privacy_probe.py) and on
the 27 sample cases, where nothing clinical may be masked."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from mdd import privacy
from mdd.cases import load_cases
from privacy_probe import CLINICAL, CLINICAL_HOSTILE, HELD_OUT, HELD_OUT_2, HOSTILE, PROBES

ROOT = Path(__file__).resolve().parents[1]
# the figures the README states (measured on this probe set; a change that lowers one fails here)
RECALL_MIN = {"name": 1.0, "date": 1.0, "age": 1.0, "address": 1.0, "place": 1.0, "org": 0.93, "plate": 1.0,
              "passport": 1.0, "employee_number": 1.0, "phone": 1.0}
PRECISION_MIN = 1.0


def _measure():
    found, total, hits, good, false_pos = (collections.Counter() for _ in range(5))
    for text, mentions in PROBES:
        out = privacy.mask(text)
        spans = []
        for m, kind in mentions:
            total[kind] += 1
            found[kind] += m not in out  # the mention as written is gone from the output
            spans.append((text.index(m), text.index(m) + len(m)))
        for h in privacy.find(text):
            hits[h.kind] += 1
            good[h.kind] += any(h.start < e and s < h.end for s, e in spans)
    for text in CLINICAL:
        for h in privacy.find(text):
            hits[h.kind] += 1
            false_pos[h.kind] += 1
    return found, total, hits, good, false_pos


def test_probe_set_is_big_enough_and_covers_every_kind():
    kinds = collections.Counter(k for _, ms in PROBES for _, k in ms)
    assert sum(kinds.values()) >= 200 and len(CLINICAL) >= 40
    assert set(kinds) == set(RECALL_MIN)


def test_recall_and_precision_per_kind():
    found, total, hits, good, false_pos = _measure()
    recall = {k: found[k] / total[k] for k in total}
    assert {k: r for k, r in recall.items() if r < RECALL_MIN[k]} == {}, recall
    precision = {k: good[k] / hits[k] for k in hits}
    assert {k: p for k, p in precision.items() if p < PRECISION_MIN} == {}, (precision, false_pos)
    assert sum(false_pos.values()) == 0  # clinical text: nothing masked


def test_the_27_sample_cases_lose_no_clinical_word():
    """Nothing in the sample cases is personal data: every field comes out of validation unchanged."""
    raw = json.loads((ROOT / "data/cases/sample_cases.json").read_text(encoding="utf-8"))
    cases, rejects = load_cases(ROOT / "data/cases/sample_cases.json", privacy.Deidentifier(b"k"))
    assert len(cases) == len(raw) == 27 and rejects == []
    assert [c.masked for c in cases if c.masked] == []
    for rec, case in zip(raw, cases):
        back = case.to_record()
        for key in ("主诉", "现病史", "重要或相关躯体疾病史", "家族史", "个人史", "精神检查", "处理意见", "诊断结果"):
            assert back[key] == rec[key], (rec["患者"], key)
        assert back["年龄"] % 10 == 0 and abs(back["年龄"] - rec["年龄"]) <= 5  # the one change: the age in tens
        assert case.age_band == __import__("mdd.cases", fromlist=["age_band"]).age_band(rec["年龄"])  # band: exact age


@pytest.mark.parametrize("text, kept", [("13岁初潮", "13岁"), ("其父亲65岁时去世", "65岁时"), ("3月前起病", "3月前"),
                                        ("2019年3月起失眠", "2019年3月")])
def test_relative_times_and_event_ages_stay(text, kept):
    assert kept in privacy.mask(text)


def test_control_characters_removed_and_counted():
    deid = privacy.Deidentifier(b"k")
    masked: list[str] = []
    out = deid.text("情绪\x00低落\u202e伴\u200b失眠\ufeff", "主诉", masked)
    assert out == "情绪低落伴失眠" and masked == ["主诉:control"] and deid.controls_removed == 4


def test_input_paths_are_labels():
    deid = privacy.Deidentifier(b"k")
    assert deid.source("/data/张伟/sample_cases.json") == "sample_cases.json"
    label = deid.source("/data/x/zhangwei_1987.json")
    assert label.startswith("input-") and label.endswith(".json") and "zhangwei" not in label
    assert deid.source("/home/刘芳/刘芳病历.jsonl").startswith("input-")


def test_jieba_tags_alone_would_mask_clinical_words():
    """Why rules check jieba: its nr / ns / nt tags on the sample cases are clinical words and drugs."""
    import jieba.posseg as pseg

    raw = json.loads((ROOT / "data/cases/sample_cases.json").read_text(encoding="utf-8"))
    text = json.dumps(raw, ensure_ascii=False)
    tagged = [w.word for w in pseg.cut(text) if w.flag in ("nr", "ns", "nt")]
    assert len(tagged) >= 150 and {"左洛复", "易醒", "麻木", "连贯"} <= set(tagged)


# The forms the first set did not hold (HOSTILE), measured strictly: a mention counts as found only when
# every character of it is inside a masked span (河南省某地付井镇 leaks the town). Before the rules for
# them (main at 0ad560b): 50 of 85 (59%); the README's table gives the figures per kind.
HOSTILE_RECALL_BEFORE = {"address": (5, 7), "age": (0, 3), "bank_card": (3, 3), "date": (8, 10), "email": (2, 2),
                         "id_card": (5, 5), "landline": (3, 3), "name": (7, 16), "org": (9, 14), "place": (0, 5),
                         "plate": (1, 1), "postcode": (0, 2), "qq": (1, 2), "record_number": (5, 8), "url": (0, 2),
                         "wechat": (1, 2)}
HOSTILE_RECALL_MIN = 0.98


def _measure_strict(probes):
    found, total, hits, good = (collections.Counter() for _ in range(4))
    missed, wrong = [], []
    for text, mentions in probes:
        spans = privacy.find(text)
        labelled = []
        for m, kind in mentions:
            a = text.index(m)
            labelled.append((a, a + len(m)))
            total[kind] += 1
            covered = all(any(h.start <= i < h.end for h in spans) for i in range(a, a + len(m)))
            found[kind] += covered
            if not covered:
                missed.append((m, privacy.mask(text)))
        for h in spans:
            hits[h.kind] += 1
            ok = any(h.start < e and s < h.end for s, e in labelled)
            good[h.kind] += ok
            if not ok:
                wrong.append((text[h.start:h.end], h.kind, text))
    return found, total, hits, good, missed, wrong


def test_hostile_forms_recall_and_precision():
    found, total, hits, good, missed, wrong = _measure_strict(HOSTILE)
    assert sum(total.values()) >= 80 and len(total) >= 16
    assert {k: v[1] for k, v in HOSTILE_RECALL_BEFORE.items()} == dict(total)  # the same mentions before and after
    assert sum(found.values()) / sum(total.values()) >= HOSTILE_RECALL_MIN, missed
    assert found == total, missed  # the README's table: every mention, every kind
    assert wrong == [] and sum(good.values()) == sum(hits.values())  # precision 100% per kind


def test_no_false_positive_on_clinical_text_near_the_hostile_forms():
    """小时候, 主任医师, 和老师, 心前区, 大城市, 县城, doses, scores, scale names: nothing masked."""
    assert {t: [t[h.start:h.end] for h in privacy.find(t)] for t in CLINICAL_HOSTILE if privacy.find(t)} == {}
    assert len(CLINICAL_HOSTILE) == 36  # the README's count


@pytest.mark.parametrize("text, masked, kept", [
    ("患者，男，三十七岁，已婚。", "三十七", "40岁"),   # an age in Chinese numerals comes out in tens
    ("其妻35岁，体健。", "35", "40岁"),
    ("患者年龄：47，因失眠来诊。", "47", "50"),
    ("户籍地河南省周口市沈丘县付井镇王庄村。", "付井镇", "河南省某地"),  # the province stays, the rest is one 某地
    ("家住幸福里小区5栋2单元302室。", "幸福里", "家住某地址"),
    ("其舅舅司马光明曾有类似发作。", "光明", "其舅舅某某曾"),
    ("张医生建议加用助眠药物。", "张", "某医生"),
    ("患者ZHANG Wei，留学生。", "ZHANG", "患者某某"),
    ("家属提供其微博主页 weibo.com/u/zhangwei1987。", "zhangwei", "[网址已隐去]"),
    ("Ray dashboard at http://127.0.0.1:8265", "[网址已隐去]", "http://127.0.0.1:8265"),
])
def test_hostile_forms_come_out_vague(text, masked, kept):
    out = privacy.mask(text)
    assert masked not in out and kept in out, out


# HELD_OUT was written after the HOSTILE rules and measured once before changing anything: 34 of 38 (89%;
# missed: 患儿王小宝，7岁 and 其父亲张德明，62岁 (an age after a name), a road without a number after a district
# (广州市天河区体育西路), a bank's branch (中国工商银行北京分行)). Rules for those four came after.
HELD_OUT_FIRST_TRY = (34, 38)


def test_held_out_forms():
    found, total, _, _, missed, wrong = _measure_strict(HELD_OUT)
    assert sum(total.values()) == HELD_OUT_FIRST_TRY[1]
    assert sum(found.values()) / sum(total.values()) >= HOSTILE_RECALL_MIN, missed
    assert found == total and wrong == [], (missed, wrong)  # 38/38 after the rules for the first try's misses


# HELD_OUT_2, written after the HELD_OUT rules, first try: 19 of 31 (61%; missed: M.D and M/D dates before a
# visit word, 台胞证号, a Hong Kong identity card, 名叫朵朵 and 小名叫二丫, a building and room after the house
# number, a Weibo handle and a Douyin id, an IP address, hospitals named by a number: 三〇一医院, 北大六院).
HELD_OUT_2_FIRST_TRY = (19, 31)


def test_second_held_out_forms():
    found, total, _, _, missed, wrong = _measure_strict(HELD_OUT_2)
    assert sum(total.values()) == HELD_OUT_2_FIRST_TRY[1]
    assert found == total and wrong == [], (missed, wrong)
