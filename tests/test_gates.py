"""The high-quality decision: each gate and hq_reason on hand-made exchanges, the thresholds read
from YAML, and the whole pipeline on real (shared MDD-5k) and synthesized dialogues."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from mdd.evaluate import gates
from mdd.evaluate.gates import GATES, OK, decide, gate_spec

POLAR_Q = "你最近有没有想过伤害自己？"
OPEN_Q = "最近睡眠怎么样？晚上几点睡，早上几点醒？"
GOOD_A = "最近睡得很差，晚上一两点才睡着，早上五点多就醒了，醒了就再也睡不着。"


def run(rows, threshold=0.7, lexicon=None):
    """rows: dicts with q, a and optional z, fit, faith, overall, diagnosis, icd, record."""
    hq, reasons = decide(
        [r["q"] for r in rows], [r["a"] for r in rows],
        np.array([r.get("overall", 0.9) for r in rows]), threshold,
        np.array([r.get("z", 5.0) for r in rows]), np.array([r.get("fit", 1.0) for r in rows]),
        [r.get("faith") for r in rows], [r.get("diagnosis", "抑郁状态") for r in rows],
        [r.get("icd", "F32.901") for r in rows], records=[r.get("record") for r in rows], lexicon=lexicon)
    assert list(hq) == [x == OK for x in reasons]
    return reasons


def test_each_gate_on_hand_made_exchanges():
    record = "患者近2月来无明显诱因出现情绪低落，兴趣减退，入睡困难，早醒，食欲减退，体重下降约3公斤。"
    cases = [
        ({"q": OPEN_Q, "a": GOOD_A}, OK),
        ({"q": OPEN_Q, "a": "嗯。"}, "filler"),
        ({"q": OPEN_Q, "a": "不知道。"}, "filler"),
        ({"q": OPEN_Q, "a": "嗯嗯，还好吧，说不清。"}, "filler"),
        ({"q": OPEN_Q, "a": ""}, "filler"),
        ({"q": OPEN_Q, "a": OPEN_Q}, "echo"),
        ({"q": OPEN_Q, "a": "医生说我是抑郁状态，" + GOOD_A}, "leak"),
        ({"q": OPEN_Q, "a": GOOD_A + "我的编码是F32.901。"}, "leak"),
        ({"q": OPEN_Q, "a": "我查过，我这是抑郁症。" + GOOD_A, "diagnosis": "焦虑状态", "icd": "F41.1"}, "leak"),
        ({"q": OPEN_Q, "a": "单子上写着F41.1。" + GOOD_A}, "leak"),  # any ICD-like code, not only the case's own
        ({"q": OPEN_Q, "a": "最近两个月无明显诱因出现情绪低落，兴趣减退，入睡困难，早醒，食欲减退。", "record": record},
         "record_copy"),
        ({"q": OPEN_Q, "a": GOOD_A, "z": 0.5}, "off_question"),
        ({"q": OPEN_Q, "a": GOOD_A, "fit": 0.5}, "off_question"),
        ({"q": OPEN_Q, "a": GOOD_A, "faith": 0.0}, "contradiction"),
        ({"q": OPEN_Q, "a": GOOD_A, "faith": 1.0}, OK),
        ({"q": OPEN_Q, "a": GOOD_A, "faith": None}, OK),  # unknown faithfulness is no gate
        ({"q": OPEN_Q, "a": GOOD_A, "overall": 0.69}, "below_threshold"),
    ]
    reasons = run([r for r, _ in cases])
    assert reasons == [want for _, want in cases]
    assert set(reasons) <= set(GATES) | {OK}


def test_gates_apply_in_order():
    # a filler that would also be off the question and below the threshold: the first gate is named
    assert run([{"q": OPEN_Q, "a": "嗯。", "z": -1.0, "overall": 0.1}]) == ["filler"]
    # a leak off the question: the leak is named
    assert run([{"q": OPEN_Q, "a": "医生说我是抑郁状态。", "z": -1.0}]) == ["leak"]


def test_terse_answers_in_kind_are_informative():
    rows = [
        {"q": POLAR_Q, "a": "没有。", "z": 0.0, "fit": 0.0},  # a denial to a simple yes/no question
        {"q": POLAR_Q, "a": "从来没有。", "z": 0.0, "fit": 0.0},
        {"q": POLAR_Q, "a": "嗯，对。", "z": 0.0, "fit": 0.0},  # a bare affirmation leaves what it affirms untold
        {"q": POLAR_Q, "a": "有过，上个月划过手腕。", "z": 0.0, "fit": 0.0},  # an affirmation with content: relevance decides
        {"q": "这种情况持续多久了？", "a": "两个多月。", "z": 0.0, "fit": 0.0},  # a duration, in kind
        {"q": POLAR_Q, "a": "嗯。", "z": 0.0},  # a filler stays a filler
        {"q": POLAR_Q, "a": "不知道。", "z": 0.0},  # so does a non-committal answer
        {"q": OPEN_Q, "a": "没有。", "z": 0.0},  # not an answer in kind to an open question
        {"q": "睡眠方面最近怎么样？比如是否入睡困难、早醒？", "a": "没有……", "z": 0.0},  # a screening part: in kind
        {"q": POLAR_Q, "a": "没有，" + GOOD_A, "z": 0.0},  # long answers are judged by their relevance
    ]
    assert run(rows) == [OK, OK, "filler", "off_question", OK, "filler", "filler", "filler", OK, "off_question"]


def test_denials_of_family_history_are_no_leak():
    spec = gate_spec()
    terms = gates.label_terms("抑郁状态", "F32.901", spec)
    assert not gates.leaks("家里没有人被诊断过抑郁症或者焦虑症。", terms, spec)
    assert not gates.leaks("从来没听说过谁得了焦虑症。", terms, spec)
    assert gates.leaks("我得了抑郁症，已经两年了。", terms, spec)
    assert gates.label_terms("心境［情感］障碍", "F39.x00", spec) == ["心境［情感］障碍", "心境障碍", "F39.x00"]


def test_thresholds_come_from_the_yaml(tmp_path):
    from mdd.evaluate.quality import LEXICON_FILE, LEXICON_PACKAGE, load_lexicon

    from importlib import resources

    lex = yaml.safe_load(resources.files(LEXICON_PACKAGE).joinpath(LEXICON_FILE).read_text(encoding="utf-8"))
    row = {"q": OPEN_Q, "a": GOOD_A, "z": 2.5}
    assert run([row]) == [OK]
    lex["gates"]["relevance"]["min_z"] = 3.0
    path = tmp_path / "lex.yaml"
    path.write_text(yaml.safe_dump(lex, allow_unicode=True), encoding="utf-8")
    assert run([row], lexicon=str(path)) == ["off_question"]
    del lex["gates"]["relevance"]
    path.write_text(yaml.safe_dump(lex, allow_unicode=True), encoding="utf-8")
    load_lexicon.cache_clear()
    gate_spec.cache_clear()
    with pytest.raises(ValueError, match="gates"):
        gate_spec(str(path))


# --- the whole pipeline on real and synthesized dialogues -----------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    from _evaldata import import_shared

    out = tmp_path_factory.mktemp("shared")
    return out, import_shared(out)


def _scorer(out):
    from mdd.index.embedders import make_embedder
    from mdd.evaluate.scoring import ExchangeScorer, corpus_df, load_records

    return ExchangeScorer(make_embedder("hashing"), idf=corpus_df(out, 300), records=load_records(out))


def _score_all(scorer, dialogues, per_batch=12):
    from mdd.evaluate.validity import score_dialogues

    return score_dialogues(scorer, dialogues, per_batch)


def test_real_dialogues_keep_a_high_quality_share_and_controls_do_not(shared):
    from mdd.evaluate.validity import auc, make_controls

    out, table = shared
    scorer = _scorer(out)
    rows = table.to_pylist()
    real = _score_all(scorer, rows)
    real_hq = np.mean(real.column("high_quality").to_numpy(zero_copy_only=False))
    assert real_hq >= 0.45, real_hq
    pa_real = real.column("patient_ability").to_numpy()
    assert real.column("faithfulness").null_count == real.num_rows  # imported: no record, unknown
    guarded = [any(g.startswith("answer:") for g in gs) for gs in real.column("turn_guards").to_pylist()]
    assert 0 < sum(guarded) < 0.01 * len(guarded)  # real answers rarely trip a turn guard
    for recipe, max_hq in (("filler", 0.0), ("diagnosis_leak", 0.0), ("moved_within_dialogue", 0.03),
                           ("moved_across_dialogues", 0.04), ("echo", 0.0), ("loop", 0.0), ("role_swap", 0.0)):
        ctrl = _score_all(scorer, make_controls(rows, recipe))
        share = np.mean(ctrl.column("high_quality").to_numpy(zero_copy_only=False))
        assert share <= max_hq, (recipe, share)
        if recipe != "diagnosis_leak":
            assert auc(pa_real, ctrl.column("patient_ability").to_numpy()) >= 0.85, recipe
    # hq_reason agrees with high_quality row by row
    hq = real.column("high_quality").to_pylist()
    assert all(h == (r == OK) for h, r in zip(hq, real.column("hq_reason").to_pylist()))


def test_synthesized_dialogues_are_checked_against_their_records(tmp_path):
    from _evaldata import synthesize_scripted
    from mdd.evaluate.validity import make_controls

    table = synthesize_scripted(tmp_path, n_cases=6, variants=2)
    scorer = _scorer(tmp_path)
    rows = table.to_pylist()
    real = _score_all(scorer, rows)
    faith = real.column("faithfulness").to_numpy(zero_copy_only=False)
    assert real.column("faithfulness").null_count == 0 and np.nanmean(faith) > 0.9
    assert 0 < np.mean(real.column("high_quality").to_numpy(zero_copy_only=False)) < 0.6
    for recipe in ("filler", "diagnosis_leak"):
        ctrl = _score_all(scorer, make_controls(rows, recipe))
        assert not any(ctrl.column("high_quality").to_pylist()), recipe
    # an answer that affirms what the record denies is a contradiction, never high quality
    flipped = []
    for d in rows:
        turns = [dict(t) for t in d["turns"]]
        for t in turns:
            if t["speaker"] in ("patient", "companion") and t.get("topic") != "开场":  # every answerer
                t["text"] = "我经常听到有声音在耳边议论我，还总觉得有人跟踪我、要害我。"
        flipped.append({**d, "turns": turns})
    ctrl = _score_all(scorer, flipped)
    assert not any(ctrl.column("high_quality").to_pylist())
    assert math.isclose(min(ctrl.column("faithfulness").to_pylist()), 0.0)
