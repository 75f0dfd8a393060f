"""The evaluation stage on Ray Data.

    read_parquet(OUT/synth) ─┬─ map_batches(explode: dialogues → exchanges)
                             │   → map_batches(_Scorer actors: embeddings + metrics, in-batch distractors)
                             │   → OUT/eval/turns/ (TURN_EVAL)  +  FAISS index of high-quality pairs → OUT/index/
                             └─ map_batches(_RuleRunner actors: rule judge) → OUT/eval/rules/ (RULE_RESULT)
    per-dialogue means + counts → OUT/eval/dialogues/ (DIALOGUE_EVAL);  summary → OUT/run.json["evaluate"]

Outputs are collected in the driver (small at this scale), sorted and written under fixed names
(``part-00000.parquet`` …) through ``mdd/storage.py``. The settings and every input shard are
checked before anything is touched; the outputs are staged and swapped in whole, so a failed
evaluation leaves the previous eval/, index/ and run.json["evaluate"] as they were, and says so.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mdd.schema import DIALOGUE_EVAL, METRICS, RULE_RESULT, TURN_EVAL
from mdd.storage import SYNTH, Store, describe_error, dialogue_shards, open_store

log = logging.getLogger("mdd.evaluate")

DIALOGUE_COLUMNS = ["dialogue_id", "case_id", "turns", "diagnosis", "icd_code", "treatment", "age", "gender",
                    "doctor_persona", "companion"]
SHARD_ROWS = 200_000
EMB_COLUMN = "__qa_emb"
RECORD_COLUMN = "__record"

_EXCHANGE_SCHEMA = pa.schema(
    [
        pa.field("dialogue_id", pa.string()),
        pa.field("case_id", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("topic", pa.string()),
        pa.field("question", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("diagnosis", pa.string()),
        pa.field("icd_code", pa.string()),
        pa.field("persona", pa.string()),
    ]
)


# --- dialogues → exchanges ------------------------------------------------------------

ANSWERERS = ("patient", "companion")


def exchanges_of(turns: list[dict] | None) -> list[tuple[int, str | None, str, str]]:
    """(turn index, topic, question, answer) of each doctor turn answered by the patient or by
    the companion in the room (a companion's interjection after a patient answer is no exchange)."""
    out = []
    turns = turns or []
    for a, b in zip(turns, turns[1:]):
        if a and b and a.get("speaker") == "doctor" and b.get("speaker") in ANSWERERS:
            out.append((len(out), a.get("topic") or b.get("topic"), a.get("text") or "", b.get("text") or ""))
    return out


def explode(batch: pa.Table, with_record: bool = False) -> pa.Table:
    from mdd.evaluate.quality import case_record

    cols: dict[str, list] = {f.name: [] for f in _EXCHANGE_SCHEMA}
    records: list[str] = []
    get = {name: (batch.column(name).to_pylist() if name in batch.column_names else [None] * batch.num_rows)
           for name in DIALOGUE_COLUMNS}
    for i in range(batch.num_rows):
        ex = exchanges_of(get["turns"][i])
        if not ex:
            continue
        if with_record:
            rec = case_record(get["diagnosis"][i], get["treatment"][i], [e[3] for e in ex])
        for turn, topic, q, a in ex:
            cols["dialogue_id"].append(get["dialogue_id"][i])
            cols["case_id"].append(get["case_id"][i])
            cols["turn"].append(turn)
            cols["topic"].append(topic)
            cols["question"].append(q)
            cols["answer"].append(a)
            cols["diagnosis"].append(get["diagnosis"][i])
            cols["icd_code"].append(get["icd_code"][i])
            cols["persona"].append(get["doctor_persona"][i])
            if with_record:
                records.append(rec)
    table = pa.Table.from_pydict(cols, schema=_EXCHANGE_SCHEMA)
    if with_record:
        table = table.append_column(RECORD_COLUMN, pa.array(records, pa.string()))
    return table


# --- Ray Data callables -------------------------------------------------------------------

class _Scorer:
    """One per actor: loads the embedder once, scores batches of exchanges."""

    def __init__(self, embedder: str, embedder_model: str | None, threshold: float, distractors: int,
                 faithfulness_default: float, judge_engine: Any | None, lexicon: str | None):
        from mdd.evaluate.embedders import make_embedder
        from mdd.evaluate.quality import QualityScorer

        self.embedder = make_embedder(embedder, embedder_model)
        self.scorer = QualityScorer(self.embedder, threshold=threshold, distractors=distractors,
                                    faithfulness_default=faithfulness_default, judge_engine=judge_engine,
                                    lexicon=lexicon)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from mdd.index import qa_text

        n = batch.num_rows
        q = batch.column("question").to_pylist()
        a = batch.column("answer").to_pylist()
        records = batch.column(RECORD_COLUMN).to_pylist() if RECORD_COLUMN in batch.column_names else None
        emb = self.embedder.encode(q + a)
        m = self.scorer.score(q, a, batch.column("diagnosis").to_pylist(), batch.column("icd_code").to_pylist(),
                              records=records, q_emb=emb[:n], a_emb=emb[n:])
        hq = np.asarray(m["high_quality"], dtype=bool)
        hq_idx = np.flatnonzero(hq)
        dim = int(self.embedder.dim)
        vec = self.embedder.encode([qa_text(q[i], a[i]) for i in hq_idx]) if len(hq_idx) else np.zeros((0, dim), np.float32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        offsets[1:] = np.cumsum(hq.astype(np.int32) * dim)
        emb_col = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(vec.reshape(-1), pa.float32()),
                                           mask=pa.array(~hq))
        out = batch.drop_columns([c for c in (RECORD_COLUMN,) if c in batch.column_names])
        for name in METRICS:
            out = out.append_column(name, pa.array(np.asarray(m[name], dtype=np.float64), pa.float64()))
        out = out.append_column("high_quality", pa.array(hq, pa.bool_()))
        return out.append_column(EMB_COLUMN, emb_col)


class _RuleRunner:
    """One per actor: the rules and the judge are built once."""

    def __init__(self, rule_sets: tuple[str, ...], judge: str, engine_cfg: Any):
        from mdd.evaluate.judges import make_judge
        from mdd.evaluate.rules import load_rules

        self.rules = load_rules(rule_sets)
        self.judge = make_judge(judge, engine_cfg=engine_cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from mdd.evaluate.rules import evaluate_rules

        cols = ["dialogue_id", "turns", "age", "gender", "diagnosis", "icd_code", "companion"]
        dialogues = [
            {c: r.get(c) for c in cols}
            for r in batch.select([c for c in cols if c in batch.column_names]).to_pylist()
        ]
        rows = evaluate_rules(dialogues, self.rules, self.judge)
        return pa.Table.from_pylist(list(rows), schema=RULE_RESULT)


# --- driver ------------------------------------------------------------------------------

def _cluster() -> tuple[int, int]:
    import ray

    res = ray.cluster_resources()
    return int(res.get("CPU", 1)), int(res.get("GPU", 0))


def _collect(ds: Any) -> pa.Table | None:
    import ray

    tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def _write(table: pa.Table, dst: Store, folder: str, shard_rows: int = SHARD_ROWS) -> int:
    shards = max(1, math.ceil(table.num_rows / shard_rows))
    for i in range(shards):
        dst.write_table(table.slice(i * shard_rows, shard_rows), f"{folder}/part-{i:05d}.parquet")
    return shards


def _sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


def _dialogue_eval(turns: pa.Table, rules: pa.Table, case_of: dict[str, str]) -> pa.Table:
    agg = turns.group_by("dialogue_id").aggregate(
        [(m, "mean") for m in METRICS] + [("high_quality", "sum"), ("turn", "count")]
    )
    ids = agg.column("dialogue_id").to_pylist()
    trig: dict[str, int] = {}
    passed: dict[str, int] = {}
    if rules.num_rows:
        r_ids = rules.column("dialogue_id").to_pylist()
        r_trig = rules.column("triggered").to_pylist()
        r_score = rules.column("score").to_pylist()
        for d, t, s in zip(r_ids, r_trig, r_score):
            trig[d] = trig.get(d, 0) + int(bool(t))
            passed[d] = passed.get(d, 0) + int(bool(t) and s is not None and s >= 1.0)
    data: dict[str, Any] = {
        "dialogue_id": ids,
        "case_id": [case_of.get(d) for d in ids],
        "n_exchanges": agg.column("turn_count"),
        **{m: agg.column(f"{m}_mean") for m in METRICS},
        "n_high_quality": agg.column("high_quality_sum"),
        "rules_triggered": [trig.get(d, 0) for d in ids],
        "rules_passed": [passed.get(d, 0) for d in ids],
    }
    return _sorted(pa.Table.from_pydict(data).cast(DIALOGUE_EVAL), ["dialogue_id"])


def _check_settings(cfg: Any) -> None:
    """The evaluator's settings, checked before anything is touched (the error names the key)."""
    from mdd.evaluate.embedders import check_embedder
    from mdd.evaluate.judges import make_judge
    from mdd.evaluate.quality import load_lexicon
    from mdd.evaluate.rules import load_rules

    ev = cfg.evaluate
    checks = {
        "evaluate.embedder": lambda: check_embedder(ev.embedder, ev.embedder_model),
        "evaluate.judge": lambda: make_judge(ev.judge, engine_cfg=cfg.engine),
        "evaluate.rule_sets": lambda: load_rules(ev.rule_sets),
        "evaluate.lexicon": lambda: load_lexicon(ev.lexicon),
    }
    for key, check in checks.items():
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - any failure is a bad setting
            raise ValueError(f"{key}: {describe_error(exc)}") from exc


def run_evaluate(cfg: Any, out_dir: str | Path | Store, quiet: bool = False) -> dict:
    """Evaluate ``OUT/synth``; writes eval/, index/ and run.json['evaluate']; returns the summary.

    ``cfg`` is a ``mdd.config.Config``; ``out_dir`` a path or URI. Ray is started (or joined) with
    ``cfg.ray``. Bad settings or shards raise ``ValueError`` / ``FileNotFoundError`` /
    ``mdd.storage.ShardError`` before anything is touched; a failure later raises
    ``mdd.storage.StageFailed`` with the previous outputs unchanged.
    """
    import ray

    from mdd.raylib import init_ray

    t0 = time.perf_counter()
    out = open_store(out_dir)
    _check_settings(cfg)
    shards, _ = dialogue_shards(out, quarantine=False)
    if not shards:
        raise FileNotFoundError(f"{out.display(SYNTH)}: no dialogue shards (*.parquet) to evaluate")

    init_ray(cfg.ray)
    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    ctx.execution_options.preserve_order = True  # same batches, same in-batch distractors on a rerun
    ctx.enable_progress_bars = not quiet
    try:
        with out.staged("evaluate", ("eval", "index")) as staging:
            summary = _run(cfg, out, sorted(shards), staging.out, t0)
            staging.run_json["evaluate"] = summary
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved
    if not quiet:
        print(format_summary(summary))
    return summary


def _run(cfg: Any, out: Store, shards: list[str], dst: Store, t0: float) -> dict:
    """Reads ``out``'s shards, writes every output to ``dst`` (the staging area)."""
    ev = cfg.evaluate
    use_llm_faith = ev.faithfulness == "llm" or (ev.faithfulness == "auto" and ev.judge == "llm")
    judge_engine = None
    if use_llm_faith:
        from mdd.engines.base import launch_engine

        judge_engine = launch_engine(cfg.engine)
    try:
        return _evaluate(cfg, out, shards, dst, judge_engine, t0)
    finally:
        if judge_engine is not None:
            try:
                judge_engine.shutdown()
            except Exception:  # noqa: BLE001
                pass


def _evaluate(cfg: Any, out: Store, shards: list[str], dst: Store, judge_engine: Any, t0: float) -> dict:
    import ray

    from mdd.evaluate.embedders import is_gpu_embedder
    from mdd.index import build_index

    ev = cfg.evaluate
    n_cpu, n_gpu = _cluster()
    files = [out.path(f"{SYNTH}/{name}") for name in shards]
    present = set(out.read_metadata(f"{SYNTH}/{shards[0]}").schema.to_arrow_schema().names)
    keep = [c for c in DIALOGUE_COLUMNS if c in present]
    dialogues = ray.data.read_parquet(files, filesystem=out.fs).select_columns(keep).materialize()
    n_dialogues = dialogues.count()

    # rules (the colleague's module): per batch of dialogues
    rule_ds = dialogues.map_batches(
        _RuleRunner,
        fn_constructor_kwargs={"rule_sets": tuple(ev.rule_sets), "judge": ev.judge, "engine_cfg": cfg.engine},
        batch_size=64,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=1 if ev.judge == "llm" else max(1, min(n_cpu - 1, 8))),
    )
    rules = _collect(rule_ds)
    rules = _sorted(rules.cast(RULE_RESULT), ["dialogue_id", "rule"]) if rules is not None else RULE_RESULT.empty_table()

    # exchanges → metrics
    gpu = is_gpu_embedder(ev.embedder) and n_gpu > 0
    # one core stays free for the driver (collecting results, FAISS) and Ray Data's own tasks
    concurrency = ev.concurrency or (n_gpu if gpu else max(1, n_cpu - 1))
    scored = dialogues.map_batches(
        explode, fn_kwargs={"with_record": judge_engine is not None}, batch_format="pyarrow", batch_size=None,
    ).map_batches(
        _Scorer,
        fn_constructor_kwargs={
            "embedder": ev.embedder,
            "embedder_model": ev.embedder_model,
            "threshold": ev.threshold,
            "distractors": ev.distractors,
            "faithfulness_default": ev.faithfulness_default,
            "judge_engine": judge_engine,
            "lexicon": ev.lexicon,
        },
        batch_size=ev.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        num_gpus=1 if gpu else None,
    )
    table = _collect(scored)
    if table is None:
        table = pa.Table.from_pylist([], schema=TURN_EVAL.append(pa.field("persona", pa.string()))
                                     .append(pa.field("diagnosis", pa.string()))
                                     .append(pa.field("icd_code", pa.string()))
                                     .append(pa.field(EMB_COLUMN, pa.list_(pa.float32()))))
    # the high-quality embeddings (null lists elsewhere) flatten to one matrix in table order
    emb = table.column(EMB_COLUMN)
    table = table.drop_columns([EMB_COLUMN])
    hq = table.filter(table.column("high_quality"))
    vectors = None
    if hq.num_rows:
        flat = np.concatenate([pc.list_flatten(c).to_numpy(zero_copy_only=False) for c in emb.chunks])
        vectors = flat.reshape(hq.num_rows, -1).astype(np.float32, copy=False)
    del emb
    turns = _sorted(table.select([f.name for f in TURN_EVAL]), ["dialogue_id", "turn"]).cast(TURN_EVAL)
    del table
    t_metrics = time.perf_counter()

    _write(turns, dst, "eval/turns")
    _write(rules, dst, "eval/rules")
    case_of = dict(zip(turns.column("dialogue_id").to_pylist(), turns.column("case_id").to_pylist()))
    dial = _dialogue_eval(turns, rules, case_of)
    _write(dial, dst, "eval/dialogues")

    # FAISS index of the high-quality pairs, with the stage's own embeddings
    embedder_obj = None
    if vectors is None:
        from mdd.evaluate.embedders import make_embedder

        embedder_obj = make_embedder(ev.embedder, ev.embedder_model)
    meta = build_index(dst, hq, vectors=vectors, embedder=embedder_obj,
                       embedder_name=ev.embedder, embedder_model=ev.embedder_model)

    wall = time.perf_counter() - t0
    n_ex = turns.num_rows
    n_hq = int(pc.sum(turns.column("high_quality").cast(pa.int64())).as_py() or 0)
    per_rule: dict[str, dict[str, int]] = {}
    if rules.num_rows:
        for name, t, s in zip(rules.column("rule").to_pylist(), rules.column("triggered").to_pylist(),
                              rules.column("score").to_pylist()):
            d = per_rule.setdefault(name, {"rows": 0, "triggered": 0, "passed": 0, "failed": 0, "skipped": 0})
            d["rows"] += 1
            if not t:
                d["skipped"] += 1
            else:
                d["triggered"] += 1
                if s is not None and s >= 1.0:
                    d["passed"] += 1
                else:
                    d["failed"] += 1
        for name, d in per_rule.items():
            if d["skipped"]:
                log.warning("rule %s skipped on %d of %d dialogues (reasons in eval/rules/)", name, d["skipped"],
                            d["rows"])
    summary = {
        "dialogues": int(n_dialogues),
        "dialogues_evaluated": int(dial.num_rows),
        "exchanges": int(n_ex),
        "high_quality": n_hq,
        "high_quality_share": (n_hq / n_ex) if n_ex else 0.0,
        "threshold": ev.threshold,
        "metric_means": {m: (float(pc.mean(turns.column(m)).as_py()) if n_ex else 0.0) for m in METRICS},
        "rules": per_rule,
        "rule_rows": int(rules.num_rows),
        "skipped": {"dialogues_without_exchanges": int(n_dialogues - dial.num_rows)},
        "index": {"size": meta["size"], "dim": meta["dim"]},
        "embedder": ev.embedder if not ev.embedder_model else f"{ev.embedder}:{ev.embedder_model}",
        "judge": ev.judge,
        "faithfulness": "llm" if judge_engine is not None else f"default={ev.faithfulness_default}",
        "wall_s": round(wall, 3),
        "metrics_s": round(t_metrics - t0, 3),
        "dialogues_per_s": round(n_dialogues / wall, 3) if wall > 0 else 0.0,
        "exchanges_per_s": round(n_ex / wall, 3) if wall > 0 else 0.0,
        "cpus": n_cpu,
        "gpus": n_gpu,
    }
    return summary


def format_summary(s: dict) -> str:
    lines = [
        f"evaluate: {s['dialogues']} dialogues, {s['exchanges']} exchanges in {s['wall_s']:.1f} s "
        f"({s['dialogues_per_s']:.1f} dialogues/s, {s['exchanges_per_s']:.0f} exchanges/s); "
        f"embedder {s['embedder']}, judge {s['judge']}, faithfulness {s['faithfulness']}",
        f"high quality (overall >= {s['threshold']}): {s['high_quality']} / {s['exchanges']} "
        f"= {100 * s['high_quality_share']:.1f}%   index: {s['index']['size']} pairs, {s['index']['dim']}-d",
        "",
        f"{'metric':<18}{'mean':>8}",
        "-" * 26,
    ]
    lines += [f"{m:<18}{v:>8.3f}" for m, v in s["metric_means"].items()]
    if s["rules"]:
        lines += ["", f"{'rule':<48}{'triggered':>10}{'passed':>8}{'failed':>8}{'skipped':>9}", "-" * 83]
        for name, d in sorted(s["rules"].items()):
            lines.append(f"{name[:47]:<48}{d['triggered']:>10}{d['passed']:>8}{d['failed']:>8}{d['skipped']:>9}")
    skipped = {k: v for k, v in s["skipped"].items() if v}
    if skipped:
        lines.append("skipped: " + ", ".join(f"{k}={v}" for k, v in skipped.items()))
    return "\n".join(lines)
