"""The evaluation stage on Ray Data.

    read_parquet(OUT/synth) ─┬─ map_batches(_Scorer actors, batches of whole dialogues: exchanges, embeddings,
                             │   metrics, gates; mdd/evaluate/scoring.py)
                             │   → OUT/eval/turns/ (TURN_EVAL)  +  FAISS index of high-quality pairs → OUT/index/
                             └─ map_batches(_RuleRunner actors: rule judge) → OUT/eval/rules/ (RULE_RESULT)
                                                      → OUT/eval/coverage/ (required items, ICD prefix x item)
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

from mdd.evaluate.coverage import coverage_summary, coverage_table, format_coverage
from mdd.evaluate.rules import checklist_item
from mdd.schema import DIALOGUE_EVAL, METRICS, RULE_RESULT, TURN_EVAL
from mdd.evaluate.gates import reason_counts
from mdd.evaluate.scoring import (  # noqa: F401 (ANSWERERS, exchanges_of: re-exported for readers of the stage)
    ANSWERERS, DIALOGUE_COLUMNS, corpus_df, exchanges_of, load_records)
from mdd.evaluate.validity import format_validity
from mdd.storage import SYNTH, Store, describe_error, dialogue_shards, open_store

log = logging.getLogger("mdd.evaluate")

SHARD_ROWS = 200_000
EMB_COLUMN = "__qa_emb"
# whole dialogues per scoring batch: evaluate.batch_size exchanges at about this many per dialogue
EXCHANGES_PER_DIALOGUE = 20


# --- Ray Data callables -------------------------------------------------------------------

class _Scorer:
    """One per actor: loads the embedder once, scores batches of whole dialogues
    (``mdd/evaluate/scoring.py``) and adds the index vectors of the high-quality pairs."""

    def __init__(self, embedder: str, embedder_model: str | None, **kwargs: Any):
        from mdd.evaluate.embedders import make_embedder
        from mdd.evaluate.scoring import ExchangeScorer

        self.embedder = make_embedder(embedder, embedder_model)
        self.scorer = ExchangeScorer(self.embedder, **kwargs)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from mdd.index import qa_text

        out = self.scorer.score(batch)
        n = out.num_rows
        q = out.column("question").to_pylist()
        a = out.column("answer").to_pylist()
        hq = out.column("high_quality").to_numpy(zero_copy_only=False).astype(bool) if n else np.zeros(0, bool)
        hq_idx = np.flatnonzero(hq)
        dim = int(self.embedder.dim)
        vec = self.embedder.encode([qa_text(q[i], a[i]) for i in hq_idx]) if len(hq_idx) else np.zeros((0, dim), np.float32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        offsets[1:] = np.cumsum(hq.astype(np.int32) * dim)
        emb_col = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(vec.reshape(-1), pa.float32()),
                                           mask=pa.array(~hq))
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


def _coverage(rules: pa.Table, out: Store) -> pa.Table:
    """The required-items matrix from the checklist rules' rows and the dialogues' ICD codes."""
    t = out.read_table(SYNTH, columns=["dialogue_id", "icd_code"])
    return coverage_table(rules, dict(zip(t.column(0).to_pylist(), t.column(1).to_pylist())))


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
    faith_mode = ev.faithfulness if ev.faithfulness != "auto" else ("llm" if ev.judge == "llm" else "record")
    judge_engine = None
    if faith_mode == "llm":
        from mdd.engines.base import launch_engine

        judge_engine = launch_engine(cfg.engine)
    try:
        return _evaluate(cfg, out, shards, dst, judge_engine, faith_mode, t0)
    finally:
        if judge_engine is not None:
            try:
                judge_engine.shutdown()
            except Exception:  # noqa: BLE001
                pass


def _evaluate(cfg: Any, out: Store, shards: list[str], dst: Store, judge_engine: Any, faith_mode: str,
              t0: float) -> dict:
    import ray

    from mdd.evaluate.embedders import is_gpu_embedder
    from mdd.index import build_index

    ev = cfg.evaluate
    n_cpu, n_gpu = _cluster()
    files = [out.path(f"{SYNTH}/{name}") for name in shards]
    present = set(out.read_metadata(f"{SYNTH}/{shards[0]}").schema.to_arrow_schema().names)
    keep = [c for c in DIALOGUE_COLUMNS if c in present]
    scorer_kwargs = {
        "threshold": ev.threshold,
        "distractors": ev.distractors,
        "faithfulness": faith_mode,
        "faithfulness_default": ev.faithfulness_default,
        "judge_engine": judge_engine,
        "lexicon": ev.lexicon,
        "idf": corpus_df(out, ev.idf_sample_dialogues, [f"{SYNTH}/{name}" for name in shards]),
        "records": load_records(out),
        "relevance_spaces": ev.relevance_spaces,
    }
    per_batch = max(2, ev.batch_size // EXCHANGES_PER_DIALOGUE)
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
        _Scorer,
        fn_constructor_kwargs={"embedder": ev.embedder, "embedder_model": ev.embedder_model, **scorer_kwargs},
        batch_size=per_batch,
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
    coverage = _coverage(rules, out)
    _write(coverage, dst, "eval/coverage")
    case_of = dict(zip(turns.column("dialogue_id").to_pylist(), turns.column("case_id").to_pylist()))
    dial = _dialogue_eval(turns, rules, case_of)
    _write(dial, dst, "eval/dialogues")

    # the validity self-check: negative controls from a sample of the run, scored by the same pipeline
    from mdd.evaluate.embedders import make_embedder
    from mdd.evaluate.scoring import ExchangeScorer
    from mdd.evaluate.validity import sample_ids, self_check

    embedder_obj = make_embedder(ev.embedder, ev.embedder_model)
    vc = ev.validity
    blocks = ray.get(dialogues.to_arrow_refs())
    ids = pa.array(sample_ids([d for b in blocks for d in b.column("dialogue_id").to_pylist()], vc.sample_dialogues))
    sample = pa.concat_tables([b.filter(pc.is_in(b.column("dialogue_id"), value_set=ids)) for b in blocks])
    del blocks
    validity, validity_rows = self_check(ExchangeScorer(embedder_obj, **scorer_kwargs), sample, per_batch,
                                         vc.min_auc, vc.max_control_hq_share, seed=vc.seed, lexicon=ev.lexicon)
    dst.write_table(validity_rows, "eval/validity.parquet")
    if validity.get("separated") is False:
        log.warning("VALIDITY: evaluate.validity.separated = false in run.json; see eval/validity.parquet")

    # FAISS index of the high-quality pairs, with the stage's own embeddings
    meta = build_index(dst, hq, vectors=vectors, embedder=None if vectors is not None else embedder_obj,
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
            if d["skipped"] and checklist_item(name) is None:  # a checklist item applies to some diagnoses only
                log.warning("rule %s skipped on %d of %d dialogues (reasons in eval/rules/)", name, d["skipped"],
                            d["rows"])
    summary = {
        "dialogues": int(n_dialogues),
        "dialogues_evaluated": int(dial.num_rows),
        "exchanges": int(n_ex),
        "high_quality": n_hq,
        "high_quality_share": (n_hq / n_ex) if n_ex else 0.0,
        "threshold": ev.threshold,
        "metric_means": {m: _mean(turns.column(m)) for m in METRICS},
        "rules": per_rule,
        "rule_rows": int(rules.num_rows),
        "coverage": coverage_summary(coverage),
        "skipped": {"dialogues_without_exchanges": int(n_dialogues - dial.num_rows)},
        "index": {"size": meta["size"], "dim": meta["dim"]},
        "embedder": ev.embedder if not ev.embedder_model else f"{ev.embedder}:{ev.embedder_model}",
        "judge": ev.judge,
        "faithfulness": faith_mode if faith_mode != "default" else f"default={ev.faithfulness_default}",
        "faithfulness_known": int(n_ex - turns.column("faithfulness").null_count),
        "hq_reasons": reason_counts(turns.column("hq_reason").to_pylist()),
        "validity": validity,
        "wall_s": round(wall, 3),
        "metrics_s": round(t_metrics - t0, 3),
        "dialogues_per_s": round(n_dialogues / wall, 3) if wall > 0 else 0.0,
        "exchanges_per_s": round(n_ex / wall, 3) if wall > 0 else 0.0,
        "cpus": n_cpu,
        "gpus": n_gpu,
    }
    return summary


def _mean(col: pa.ChunkedArray) -> float | None:
    """Mean over the known values (None when there is none, e.g. faithfulness of imported dialogues)."""
    v = pc.mean(col).as_py()
    return float(v) if v is not None else None


def format_summary(s: dict) -> str:
    lines = [
        f"evaluate: {s['dialogues']} dialogues, {s['exchanges']} exchanges in {s['wall_s']:.1f} s "
        f"({s['dialogues_per_s']:.1f} dialogues/s, {s['exchanges_per_s']:.0f} exchanges/s); "
        f"embedder {s['embedder']}, judge {s['judge']}, faithfulness {s['faithfulness']}",
        f"high quality (every gate passed, then overall >= {s['threshold']}): {s['high_quality']} / "
        f"{s['exchanges']} = {100 * s['high_quality_share']:.1f}%   index: {s['index']['size']} pairs, "
        f"{s['index']['dim']}-d",
        "first failed gate (hq_reason): " + ", ".join(f"{k} {v}" for k, v in s["hq_reasons"].items() if v),
        "",
        f"{'metric':<18}{'mean':>8}",
        "-" * 26,
    ]
    lines += [f"{m:<18}{v:>8.3f}" if v is not None else f"{m:<18}{'unknown':>8}"
              for m, v in s["metric_means"].items()]
    lines += [""] + format_validity(s.get("validity") or {})
    if s["rules"]:
        lines += ["", f"{'rule':<48}{'triggered':>10}{'passed':>8}{'failed':>8}{'skipped':>9}", "-" * 83]
        for name, d in sorted(s["rules"].items()):
            if checklist_item(name) is not None:
                continue  # summed up in the coverage matrix below
            lines.append(f"{name[:47]:<48}{d['triggered']:>10}{d['passed']:>8}{d['failed']:>8}{d['skipped']:>9}")
    lines += format_coverage(s.get("coverage") or {})
    skipped = {k: v for k, v in s["skipped"].items() if v}
    if skipped:
        lines.append("skipped: " + ", ".join(f"{k}={v}" for k, v in skipped.items()))
    return "\n".join(lines)
