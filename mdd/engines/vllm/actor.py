"""The vLLM engine actor: one vLLM v1 ``AsyncLLM`` hosted in a Ray actor, and its helpers.

* :class:`EngineActor` runs one engine (one GPU, or the front end of a tensor-parallel group;
  :mod:`mdd.engines.pool` places it) and serves many calls at once.
* :func:`sampling_to_dict` / :func:`build_sampling_params`: our ``Sampling`` as it crosses the
  Ray call, and as vLLM's ``SamplingParams`` inside the actor.
* :func:`engine_args_kwargs`: the config's ``vllm`` options as ``AsyncEngineArgs``.
* :class:`PieceTokenizer`: cached piece-wise prompt tokenization; :class:`ThreadPolicy`: intra-op
  threads of a CPU engine by load (through :mod:`mdd.engines.vllm.worker_ext`).
* A vLLM core that died raises :class:`EngineDeadError` and the actor exits so Ray restarts it.

vLLM is imported only inside the actor process.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import ray

from mdd.engines.base import Sampling
from mdd.engines.vllm.admission import AdmissionGate

log = logging.getLogger(__name__)

PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
KV_USAGE = "vllm:kv_cache_usage_perc"  # blocks held by running requests ÷ all blocks (a gauge)
PREEMPTIONS = "vllm:num_preemptions"  # running requests pushed out of a full cache (a counter)


class CallRecord(NamedTuple):
    """One request as the engine served it (the benchmark replays these shapes, reads the engine's
    occupancy from the times and charges engine time to roles). ``chain``: the prompt chain the
    call extends (its dialogue, its agent and its first message), so a replay can give every chain
    its own cached prefix."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    start: float
    end: float
    role: str = ""
    chain: int = 0


class EngineDeadError(RuntimeError):
    """Raised inside the actor when its vLLM engine core died; the actor then exits so Ray
    restarts it. Crosses Ray as ``RayTaskError(EngineDeadError)``."""


def sampling_to_dict(s: Sampling) -> dict[str, Any]:
    """A plain, picklable form of :class:`Sampling` (what crosses the Ray call)."""
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
        "frequency_penalty": s.frequency_penalty,
        "top_k": s.top_k,
        "repetition_penalty": s.repetition_penalty,
        "seed": s.seed,
        "choice": list(s.choice) if s.choice is not None else None,
        "json_schema": s.json_schema,
        "min_tokens": s.min_tokens,
    }


def build_sampling_params(d: dict[str, Any], max_tokens: int | None = None) -> Any:
    """``Sampling`` dict → ``vllm.SamplingParams`` (structured outputs via
    ``StructuredOutputsParams``; final output only, no streaming deltas; token ids only: the
    caller decodes the finished answer once instead of vLLM detokenizing it token by token)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured = None
    if d.get("choice"):
        structured = StructuredOutputsParams(choice=list(d["choice"]))
    elif d.get("json_schema") is not None:
        structured = StructuredOutputsParams(json=d["json_schema"])
    max_tokens = int(max_tokens if max_tokens is not None else d.get("max_tokens", 256))
    return SamplingParams(
        temperature=float(d.get("temperature", 0.7)),
        top_p=float(d.get("top_p", 1.0)),
        max_tokens=max_tokens,
        min_tokens=min(int(d.get("min_tokens") or 0), max_tokens),
        frequency_penalty=float(d.get("frequency_penalty", 0.0)),
        top_k=int(d.get("top_k") or 0),  # 0: off
        repetition_penalty=float(d.get("repetition_penalty", 1.0)),
        seed=d.get("seed"),
        structured_outputs=structured,
        output_kind=RequestOutputKind.FINAL_ONLY,
        detokenize=False,
    )


WORKER_EXTENSION = "mdd.engines.vllm.worker_ext.CPUThreads"


def _no_gpu(opts: dict[str, Any]) -> bool:
    """The engine runs on vLLM's CPU build (no GPU given to it)."""
    return float(opts.get("num_gpus_per_engine", 1.0)) == 0.0


