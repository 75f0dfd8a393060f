"""An in-process engine (e.g. ``scripted``) hosted in the actor pool's engine actors.

``engine.vllm.hosted: scripted`` keeps everything of a ``vllm`` run but the model: one engine actor
per GPU (``num_gpus_per_engine``, the same placement), the pool's sticky least-loaded routing and
its dead-actor handling, with the scripted engine answering inside each actor instead of vLLM.
That is a cluster dry run (placement, node loss, output) at no model cost, and the cheap engine a
multi-node test needs. The whole :class:`~mdd.engines.base.Request` crosses the Ray call (the
scripted engine reads its operation and context), so the dialogues are the same as a local
scripted run's, row for row.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ray

from mdd.engines.base import Request, engine_class
from mdd.engines.pool import ActorPoolEngine


@ray.remote
class HostedEngineActor:
    """The pool's actor interface around an in-process engine (``opts["hosted_class"]``, resolved by the
    driver: this process has imported no engine but the class's own module)."""

    def __init__(self, model: str, opts: dict[str, Any], index: int = 0) -> None:
        self.index = index
        self.engine = opts["hosted_class"].launch(SimpleNamespace(model=model))
        self.node = ray.get_runtime_context().get_node_id()
        self.in_flight = self.requests = self.prompt_tokens = self.output_tokens = 0

    def ready(self) -> dict[str, Any]:
        return {"index": self.index, "engine": self.engine.name, "model": self.engine.model, "node": self.node}

    async def generate_request(self, request: Request) -> dict[str, Any]:
        self.in_flight += 1
        self.requests += 1
        try:
            c = await self.engine.generate(request)
        finally:
            self.in_flight -= 1
        self.prompt_tokens += c.prompt_tokens
        self.output_tokens += c.output_tokens
        return {"text": c.text, "prompt_tokens": c.prompt_tokens, "output_tokens": c.output_tokens,
                "cached_tokens": c.cached_tokens, "finish_reason": c.finish_reason}

    def stats(self) -> dict[str, Any]:
        return {"index": self.index, "node": self.node, "in_flight": self.in_flight, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}

    def reset_prefix_cache(self) -> bool:
        return True

    def end_session(self, session: str, finished: bool = True) -> None:
        """A dialogue is over (the pool tells every actor type; the hosted engine keeps no room for it)."""

    def shutdown(self) -> None:
        self.engine.shutdown()


class HostedPoolEngine(ActorPoolEngine):
    """The actor pool over :class:`HostedEngineActor` s, placed as the vLLM pool's (``cfg.vllm``); its
    rows name the hosted engine, its errors read as the vLLM pool's."""

    name = "vllm"
    label = "vllm"

    @classmethod
    def launch(cls, cfg: Any, actor_cls: Any = None) -> "HostedPoolEngine":
        pool = cls.start(cfg, actor_cls or HostedEngineActor, {"hosted_class": engine_class(cfg.vllm.hosted)})
        pool.name, pool.model = pool.launch_info[0]["engine"], pool.launch_info[0]["model"]
        return pool

    def _call(self, actor: Any, request: Request, rid: str) -> Any:
        return actor.generate_request.remote(request)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "name": self.name}
