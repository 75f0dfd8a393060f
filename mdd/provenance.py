"""Provenance: what made a dialogue, as one fingerprint, and whether a rerun may add to an output.

The fingerprint is a hash of the components that decide a dialogue's content:

- ``engine``, ``model``: the engine and the model that wrote it;
- ``seed``: the run seed (every dialogue's seed derives from it);
- ``dialogue``: the ``synth.dialogue`` config section (caps, sampling);
- ``prompts``: a hash of the text of the modules that write the prompts (``PROMPT_MODULES``:
  ``mdd/dialogue/prompts.py``, ``patient.py``, ``lay.py``);
- ``knowledge``: a hash of every YAML file under ``mdd/knowledge/`` (trees, graphs, personas, ...);
  both hashes read a moved module under its former name (``MOVED``): moving code writes no new prompt,
  so it neither changes the fingerprint nor stops a resume; the dry-run engine's script in the knowledge
  (``DRY_RUN_SCRIPT``) is left out, like its code;
- ``privacy``: ``privacy.case_ids`` and an id of the id-hash key (never the key): another key gives
  other case ids.

Settings that change how fast, not what, are left out (in flight, workers, shard size, retries,
``variants``: more variants of the same config add to an output). The fingerprint and its
components are written to ``run.json`` (``provenance``) and to every synth shard's Parquet
metadata (``mdd.fingerprint``, ``mdd.provenance``).

A rerun into an output that already holds dialogues follows ``--resume``:

- ``if-possible`` (the default): resume only when every dialogue there was made with this run's
  fingerprint; otherwise refuse, naming the components that differ;
- ``always``: resume whatever made the dialogues there; ``run.json`` lists every fingerprint in the
  output (``provenance.history``) and each shard keeps its own, so the mix is on record;
- ``never``: never add to an output that holds dialogues (a fresh ``--out`` for every run).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mdd.errors import MddError

RESUME_POLICIES = ("if-possible", "always", "never")
FINGERPRINT_KEY = "mdd.fingerprint"
COMPONENTS_KEY = "mdd.provenance"
UNKNOWN = "unknown"  # dialogues written before fingerprints, or by another tool

_PKG = Path(__file__).resolve().parent


class ProvenanceMismatch(MddError, ValueError):
    """A rerun would mix dialogues of different provenance into one output (exit code 2)."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


# the modules that write what the models are shown (the doctor's and the tool's prompts, the
# patient's lay view of the case)
PROMPT_MODULES = ("dialogue/prompts.py", "dialogue/patient.py", "dialogue/lay.py")


# modules moved since fingerprints began, new name -> former name (as module and as path): the hashes
# read a mention of the new name as the former one
MOVED = {"mdd.record.speech": "mdd.evaluate.speech", "mdd.dialogue.dryrun.engine": "mdd.engines.scripted",
         "mdd.dialogue.dryrun.speech": "mdd.engines.scripted_speech"}


# the dry-run engine's own script kept in the knowledge files, (file, top-level key, key): how each speech
# style shapes a scripted answer was code of the engine until it became data. Like the engine's code (the
# fingerprint names the engine, ``scripted``, not its code), it is left out of the knowledge hash, with
# the comment lines right above it
DRY_RUN_SCRIPT = (("styles.yaml", "scripted", "behaviour"),)


def _as_before(data: bytes) -> bytes:
    for new, old in MOVED.items():
        for a, b in ((new, old), (new.replace(".", "/") + ".py", old.replace(".", "/") + ".py")):
            data = data.replace(a.encode(), b.encode())
    return data


def _without_key(data: bytes, top: str, key: str) -> bytes:
    """``data`` (a YAML file) without ``top.key`` (a two-space-indented key of the top-level ``top``), its
    value's lines (up to the next key or a blank line) and the comment lines right above it."""
    out: list[str] = []
    in_top = skipping = False
    for line in data.decode("utf-8").split("\n"):
        if line and not line.startswith((" ", "#")):
            in_top, skipping = line.startswith(f"{top}:"), False
        elif in_top and line.startswith(f"  {key}:"):
            while out and out[-1].startswith("  #"):
                out.pop()
            skipping = True
            continue
        elif skipping and (line.startswith("    ") or (line.startswith("  #") and not line.startswith("  # "))):
            continue
        elif skipping and (line.startswith("  ") or not line):  # the next key of ``top``, or a blank line
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out).encode("utf-8")


