"""vLLM engines in Ray actors: ``actor`` (one AsyncLLM per actor and its helpers), ``pool`` (the
client the dialogue workers call: the generic actor pool of :mod:`mdd.engines.pool` over vLLM's
actors), ``admission`` (KV-aware admission), ``worker_ext`` (methods mixed into vLLM's worker)."""
from mdd.engines.vllm.actor import (
    EngineActor,
    EngineDeadError,
    PieceTokenizer,
    ThreadPolicy,
    build_sampling_params,
    engine_args_kwargs,
    sampling_to_dict,
)
from mdd.engines.vllm.pool import VLLMPoolEngine

__all__ = [
    "EngineActor",
    "EngineDeadError",
    "PieceTokenizer",
    "ThreadPolicy",
    "VLLMPoolEngine",
    "build_sampling_params",
    "engine_args_kwargs",
    "sampling_to_dict",
]
