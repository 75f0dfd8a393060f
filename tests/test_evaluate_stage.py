"""The evaluation stage end to end on Ray Data, on the imported shared MDD-5k dialogues."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mdd.evaluate.gates import GATES
from mdd.evaluate.validity import RECIPES
from mdd.schema import COVERAGE, DIALOGUE_EVAL, METRICS, QA_SIDECAR, RULE_RESULT, TURN_EVAL, VALIDITY

MDD5K = Path(__file__).parents[1].parent / "shared" / "mdd5k"


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    from jobs.import_mdd5k import main as import_main
    from jobs.evaluate import main as evaluate_main

    out = tmp_path_factory.mktemp("eval")
    assert import_main(["--dialogues", str(MDD5K / "dialogues"), "--labels", str(MDD5K / "labels"),
                        "--out", str(out)]) == 0
    (out / "run.json").write_text(json.dumps({"synth": {"dialogues": 100}}), encoding="utf-8")
    assert evaluate_main(["--out", str(out), "--embedder", "hashing", "--judge", "keyword"]) == 0
    first = {
        "files": _files(out / "eval") + _files(out / "index"),
        "turns": pq.read_table(out / "eval" / "turns"),
        "faiss": (out / "index" / "qa.faiss").read_bytes(),
    }
    return out, first


def test_every_exchange_scored(run):
    out, first = run
    turns = first["turns"]
    assert turns.schema.equals(TURN_EVAL, check_metadata=False)
    synth = pq.read_table(out / "synth")
    assert turns.num_rows == sum(synth.column("n_exchanges").to_pylist())
    keys = list(zip(turns.column("dialogue_id").to_pylist(), turns.column("turn").to_pylist()))
    assert len(set(keys)) == len(keys)
    expected = {(d, t) for d, n in zip(synth.column("dialogue_id").to_pylist(),
                                       synth.column("n_exchanges").to_pylist()) for t in range(n)}
    assert set(keys) == expected
    for m in METRICS:
        if m == "faithfulness":  # imported dialogues have no case record: unknown, not a constant
            assert turns.column(m).null_count == turns.num_rows
            continue
        v = turns.column(m).to_numpy()
        assert turns.column(m).null_count == 0 and np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all(), m
    share = float(np.mean(turns.column("high_quality").to_numpy(zero_copy_only=False)))
    assert 0.25 < share < 0.99
    reasons = turns.column("hq_reason").to_pylist()
    assert set(reasons) <= set(GATES) | {"ok"}
    assert turns.column("high_quality").to_pylist() == [r == "ok" for r in reasons]


def test_dialogues_rules_and_run_json(run):
    out, first = run
    turns = first["turns"]
    dial = pq.read_table(out / "eval" / "dialogues")
    assert dial.schema.equals(DIALOGUE_EVAL, check_metadata=False)
    assert dial.num_rows == 100
    assert sum(dial.column("n_exchanges").to_pylist()) == turns.num_rows
    n_hq = int(np.sum(turns.column("high_quality").to_numpy(zero_copy_only=False)))
    assert sum(dial.column("n_high_quality").to_pylist()) == n_hq
    rules = pq.read_table(out / "eval" / "rules")
    assert rules.schema.equals(RULE_RESULT, check_metadata=False)
    assert set(rules.column("dialogue_id").to_pylist()) == set(dial.column("dialogue_id").to_pylist())
    n_trig = sum(bool(t) for t in rules.column("triggered").to_pylist())
    assert sum(dial.column("rules_triggered").to_pylist()) == n_trig
    run_json = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run_json["synth"] == {"dialogues": 100}  # merged, not overwritten
    ev = run_json["evaluate"]
    assert ev["dialogues"] == 100 and ev["exchanges"] == turns.num_rows and ev["high_quality"] == n_hq
    assert ev["embedder"] == "hashing" and ev["judge"] == "keyword"
    assert set(ev["metric_means"]) == set(METRICS) and ev["metric_means"]["faithfulness"] is None
    assert ev["faithfulness"] == "record" and ev["faithfulness_known"] == 0
    assert sum(ev["hq_reasons"].values()) == turns.num_rows and ev["hq_reasons"]["ok"] == n_hq
    assert ev["dialogues_per_s"] > 0 and ev["exchanges_per_s"] > 0
    assert sum(r["triggered"] for r in ev["rules"].values()) == n_trig


def test_validity_self_check_is_written(run):
    out, first = run
    v = json.loads((out / "run.json").read_text(encoding="utf-8"))["evaluate"]["validity"]
    assert v["separated"] is True and v["sample_dialogues"] == 40
    assert set(v["recipes"]) == set(RECIPES)
    for name, r in v["recipes"].items():
        assert r["control_hq_share"] <= 0.05 and r["auc"]["patient_ability"] >= 0.85, (name, r)
    table = pq.read_table(out / "eval" / "validity.parquet")
    assert table.schema.equals(VALIDITY, check_metadata=False)
    assert table.num_rows == len(RECIPES) * (len(METRICS) + 1)
    rows = {(r["control"], r["metric"]): r for r in table.to_pylist()}
    assert rows[("filler", "high_quality")]["control_mean"] == v["recipes"]["filler"]["control_hq_share"]
    assert rows[("filler", "high_quality")]["real_mean"] == v["real_hq_share"]


def test_required_items_coverage_of_the_released_corpus(run):
    """A known answer: MDD-5k's doctors ask about suicidal ideation but hardly ever about past
    attempts, access to means, harm to others, substance use or the thyroid (the gaps the
    checklist closes); the matrix shows both sides."""
    out, _ = run
    cov = pq.read_table(out / "eval" / "coverage")
    assert cov.schema.equals(COVERAGE, check_metadata=False)
    share = {(r["icd_prefix"], r["item"]): r["share"] for r in cov.to_pylist()}
    assert share[("F32", "risk_ideation")] >= 0.8 and share[("F32", "mood_low")] >= 0.9
    for item in ("risk_past_attempt", "risk_means", "risk_harm_others", "substance_other", "physical_thyroid"):
        assert share[("F32", item)] <= 0.15, item
    ev = json.loads((out / "run.json").read_text(encoding="utf-8"))["evaluate"]["coverage"]
    assert ev["matrix"]["F32"]["physical_thyroid"] == share[("F32", "physical_thyroid")]
    assert 0 < ev["asked"] < ev["required"] and "F32:risk_means" in " ".join(ev["missing_cells"])


def test_index_matches_high_quality(run):
    from mdd.index import index_vectors

    out, first = run
    turns = first["turns"]
    hq = turns.filter(turns.column("high_quality"))
    side = pq.read_table(out / "index" / "qa.parquet")
    assert side.schema.equals(QA_SIDECAR, check_metadata=False)
    ids, vecs = index_vectors(out)
    assert len(ids) == side.num_rows == len(set(zip(hq.column("question").to_pylist(), hq.column("answer").to_pylist())))
    assert sum(side.column("count").to_pylist()) == hq.num_rows  # every HQ exchange, duplicates counted
    assert set(zip(side.column("dialogue_id").to_pylist(), side.column("turn").to_pylist())) <= set(
        zip(hq.column("dialogue_id").to_pylist(), hq.column("turn").to_pylist()))
    assert side.column("diagnosis").null_count == 0
    meta = json.loads((out / "index" / "meta.json").read_text())
    assert meta["embedder"] == "hashing" and meta["pairs"] == hq.num_rows and meta["bytes"]["per_pair"] <= 2048


def test_rerun_replaces_and_is_deterministic(run, capsys):
    from jobs.evaluate import main as evaluate_main

    out, first = run
    assert evaluate_main(["--out", str(out), "--quiet"]) == 0
    assert _files(out / "eval") + _files(out / "index") == first["files"]
    assert pq.read_table(out / "eval" / "turns").equals(first["turns"])
    assert (out / "index" / "qa.faiss").read_bytes() == first["faiss"]


def test_missing_synth(tmp_path, capsys):
    from jobs.evaluate import main as evaluate_main

    assert evaluate_main(["--out", str(tmp_path), "--quiet"]) == 1
    assert "no dialogue shards" in capsys.readouterr().err