def prompts_hash() -> str:
    h = hashlib.sha256()
    for rel in PROMPT_MODULES:
        f = _PKG / rel
        h.update(rel.encode() + b"\0" + (_as_before(f.read_bytes()) if f.is_file() else b"") + b"\0")
    return h.hexdigest()[:16]


def knowledge_hash() -> str:
    h = hashlib.sha256()
    root = _PKG / "knowledge"
    for f in sorted(root.rglob("*.yaml")):
        rel, data = f.relative_to(root).as_posix(), _as_before(f.read_bytes())
        for name, top, key in DRY_RUN_SCRIPT:
            if rel == name:
                data = _without_key(data, top, key)
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def components(cfg: Any, engine: str, model: str, key_id: str) -> dict[str, Any]:
    """The fingerprint's components for a run of ``cfg`` (a ``mdd.config.Config``)."""
    return {
        "engine": engine,
        "model": model,
        "seed": cfg.synth.seed,
        "dialogue": cfg.synth.dialogue.model_dump(mode="json"),
        "prompts": prompts_hash(),
        "knowledge": knowledge_hash(),
        "privacy": {"case_ids": cfg.privacy.case_ids, "key_id": key_id},
    }


def fingerprint(comp: dict[str, Any]) -> str:
    return _sha(json.dumps(comp, sort_keys=True, ensure_ascii=False).encode())


def shard_metadata(comp: dict[str, Any]) -> dict[str, str]:
    """Key-value pairs for a shard's Parquet metadata."""
    return {FINGERPRINT_KEY: fingerprint(comp), COMPONENTS_KEY: json.dumps(comp, sort_keys=True, ensure_ascii=False)}


def in_output(store: Any, shards: list[str]) -> dict[str, dict[str, Any]]:
    """``{fingerprint: components}`` of the given synth shards of a ``mdd.storage.Store``
    (``UNKNOWN`` for shards without one)."""
    found: dict[str, dict[str, Any]] = {}
    for rel in shards:
        meta = store.read_metadata(rel).metadata or {}
        fp = meta.get(FINGERPRINT_KEY.encode(), b"").decode() or UNKNOWN
        if fp not in found:
            try:
                found[fp] = json.loads(meta.get(COMPONENTS_KEY.encode(), b"{}"))
            except ValueError:
                found[fp] = {}
    return found


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} ({a} -> {b})" if not isinstance(a, dict) and not isinstance(b, dict)
                       else f"{prefix}{k}")
    return out


def check_resume(existing: dict[str, dict[str, Any]], comp: dict[str, Any], policy: str, out: str) -> None:
    """Raise :class:`ProvenanceMismatch` when ``policy`` forbids adding to an output whose dialogues
    were made with ``existing`` (``in_output``)."""
    if policy not in RESUME_POLICIES:
        raise ProvenanceMismatch(f"--resume must be one of {', '.join(RESUME_POLICIES)}, got {policy!r}")
    if not existing or policy == "always":
        return
    if policy == "never":
        raise ProvenanceMismatch(f"{out} already holds dialogues and --resume is never: use a new --out")
    fp = fingerprint(comp)
    others = {k: v for k, v in existing.items() if k != fp}
    if not others:
        return
    parts = []
    for other, old in sorted(others.items()):
        if other == UNKNOWN or not old:
            parts.append("dialogues of unknown provenance")
        else:
            parts.append(f"fingerprint {other} (differs in: {', '.join(_diff(old, comp)) or 'nothing recorded'})")
    raise ProvenanceMismatch(
        f"{out} holds dialogues made differently ({'; '.join(parts)}), this run is {fp}: rerun with the same "
        f"settings, use a new --out, or --resume always to add to it anyway")


def section(existing: dict[str, dict[str, Any]], comp: dict[str, Any]) -> dict[str, Any]:
    """The ``provenance`` section of run.json: this run's fingerprint and every one in the output."""
    fp = fingerprint(comp)
    history = sorted(set(existing) | {fp})
    return {"fingerprint": fp, "components": comp, "history": history,
            "mixed": len(history) > 1}
