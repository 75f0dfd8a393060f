"""The evaluation stage: a thin orchestrator over streamed shard workers.

    synth/ shard names ──▶ incremental.plan: which shards need evaluating (eval/state.json, fingerprint, IDF)
         kept shards' tables ──▶ copied into the staging area unchanged
         new shards ──▶ streaming.evaluate_shards: Ray actors score, judge and WRITE
                        eval/{turns,rules,dialogues,pairs}/<shard>.parquet, return small partials
    partials (kept + new) ──▶ aggregate.merge ──▶ eval/coverage/, run.json["evaluate"]
    validity self-check on a bounded sample ──▶ eval/validity.parquet
    eval/pairs/ ──▶ index/ (FAISS index of the distinct high-quality pairs, built in a worker: mdd/index/)

The driver holds shard names, partial aggregates and bounded samples, never the corpus. The
settings and every input shard are checked before anything is touched; the outputs are staged and
swapped in whole, so a failed evaluation leaves the previous eval/, index/ and run.json["evaluate"]
as they were, and says so.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mdd.evaluate import aggregate, incremental, streaming
from mdd.evaluate.coverage import format_coverage
from mdd.evaluate.rule_set import checklist_item
from mdd.evaluate.scoring import DIALOGUE_COLUMNS, load_records
from mdd.evaluate.validity import format_validity
from mdd.storage import (
    SYNTH,
    Store,
    describe_error,
    dialogue_shards,
    duplicate_rows,
    log_duplicates,
    open_store,
    without_rows,
)

log = logging.getLogger(__name__)

# whole dialogues per scoring batch: evaluate.batch_size exchanges at about this many per dialogue
EXCHANGES_PER_DIALOGUE = 20


def _cluster() -> tuple[int, int]:
    import ray

    res = ray.cluster_resources()
    return int(res.get("CPU", 1)), int(res.get("GPU", 0))


def _check_settings(cfg: Any) -> None:
    """The evaluator's settings, checked before anything is touched (the error names the key)."""
    from mdd.evaluate.judges import make_judge
    from mdd.evaluate.quality import load_lexicon
    from mdd.evaluate.rule_set import load_rules
    from mdd.index.embedders import check_embedder

    ev = cfg.evaluate
    checks = {
        "evaluate.embedder": lambda: check_embedder(ev.embedder, ev.embedder_model),
        "evaluate.judge": lambda: make_judge(ev.judge, engine_cfg=cfg.engine_for("judge")),
        "evaluate.rule_sets": lambda: load_rules(ev.rule_sets),
        "evaluate.lexicon": lambda: load_lexicon(ev.lexicon),
    }
    for key, check in checks.items():
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - any failure is a bad setting
            raise ValueError(f"{key}: {describe_error(exc)}") from exc


def run_evaluate(cfg: Any, out_dir: str | Path | Store, quiet: bool = False, full: bool = False) -> dict:
    """Evaluate ``OUT/synth``; writes eval/, index/ and run.json['evaluate']; returns the summary.

    ``cfg`` is a ``mdd.config.Config``; ``out_dir`` a path or URI. Ray is started (or joined) with
    ``cfg.ray``. Only shards not yet evaluated with this evaluator are evaluated unless ``full``
    (or ``evaluate.incremental: false``). Bad settings or shards raise ``ValueError`` /
    ``FileNotFoundError`` / ``mdd.storage.ShardError`` before anything is touched; a failure later
    raises ``mdd.storage.StageFailed`` with the previous outputs unchanged.
    """
    from mdd.raylib import init_ray

    t0 = time.perf_counter()
    out = open_store(out_dir)
    _check_settings(cfg)
    shards, _ = dialogue_shards(out, quarantine=False)
    if not shards:
        raise FileNotFoundError(f"{out.display(SYNTH)}: no dialogue shards (*.parquet) to evaluate")
    skip = duplicate_rows(shards)  # an id written twice by an older run is evaluated once
    log_duplicates(out.display(SYNTH), sum(len(v) for v in skip.values()))
    shards = {name: [d for i, d in enumerate(ids) if i not in set(skip.get(name, ()))] for name, ids in shards.items()}
    shards = {name: ids for name, ids in shards.items() if ids}  # a shard that only repeats: nothing to evaluate

    init_ray(cfg.ray)
    with out.staged("evaluate", ("eval", "index")) as staging:
        summary = _run(cfg, out, shards, staging.out, t0, full, skip)
        staging.run_json["evaluate"] = summary
    if not quiet:
        print(format_summary(summary))
    return summary


