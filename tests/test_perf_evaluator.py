"""The evaluator benchmark's pieces (mdd/perf/evaluator.py, jobs/bench_evaluator.py) on a few shared dialogues."""
from __future__ import annotations

import json

import numpy as np

from mdd.perf.evaluator import HELD_OUT, TUNED, _Memo, held_out_controls, measure, relevance_options


def test_held_out_recipes_replace_every_answer(tmp_path):
    from _evaldata import import_shared
    from mdd.evaluate.validity import _patient_slots

    rows = import_shared(tmp_path).slice(0, 10).to_pylist()
    for recipe in HELD_OUT:
        ctrl = held_out_controls(rows, recipe)
        assert len(ctrl) == len(rows)
        for d, c in zip(rows, ctrl):
            slots = _patient_slots(d["turns"])
            changed = sum(d["turns"][i]["text"] != c["turns"][i]["text"] for i in slots)
            assert changed >= len(slots) - 1, recipe  # (a neighbour may repeat itself)
            if recipe == "similar_question_other_case":
                own = {t["text"] for o in rows if o["case_id"] == d["case_id"] for t in o["turns"]}
                assert not any(c["turns"][i]["text"] in own for i in slots)


def test_measure_and_options_on_a_subset(tmp_path):
    from _evaldata import import_shared
    from mdd.index.embedders import make_embedder

    table = import_shared(tmp_path).slice(0, 12)
    memo = _Memo(make_embedder("hashing"))
    r = measure(table, memo, recipes=("filler", "question_echo"))
    assert r["dialogues"] == 12 and set(r["recipes"]) == {"filler", "question_echo"}
    assert r["recipes"]["filler"]["tuned_on"] and not r["recipes"]["question_echo"]["tuned_on"]
    assert r["recipes"]["filler"]["hq_share"] == 0.0 and r["real"]["hq_share"] > 0.3
    opts = relevance_options(table, {"hashing": memo}, recipes=("moved_across_dialogues",))
    assert opts["IDF n-gram z (calibrated)"]["moved_across_dialogues"] > 0.85
    # the self-check's recipes: the four the gates were chosen on, and the trained model's collapse shapes
    assert set(TUNED) <= {"moved_within_dialogue", "moved_across_dialogues", "filler", "diagnosis_leak",
                          "echo", "loop", "role_swap"}
    # the memo encodes each distinct text once and gives the same vectors
    v = memo.encode(["睡不着", "睡不着"])
    assert np.array_equal(v[0], v[1]) and len(memo.cache) >= 1


def test_bench_evaluator_job_writes_its_json(tmp_path):
    from _evaldata import MDD5K
    from jobs.bench_evaluator import main

    src = tmp_path / "slice"
    (src / "dialogues").mkdir(parents=True)
    (src / "labels").mkdir()
    for name in ("patient_1", "patient_102"):  # two case files (10 dialogues): links, not copies
        (src / "dialogues" / f"{name}.json").symlink_to(MDD5K / "dialogues" / f"{name}.json")
        (src / "labels" / f"{name}_label.json").symlink_to(MDD5K / "labels" / f"{name}_label.json")
    out = tmp_path / "bench.json"
    assert main(["--src", str(src), "--out", str(out), "--repeats", "1"]) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    run = res["runs"]["mdd5k/hashing/lexical"]
    assert run["dialogues"] == 10 and set(run["recipes"]) == set(TUNED) | set(HELD_OUT)
    assert "IDF n-gram z (calibrated)" in res["relevance_options"]["mdd5k/hashing"]
    cost = res["scoring_cost"]
    assert cost["dialogues"] == 10 and cost["seed"]["median"] > 0 and cost["stage"]["median"] > 0
