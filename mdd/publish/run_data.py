"""A finished run's outputs, read defensively for the report, the card and the exports.

Each table is read on first use and is ``None`` when the stage that writes it has not run (or
wrote nothing); columns that other stages add later are used when present. Nothing here writes.
"""
from __future__ import annotations

import os
from functools import cached_property
from typing import Any

import pyarrow as pa

from mdd import knowledge
from mdd.record.summary import SynthesisSummary
from mdd.storage import StorageError, Store, first_rows, log_duplicates, open_store

SYNTH_COLUMNS_SKIPPED = ("experience",)  # long free text no reader here needs
# each table's key: a row whose key an earlier row has is skipped (storage.first_rows), so every dialogue id is
# in the report, the card and the exports once even when an older run wrote it twice
KEYS = {"synth": ("dialogue_id",), "eval/turns": ("dialogue_id", "turn"), "eval/rules": ("dialogue_id", "rule"),
        "eval/dialogues": ("dialogue_id",)}


class RunData:
    def __init__(self, out: str | os.PathLike | Store, sections: dict[str, Any] | None = None):
        self.store = open_store(out)
        self.sections = sections or {}  # run.json sections being written (staged) that readers should see

    @cached_property
    def run_json(self) -> dict[str, Any]:
        return {**self.store.read_run_json(), **self.sections}

    def table(self, rel: str, columns: list[str] | None = None) -> pa.Table | None:
        """The Parquet file or folder ``rel`` under OUT; None when absent. A file that cannot be read
        is a ``StorageError`` naming it and the command that writes it again."""
        files = self.store.parquet_files(rel)
        if not files:
            return None
        for f in files:
            try:
                self.store.read_metadata(f)
            except (OSError, pa.ArrowException) as exc:
                raise _unreadable(self.store, f, exc) from None
        try:
            table = self.store.read_table(rel, columns)
        except (OSError, pa.ArrowException) as exc:
            raise _unreadable(self.store, rel, exc) from None
        if rel in KEYS:
            table, n = first_rows(table, KEYS[rel])
            log_duplicates(self.store.display(rel), n)
        return table

    def check_readable(self, tops: tuple[str, ...] = ("eval", "cases.parquet", "rejects.parquet",
                                                       "failures.parquet")) -> None:
        """Every Parquet footer under ``tops`` reads (``synth/`` is checked by ``dialogue_shards``):
        a ``StorageError`` naming the first file that does not, before anything is written."""
        for top in tops:
            files = [top] if self.store.is_file(top) else \
                [f"{top}/{f}" for f in self.store.files(top, ".parquet", recursive=True)]
            for f in files:
                try:
                    self.store.read_metadata(f)
                except (OSError, pa.ArrowException) as exc:
                    raise _unreadable(self.store, f, exc) from None

    @cached_property
    def synthesis(self) -> SynthesisSummary:
        """run.json's ``synthesize`` section, typed (read once; an older section's missing keys are defaults)."""
        return SynthesisSummary.from_json(self.section("synthesize"))

    def section(self, *keys: str) -> Any:
        """``run_json[k1][k2]…`` or None."""
        node: Any = self.run_json
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return None
            node = node[k]
        return node

    @cached_property
    def synth(self) -> pa.Table | None:
        names = self.store.read_schema_names("synth")
        if names is None:
            return None
        return self.table("synth", [c for c in names if c not in SYNTH_COLUMNS_SKIPPED])

    @cached_property
    def turn_eval(self) -> pa.Table | None:
        return self.table("eval/turns")

    @cached_property
    def rules(self) -> pa.Table | None:
        return self.table("eval/rules")

    @cached_property
    def dialogue_eval(self) -> pa.Table | None:
        return self.table("eval/dialogues")

    @cached_property
    def validity(self) -> pa.Table | None:
        return self.table("eval/validity.parquet")

    @cached_property
    def rejects(self) -> pa.Table | None:
        return self.table("rejects.parquet")

    @cached_property
    def failures(self) -> pa.Table | None:
        return self.table("failures.parquet")

    def column(self, table: str, name: str) -> list | None:
        t = getattr(self, table)
        return t.column(name).to_pylist() if t is not None and name in t.column_names else None


def _unreadable(store: Store, rel: str, exc: BaseException) -> StorageError:
    top = rel.split("/")[0]
    fix = {"eval": f"mdd evaluate --out {store.display()} --full",
           "index": f"mdd evaluate --out {store.display()} --full",
           "synth": f"mdd synthesize --out {store.display()} (it quarantines the file and writes its dialogues again)"
           }.get(top, f"mdd synthesize --out {store.display()}")
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return StorageError(f"{store.display(rel)} cannot be read ({type(exc).__name__}: {reason}); write it again "
                        f"with `{fix}`")


USAGE_FIELDS = ("calls", "prompt_tokens", "output_tokens", "cached_tokens")


def usage_by_model(run: RunData) -> list[dict[str, Any]]:
    """Per model, over every dialogue of the run (resumed invocations included): the roles it played,
    the dialogues it served, its calls and prompt / output / cached tokens (the ``models`` and
    ``usage_by_model`` columns; [] for files written before they existed)."""
    usage, models = run.column("synth", "usage_by_model"), run.column("synth", "models")
    if usage is None:
        return []
    rows: dict[str, dict[str, Any]] = {}
    for entries, played in zip(usage, models or [None] * len(usage)):
        for u in entries or []:
            row = rows.setdefault(u["model"], {"model": u["model"], "roles": set(), "dialogues": 0,
                                               **dict.fromkeys(USAGE_FIELDS, 0)})
            row["dialogues"] += 1
            for k in USAGE_FIELDS:
                row[k] += int(u.get(k) or 0)
            row["roles"] |= {r for r, m in (played or {}).items() if m == u["model"]}
    return [{**r, "roles": ", ".join(sorted(r["roles"]))} for r in sorted(rows.values(), key=lambda r: -r["calls"])]


def reference_figures() -> dict[str, Any]:
    """The published MDD-5k figures (``mdd/knowledge/mdd5k_reference.yaml``)."""
    ref = dict(knowledge.load_yaml("mdd5k_reference.yaml"))
    ref.setdefault("label", "MDD-5k (published)")
    return ref
