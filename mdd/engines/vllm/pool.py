"""The vLLM pool: the generic actor pool (:mod:`mdd.engines.pool`) over :class:`EngineActor` s.

Layout::

    driver: VLLMPoolEngine.launch(cfg) ──starts──> EngineActor × num_engines (one AsyncLLM each)
    workers: pickled VLLMPoolEngine.generate(request) ──Ray call──> EngineActor.generate(...)

What is vLLM's here: the actor class, how a request crosses to it (messages and sampling as plain
dicts), that its core dying (:class:`EngineDeadError`) marks the engine down, and the model check
before anything starts. For ``tensor_parallel_size > 1`` vLLM is started with
``distributed_executor_backend="ray"`` so its TP workers land in the pool's placement group.
``engine.vllm.hosted`` starts the hosted pool (:mod:`mdd.engines.hosted`) instead.
"""
from __future__ import annotations

from typing import Any

from mdd.config import VLLMOptions
from mdd.engines.base import Request, register_engine
from mdd.engines.pool import ActorPoolEngine
from mdd.engines.vllm.actor import EngineActor, EngineDeadError, sampling_to_dict


@register_engine("vllm", options=VLLMOptions)
class VLLMPoolEngine(ActorPoolEngine):
    """Client of a pool of :class:`EngineActor` s; picklable (actor handles only)."""

    name = "vllm"
    label = "vllm"
    dead_errors = (EngineDeadError,)

    @classmethod
    def preflight(cls, cfg: Any) -> None:
        """A model of the registry must be fetched before anything starts (EngineError names the command)."""
        from mdd.engines.tiny_model import is_tiny, resolve_model

        if not is_tiny(cfg.model) and not getattr(cfg.vllm, "hosted", None):
            resolve_model(cfg.model)

    @classmethod
    def launch(cls, cfg: Any, actor_cls: Any = None) -> ActorPoolEngine:
        """Start ``cfg.vllm.num_engines`` engine actors (``actor_cls``, by default
        :class:`EngineActor`) and wait until all are ready. ``cfg.vllm.hosted`` starts
        :class:`mdd.engines.hosted.HostedEngineActor` s instead."""
        if actor_cls is None and getattr(cfg.vllm, "hosted", None):
            from mdd.engines.hosted import HostedPoolEngine

            return HostedPoolEngine.launch(cfg)
        return cls.start(cfg, actor_cls or EngineActor)

    def _call(self, actor: Any, request: Request, rid: str) -> Any:
        """The Ray call that sends ``request`` to ``actor`` (an object ref)."""
        msgs = [m.as_dict() for m in request.messages]
        return actor.generate.remote(msgs, sampling_to_dict(request.sampling), rid, request.session, request.agent)
