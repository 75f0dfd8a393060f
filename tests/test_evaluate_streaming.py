"""The streamed evaluation stage: per-shard workers write the tables, the driver merges partials.

The sample cases' dialogues (the main job's, made in-process) are written as four synth shards.
The stage's tables must hold the same rows with the same values as the same evaluator computed
another way: in this process, the whole run as one table (every shard's dialogues scored in the
stage's distractor batches, the rules of all dialogues judged at once, the per-dialogue means and
the coverage matrix folded from the whole tables). A rerun evaluates only a new shard, and the
outputs of a shard that is gone are dropped.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from mdd.config import load_config
from mdd.schema import DIALOGUE, METRICS, RULE_RESULT, TURN_EVAL

CFG = "configs/local.yaml"
IDF_SAMPLE = 40  # under the first run's 60 dialogues: the IDF is full and kept when the run grows


def _cfg():
    return load_config(CFG, {"evaluate.idf_sample_dialogues": IDF_SAMPLE})


def _sort(t: pa.Table, keys: list[str]) -> pa.Table:
    return t.take(pc.sort_indices(t, sort_keys=[(k, "ascending") for k in keys]))


@pytest.fixture(scope="module")
def staged(ray_session, sample_run, tmp_path_factory):
    from mdd.synthesize.plan import shard_name
    from mdd.synthesize.run import write_cases
    from mdd.storage import open_store

    out = tmp_path_factory.mktemp("stream") / "out"
    store = open_store(out)
    write_cases(store, list(sample_run["cases"].values()))
    rows = sorted(sample_run["rows"], key=lambda r: r["dialogue_id"])[:80]
    shards = {}
    for k in range(4):  # shards of 20, 20, 20 and 8 dialogues, every 4th dialogue in shard k
        part = rows[k::4] if k < 3 else rows[3::4][:8]
        ids = [r["dialogue_id"] for r in part]
        shards[shard_name(ids)] = pa.Table.from_pylist(part, schema=DIALOGUE)
    names = list(shards)  # in the order made: the fourth is added later
    for name in names[:3]:
        store.write_table(shards[name], f"synth/{name}")
    return out, store, shards, names


def _evaluate(out, **kw) -> dict:
    from mdd.evaluate.stage import run_evaluate

    return run_evaluate(_cfg(), out, quiet=True, **kw)


def _expected(store, shards: dict[str, pa.Table], names: list[str]) -> dict[str, pa.Table]:
    """The same evaluator, computed another way: in this process, on whole tables."""
    from mdd.evaluate.coverage import coverage_table
    from mdd.index.embedders import make_embedder
    from mdd.evaluate.rule_set import load_rules
    from mdd.evaluate.rules import evaluate_rules
    from mdd.evaluate.scoring import ExchangeScorer, corpus_df, load_records
    from mdd.evaluate.stage import EXCHANGES_PER_DIALOGUE
    from mdd.evaluate.streaming import distractor_batches

    ev = _cfg().evaluate
    per_batch = ev.batch_size // EXCHANGES_PER_DIALOGUE
    scorer = ExchangeScorer(make_embedder("hashing"), threshold=ev.threshold, distractors=ev.distractors,
                            idf=corpus_df(store, ev.idf_sample_dialogues, [f"synth/{n}" for n in sorted(names)]),
                            records=load_records(store))
    turns = pa.concat_tables([scorer.score(b) for n in names for b in distractor_batches(shards[n], per_batch)])
    turns = _sort(turns.select([f.name for f in TURN_EVAL]).cast(TURN_EVAL), ["dialogue_id", "turn"])
    dialogues = pa.concat_tables([shards[n] for n in names])
    rules = _sort(pa.Table.from_pylist(evaluate_rules(dialogues.to_pylist(), load_rules(ev.rule_sets), "keyword"),
                                       schema=RULE_RESULT), ["dialogue_id", "rule"])
    agg = _sort(turns.group_by("dialogue_id").aggregate([(m, "mean") for m in METRICS]
                                                        + [("high_quality", "sum"), ("turn", "count")]),
                ["dialogue_id"])
    icd = dict(zip(dialogues.column("dialogue_id").to_pylist(), dialogues.column("icd_code").to_pylist()))
    return {"turns": turns, "rules": rules, "agg": agg, "coverage": coverage_table(rules, icd)}


def _read(out, table: str, keys: list[str]) -> pa.Table:
    return _sort(pq.read_table(out / "eval" / table), keys)


def test_streamed_tables_equal_the_whole_table_computation(staged):
    out, store, shards, names = staged
    s = _evaluate(out)
    want = _expected(store, shards, names[:3])
    for name in names[:3]:  # one file per input shard in each table, sorted within the file
        t = pq.read_table(out / "eval" / "turns" / name)
        keys = list(zip(t.column("dialogue_id").to_pylist(), t.column("turn").to_pylist()))
        assert keys == sorted(keys) and set(t.column("dialogue_id").to_pylist()) == set(
            shards[name].column("dialogue_id").to_pylist())
    turns = _read(out, "turns", ["dialogue_id", "turn"])
    assert turns.num_rows == want["turns"].num_rows > 1000
    assert turns.equals(want["turns"])  # every row, every value
    assert _read(out, "rules", ["dialogue_id", "rule"]).equals(want["rules"])
    dial = _read(out, "dialogues", ["dialogue_id"])
    assert dial.column("dialogue_id").equals(want["agg"].column("dialogue_id"))
    for m in METRICS:
        assert np.allclose(dial.column(m).to_numpy(zero_copy_only=False).astype(float),
                           want["agg"].column(f"{m}_mean").to_numpy(zero_copy_only=False).astype(float),
                           rtol=0, atol=1e-12, equal_nan=True), m
    assert dial.column("n_high_quality").to_pylist() == want["agg"].column("high_quality_sum").to_pylist()
    assert _read(out, "coverage", ["icd_prefix", "item"]).equals(want["coverage"])
    # the summary, merged from partials, is the whole tables' summary
    hq = turns.column("high_quality").to_pylist()
    assert s["exchanges"] == turns.num_rows and s["high_quality"] == sum(hq) and s["dialogues"] == 60
    reasons = turns.column("hq_reason").to_pylist()
    assert {k: v for k, v in s["hq_reasons"].items() if v} == {r: reasons.count(r) for r in set(reasons)}
    for m in METRICS:
        assert s["metric_means"][m] == pytest.approx(pc.mean(turns.column(m)).as_py(), abs=1e-12), m
    trig = sum(bool(t) for t in want["rules"].column("triggered").to_pylist())
    assert sum(r["triggered"] for r in s["rules"].values()) == trig
    assert s["incremental"]["evaluated"] == 3 and s["incremental"]["idf_refit"] is True


def test_a_rerun_evaluates_only_new_shards_and_drops_gone_ones(staged):
    out, store, shards, names = staged
    before = {p.name: p.stat().st_ino for p in (out / "eval" / "turns").iterdir()}
    first = json.loads((out / "run.json").read_text(encoding="utf-8"))["evaluate"]
    s = _evaluate(out)  # nothing new
    assert (s["incremental"]["evaluated"], s["incremental"]["kept"]) == (0, 3)
    assert s["high_quality"] == first["high_quality"] and s["metric_means"] == first["metric_means"]
    store.write_table(shards[names[3]], f"synth/{names[3]}")  # a resumed synthesis added a shard
    s = _evaluate(out)
    inc = s["incremental"]
    assert (inc["evaluated"], inc["kept"], inc["dropped"], inc["idf_refit"]) == (1, 3, 0, False)
    after = {p.name: p.stat().st_ino for p in (out / "eval" / "turns").iterdir()}
    assert set(after) == set(before) | {names[3]}
    assert all(after[n] == before[n] for n in before)  # the kept shards' files carried over, not rewritten
    assert s["dialogues"] == 68 and s["exchanges"] == pq.read_table(out / "eval" / "turns").num_rows
    # the new shard scored with the kept IDF: as a full evaluation of the four shards with that IDF would
    state = json.loads((out / "eval" / "state.json").read_text(encoding="utf-8"))
    assert sorted(state["shards"]) == sorted(names) and state["idf"]["dialogues"] == IDF_SAMPLE
    (out / "synth" / names[0]).unlink()  # a shard gone: its outputs are dropped
    s = _evaluate(out)
    assert (s["incremental"]["evaluated"], s["incremental"]["dropped"]) == (0, 1)
    for t in ("turns", "rules", "dialogues", "pairs"):
        assert sorted(p.name for p in (out / "eval" / t).iterdir()) == sorted(names[1:])
    assert s["dialogues"] == 68 - 20
    full = _evaluate(out, full=True)  # a full re-evaluation refits the IDF on the shards now there
    assert full["incremental"]["evaluated"] == 3 and full["incremental"]["idf_refit"] is True
