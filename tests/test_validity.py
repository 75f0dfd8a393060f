"""The validity self-check: AUC on known rankings, the control recipes, and a blind evaluator
being reported loudly."""
from __future__ import annotations

import itertools
import logging
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from mdd.evaluate.validity import RECIPES, auc, format_validity, make_controls, sample_ids, self_check


def brute_auc(real, control):
    pairs = [(1.0 if r > c else 0.5 if r == c else 0.0) for r, c in itertools.product(real, control)]
    return sum(pairs) / len(pairs)


def test_auc_known_rankings_and_ties():
    assert auc([3, 4], [1, 2]) == 1.0
    assert auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 1], [1, 1]) == 0.5
    assert auc([2, 1], [1, 0]) == pytest.approx(3.5 / 4)  # one tie counts half
    assert auc([True, False, False], [False, False]) == pytest.approx(4 / 6)  # a boolean decision
    assert auc([0.5, np.nan], [0.2]) == 1.0  # NaN (unknown) dropped
    assert auc([], [1.0]) is None and auc([np.nan], [1.0]) is None
    rng = random.Random(3)
    for _ in range(20):
        real = [rng.randint(0, 5) for _ in range(rng.randint(1, 30))]
        control = [rng.randint(0, 5) for _ in range(rng.randint(1, 30))]
        assert auc(real, control) == pytest.approx(brute_auc(real, control))


def _dialogue(i, case, n=4):
    turns = []
    for k in range(n):
        turns.append({"speaker": "doctor", "text": f"问题{i}-{k}？", "topic": None})
        turns.append({"speaker": "patient", "text": f"回答{i}-{k}。", "topic": None})
    turns.append({"speaker": "doctor", "text": "诊断结束。", "topic": None})
    return {"dialogue_id": f"d{i}", "case_id": case, "turns": turns, "diagnosis": "焦虑状态", "icd_code": "F41.1"}


def test_control_recipes():
    dialogues = [_dialogue(i, f"c{i // 2}") for i in range(6)]
    answers = lambda d: [t["text"] for t in d["turns"] if t["speaker"] == "patient"]  # noqa: E731
    moved = make_controls(dialogues, "moved_within_dialogue")
    for d, c in zip(dialogues, moved):
        assert sorted(answers(d)) == sorted(answers(c))  # the same answers ...
        assert all(a != b for a, b in zip(answers(d), answers(c)))  # ... each at another question
        assert c["dialogue_id"] == d["dialogue_id"] + "~moved_within_dialogue"
    across = make_controls(dialogues, "moved_across_dialogues")
    for d, c in zip(dialogues, across):
        own_case = {a for o in dialogues if o["case_id"] == d["case_id"] for a in answers(o)}
        assert not set(answers(c)) & own_case
    fillers = make_controls(dialogues, "filler")
    assert all(len(a) <= 8 for c in fillers for a in answers(c))
    leaks = make_controls(dialogues, "diagnosis_leak")
    assert all(("焦虑状态" in a or "F41.1" in a) and "回答" in a for c in leaks for a in answers(c))
    assert make_controls(dialogues, "filler") == fillers  # deterministic
    with pytest.raises(ValueError):
        make_controls(dialogues, "nonsense")
    assert sample_ids([f"d{i}" for i in range(50)], 10) == sample_ids([f"d{i}" for i in reversed(range(50))], 10)


@pytest.fixture(scope="module")
def shared_sample(tmp_path_factory):
    from _evaldata import import_shared
    from mdd.evaluate.scoring import corpus_df

    out = tmp_path_factory.mktemp("validity")
    table = import_shared(out)
    keep = pa.array(sample_ids(table.column("dialogue_id").to_pylist(), 24))
    sample = table.filter(pc.is_in(table.column("dialogue_id"), value_set=keep))
    return sample, corpus_df(out, 300)


def test_self_check_separates_on_real_dialogues(shared_sample):
    from mdd.index.embedders import make_embedder
    from mdd.evaluate.scoring import ExchangeScorer

    sample, idf = shared_sample
    summary, rows = self_check(ExchangeScorer(make_embedder("hashing"), idf=idf), sample, per_batch=12,
                               min_auc=0.8, max_control_hq_share=0.1)
    assert summary["separated"] is True and set(summary["recipes"]) == set(RECIPES)
    assert summary["real_hq_share"] > 0.4
    assert rows.num_rows == len(RECIPES) * 11
    lines = format_validity(summary)
    assert lines[0].startswith("validity self-check on 24 dialogues") and not any("WARNING" in x for x in lines)


def test_a_blind_evaluator_says_so_loudly(shared_sample, tmp_path, caplog):
    from importlib import resources

    from mdd.index.embedders import make_embedder
    from mdd.evaluate.scoring import ExchangeScorer

    sample, idf = shared_sample
    lex = yaml.safe_load(resources.files("mdd.knowledge").joinpath("lexicons.yaml").read_text(encoding="utf-8"))
    # an evaluator whose relevance gate is off and whose relevance score ignores the answer
    lex["gates"]["relevance"].update(min_z=-1e9, min_fit=0.0)
    lex["scoring"]["relevance"].update(z_mid=-1e9, fit_full=1e-9)
    path = tmp_path / "blind.yaml"
    path.write_text(yaml.safe_dump(lex, allow_unicode=True), encoding="utf-8")
    scorer = ExchangeScorer(make_embedder("hashing"), threshold=0.0, idf=idf, lexicon=str(path))
    with caplog.at_level(logging.WARNING, logger="mdd.evaluate"):
        summary, _ = self_check(scorer, sample, per_batch=12, min_auc=0.8, max_control_hq_share=0.1,
                                lexicon=str(path))
    assert summary["separated"] is False
    assert summary["recipes"]["moved_within_dialogue"]["separated"] is False
    assert summary["recipes"]["filler"]["separated"] is True  # the filler gate still works
    assert any("VALIDITY" in r.message and "moved_within_dialogue" in r.message for r in caplog.records)
    assert any(line.startswith("WARNING") for line in format_validity(summary))
