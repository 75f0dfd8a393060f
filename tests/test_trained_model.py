"""Short dialogues end to end on the trained model (configs/local-real.yaml: Qwen2.5-Coder-1.5B-Instruct
on vLLM's CPU build), so that a prompt or guard change that breaks a trained model fails the suite.

The model is fetched once per machine into the model cache (`mdd models fetch`, ~2 minutes the first
time; afterwards found in ~/.cache/mdd/models). vLLM's CPU build samples without seeds, so a run is not
repeatable: two dialogues run, each must end either clean (every turn passes the guards again, the
closing names the diagnosis) or as a counted failure with its guards' reasons, and at least one ends
clean. The case is the sample case whose record documents thoughts of dying (S10, postpartum
depression: "不如和孩子一起消失"), the one a trained model was seen to deny."""
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from mdd import models

REPO = Path(__file__).resolve().parents[1]
CASE = "S10"
EXCHANGES = 8
VARIANTS = 2

pytestmark = pytest.mark.trained


@pytest.fixture(scope="module")
def real_run(ray_session, tmp_path_factory):
    from jobs.run import main as run_main

    models.fetch("qwen2.5-coder-1.5b", log=print)  # idempotent: cached per machine
    tmp = tmp_path_factory.mktemp("real")
    cases = json.loads((REPO / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    (tmp / "cases.json").write_text(json.dumps([c for c in cases if c["患者"] == CASE], ensure_ascii=False),
                                    encoding="utf-8")
    cfg = yaml.safe_load((REPO / "configs" / "local-real.yaml").read_text(encoding="utf-8"))
    cfg["synth"]["dialogue"]["max_exchanges"] = EXCHANGES  # a short interview: the closing comes at the cap
    cfg["synth"]["in_flight"] = VARIANTS
    (tmp / "real.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    out = tmp / "out"
    rc = run_main(["--config", str(tmp / "real.yaml"), "--cases", str(tmp / "cases.json"), "--out", str(out),
                   "--variants", str(VARIANTS), "--no-progress"])
    return rc, out


def test_a_trained_model_writes_a_clean_dialogue(real_run):
    from mdd.dialogue import guards as G
    from mdd.cases import case_fields
    from mdd.cases import load_cases

    rc, out = real_run
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    g = run["synthesize"]["guards"]
    failed = pq.read_table(out / "failures.parquet").to_pylist() if (out / "failures.parquet").exists() else []
    rows = pq.read_table(out / "synth").to_pylist() if (out / "synth").exists() else []
    assert rc == 0 and len(rows) + len(failed) == VARIANTS
    # a failure is counted with its reasons, never written clean
    for f in failed:
        assert f["guards"] and f["error"].startswith("guard") and f["guard_events"], f["error"]
    assert not {f["dialogue_id"] for f in failed} & {r["dialogue_id"] for r in rows}
    assert rows, [(f["error"][:200], f["guard_events"]) for f in failed]
    case = load_cases(REPO / "data" / "cases")[0]
    facts = G.RecordFacts.of(case_fields(next(c for c in case if c.case_id == CASE)))
    for row in rows:
        assert row["engine"] == "vllm" and row["model"].endswith("qwen2.5-coder-1.5b")  # the fetched folder
        assert row["n_exchanges"] == EXCHANGES  # the cap ends these short interviews
        # every turn the guards let through holds up when the whole dialogue is checked again
        assert not G.check_dialogue(row["turns"], facts, G.is_thought_topic).failures
        assert row["diagnosis"] == "抑郁状态" and "抑郁" in row["turns"][-1]["text"]  # the closing names it
        assert row["regenerations"] == len({(e["turn"], e["speaker"], e["attempt"]) for e in row["guard_events"]})
    # the accounting says what happened
    assert g["dialogues"] == VARIANTS and g["dialogues_failed"] == len(failed)
    assert g["turns_generated"]["doctor"] >= EXCHANGES * len(rows)
    (by,) = run["synthesize"]["usage_by_model_and_role"].values()  # one model for every role
    assert by["doctor"]["calls"] >= EXCHANGES and by["patient"]["output_tokens"] > 0
    # and the evaluation ran over the clean ones
    turns = pq.read_table(out / "eval" / "turns")
    assert turns.num_rows == EXCHANGES * len(rows) and "turn_guards" in turns.column_names
