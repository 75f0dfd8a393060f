"""OpenAIEngine against a real HTTP server on 127.0.0.1 (an OpenAI-style stand-in)."""
from __future__ import annotations

import json
import pickle
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mdd.config import EngineConfig, OpenAIOptions
from mdd.engines.base import EngineError, Message, Request, Sampling
from mdd.engines.openai_engine import OpenAIEngine, OpenAIRequestError


MALFORMED = {  # 200 bodies that are not a chat completion
    "truncated": b'{"id": "x", "choices": [{"message": {"content": "\xe5\xa5',
    "html": b"<html><body>502 Bad Gateway</body></html>",
    "no-choices": b'{"id": "x", "object": "chat.completion", "choices": []}',
    "null-content": b'{"choices": [{"message": {"content": {"a": 1}}}]}',
}


class StandIn:
    """Scripted responses: a queue of (status, headers) consumed per request, then 200s. A status
    may name a malformed 200 body (MALFORMED). ``malformed_every``: every n-th request gets one;
    ``reject_marker``: HTTP 400 for a request whose messages contain it."""

    def __init__(self) -> None:
        self.script: list[tuple[int | str, dict[str, str]]] = []
        self.malformed_every = 0
        self.malformed_sent = 0
        self.reject_marker: str | None = None
        self.rejected = 0
        self.bodies: list[dict] = []
        self.times: list[float] = []
        self.headers: list[dict[str, str]] = []
        self.delay = 0.0
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()


def _handler(state: StandIn):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(n) or b"{}")
            with state.lock:
                state.bodies.append(body)
                state.times.append(time.monotonic())
                state.headers.append(dict(self.headers))
                state.active += 1
                state.max_active = max(state.max_active, state.active)
                status, hdrs = state.script.pop(0) if state.script else (200, {})
                if state.malformed_every and len(state.bodies) % state.malformed_every == 0:
                    status = list(MALFORMED)[state.malformed_sent % len(MALFORMED)]
                    state.malformed_sent += 1
                if state.reject_marker and any(state.reject_marker in m["content"] for m in body.get("messages", [])):
                    status = 400
                    state.rejected += 1
            try:
                if state.delay:
                    time.sleep(state.delay)
                if self.path != "/v1/chat/completions":
                    status = 404
                structured = body.get("structured_outputs") or {}
                content = structured["choice"][0] if "choice" in structured else (
                    '{"covered": []}' if "json" in structured else "好的")
                if isinstance(status, str):
                    payload = None
                    data = MALFORMED[status]
                    status = 200
                elif status == 200:
                    payload = {
                        "id": "x", "object": "chat.completion", "model": body.get("model"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
                                  "prompt_tokens_details": {"cached_tokens": 8}},
                    }
                else:
                    payload = {"error": {"message": f"status {status}"}}
                if payload is not None:
                    data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                with state.lock:
                    state.active -= 1

    return H


def _serve() -> tuple[StandIn, ThreadingHTTPServer]:
    state = StandIn()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    return state, httpd


@pytest.fixture()
def server():
    state, httpd = _serve()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def two_servers():
    (a, ha), (b, hb) = _serve(), _serve()
    yield a, b
    for h in (ha, hb):
        h.shutdown()
        h.server_close()


def _engine(url: str, **kw) -> OpenAIEngine:
    opts = dict(base_url=url, backoff_s=0.01, max_backoff_s=0.05, max_retries=4, timeout_s=5.0)
    opts.update(kw)
    return OpenAIEngine.launch(EngineConfig(name="openai", model="qwen-test", openai=OpenAIOptions(**opts)))


REQ = Request(messages=(Message("system", "你是医生"), Message("user", "你好")),
              sampling=Sampling(temperature=0.5, top_p=0.8, max_tokens=20, frequency_penalty=0.3, seed=9))


async def test_retries_then_success(server):
    server.script = [(429, {"Retry-After": "0"}), (503, {}), (200, {})]
    eng = _engine(server.url)
    c = await eng.generate(REQ)
    await eng.close()
    assert (c.text, c.prompt_tokens, c.output_tokens, c.cached_tokens) == ("好的", 11, 2, 8)
    assert len(server.bodies) == 3
    b = server.bodies[-1]
    assert b["model"] == "qwen-test" and b["messages"][1] == {"role": "user", "content": "你好"}
    assert (b["temperature"], b["top_p"], b["max_tokens"], b["frequency_penalty"], b["seed"]) == (0.5, 0.8, 20, 0.3, 9)
    assert "structured_outputs" not in b
    assert eng.metrics()["prefix_cache_hits"] == 8


async def test_gives_up_with_engine_error(server):
    server.script = [(500, {})] * 10
    eng = _engine(server.url, max_retries=2)
    with pytest.raises(EngineError, match="3 attempts"):
        await eng.generate(REQ)
    assert len(server.bodies) == 3


