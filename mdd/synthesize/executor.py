"""The executor: runs a plan's shards on Ray dialogue workers.

Dialogue workers are stateless async Ray actors; each keeps many dialogues in flight. A dialogue that
fails is retried from its start, up to ``max_attempts``; then it goes to ``failures.parquet`` and the run
finishes the rest. A shard is written whole (``mdd/storage.py``: a rename on a disk, one upload on an
object store) only when all of its dialogues are in: after a ``kill -9`` the rerun finds whole shards
only and writes each missing dialogue exactly once.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import sys
import time
from collections import Counter
from typing import Any

import pyarrow as pa

from mdd import privacy, schema
from mdd.cases import Case
from mdd.config import Config
from mdd.engines.base import EngineBase
from mdd.storage import SYNTH, Store
from mdd.synthesize.plan import Item, shard_name, submission_order
from mdd.synthesize.stats import RunStats
from mdd.synthesize.worker import DialogueWorker

log = logging.getLogger(__name__)


def fan_out(cfg: Config, cases: list[Case], engine: EngineBase, work: list[list[Item]], stats: RunStats,
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
    queue = submission_order(queue, by_id, sc, sc.in_flight)  # the last ones longest first (mdd/synthesize/plan.py)
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
                             "guards": guard["guards"] if guard else None,
                             "speaker": guard["speaker"] if guard else None,
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
                    res = {"ok": False, "retriable": True, "backoff": True, "error": f"worker died: {exc}"}
                    if workers[k] is handle:
                        log.warning("dialogue worker %d died; starting a new one", k)
                        workers[k] = new_worker()
                except ray.exceptions.RayError as exc:
                    res = {"ok": False, "retriable": True, "backoff": True,
                           "error": f"worker: {type(exc).__name__}: {exc}"}
                if res["ok"]:
                    stats.add(res)
                    settle(it, res["row"], None)
                elif res.get("retriable") and attempts[it.dialogue_id] < sc.max_attempts:
                    stats.retries += 1
                    n = attempts[it.dialogue_id]
                    # an engine (or worker) failure: give it time to restart before the retry
                    wait = sc.retry_backoff_s * 2 ** (n - 1) if res.get("backoff") else 0.0
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