def _faith_mode(ev: Any) -> str:
    return ev.faithfulness if ev.faithfulness != "auto" else ("llm" if ev.judge == "llm" else "record")


def _run(cfg: Any, out: Store, shards: dict[str, list[str]], dst: Store, t0: float, full: bool,
         skip: dict[str, list[int]]) -> dict:
    """Reads ``out``'s shards, writes every output to ``dst`` (the staging area)."""
    judge_engine = None
    if _faith_mode(cfg.evaluate) == "llm":
        from mdd.engines.base import launch_engine

        judge_engine = launch_engine(cfg.engine_for("judge"))  # roles.judge with named engines
    try:
        return _evaluate(cfg, out, shards, dst, judge_engine, t0, full, skip)
    finally:
        if judge_engine is not None:
            try:
                judge_engine.shutdown()
            except Exception:  # noqa: BLE001
                pass


def _evaluate(cfg: Any, out: Store, shards: dict[str, list[str]], dst: Store, judge_engine: Any, t0: float,
              full: bool, skip: dict[str, list[int]]) -> dict:
    from mdd.index.embedders import is_gpu_embedder

    ev = cfg.evaluate
    faith_mode = _faith_mode(ev)
    n_cpu, n_gpu = _cluster()
    per_batch = max(2, ev.batch_size // EXCHANGES_PER_DIALOGUE)
    plan = incremental.plan(out, cfg, faith_mode, per_batch, shards, full=full, skip=skip)
    log.info("evaluate: %s", plan.reason)
    scorer_kwargs = {
        "threshold": ev.threshold,
        "distractors": ev.distractors,
        "faithfulness": faith_mode,
        "faithfulness_default": ev.faithfulness_default,
        "judge_engine": judge_engine,
        "lexicon": ev.lexicon,
        "idf": (plan.idf.df, plan.idf.n_docs),
        "relevance_spaces": ev.relevance_spaces,
    }
    incremental.carry_over(out, dst, plan.keep)
    gpu = is_gpu_embedder(ev.embedder) and n_gpu > 0
    # one worker per CPU that is free now (an engine actor of the same Ray may hold some): an actor
    # waiting for a CPU that never frees would stall the pool
    import ray

    free = int(ray.available_resources().get("CPU", 0))
    workers = 1 if ev.judge == "llm" else (ev.concurrency or (n_gpu if gpu else max(1, min(n_cpu, free))))
    new = streaming.evaluate_shards(
        plan.todo, workers, 1 if gpu else None, src=out, dst=dst, columns=DIALOGUE_COLUMNS, per_batch=per_batch,
        scorer_kwargs=scorer_kwargs, embedder=ev.embedder, embedder_model=ev.embedder_model,
        rule_sets=tuple(ev.rule_sets), judge=ev.judge, engine_cfg=cfg.engine_for("judge"),
        metadata={incremental.FINGERPRINT_KEY: plan.fingerprint}, index_cfg=ev.index, skip=skip)
    sizes = out.file_sizes(SYNTH)
    entries = {**plan.keep, **{s: {"bytes": sizes.get(s), "partial": p, **({"skipped": skip[s]} if s in skip else {})}
                               for s, p in new.items()}}
    t_metrics = time.perf_counter()

    total = aggregate.merge(entries[s]["partial"] for s in sorted(entries))
    coverage = aggregate.coverage_of(total)
    dst.write_table(coverage, "eval/coverage/part-00000.parquet")
    dst.write_table(plan.idf.table(), incremental.IDF_FILE)
    dst.write_json(incremental.STATE_FILE, plan.state(entries))

    validity = _validity(cfg, out, dst, shards, scorer_kwargs, per_batch, skip)

    # FAISS index of the high-quality pairs, from the shards' pairs tables, built in a worker
    from mdd.index import build_from_pairs

    # (no CPU reserved: it runs after the shard workers are gone, and must not wait behind an engine actor)
    meta = ray.get(ray.remote(num_cpus=0)(build_from_pairs).remote(dst, ev.embedder, ev.embedder_model, ev.index))

    wall = time.perf_counter() - t0
    counts = aggregate.summary_counts(total, coverage)
    n_dialogues, n_ex = counts["dialogues"], counts["exchanges"]
    return {
        **counts,
        "threshold": ev.threshold,
        "index": {k: meta[k] for k in ("size", "pairs", "dim", "type", "nprobe")}
        | {"recall_at_10": meta["recall_at_10"]["value"], "bytes_per_pair": meta["bytes"]["per_pair"]},
        "embedder": ev.embedder if not ev.embedder_model else f"{ev.embedder}:{ev.embedder_model}",
        "judge": ev.judge,
        "faithfulness": faith_mode if faith_mode != "default" else f"default={ev.faithfulness_default}",
        "validity": validity,
        "incremental": {"fingerprint": plan.fingerprint, "shards": len(entries), "evaluated": len(new),
                        "kept": len(plan.keep), "dropped": len(plan.dropped), "idf_refit": plan.idf_refit,
                        "idf_dialogues": plan.idf.dialogues, "reason": plan.reason},
        "wall_s": round(wall, 3),
        "metrics_s": round(t_metrics - t0, 3),
        "dialogues_per_s": round(n_dialogues / wall, 3) if wall > 0 else 0.0,
        "exchanges_per_s": round(n_ex / wall, 3) if wall > 0 else 0.0,
        "cpus": n_cpu,
        "gpus": n_gpu,
    }


def _validity(cfg: Any, out: Store, dst: Store, shards: dict[str, list[str]], scorer_kwargs: dict, per_batch: int,
              skip: dict[str, list[int]]) -> dict:
    """The validity self-check: negative controls from a bounded sample of the whole run, scored by
    the same pipeline in the driver (reads only the shards that hold sampled dialogues)."""
    import pyarrow.parquet as pq

    from mdd.evaluate.scoring import ExchangeScorer
    from mdd.evaluate.validity import sample_ids, self_check
    from mdd.index.embedders import make_embedder

    ev, vc = cfg.evaluate, cfg.evaluate.validity
    ids = set(sample_ids([d for v in shards.values() for d in v], vc.sample_dialogues))
    parts = []
    for name in sorted(shards):
        if ids.isdisjoint(shards[name]):
            continue
        present = set(out.read_metadata(f"{SYNTH}/{name}").schema.to_arrow_schema().names)
        t = without_rows(pq.read_table(out.path(f"{SYNTH}/{name}"), filesystem=out.fs,
                                       columns=[c for c in DIALOGUE_COLUMNS if c in present]), skip.get(name, ()))
        parts.append(t.filter(pc.is_in(t.column("dialogue_id"), value_set=pa.array(sorted(ids)))))
    sample = streaming.sorted_by(pa.concat_tables(parts, promote_options="default"), ["dialogue_id"])
    records = load_records(out, case_ids=set(sample.column("case_id").to_pylist()))
    scorer = ExchangeScorer(make_embedder(ev.embedder, ev.embedder_model), records=records, **scorer_kwargs)
    validity, rows = self_check(scorer, sample, per_batch, vc.min_auc, vc.max_control_hq_share, seed=vc.seed,
                                lexicon=ev.lexicon)
    dst.write_table(rows, "eval/validity.parquet")
    if validity.get("separated") is False:
        log.warning("VALIDITY: evaluate.validity.separated = false in run.json; see eval/validity.parquet")
    return validity


def format_summary(s: dict) -> str:
    lines = [
        f"evaluate: {s['dialogues']} dialogues, {s['exchanges']} exchanges in {s['wall_s']:.1f} s "
        f"({s['dialogues_per_s']:.1f} dialogues/s, {s['exchanges_per_s']:.0f} exchanges/s); "
        f"embedder {s['embedder']}, judge {s['judge']}, faithfulness {s['faithfulness']}",
        f"high quality (every gate passed, then overall >= {s['threshold']}): {s['high_quality']} / "
        f"{s['exchanges']} = {100 * s['high_quality_share']:.1f}%   index: {s['index']['size']} distinct pairs "
        f"(of {s['index'].get('pairs', s['index']['size'])}), {s['index']['dim']}-d {s['index'].get('type', '')}, "
        f"{s['index'].get('bytes_per_pair') or 0:.0f} bytes per pair",
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