async def test_backoff_grows(server):
    server.script = [(503, {})] * 3
    eng = _engine(server.url, backoff_s=0.05, max_backoff_s=1.0)
    await eng.generate(REQ)
    gaps = [b - a for a, b in zip(server.times, server.times[1:])]
    assert len(gaps) == 3
    assert gaps[0] >= 0.02 and gaps[2] >= 0.1  # 0.05*2^k with jitter in [half, full]


async def test_retry_after_is_honoured(server):
    server.script = [(429, {"Retry-After": "0.3"})]
    eng = _engine(server.url, backoff_s=0.001, max_backoff_s=1.0)
    await eng.generate(REQ)
    assert server.times[1] - server.times[0] >= 0.25


async def test_structured_output_fields(server):
    eng = _engine(server.url)
    await eng.generate(Request(messages=REQ.messages, sampling=Sampling(max_tokens=4, choice=("是", "否"))))
    schema = {"type": "object", "properties": {"end": {"type": "boolean"}}, "required": ["end"]}
    await eng.generate(Request(messages=REQ.messages, sampling=Sampling(max_tokens=30, json_schema=schema)))
    choice_body, json_body = server.bodies
    assert choice_body["structured_outputs"] == {"choice": ["是", "否"]}
    assert "response_format" not in choice_body
    assert json_body["structured_outputs"] == {"json": schema}
    assert json_body["response_format"]["type"] == "json_schema"
    assert json_body["response_format"]["json_schema"]["schema"] == schema


async def test_concurrency_limit(server):
    import asyncio

    server.delay = 0.05
    eng = _engine(server.url, concurrency=3)
    outs = await asyncio.gather(*(eng.generate(REQ) for _ in range(12)))
    assert len(outs) == 12
    assert 1 < server.max_active <= 3
    assert eng.metrics()["max_in_flight"] <= 3


@pytest.mark.parametrize("status", [400, 401, 404, 422, 425])
async def test_client_error_is_not_retried(server, status):
    server.script = [(status, {})]
    eng = _engine(server.url)
    with pytest.raises(OpenAIRequestError, match=f"HTTP {status}") as ei:
        await eng.generate(REQ)
    assert not isinstance(ei.value, EngineError) and ei.value.retriable is False
    assert len(server.bodies) == 1


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
async def test_transient_statuses_are_retried(server, status):
    server.script = [(status, {})]
    eng = _engine(server.url)
    assert (await eng.generate(REQ)).text == "好的"
    assert len(server.bodies) == 2 and eng.metrics()["retries"] == 1


async def test_malformed_bodies_are_retried_like_transport_errors(server):
    server.script = [(kind, {}) for kind in MALFORMED]
    eng = _engine(server.url)
    c = await eng.generate(REQ)
    assert c.text == "好的" and len(server.bodies) == len(MALFORMED) + 1
    m = eng.metrics()
    assert (m["malformed"], m["retries"], m["requests"], m["errors"]) == (len(MALFORMED), len(MALFORMED), 1, 0)


async def test_malformed_bodies_beyond_the_retries_are_an_engine_error(server):
    server.script = [("html", {})] * 10
    eng = _engine(server.url, max_retries=2)
    with pytest.raises(EngineError, match="malformed response body") as ei:
        await eng.generate(REQ)
    assert "Bad Gateway" not in str(ei.value)  # the body is not quoted
    assert len(server.bodies) == 3


async def test_connection_refused_is_engine_error():
    eng = _engine("http://127.0.0.1:9/v1", max_retries=1)
    with pytest.raises(EngineError, match="ConnectError|attempts"):
        await eng.generate(REQ)


async def test_env_url_key_and_pickling(server, monkeypatch):
    monkeypatch.setenv("MDD_TEST_URL", server.url)
    monkeypatch.setenv("MDD_TEST_KEY", "sk-test")
    opts = OpenAIOptions(base_url_env="MDD_TEST_URL", api_key_env="MDD_TEST_KEY", backoff_s=0.01)
    eng = OpenAIEngine.launch(EngineConfig(name="openai", model="m", openai=opts))
    await eng.generate(REQ)
    clone = pickle.loads(pickle.dumps(eng))  # workers receive a pickled engine
    await clone.generate(REQ)
    assert [h.get("Authorization") for h in server.headers] == ["Bearer sk-test"] * 2


def test_missing_base_url_names_the_env_var(monkeypatch):
    monkeypatch.delenv("MDD_OPENAI_BASE_URL", raising=False)
    with pytest.raises(EngineError, match="MDD_OPENAI_BASE_URL"):
        OpenAIEngine.launch(EngineConfig(name="openai", model="m"))


# --- the driver with the openai engine: real Ray workers against the stand-in on 127.0.0.1 ---------------

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def _driver_config(tmp_path: Path, url: str, cases: list[dict]):
    from mdd.config import load_config

    f = tmp_path / "cases.json"
    f.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    return load_config(ROOT / "configs" / "local.yaml", {
        "engine.name": "openai", "engine.model": "stand-in", "synth.cases": str(f), "synth.out": str(tmp_path / "out"),
        "synth.variants": 2, "synth.in_flight": 8, "synth.max_attempts": 3, "synth.retry_backoff_s": 0.1,
        "engine.openai": {"base_url": url, "backoff_s": 0.01, "max_backoff_s": 0.05, "max_retries": 4}})


