"""The project's own knowledge, as YAML beside this file.

- ``trees/{female,male}_{child,teen,adult,elderly}.yaml``: symptom inquiry trees (SCID-5 topics)
- ``modules/*.yaml``: per-disorder modules attached under a tree node when their condition holds
  or the checklist names them for the case's diagnosis (a module's top-level ``audience`` is the
  default of its nodes; see ``mdd.tree.AUDIENCES``)
- ``checklists.yaml``: must-ask items per ICD prefix (read by the agenda and by the rule judge)
- ``graphs/{female,male}_{child,teen,adult,elderly}.yaml``: experience knowledge graphs (time, people, events)
- ``personas.yaml``: doctor personas
- ``rules/*.yaml``, ``lexicons.yaml``: the evaluation stage's rule sets and lexicons
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mdd.errors import MddError

HERE = Path(__file__).resolve().parent
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the trees load 10x faster
GENDER_KEY = {"女": "female", "男": "male"}


class KnowledgeError(MddError, ValueError):
    pass


@lru_cache(maxsize=None)
def load_yaml(relpath: str) -> Any:
    path = HERE / relpath
    if not path.is_file():
        raise KnowledgeError(f"knowledge file missing: {path}")
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=_LOADER)


def tree_name(gender: str, band: str) -> str:
    return f"{GENDER_KEY[gender]}_{band}"


def tree_data(gender: str, band: str) -> dict[str, Any]:
    return load_yaml(f"trees/{tree_name(gender, band)}.yaml")


def graph_data(gender: str, band: str) -> dict[str, Any]:
    return load_yaml(f"graphs/{tree_name(gender, band)}.yaml")


@lru_cache(maxsize=None)
def module_data() -> tuple[dict[str, Any], ...]:
    folder = HERE / "modules"
    if not folder.is_dir():
        return ()
    return tuple(load_yaml(f"modules/{p.name}") for p in sorted(folder.glob("*.yaml")))


@lru_cache(maxsize=None)
def personas() -> tuple[dict[str, Any], ...]:
    data = load_yaml("personas.yaml")
    items = data.get("personas") if isinstance(data, dict) else data
    if not items:
        raise KnowledgeError("personas.yaml: no personas")
    ids = [p["id"] for p in items]
    if len(set(ids)) != len(ids):
        raise KnowledgeError("personas.yaml: duplicate persona ids")
    return tuple(items)