def engine_args_kwargs(model: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Every ``VLLMOptions`` field → ``AsyncEngineArgs`` keyword arguments."""
    tp = int(opts.get("tensor_parallel_size", 1))
    kw: dict[str, Any] = {
        "model": model,
        "max_num_seqs": int(opts["max_num_seqs"]),
        "max_num_batched_tokens": int(opts["max_num_batched_tokens"]),
        "gpu_memory_utilization": float(opts["gpu_memory_utilization"]),
        "max_model_len": int(opts["max_model_len"]),
        "dtype": opts.get("dtype", "auto"),
        "enable_prefix_caching": bool(opts.get("enable_prefix_caching", True)),
        "enforce_eager": bool(opts.get("enforce_eager", False)),
        "tensor_parallel_size": tp,
        "disable_log_stats": False,  # keep the Prometheus counters (prefix cache) alive
    }
    if opts.get("block_size") is not None:
        kw["block_size"] = int(opts["block_size"])
        if opts.get("kv_cache_tokens"):  # whole blocks, plus the null block vLLM holds back
            kw["num_gpu_blocks_override"] = -(-int(opts["kv_cache_tokens"]) // kw["block_size"]) + 1
    if opts.get("kv_cache_dtype", "auto") != "auto":
        kw["kv_cache_dtype"] = str(opts["kv_cache_dtype"])
    if opts.get("cpu_threads") and _no_gpu(opts):
        kw["worker_extension_cls"] = WORKER_EXTENSION
    if tp > 1:
        kw["distributed_executor_backend"] = "ray"
    # A model folder with its own tokenizer/ (the tiny model: a character-level tokenizer that
    # AutoTokenizer would otherwise replace with Qwen2's byte-level one, keyed on model_type)
    if (Path(model) / "tokenizer" / "tokenizer.json").is_file():
        kw["tokenizer"] = str(Path(model) / "tokenizer")
    kw.update(opts.get("extra") or {})
    return kw


def engine_env(opts: dict[str, Any]) -> dict[str, str]:
    """Environment variables vLLM reads at start-up, from the ``VLLMOptions`` fields."""
    env: dict[str, str] = {}
    kv = opts.get("kv_cache_space_gib")
    if kv is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(round(float(kv)))))
    mp = opts.get("v1_multiprocessing")
    if mp is None and _no_gpu(opts):
        mp = False  # the CPU build: one process fewer competing for the same cores
    if mp is not None:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if mp else "0"
    if opts.get("batch_invariant"):
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


class PieceTokenizer:
    """Tokenizes a chat prompt piece by piece between special tokens, caching each piece.

    A dialogue's prompts are append-only, so all but the newest messages were tokenized by an
    earlier call; re-encoding a whole 5k-token prompt costs milliseconds of the engine actor's
    event loop per call. Special tokens (``<|im_start|>``, ``<|im_end|>``) are matched before
    any other tokenization, so encoding the pieces between them gives the same ids as encoding
    the whole text; a self-check at start-up confirms it for the tokenizer at hand and falls
    back to whole-text encoding where it does not hold.
    """

    SAMPLE = [{"role": "system", "content": "你是一名精神科医生。 Be brief.\n"},
              {"role": "user", "content": "  最近睡不好，\n\n【下一步】问一下 sleep 情况。"},
              {"role": "assistant", "content": "您好！最近 睡眠怎么样？"},
              {"role": "user", "content": "还行吧……"}]

    def __init__(self, tokenizer: Any, max_pieces: int = 200_000) -> None:
        self.tokenizer = tokenizer
        self.max_pieces = max_pieces
        self.cache: OrderedDict[str, list[int]] = OrderedDict()
        self.hits = self.misses = 0
        specials = sorted({t for t in self._specials() if t}, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        if self.split is not None:
            try:
                text = tokenizer.apply_chat_template(self.SAMPLE, add_generation_prompt=True, tokenize=False)
                if self.encode(text) != self._whole(text):
                    self.split = None
            except Exception:  # pragma: no cover - a tokenizer without a chat template
                self.split = None
            self.cache.clear()
        if self.split is None:
            log.info("tokenizing whole prompts: piece-wise encoding does not match for this tokenizer")

    def _specials(self) -> list[str]:
        decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        found = [getattr(t, "content", "") for t in decoder.values() if getattr(t, "special", False)]
        return found or list(getattr(self.tokenizer, "all_special_tokens", []) or [])

    def _whole(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        if self.split is None:
            return self._whole(text)
        ids: list[int] = []
        for piece in self.split.split(text):
            if not piece:
                continue
            got = self.cache.get(piece)
            if got is None:
                self.misses += 1
                got = self._whole(piece)
                self.cache[piece] = got
                if len(self.cache) > self.max_pieces:
                    self.cache.popitem(last=False)
            else:
                self.hits += 1
                self.cache.move_to_end(piece)
            ids.extend(got)
        return ids


class ThreadPolicy:
    """Intra-op threads of a CPU engine by load: ``high`` threads while at least ``min_batch``
    requests are in flight, one thread once they fall to half of that (hysteresis).

    A decode step of a big batch is mostly attention over every sequence's KV cache and splits
    well across cores; a step at batch 1 is microseconds of work per operator, and spreading it
    over threads only adds their synchronisation (measured on 2 cores: one dialogue in flight ran
    25% slower with 2 threads, 135 in flight ran 15% faster). ``apply`` sends the change to the
    engine (it lands between two steps); one change is in the air at a time, and a change that
    fails leaves the policy off.
    """

    def __init__(self, high: int | None, min_batch: int, apply: Any) -> None:
        self.high = high if high and high > 1 else None
        self.min_batch = max(1, min_batch)
        self.apply = apply
        # None: not managed; 0: as started (OMP_NUM_THREADS) until the first change
        self.current: int | None = 0 if self.high else None
        self.switches = 0
        self.pending: asyncio.Task[Any] | None = None
        self.load = 0

    def want(self, load: int) -> int | None:
        if not self.high:
            return self.current
        if load >= self.min_batch:
            return self.high
        if load <= self.min_batch // 2:
            return 1
        return self.current

    def update(self, load: int) -> None:
        self.load = load
        n = self.want(load)
        if n is not None and n != self.current and self.pending is None:  # (None only when current is None)
            self._send(n)

    def _send(self, n: int) -> None:
        self.pending = asyncio.get_running_loop().create_task(self.apply(n))
        self.pending.add_done_callback(lambda t: self._done(t, n))

    def _done(self, task: asyncio.Task[Any], n: int) -> None:
        self.pending = None
        if task.cancelled() or task.exception() is not None:
            log.warning("engine threads: setting %d failed (%s); keeping %d", n,
                        None if task.cancelled() else task.exception(), self.current)
            self.high = None
            return
        self.current = int(task.result())
        self.switches += 1
        self.update(self.load)  # the load may have moved while the change was in the air


@ray.remote
class EngineActor:
    """One vLLM v1 ``AsyncLLM`` in a Ray actor (async methods: many calls in flight)."""

    def __init__(self, model: str, opts: dict[str, Any], index: int = 0) -> None:
        os.environ.update(engine_env(opts))  # read when the engine core starts (a spawned child inherits it)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.index = index
        self.model = model
        self.max_model_len = int(opts["max_model_len"])
        seeded = opts.get("per_request_seed")
        if seeded is None:
            from vllm.platforms import current_platform

            # vLLM 0.32's CPU sampler fails on seeded requests in a batch ("CPU Generator does
            # not use offset") and takes the engine core down: seeds only where they work.
            seeded = not current_platform.is_cpu()
        self.seeded = bool(seeded)
        t0 = time.monotonic()
        kwargs = engine_args_kwargs(model, opts)
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.start_s = time.monotonic() - t0
        self.tokenizer = self._load_tokenizer(kwargs)
        self.piece_ids = PieceTokenizer(self.tokenizer)
        cache_config = getattr(getattr(self.llm, "vllm_config", None), "cache_config", None)
        self.block_size = int(getattr(cache_config, "block_size", 0) or 0)  # as vLLM resolved it
        self.kv_cache_dtype = str(getattr(cache_config, "cache_dtype", "auto"))
        self.kv_blocks = int(getattr(cache_config, "num_gpu_blocks", 0) or 0)
        adm = opts.get("admission") or {}
        self.gate = AdmissionGate(max(1, self.kv_blocks - 1) * max(1, self.block_size),
                                  mode=adm.get("mode", "fixed"), fill=float(adm.get("fill", 0.9)),
                                  prior_tokens=int(adm.get("prior_tokens") or self.max_model_len // 2))
        self.threads = ThreadPolicy(
            int(opts["cpu_threads"]) if kwargs.get("worker_extension_cls") == WORKER_EXTENSION else None,
            int(opts.get("cpu_threads_min_batch", 16)), self._set_threads)
        self.in_flight = 0
        self.requests = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.call_log: list[CallRecord] = []

    def _load_tokenizer(self, kwargs: dict[str, Any]) -> Any:
        tok = getattr(self.llm, "tokenizer", None)
        if tok is not None and hasattr(tok, "apply_chat_template") and hasattr(tok, "encode"):
            return tok
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(kwargs.get("tokenizer") or kwargs["model"],
                                             trust_remote_code=bool(kwargs.get("trust_remote_code")))

    def ready(self) -> dict[str, Any]:
        return {"index": self.index, "model": self.model, "start_s": self.start_s, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id()}

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.piece_ids.encode(text)

    async def generate(
        self, messages: list[dict[str, str]], sampling: dict[str, Any], request_id: str, session: str = "",
        role: str = "",
    ) -> dict[str, Any]:
        """One call. ``session`` names its dialogue: a new one passes the admission gate first;
        ``role`` (doctor, patient, tool ...) is recorded in the call log."""
        await self.gate.enter(session)
        chain = hash(messages[0]["content"]) if messages else 0  # the prompt chain this call extends
        held = 0
        try:
            out = await self._generate(messages, sampling, request_id, role, hash((session, role, chain)))
            held = out["prompt_tokens"] + out["output_tokens"]
            return out
        finally:
            self.gate.leave(session, chain, held)

    async def _generate(self, messages: list[dict[str, str]], sampling: dict[str, Any],
                        request_id: str, role: str = "", chain: int = 0) -> dict[str, Any]:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDead

        t_start = time.monotonic()
        ids = self._prompt_ids(messages)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit max_model_len={self.max_model_len}"
            )
        if not self.seeded:
            sampling = {**sampling, "seed": None}
        params = build_sampling_params(sampling, max_tokens=min(int(sampling["max_tokens"]), room))
        self._enter()
        self.requests += 1
        final = None
        try:
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=ids), params, request_id):
                final = out
        except VLLMEngineDead as exc:
            self.errors += 1
            self._exit_soon()
            raise EngineDeadError(f"engine {self.index}: vLLM engine core died: {exc}") from None
        except BaseException:
            self.errors += 1
            raise
        finally:
            self._leave()
        if final is None or not final.outputs:
            raise RuntimeError(f"engine {self.index}: no output for request {request_id}")
        comp = final.outputs[0]
        n_prompt = len(final.prompt_token_ids or ids)
        n_out = len(comp.token_ids)
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        self.prompt_tokens += n_prompt
        self.output_tokens += n_out
        self.cached_tokens += cached
        if len(self.call_log) < 1_000_000:
            self.call_log.append(CallRecord(n_prompt, cached, n_out, t_start, time.monotonic(), role, chain))
        return {
            "text": self.tokenizer.decode(comp.token_ids, skip_special_tokens=True),
            "prompt_tokens": n_prompt,
            "output_tokens": n_out,
            "cached_tokens": cached,
            "finish_reason": comp.finish_reason or "stop",
        }

    def _enter(self) -> None:
        self.in_flight += 1
        self.threads.update(self.in_flight)

    def _leave(self) -> None:
        self.in_flight -= 1
        self.threads.update(self.in_flight)

    async def _set_threads(self, n: int) -> int:
        got = await self.llm.collective_rpc("mdd_set_threads", args=(n,))
        return int(got[0])

    def _exit_soon(self) -> None:
        """The engine core is gone: leave so Ray restarts this actor (max_restarts)."""
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, os._exit, 1)

    def end_session(self, session: str, finished: bool = True) -> None:
        """A dialogue is over: the admission gate frees its room (and learns its footprint)."""
        self.gate.end(session, learn=finished)

    def set_admission(self, mode: str) -> str:
        """Switch admission between ``fixed`` and ``kv`` while the engine runs (the benchmark)."""
        if mode not in ("fixed", "kv"):
            raise ValueError(f"admission mode must be 'fixed' or 'kv', got {mode!r}")
        self.gate.mode = mode
        self.gate._wake()
        return mode

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "index": self.index,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "block_size": self.block_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "threads": self.threads.current,
            "thread_switches": self.threads.switches,
            "kv_blocks": self.kv_blocks,
            "per_request_seed": self.seeded,
            **self.gate.stats(),
        }
        queries = hits = None
        try:
            from vllm.v1.metrics.reader import get_metrics_snapshot

            for m in get_metrics_snapshot():
                name = m.name.removesuffix("_total")
                if name == PREFIX_QUERIES:
                    queries = (queries or 0) + int(getattr(m, "value", 0))
                elif name == PREFIX_HITS:
                    hits = (hits or 0) + int(getattr(m, "value", 0))
                elif name == KV_USAGE:
                    s["kv_cache_usage"] = float(getattr(m, "value", 0.0))
                elif name == PREEMPTIONS:
                    s["preemptions"] = s.get("preemptions", 0) + int(getattr(m, "value", 0))
        except Exception:  # pragma: no cover - metrics are best effort
            pass
        if queries is None or hits is None:  # fall back to our own per-request counts
            s["prefix_cache_queries"] = self.prompt_tokens
            s["prefix_cache_hits"] = self.cached_tokens
            s["prefix_cache_source"] = "requests"
        else:
            s["prefix_cache_queries"] = queries
            s["prefix_cache_hits"] = hits
            s["prefix_cache_source"] = "vllm"
        return s

    def take_log(self) -> list[CallRecord]:
        """The requests served since the last call."""
        out, self.call_log = self.call_log, []
        return out

    def vocab_size(self) -> int:
        return len(self.tokenizer)

    async def generate_tokens(self, prompt_ids: list[int], max_tokens: int, request_id: str,
                              temperature: float = 0.0) -> dict[str, Any]:
        """A raw request with a forced output length (benchmark baseline: no chat template, no EOS)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=float(temperature), max_tokens=max(1, int(max_tokens)), ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY, detokenize=False)
        final = None
        self._enter()
        try:
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id):
                final = out
        finally:
            self._leave()
        n_out = len(final.outputs[0].token_ids) if final is not None and final.outputs else 0
        return {"output_tokens": n_out, "cached_tokens": int(getattr(final, "num_cached_tokens", 0) or 0)}

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.llm.reset_prefix_cache())

    def shutdown(self) -> None:
        try:
            self.llm.shutdown()
        except Exception:  # pragma: no cover
            pass