def test_two_percent_malformed_bodies_every_dialogue_completes(ray_session, server, tmp_path):
    from mdd.synthesize.run import run_synthesis

    server.malformed_every = 50  # 2% of the responses
    cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:3]
    summary = run_synthesis(_driver_config(tmp_path, server.url, cases), progress=False)
    c = summary["counts"]
    assert (c["dialogues_run"], c["dialogues_failed"], c["dialogue_retries"]) == (6, 0, 0)
    assert server.malformed_sent >= 5
    m = summary["engine"]["metrics"]  # counted on the workers, collected into run.json
    run = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert run["engine"]["metrics"] == m
    assert m["requests"] == summary["llm_calls"]["total"] == len(server.bodies) - server.malformed_sent
    assert m["malformed"] == m["retries"] == server.malformed_sent


def test_a_final_client_error_fails_its_dialogues_once(ray_session, server, tmp_path):
    import polars as pl

    from mdd.synthesize.run import run_synthesis

    cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:3]
    cases[1]["主诉"] += "（拒收标记）"
    server.reject_marker = "拒收标记"
    summary = run_synthesis(_driver_config(tmp_path, server.url, cases), progress=False)
    failures = pl.read_parquet(tmp_path / "out" / "failures.parquet")
    bad = cases[1]["患者"]
    assert sorted(failures["dialogue_id"]) == [f"{bad}-v0", f"{bad}-v1"]
    assert (failures["attempts"] == 1).all() and failures["error"].str.contains("HTTP 400").all()
    assert server.rejected == 2  # one request per dialogue: neither the engine nor the driver retried
    assert summary["counts"]["dialogues_run"] == 4 and summary["counts"]["dialogue_retries"] == 0
    assert summary["engine"]["metrics"]["errors"] == 2


def test_named_openai_engines_each_role_reaches_its_endpoint(ray_session, two_servers, tmp_path):
    """engines: a hosted doctor and a local patient/tool model on two endpoints; every request of a
    role reaches its endpoint (seen at the endpoint: the model asked for and the call's instruction)."""
    import polars as pl
    import yaml

    from mdd.config import load_config
    from mdd.synthesize.run import run_synthesis

    hosted, local = two_servers
    opts = {"backoff_s": 0.01, "max_backoff_s": 0.05, "max_retries": 4}
    cases = json.loads(SAMPLES.read_text(encoding="utf-8"))[:3]
    (tmp_path / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    cfg = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text(encoding="utf-8"))
    cfg.pop("engine", None)
    cfg["engines"] = {"hosted": {"name": "openai", "model": "hosted-doctor", "openai": {"base_url": hosted.url, **opts}},
                      "local": {"name": "openai", "model": "local-small", "openai": {"base_url": local.url, **opts}}}
    cfg["roles"] = {"doctor": "hosted", "default": "local"}
    cfg["synth"] = {**cfg["synth"], "cases": str(tmp_path / "cases.json"), "out": str(tmp_path / "out"),
                    "variants": 2, "in_flight": 8}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    summary = run_synthesis(load_config(tmp_path / "cfg.yaml"), progress=False)
    assert summary["counts"]["dialogues_run"] == 6

    def instruction(body: dict) -> str:  # whose call: a tool verdict (【判断】, 【整理】) or a speaker's turn
        tag = body["messages"][-1]["content"].rpartition("【")[2].partition("】")[0]
        if tag in ("判断", "整理"):
            return tag
        system = body["messages"][0]["content"]
        return "医生" if system.startswith("你是一名精神科医生") else "患者" if "看病的人" in system else "其他"

    by_role = summary["llm_calls"]["by_role"]
    assert len(hosted.bodies) == by_role["doctor"] > 0
    local_calls = by_role["patient"] + by_role["companion"] + by_role["tool"]  # the companion: roles.default
    assert len(local.bodies) == local_calls > 0
    assert {b["model"] for b in hosted.bodies} == {"hosted-doctor"}
    assert {b["model"] for b in local.bodies} == {"local-small"}
    assert {instruction(b) for b in hosted.bodies} == {"医生"}  # the doctor's next question, nothing else
    assert "医生" not in {instruction(b) for b in local.bodies}
    assert {"患者", "判断"} <= {instruction(b) for b in local.bodies}  # patient answers and tool verdicts
    assert summary["llm_calls"]["by_model"] == {"hosted-doctor": by_role["doctor"],
                                                "local-small": local_calls}
    models = pl.read_parquet(tmp_path / "out" / "synth")["models"].to_list()
    assert all(m["doctor"] == "hosted-doctor" and m["patient"] == m["tool"] == "local-small" for m in models)
