"""Session-wide fixtures: one local Ray and one real vLLM CPU engine for the whole test run.

The vLLM engine takes ~45-100 s to start on 2 cores (the first start on a machine also
compiles the model; later starts reuse vLLM's compile cache), so it starts at most once per
session and only when a test asks for ``vllm_engine``.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """The jobs' ``main()`` configure logging as a command line should (``logging.basicConfig``);
    called in-process, that binds the root logger to one test's captured stream, and later log
    records (Ray Data's too) would fail against the closed stream. Undo it after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


_S3_ENV: dict[str, str] = {}


def s3_test_env() -> dict[str, str]:
    """The AWS variables of the session's local S3 server (moto on a port chosen once)."""
    if not _S3_ENV:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        _S3_ENV.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_EC2_METADATA_DISABLED": "true"})
    return _S3_ENV


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray (2 CPUs, no dashboard); reuses one that is already running.

    As on a cluster, Ray's workers read object-store credentials from their own environment (the
    evaluation's shard workers write to OUT themselves): the local S3 server's variables are set
    before Ray starts, so that its workers inherit them (``s3_server`` serves that endpoint)."""
    import ray

    os.environ.update(s3_test_env())
    import ray.data  # noqa: F401 - now: its log handler binds sys.stderr when first imported, and a
    # first import inside a capsys test would bind that test's stream, closed for every later test
    started = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny random-weight Qwen2 model (built once into .cache/models/mdd-tiny; a stable
    path also lets vLLM reuse its compile cache across runs)."""
    from mdd.engines.tiny_model import build_tiny_model

    return build_tiny_model(os.environ.get("MDD_TINY_MODEL_DIR") or REPO / ".cache" / "models" / "mdd-tiny")


@pytest.fixture(scope="session")
def vllm_engine(ray_session, tiny_model_dir):
    """A launched ``VLLMPoolEngine`` configured as configs/local-vllm.yaml (tiny model)."""
    from mdd.config import load_config
    from mdd.engines.vllm import VLLMPoolEngine

    cfg = load_config(REPO / "configs" / "local-vllm.yaml").engine
    cfg = cfg.model_copy(update={"model": f"tiny:{tiny_model_dir}"})
    engine = VLLMPoolEngine.launch(cfg)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="session")
def sample_run():
    """The README main job's dialogues, made in-process: the 27 sample cases x 5 variants on the
    scripted engine with configs/local.yaml's seed (the same rows a run writes, without Ray)."""
    import asyncio

    from mdd.cases import load_cases
    from mdd.config import load_config
    from mdd.dialogue import ops
    from mdd.dialogue.loop import run_dialogue
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    cfg = load_config(REPO / "configs" / "local.yaml")
    cases, _ = load_cases(REPO / cfg.synth.cases)
    personas, seed, rows = ops.all_personas(), cfg.synth.seed, []

    async def run_all():
        engine = ScriptedEngine()
        for case in cases:
            triples = ops.sample_triples(case, seed, cfg.synth.variants)
            for v in range(cfg.synth.variants):
                persona = ops.choose_persona(personas, seed, case.case_id, v)
                rows.append((await run_dialogue(case, v, seed, engine, cfg.synth.dialogue, persona, triples[v]))[0])

    asyncio.run(run_all())
    return {"cases": {c.case_id: c for c in cases}, "rows": rows}


@pytest.fixture
def scaled_cases(tmp_path):
    """``scaled_cases(n, prefix)``: a JSON file of ``n`` copies of the sample cases, ids prefix00, …"""
    from mdd.perf.scale import scaled_cases as build

    def make(n: int, prefix: str) -> Path:
        return build(n, tmp_path / f"{prefix}-{n}.json", prefix=prefix, width=2)

    return make


@pytest.fixture(scope="session")
def main_run(ray_session, tmp_path_factory) -> Path:
    """The main job (jobs.run) on 6 sample cases x 2 variants, two rounds: round 1 in OUT/rounds/1/,
    round 2 (exemplars from round 1's index) in OUT, with its report and dataset card."""
    import json

    from jobs.run import main as run_main

    tmp = tmp_path_factory.mktemp("main-run")
    cases = tmp / "cases.json"
    samples = json.loads((REPO / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    cases.write_text(json.dumps(samples[:6], ensure_ascii=False), encoding="utf-8")
    out = tmp / "out"
    assert run_main(["--config", str(REPO / "configs" / "local.yaml"), "--cases", str(cases), "--out", str(out),
                     "--variants", "2", "--rounds", "2", "--no-progress"]) == 0
    return out


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API on 127.0.0.1 (moto's standalone server, from the dev extra) for the whole
    session; the AWS variables point this process (and the subprocesses it starts) at it.
    Yields ``new_uri()``: a fresh ``s3://bucket/prefix`` per call."""
    env = s3_test_env()
    port = int(env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "moto server did not start"
                time.sleep(0.2)
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("mdd-test")

        def new_uri() -> str:
            return f"s3://mdd-test/{uuid.uuid4().hex[:12]}"

        yield new_uri
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
