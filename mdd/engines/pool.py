"""The pool client the dialogue workers call, over Ray actors that each host an engine.

Layout::

    driver: <Pool>.launch(cfg) ──starts──> actor × num_engines (one engine each)
    workers: pickled <Pool>.generate(request) ──Ray call──> actor.generate...(...)

* One actor per GPU (``num_gpus=num_gpus_per_engine``) for TP=1. For
  ``tensor_parallel_size > 1`` the actor runs inside a STRICT_PACK placement group with one
  CPU bundle for itself plus TP one-GPU bundles (an engine such as vLLM started with
  ``distributed_executor_backend="ray"`` lands its TP workers in that group: it picks up the
  actor's current placement group). That path is written but cannot be exercised on the
  CPU-only development machines.
* A dialogue (``Request.session``) sticks to one engine so its append-only prompts hit that
  engine's prefix cache; a new session goes to the least-loaded engine.
* An engine actor that died (or whose engine core died: ``dead_errors``) raises
  :class:`EngineError`; the sticky entry is dropped so the caller's retry of the whole dialogue
  lands on a live engine. Actors are restarted by Ray up to ``max_restarts`` times; tasks are
  never retried by Ray (``max_task_retries=0``), the dialogue loop decides.

:class:`ActorPoolEngine` is generic over the actor class: :meth:`ActorPoolEngine.start` starts any
Ray actor class built as ``cls(model, opts, index)`` with ``ready()``, ``stats()``,
``reset_prefix_cache()``, ``end_session(session, finished)`` and ``shutdown()``; a subclass says how
one request crosses to an actor (:meth:`ActorPoolEngine._call`, returning ``text``,
``prompt_tokens``, ``output_tokens``, ``cached_tokens``, ``finish_reason``). The vLLM pool
(:mod:`mdd.engines.vllm.pool`) and the hosted pool (:mod:`mdd.engines.hosted`) are its two.
Unpickling a client in a worker imports Ray, not the engine behind the actors.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from typing import Any, Self

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from mdd.engines.base import Completion, EngineBase, EngineError, Request

log = logging.getLogger(__name__)


_SUM_KEYS = (
    "in_flight",
    "preemptions",
    "live_sessions",
    "requests",
    "errors",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
)


class ActorPoolEngine(EngineBase):
    """Client of a pool of engine actors; picklable (actor handles only).

    Routing state (sticky sessions, local load) lives per process and is not pickled.
    ``label`` names the pool in its error messages; ``dead_errors`` are the errors (crossing Ray
    as ``RayTaskError(...)``) that say an actor's engine core died.
    """

    name = "pool"
    label = "pool"
    dead_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        actors: list[Any],
        model: str,
        *,
        placement_groups: list[Any] | None = None,
        stats_refresh_s: float = 5.0,
        session_ttl_s: float = 900.0,
        max_sessions: int = 200_000,
    ) -> None:
        if not actors:
            raise ValueError(f"{type(self).__name__} needs at least one engine actor")
        self.actors = list(actors)
        self.model = model
        self.placement_groups = list(placement_groups or [])
        self.stats_refresh_s = stats_refresh_s
        self.session_ttl_s = session_ttl_s
        self.max_sessions = max_sessions
        self.launch_info: list[dict[str, Any]] = []
        self.launch_s = 0.0
        self._init_local()

    # ----- per-process routing state -------------------------------------------------
    def _init_local(self) -> None:
        n = len(self.actors)
        self._sticky: OrderedDict[str, tuple[int, float]] = OrderedDict()  # session -> (engine, last use)
        self._sessions = [0] * n  # sessions assigned by this client, per engine
        self._inflight = [0] * n  # calls in flight from this client, per engine
        self._remote_inflight = [0] * n  # in flight on the engine (all clients), last refresh
        self._local_at_refresh = [0] * n
        self._down_until = [0.0] * n
        self._last_refresh = 0.0
        self._refreshing = False
        self._refresh_task: asyncio.Task | None = None
        self._rr = random.randrange(n)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("actors", "model", "placement_groups", "stats_refresh_s", "session_ttl_s", "max_sessions",
                "launch_info", "launch_s")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    # ----- launch (driver) ------------------------------------------------------------
    @classmethod
    def start(cls, cfg: Any, actor_cls: Any, extra: dict[str, Any] | None = None) -> Self:
        """Start ``cfg.vllm.num_engines`` actors of ``actor_cls`` (placed by ``cfg.vllm``: GPUs, CPUs,
        tensor parallelism, restarts) and wait until all are ready. Each actor gets ``cfg.vllm``'s
        options as a dict, with ``extra`` added."""
        from mdd.engines.tiny_model import resolve_model

        if not ray.is_initialized():
            from mdd.config import RayConfig
            from mdd.raylib import init_ray

            init_ray(RayConfig())
        t_launch = time.monotonic()
        o = cfg.vllm
        model = resolve_model(cfg.model)
        opts = {**o.model_dump(), **(extra or {})}
        tp = int(o.tensor_parallel_size)
        actors: list[Any] = []
        pgs: list[Any] = []
        max_conc = max(1000, 4 * int(o.max_num_seqs))
        base_opts: dict[str, Any] = {
            "max_restarts": int(o.max_restarts),
            "max_task_retries": 0,
            "max_concurrency": max_conc,
        }
        try:
            for i in range(int(o.num_engines)):
                if tp == 1:
                    a = actor_cls.options(
                        num_cpus=o.num_cpus_per_engine, num_gpus=o.num_gpus_per_engine, **base_opts
                    ).remote(model, opts, i)
                else:
                    from ray.util.placement_group import placement_group
                    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                    # bundle 0: the actor (AsyncLLM front end); bundles 1..TP: one GPU per TP worker
                    bundles = [{"CPU": max(o.num_cpus_per_engine, 1.0)}] + [
                        {"GPU": 1.0, "CPU": 1.0} for _ in range(tp)
                    ]
                    pg = placement_group(bundles, strategy="STRICT_PACK")
                    pgs.append(pg)
                    ray.get(pg.ready(), timeout=o.startup_timeout_s)
                    a = actor_cls.options(
                        num_cpus=max(o.num_cpus_per_engine, 1.0),
                        num_gpus=0,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=pg,
                            placement_group_bundle_index=0,
                            placement_group_capture_child_tasks=True,
                        ),
                        **base_opts,
                    ).remote(model, opts, i)
                actors.append(a)
            t0 = time.monotonic()
            info = ray.get([a.ready.remote() for a in actors], timeout=o.startup_timeout_s)
            log.info("%s: %d engine(s) ready in %.1fs: %s", cls.label, len(actors), time.monotonic() - t0, info)
        except BaseException as exc:
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:
                    pass
            _remove_pgs(pgs)
            if isinstance(exc, GetTimeoutError):
                raise EngineError(f"{cls.label}: engines not ready after {o.startup_timeout_s}s") from exc
            if isinstance(exc, (RayActorError, RayTaskError)):
                raise EngineError(f"{cls.label}: an engine failed to start (model {model!r}): {exc}") from exc
            raise
        pool = cls(actors, model, placement_groups=pgs, stats_refresh_s=o.stats_refresh_s)
        pool.launch_info = info
        pool.launch_s = time.monotonic() - t_launch
        return pool

    # ----- routing ---------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        while self._sticky:
            sess, (idx, last) = next(iter(self._sticky.items()))
            if len(self._sticky) <= self.max_sessions and now - last < self.session_ttl_s:
                break
            self._sticky.popitem(last=False)
            self._sessions[idx] = max(0, self._sessions[idx] - 1)

    def _score(self, i: int, now: float) -> tuple[float, ...]:
        others = max(0, self._remote_inflight[i] - self._local_at_refresh[i])
        down = 1 if self._down_until[i] > now else 0
        return (down, self._sessions[i] + others, self._inflight[i], (i - self._rr) % len(self.actors))

    def engine_for(self, session: str) -> int:
        """The engine index serving ``session`` (assigning one if new)."""
        now = time.monotonic()
        if session and session in self._sticky:
            idx, _ = self._sticky[session]
            self._sticky[session] = (idx, now)
            self._sticky.move_to_end(session)
            return idx
        self._expire(now)
        idx = min(range(len(self.actors)), key=lambda i: self._score(i, now))
        self._rr = (self._rr + 1) % len(self.actors)
        if session:
            self._sticky[session] = (idx, now)
            self._sessions[idx] += 1
        return idx

    def end_session(self, session: str) -> None:
        """Release a finished dialogue's sticky slot (optional; idle sessions also expire)."""
        ent = self._sticky.pop(session, None)
        if ent is not None:
            self._sessions[ent[0]] = max(0, self._sessions[ent[0]] - 1)

    async def close_session(self, session: str, finished: bool = True) -> None:
        """A dialogue is over: release its sticky slot here and its admission room on its engine."""
        ent = self._sticky.get(session)
        self.end_session(session)
        if ent is not None:
            try:  # awaited, so the engine has freed the room when the dialogue's result is out
                await asyncio.wait_for(_await_ref(self.actors[ent[0]].end_session.remote(session, finished)), 10)
            except Exception:  # a dead engine forgot the session anyway
                pass

    def _mark_down(self, idx: int, session: str) -> None:
        self.end_session(session)
        self._down_until[idx] = time.monotonic() + 30.0
        # Every session on a dead engine lost its cache and its calls: send retries elsewhere.
        for s in [s for s, (i, _) in self._sticky.items() if i == idx]:
            self.end_session(s)

    def _maybe_refresh(self) -> None:
        now = time.monotonic()
        if self._refreshing or now - self._last_refresh < self.stats_refresh_s:
            return
        self._refreshing = True
        self._last_refresh = now
        try:  # keep a reference: the loop holds tasks only weakly
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh())
        except RuntimeError:
            self._refreshing = False

    async def _refresh(self) -> None:
        try:
            for i, a in enumerate(self.actors):
                try:
                    s = await asyncio.wait_for(_await_ref(a.stats.remote()), timeout=5.0)
                    self._remote_inflight[i] = int(s.get("in_flight", 0))
                    self._local_at_refresh[i] = self._inflight[i]
                except Exception:
                    pass
        finally:
            self._refreshing = False

    # ----- calls -----------------------------------------------------------------------
    def _call(self, actor: Any, request: Request, rid: str) -> Any:
        """The Ray call that sends ``request`` to ``actor`` (an object ref)."""
        raise NotImplementedError

    async def generate(self, request: Request) -> Completion:
        idx = self.engine_for(request.session)
        self._maybe_refresh()
        rid = f"{request.session or 'call'}-{request.op or request.agent}-{uuid.uuid4().hex[:12]}"
        self._inflight[idx] += 1
        ref = None
        try:
            ref = self._call(self.actors[idx], request, rid)
            out = await ref
        except asyncio.CancelledError:
            if ref is not None:
                try:
                    ray.cancel(ref)  # aborts the vLLM request inside the actor
                except Exception:
                    pass
            raise
        except RayActorError as exc:
            self._mark_down(idx, request.session)
            raise EngineError(f"{self.label} engine {idx} is unavailable: {type(exc).__name__}: {exc}") from exc
        except self.dead_errors as exc:  # RayTaskError(<a dead error>)
            self._mark_down(idx, request.session)
            raise EngineError(f"{self.label} engine {idx}: engine core died") from exc
        finally:
            self._inflight[idx] -= 1
        return Completion(
            text=out["text"],
            prompt_tokens=int(out["prompt_tokens"]),
            output_tokens=int(out["output_tokens"]),
            cached_tokens=int(out["cached_tokens"]),
            finish_reason=str(out["finish_reason"]),
        )

    # ----- driver-side helpers -----------------------------------------------------------
    def engine_stats(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Per-engine stats; an engine that does not answer reports ``{"index": i, "down": 1}``."""
        out: list[dict[str, Any]] = []
        refs = [a.stats.remote() for a in self.actors]
        for i, r in enumerate(refs):
            try:
                out.append(ray.get(r, timeout=timeout))
            except Exception:
                out.append({"index": i, "down": 1})
        return out

    async def aengine_stats(self) -> list[dict[str, Any]]:
        res = await asyncio.gather(*[_await_ref(a.stats.remote()) for a in self.actors], return_exceptions=True)
        return [r if isinstance(r, dict) else {"index": i, "down": 1} for i, r in enumerate(res)]

    @staticmethod
    def aggregate(stats: list[dict[str, Any]]) -> dict[str, float]:
        agg: dict[str, float] = {k: 0.0 for k in _SUM_KEYS}
        for s in stats:
            for k in _SUM_KEYS:
                agg[k] += float(s.get(k, 0) or 0)
        agg["engines"] = float(len(stats))
        agg["engines_down"] = float(sum(1 for s in stats if s.get("down")))
        q = agg["prefix_cache_queries"]
        agg["prefix_cache_hit_rate"] = agg["prefix_cache_hits"] / q if q else 0.0
        return agg

    def metrics(self) -> dict[str, float]:
        return self.aggregate(self.engine_stats())

    async def ametrics(self) -> dict[str, float]:
        return self.aggregate(await self.aengine_stats())

    def reset_prefix_cache(self) -> bool:
        return all(ray.get([a.reset_prefix_cache.remote() for a in self.actors]))

    def shutdown(self) -> None:
        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
        except Exception:
            pass
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        _remove_pgs(self.placement_groups)
        self.placement_groups = []


async def _await_ref(ref: Any) -> Any:
    return await ref


def _remove_pgs(pgs: list[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in pgs:
        try:
            remove_placement_group(pg)
        except Exception:
            pass
