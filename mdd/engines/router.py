"""The engine the dialogue loop calls when ``engines:`` names several: it sends each call to the
engine that plays the call's role in that dialogue (``mdd/engines/roles.py``).

Each named engine is launched once (a vLLM pool keeps a dialogue on one of its engines, so the
dialogue's prefix stays cached there; an OpenAI-compatible endpoint per name works the same way).
The router is picklable when its engines are; it keeps no per-dialogue state (a dialogue's draw
is recomputed from its id), so retries and other workers route the same way.
"""
from __future__ import annotations

from typing import Any

from mdd.engines.base import Completion, EngineBase, Request, launch_engine
from mdd.engines.roles import RoleMap, role_of


class RoleRouter(EngineBase):
    name = "roles"

    def __init__(self, engines: dict[str, EngineBase], roles: RoleMap, run_seed: int) -> None:
        self.engines = dict(engines)
        self.roles = roles
        self.run_seed = int(run_seed)
        self.name = "+".join(sorted({e.name for e in self.engines.values()}))
        self.model = "+".join(sorted({e.model for e in self.engines.values()}))

    @classmethod
    def launch(cls, cfg: Any) -> "RoleRouter":  # cfg: mdd.config.Config with engines:
        launched: dict[str, EngineBase] = {}
        try:
            for name, ecfg in cfg.engines.items():
                launched[name] = launch_engine(ecfg)
        except BaseException:
            for e in launched.values():
                e.shutdown()
            raise
        return cls(launched, cfg.role_map(), cfg.synth.seed)

    @property
    def launch_info(self) -> list[dict[str, Any]]:
        """Every pool's engine actors as launched (their Ray nodes), each tagged with its engine name."""
        return [{**i, "pool": name} for name, e in self.engines.items() for i in getattr(e, "launch_info", None) or []]

    def engine_name(self, role: str, session: str) -> str:
        return self.roles.engine_for(role, session, self.run_seed)

    def engine_for(self, role: str, session: str) -> EngineBase:
        return self.engines[self.engine_name(role, session)]

    async def generate(self, request: Request) -> Completion:
        return await self.engine_for(role_of(request.agent), request.session).generate(request)

    def should_retry(self, exc: BaseException) -> bool:
        """Retried when every named engine would retry it (the one that raised is not known here)."""
        return all(e.should_retry(exc) for e in self.engines.values())

    def models_for(self, session: str, roles: Any) -> dict[str, str]:
        return {r: self.engine_for(r, session).model for r in roles}

    async def close_session(self, session: str, finished: bool = True) -> None:
        for e in self.engines.values():
            await e.close_session(session, finished)

    async def close(self) -> None:
        for e in self.engines.values():
            await e.close()

    def metrics(self) -> dict[str, float]:
        """Each named engine's counters (prefix-cache queries and hits per pool) as ``name.counter``."""
        return {f"{name}.{k}": v for name, e in self.engines.items() for k, v in e.metrics().items()}

    def worker_metrics(self) -> dict[str, float]:
        return {f"{name}.{k}": v for name, e in self.engines.items() for k, v in e.worker_metrics().items()}

    def shutdown(self) -> None:
        for e in self.engines.values():
            e.shutdown()


def launch_for(cfg: Any) -> EngineBase:
    """The engine a run calls: its single ``engine:``, or a router over its named ``engines:``."""
    if getattr(cfg, "engines", None):
        return RoleRouter.launch(cfg)
    return launch_engine(cfg.engine)
