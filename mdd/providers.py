"""The LLM providers a run can name (``engine.name``): the modules whose import registers an engine.

A new LLM provider is added in one place: a module with its engine class, decorated
``@register_engine("name", options=NameOptions)`` (:mod:`mdd.engines.base`), named in
:data:`ENGINE_MODULES`. The config loads these modules when it checks ``engine.name`` (and
``engine.vllm.hosted``), so whoever holds a validated config can launch any of them.
"""
from __future__ import annotations

import importlib

from mdd.engines.base import EngineEntry, registered_engines

ENGINE_MODULES = (
    "mdd.dialogue.dryrun.engine",  # scripted: the offline dry run
    "mdd.engines.vllm.pool",  # vllm: Ray actors each hosting vLLM
    "mdd.engines.openai_engine",  # openai: any OpenAI-compatible endpoint
)


def load_engines() -> dict[str, EngineEntry]:
    """Every built-in engine, registered: ``{name: EngineEntry}``."""
    for module in ENGINE_MODULES:
        importlib.import_module(module)
    return registered_engines()
