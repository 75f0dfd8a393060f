"""Any OpenAI-compatible chat endpoint (``vllm serve``, hosted Qwen/DeepSeek, ...).

Plain ``httpx.AsyncClient`` (no SDK). The base URL comes from ``OpenAIOptions.base_url`` or
the environment variable it names (``MDD_OPENAI_BASE_URL`` by default), the key from
``api_key_env``. Structured outputs go in the body both as vLLM's ``structured_outputs``
(``{"choice": [...]}`` / ``{"json": schema}``) and, for JSON, as OpenAI's
``response_format: {"type": "json_schema", ...}``.

Retries with exponential backoff and jitter on 408, 409, 429, 5xx, connection errors, timeouts
and malformed 200 bodies (not JSON, no ``choices``), honouring ``Retry-After``; after
``max_retries`` an :class:`EngineError` (the driver retries the dialogue later). Every other 4xx
raises :class:`OpenAIRequestError`, which is final: the dialogue is recorded as failed once.

Each dialogue worker holds its own copy of the engine; its counters (``worker_metrics``) are
collected by the driver and reach ``run.json``.

The object is pickled to workers: the HTTP client and the concurrency semaphore are created
lazily, one per event loop.
"""
from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from typing import Any

from mdd.config import OpenAIOptions
from mdd.engines.base import Completion, EngineBase, EngineError, EngineRequestError, Request, register_engine

RETRY_STATUS = {408, 409, 429}  # and every 5xx


class MalformedResponse(ValueError):
    """A 200 whose body is not a chat completion: retried like a transport error."""


class OpenAIRequestError(EngineRequestError):
    """A final request error (HTTP 4xx other than 408/409/429): fix the request or config."""

    def __init__(self, status: int, body: str, url: str) -> None:
        super().__init__(f"openai: HTTP {status} from {url}: {body[:500]}")
        self.status = status
        self.body = body


