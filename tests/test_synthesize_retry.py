"""The driver retries by the type of what failed, as the engine says (``should_retry``), and waits
before a retry only after an outage (an ``EngineError`` or a dead worker), never by an error's text."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from mdd.cases import load_cases
from mdd.config import DialogueConfig, load_config
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.synthesize.run import run_synthesis
from mdd.synthesize.worker import DialogueWorker
from mdd.engines.base import Completion, EngineError, EngineRequestError, Request
from mdd.engines.router import RoleRouter

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


class Raises(ScriptedEngine):
    """Raises ``exc`` on the first patient answer it is asked for (in this process)."""

    def __init__(self, exc: BaseException, retry: bool | None = None):
        super().__init__()
        self.exc, self.retry, self.raised = exc, retry, False

    async def generate(self, request: Request) -> Completion:
        if request.op == "PatGen" and not self.raised:
            self.raised = True
            raise self.exc
        return await super().generate(request)

    def should_retry(self, exc: BaseException) -> bool:
        return super().should_retry(exc) if self.retry is None else self.retry


def _run(engine) -> dict:
    cases, _ = load_cases(SAMPLES)
    worker = DialogueWorker({cases[0].case_id: cases[0]}, engine, DialogueConfig(), 7)
    return asyncio.run(worker.run(cases[0].case_id, 0))


@pytest.mark.parametrize("exc, retry, retriable, backoff", [
    (EngineError("engine 0 is unavailable"), None, True, True),  # an outage: again, after a wait
    (EngineRequestError("HTTP 400"), None, False, False),  # refused for good: never again
    (ValueError("engine-like words in a malformed answer"), None, True, False),  # the text says nothing
    (ValueError("malformed"), False, False, False),  # the engine says no
    (EngineError("down"), False, False, True),
])
def test_the_worker_reports_what_the_engine_says_by_type(exc, retry, retriable, backoff):
    res = _run(Raises(exc, retry))
    assert not res["ok"] and res["retriable"] is retriable and res["backoff"] is backoff


def test_a_router_retries_only_when_every_engine_would():
    eng = {"a": ScriptedEngine(), "b": Raises(ValueError(), retry=False)}
    router = RoleRouter(eng, None, 1)
    assert not router.should_retry(ValueError()) and RoleRouter({"a": ScriptedEngine()}, None, 1).should_retry(ValueError())
    assert not router.should_retry(EngineRequestError("x"))


class OnceEach(ScriptedEngine):
    """Every dialogue's first patient answer fails once with ``kind`` (by session, in this process)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.failed = kind, set()

    async def generate(self, request: Request) -> Completion:
        if request.op == "PatGen" and request.session not in self.failed:
            self.failed.add(request.session)
            raise EngineError("down for a moment") if self.kind == "outage" else ValueError("engine: malformed")
        return await super().generate(request)


def _subset(tmp: Path, n: int) -> Path:
    import json

    f = tmp / "cases.json"
    f.write_text(json.dumps(json.loads(SAMPLES.read_text(encoding="utf-8"))[:n], ensure_ascii=False), encoding="utf-8")
    return f


@pytest.mark.parametrize("kind, backoff", [("outage", 3.0), ("malformed", 120.0)])
def test_only_an_outage_waits_before_its_retry(ray_session, tmp_path, kind, backoff):
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = load_config(ROOT / "configs" / "local.yaml", {
        "synth.cases": str(_subset(tmp_path, 1)), "synth.out": str(tmp_path / "out"), "synth.variants": 2,
        "synth.max_attempts": 2, "synth.retry_backoff_s": backoff, "synth.num_workers": 1})
    t0 = time.monotonic()
    summary = run_synthesis(cfg, engine=OnceEach(kind), progress=False)
    took = time.monotonic() - t0
    assert summary["counts"]["dialogues_failed"] == 0 and summary["counts"]["dialogue_retries"] == 2
    assert pl.read_parquet(tmp_path / "out" / "synth" / "*.parquet").height == 2
    # (a malformed answer whose text begins with "engine" is no outage: retried at once)
    assert took >= backoff if kind == "outage" else took < backoff, took
