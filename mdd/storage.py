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


def write_bytes(data: bytes, path: Path) -> None:
    """Atomic, like ``write_table``: a report, a plot, a card or an export file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text(text: str, path: Path) -> None:
    write_bytes(text.encode("utf-8"), path)


def _parquet_files(path: Path) -> list[Path]:
    path = Path(path)
    return sorted(path.glob("*.parquet")) if path.is_dir() else [path] if path.is_file() else []


def read_schema_names(path: Path) -> list[str] | None:
    """Column names over a Parquet file or folder (union, first-seen order); None when absent."""
    files = _parquet_files(path)
    if not files:
        return None
    names: dict[str, None] = {}
    for f in files:
        names.update(dict.fromkeys(pq.read_schema(f).names))
    return list(names)


def read_table(path: Path, columns: list[str] | None = None) -> pa.Table | None:
    """A Parquet file or a folder of them (``*.parquet``, sorted by name) as one table; None when absent.

    Tolerant of shards written before a column was added: ``columns`` missing from a shard (or from
    all of them) come back as nulls, and shards with extra columns are unified.
    """
    files = _parquet_files(path)
    if not files:
        return None
    tables = []
    for f in files:
        names = pq.read_schema(f).names
        tables.append(pq.read_table(f, columns=[c for c in columns if c in names] if columns else None))
    table = pa.concat_tables(tables, promote_options="permissive")
    for c in columns or []:
        if c not in table.column_names:
            table = table.append_column(c, pa.nulls(table.num_rows))
    return table


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