@register_engine("openai", options=OpenAIOptions)
class OpenAIEngine(EngineBase):
    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        *,
        concurrency: int = 64,
        max_retries: int = 5,
        timeout_s: float = 120.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stats: dict[str, float] = {}
        self._init_local()

    def _init_local(self) -> None:
        self._loop_state: dict[int, tuple[Any, asyncio.Semaphore, Any]] = {}
        self.stats = {
            "requests": 0,
            "retries": 0,
            "errors": 0,
            "malformed": 0,
            "prompt_tokens": 0,
            "output_tokens": 0,
            "cached_tokens": 0,
            "in_flight": 0,
            "max_in_flight": 0,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_loop_state", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_local()

    @staticmethod
    def _base_url(o: Any) -> str:
        base_url = o.base_url or os.environ.get(o.base_url_env, "").strip()
        if not base_url:
            raise EngineError(
                f"openai engine: no base URL; set the environment variable {o.base_url_env} "
                f"(e.g. http://127.0.0.1:8000/v1) or engine.openai.base_url in the config"
            )
        return base_url

    @classmethod
    def preflight(cls, cfg: Any) -> None:
        cls._base_url(cfg.openai)

    @classmethod
    def launch(cls, cfg: Any) -> "OpenAIEngine":
        o = cfg.openai
        base_url = cls._base_url(o)
        api_key = os.environ.get(o.api_key_env) or None
        return cls(
            cfg.model,
            base_url,
            api_key,
            concurrency=o.concurrency,
            max_retries=o.max_retries,
            timeout_s=o.timeout_s,
            backoff_s=o.backoff_s,
            max_backoff_s=getattr(o, "max_backoff_s", 30.0),
        )

    # ----- per-loop resources ---------------------------------------------------------
    def _state(self) -> tuple[Any, asyncio.Semaphore]:
        import httpx

        loop = asyncio.get_running_loop()
        key = id(loop)
        st = self._loop_state.get(key)
        if st is None or st[2] is not loop:
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                headers=headers,
                limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
            )
            st = (client, asyncio.Semaphore(self.concurrency), loop)
            self._loop_state[key] = st
        return st[0], st[1]

    # ----- request body -----------------------------------------------------------------
    def body(self, request: Request) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.as_dict() for m in request.messages],
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
            "frequency_penalty": s.frequency_penalty,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.min_tokens:
            body["min_tokens"] = s.min_tokens  # a vLLM server extension; sent only when asked for
        if s.top_k:
            body["top_k"] = s.top_k  # vLLM (and most OpenAI-compatible servers) take these two as extensions
        if s.repetition_penalty != 1.0:
            body["repetition_penalty"] = s.repetition_penalty
        if s.choice is not None:
            body["structured_outputs"] = {"choice": list(s.choice)}
        elif s.json_schema is not None:
            body["structured_outputs"] = {"json": s.json_schema}
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": s.json_schema},
            }
        return body

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            ra = _parse_retry_after(retry_after)
            if ra is not None:
                return min(max(ra, 0.0), max(self.max_backoff_s, self.backoff_s))
        base = min(self.backoff_s * (2**attempt), self.max_backoff_s)
        return base * (0.5 + random.random() * 0.5)  # jitter in [base/2, base]

    # ----- calls ---------------------------------------------------------------------------
    async def generate(self, request: Request) -> Completion:
        import httpx

        client, sem = self._state()
        url = f"{self.base_url}/chat/completions"
        body = self.body(request)
        last = "no attempt"
        async with sem:
            self.stats["in_flight"] += 1
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])
            try:
                for attempt in range(self.max_retries + 1):
                    if attempt:
                        self.stats["retries"] += 1
                    retry_after = None
                    try:
                        resp = await client.post(url, json=body)
                    except (httpx.TimeoutException, httpx.TransportError) as exc:
                        last = f"{type(exc).__name__}: {exc}"
                    else:
                        if resp.status_code == 200:
                            try:
                                return self._completion(resp, url)
                            except MalformedResponse as exc:
                                self.stats["malformed"] += 1
                                last = str(exc)
                                if attempt < self.max_retries:
                                    await asyncio.sleep(self._delay(attempt, None))
                                continue
                        text = resp.text
                        if resp.status_code in RETRY_STATUS or resp.status_code >= 500:
                            last = f"HTTP {resp.status_code}: {text[:200]}"
                            retry_after = resp.headers.get("retry-after")
                        else:
                            self.stats["errors"] += 1
                            raise OpenAIRequestError(resp.status_code, text, url)
                    if attempt < self.max_retries:
                        await asyncio.sleep(self._delay(attempt, retry_after))
                self.stats["errors"] += 1
                raise EngineError(
                    f"openai: {url} failed after {self.max_retries + 1} attempts; last: {last}"
                )
            finally:
                self.stats["in_flight"] -= 1

    def _completion(self, resp: Any, url: str) -> Completion:
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            if not isinstance(text, str):
                raise TypeError("content is not text")
            usage = data.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            c = Completion(
                text=text,
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
                cached_tokens=int(details.get("cached_tokens") or 0),
                finish_reason=str(choice.get("finish_reason") or "stop"),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # the body is not shown: it may quote the prompt
            raise MalformedResponse(f"malformed response body ({len(resp.content)} bytes, "
                                    f"{type(exc).__name__}) from {url}") from None
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += c.prompt_tokens
        self.stats["output_tokens"] += c.output_tokens
        self.stats["cached_tokens"] += c.cached_tokens
        return c

    def metrics(self) -> dict[str, float]:
        m = {k: float(v) for k, v in self.stats.items()}
        m["prefix_cache_queries"] = m["prompt_tokens"]
        m["prefix_cache_hits"] = m["cached_tokens"]
        return m

    def worker_metrics(self) -> dict[str, float]:
        return self.metrics()

    async def close(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        st = self._loop_state.pop(id(loop), None)
        if st is not None:
            await st[0].aclose()


def _parse_retry_after(value: str) -> float | None:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return dt.timestamp() - time.time()
