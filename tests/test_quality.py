"""Per-exchange quality metrics: unit checks and calibration on the 100 shared MDD-5k dialogues."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mdd.index.embedders import make_embedder
from mdd.evaluate.quality import (
    QualityScorer,
    distractor_index,
    doctor_scores,
    load_lexicon,
    relevance,
    robustness,
)
from mdd.schema import METRICS

MDD5K = Path(__file__).parents[1].parent / "shared" / "mdd5k"


def _shared_exchanges():
    q, a, d, c, dlg = [], [], [], [], []
    for f in sorted((MDD5K / "dialogues").glob("patient_*.json")):
        label = json.loads((MDD5K / "labels" / f"{f.stem}_label.json").read_text(encoding="utf-8"))
        for k, rec in enumerate(json.loads(f.read_text(encoding="utf-8"))):
            for ex in rec["conversation"]:
                if ex.get("doctor") and ex.get("patient"):
                    q.append(ex["doctor"])
                    a.append(ex["patient"])
                    d.append(label["Diagnosis_Result"])
                    c.append(label["ICD_Code"])
                    dlg.append(f"{f.stem}-{k}")
    return q, a, d, c, dlg


@pytest.fixture(scope="module")
def scorer():
    return QualityScorer(make_embedder("hashing"), threshold=0.7, distractors=15)


def _score_batches(scorer, q, a, d, c, bs=256):
    out: dict[str, list] = {}
    for i in range(0, len(q), bs):
        for k, v in scorer.score(q[i:i + bs], a[i:i + bs], d[i:i + bs], c[i:i + bs]).items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


def test_lexicon_loads_with_sections():
    lex = load_lexicon()
    assert {"doctor", "patient", "scoring"} <= set(lex)
    assert "sleep" in lex["doctor"]["elements"]


def test_calibration_on_shared_dialogues(scorer):
    q, a, d, c, _ = _shared_exchanges()
    m = _score_batches(scorer, q, a, d, c)
    for name in METRICS:
        v = m[name]
        assert v.shape == (len(q),) and np.isfinite(v).all(), name
        assert (v >= 0).all() and (v <= 1).all(), name
    share = float(m["high_quality"].mean())
    assert 0.2 <= share <= 0.6, share
    assert np.array_equal(m["high_quality"], m["overall"] >= 0.7)
    assert np.allclose(m["overall"], (m["doctor_quality"] + m["patient_ability"]) / 2)
    assert np.allclose(m["faithfulness"], 0.75)


def test_mismatched_pairs_rank_lower(scorer):
    q, a, d, c, dlg = _shared_exchanges()
    true = _score_batches(scorer, q, a, d, c)["relevance_rank"]
    # pair each question with an answer from a dialogue of another case
    shift = len(a) // 2
    wrong = _score_batches(scorer, q, a[shift:] + a[:shift], d, c)["relevance_rank"]
    assert true.mean() > wrong.mean() + 0.2, (true.mean(), wrong.mean())
    assert true.mean() > 0.8


def test_relevance_short_answers_lowered():
    e = make_embedder("hashing")
    q = ["你最近睡眠怎么样？", "你最近睡眠怎么样？"]
    a = ["我最近睡眠不太好，晚上经常睡不着。", "嗯"]
    emb = e.encode(q + a)
    r = relevance(emb[:2], emb[2:], a)
    assert r[1] < r[0] and 0 <= r.min() and r.max() <= 1


def test_robustness_penalises_leaks():
    diag, code = "抑郁状态", "F32.901"
    plain = "最近一直心情不好，晚上睡不着。"
    r = robustness(
        [plain, "医生说我是抑郁状态。", "我的编码是F32.901。", "病历上写着诊断为抑郁，量表评分很高。",
         "我有快感缺失和精神运动性迟滞。", "我" * 600, ""],
        [diag] * 7, [code] * 7,
    )
    assert r[0] == 1.0
    assert all(r[i] < r[0] for i in range(1, 6))
    assert r[6] == 1.0
    assert ((r >= 0) & (r <= 1)).all()
    # comma-separated codes and missing labels
    r2 = robustness(["F41.1让我害怕", "普通回答"], [None, None], ["F32.9,F41.1", None])
    assert r2[0] < 1.0 and r2[1] == 1.0


def test_doctor_scores_order():
    vague = "还有什么想说的吗？"
    specific = "这种失眠持续多久了？每周有几次？是在压力大的时候加重吗，什么情况下能缓解？"
    s = doctor_scores([vague, specific, "最近心情、兴趣、睡眠、食欲怎么样？有没有想过自杀？"])
    assert s["specificity"][1] > s["specificity"][0]
    assert s["targetedness"][2] > s["targetedness"][0]
    assert s["professionalism"][0] < s["professionalism"][2]
    jargon = "症状情绪睡眠食欲注意力精力兴趣自杀幻觉妄想病程诱因既往病史家族史药物治疗"
    assert doctor_scores([jargon])["professionalism"][0] < s["professionalism"][2]
    for v in s.values():
        assert np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()


def test_distractors_deterministic_and_exclude_self():
    idx = distractor_index(20, 15)
    assert idx.shape == (20, 15)
    assert not (idx == np.arange(20)[:, None]).any()
    assert all(len(set(r)) == 15 for r in idx)
    assert np.array_equal(idx, distractor_index(20, 15))
    assert distractor_index(5, 15).shape == (5, 4)
    assert distractor_index(1, 15).shape == (1, 0)


def test_edge_cases(scorer):
    out = scorer.score(["", "你好"], ["", "嗯"])
    for name in METRICS:
        assert np.isfinite(out[name]).all() and ((out[name] >= 0) & (out[name] <= 1)).all()
    one = scorer.score(["睡眠怎么样"], ["不好"])
    assert one["relevance_rank"][0] == 1.0
    empty = scorer.score([], [])
    assert all(len(v) == 0 for v in empty.values())


def test_llm_faithfulness_with_fake_engine():
    from mdd.engines.base import Completion

    class Fake:
        def __init__(self):
            self.calls = 0

        async def generate(self, request):
            self.calls += 1
            assert request.sampling.choice == ("是", "否") and request.op == "Faithfulness"
            text = "否" if "编造" in request.messages[-1].content else "是"
            return Completion(text=text, prompt_tokens=1, output_tokens=1)

    eng = Fake()
    s = QualityScorer(make_embedder("hashing"), judge_engine=eng)
    out = s.score(["睡得好吗", "心情呢"], ["不好", "编造的内容"], records=["诊断：抑郁", "诊断：抑郁"])
    assert eng.calls == 2 and list(out["faithfulness"]) == [1.0, 0.0]
