"""Where a run's outputs live, and how they are written.

Every table and summary a stage writes goes through here, so that one mechanism decides what
"written" means: a reader (and a rerun after ``kill -9``) sees a whole file or none.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

RUN_JSON = "run.json"


def write_table(table: pa.Table, path: Path) -> None:
    """Atomic: readers (and a rerun after kill -9) see the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def read_run_json(out: Path) -> dict[str, Any]:
    """``OUT/run.json`` as a dict ({} when missing or unreadable)."""
    path = Path(out) / RUN_JSON
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def update_run_json(out: Path, key: str, value: Any) -> None:
    """Merge one section into ``run.json`` (each stage owns a key), atomically."""
    path = Path(out) / RUN_JSON
    data = read_run_json(out)
    data[key] = value
    tmp = path.with_name(RUN_JSON + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
