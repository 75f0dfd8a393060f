"""The one engine interface every backend implements.

An engine takes role-tagged chat messages plus sampling parameters and returns text with
token counts. A backend registers itself under the name a config gives it
(``@register_engine("vllm", options=VLLMOptions)``); the modules that do are listed in
``mdd/providers.py``, which the config loads when it checks ``engine.name``. Backends import their
heavy dependencies lazily, so the scripted dry run never imports vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, TypeVar, runtime_checkable

from mdd.errors import MddError

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters. ``choice`` and ``json_schema`` request structured output;
    ``min_tokens`` suppresses the end of the answer until that many tokens (0: off); ``top_k`` 0 and
    ``repetition_penalty`` 1.0 are off."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_tokens: int = 256
    frequency_penalty: float = 0.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    choice: tuple[str, ...] | None = None
    json_schema: dict[str, Any] | None = None
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.choice is not None and self.json_schema is not None:
            raise ValueError("Sampling: choose either `choice` or `json_schema`, not both")
        if self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"Sampling.min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")


@dataclass(frozen=True, slots=True)
class Request:
    """Everything an engine needs for one call.

    ``agent`` is the calling agent (doctor, patient, tool) and ``op`` the operation
    (DocGen, PatGen, IsTopicEnd, ...). Real engines use them for accounting only; the
    scripted engine uses them, with ``context``, to write its dry-run text.
    ``session`` names the dialogue so that a pool keeps all of its calls on one engine.
    """

    messages: tuple[Message, ...]
    sampling: Sampling = Sampling()
    agent: str = "tool"
    op: str = ""
    session: str = ""
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    finish_reason: str = "stop"


class EngineError(MddError, RuntimeError):
    """A retriable infrastructure failure (engine down, endpoint unreachable)."""


class EngineRequestError(ValueError):
    """A request the engine refuses for good (bad request, unknown model): retrying cannot help.

    An engine's :meth:`EngineBase.should_retry` says no to it, so the driver records the dialogue as
    failed after one attempt."""

    retriable = False


def add_metrics(*parts: dict[str, float]) -> dict[str, float]:
    """Counters of several processes as one: summed, except ``max_*`` (the maximum) and the
    ``in_flight`` gauge (left out)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            if k == "in_flight" or not isinstance(v, (int, float)):
                continue
            out[k] = max(out.get(k, v), v) if k.startswith("max_") else out.get(k, 0.0) + v
    return out


@runtime_checkable
class Engine(Protocol):
    name: str
    model: str

    async def generate(self, request: Request) -> Completion: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """A registered engine: its class, and the class of the options it reads from the engine's config
    (under the engine's name: ``engine.vllm``); ``None``: it needs the model name alone (and so can be
    hosted in the pool's actors, ``engine.vllm.hosted``)."""

    cls: type[EngineBase]
    options: type | None = None


_ENGINES: dict[str, EngineEntry] = {}


E = TypeVar("E", bound="EngineBase")


def register_engine(name: str, *, options: type | None = None) -> Callable[[type[E]], type[E]]:
    """Class decorator: the engine a config names ``name`` (``engine.name``), reading ``options``."""

    def register(cls: type[E]) -> type[E]:
        old = _ENGINES.get(name)
        if old is not None and old.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"engine {name!r}: registered twice ({old.cls.__qualname__}, {cls.__qualname__})")
        _ENGINES[name] = EngineEntry(cls, options)
        return cls

    return register


def registered_engines() -> dict[str, EngineEntry]:
    """The engines registered in this process (``mdd.providers.load_engines`` imports the built-in ones)."""
    return dict(_ENGINES)


def engine_class(name: str) -> type[EngineBase]:
    """Resolve an engine name (the part of the config string before ``/``) to its class."""
    key = name.split("/", 1)[0].strip().lower()
    if key not in _ENGINES:
        raise ValueError(f"engine: unknown engine {name!r}; known: {', '.join(sorted(_ENGINES)) or '(none loaded)'}")
    return _ENGINES[key].cls


class EngineBase:
    """Shared life cycle of the backends.

    ``launch`` runs once in the driver: it may start Ray actors (vLLM engines) and returns an
    object that is pickled to every dialogue worker. ``generate`` runs in the workers.
    ``metrics`` returns counters such as vLLM's prefix-cache queries and hits; ``shutdown``
    (driver side) releases what ``launch`` started.
    """

    name: str = "base"
    model: str = ""

    @classmethod
    def launch(cls, cfg: Any) -> "EngineBase":  # cfg: mdd.config.EngineConfig
        raise NotImplementedError

    @classmethod
    def preflight(cls, cfg: Any) -> None:
        """Cheap checks of the settings before anything starts (raises EngineError)."""
        return None

    async def generate(self, request: Request) -> Completion:
        raise NotImplementedError

    def should_retry(self, exc: BaseException) -> bool:
        """Whether a dialogue that failed with ``exc`` while this engine served it is worth running again
        from its start: yes, unless the engine refused a request for good (:class:`EngineRequestError`).
        An :class:`EngineError` (the engine down or unreachable) is also retried after a backoff."""
        return not isinstance(exc, EngineRequestError)

    async def close(self) -> None:
        return None

    async def close_session(self, session: str, finished: bool = True) -> None:
        """The dialogue ``session`` is over (``finished``: it ran to its end); a pool frees what it
        kept for it. Optional for a backend."""
        return None

    def models_for(self, session: str, roles: Any) -> dict[str, str]:
        """The model that plays each of ``roles`` in dialogue ``session`` (one engine: this one)."""
        return {r: self.model for r in roles}

    def metrics(self) -> dict[str, float]:
        return {}

    def worker_metrics(self) -> dict[str, float]:
        """Counters kept in this process's copy of the engine (an HTTP client's requests and
        retries): the driver collects them from every dialogue worker and adds them up. Engines
        whose counters live in their own actors (vLLM) report through ``metrics`` instead."""
        return {}

    def shutdown(self) -> None:
        return None


def launch_engine(cfg: Any) -> EngineBase:
    """Start the engine named by ``cfg.name`` (an ``EngineConfig``)."""
    return engine_class(cfg.name).launch(cfg)


def preflight_engine(cfg: Any) -> None:
    """The named engine's cheap checks (a missing base URL, ...) before Ray or a model starts."""
    engine_class(cfg.name).preflight(cfg)
