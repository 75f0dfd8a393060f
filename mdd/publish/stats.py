"""Figures computed from a run's outputs, shared by the report and the dataset card."""
from __future__ import annotations

import os
import posixpath
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from mdd.publish.run_data import RunData, reference_figures
from mdd.record import count_exchanges
from mdd.storage import open_store


def shape(table: pa.Table | None) -> dict[str, Any] | None:
    """Exchanges per dialogue and characters per turn by speaker, with their distributions.

    Every turn of a speaker counts (the doctor's closing diagnosis turn too), the same way for a
    run and for a reference corpus.
    """
    if table is None or table.num_rows == 0 or "turns" not in table.column_names:
        return None
    turns_col = table.column("turns").to_pylist()
    n_ex = table.column("n_exchanges").to_pylist() if "n_exchanges" in table.column_names else None
    exchanges = [int(n if n is not None else count_exchanges(t)) for n, t in zip(n_ex or [None] * len(turns_col),
                                                                          turns_col)]
    chars: dict[str, list[int]] = {}
    for turns in turns_col:
        for t in turns or []:
            if t and t.get("speaker"):
                chars.setdefault(t["speaker"], []).append(len(t.get("text") or ""))
    order = [s for s in ("doctor", "patient", "companion") if s in chars] + sorted(
        s for s in chars if s not in ("doctor", "patient", "companion"))
    return {
        "dialogues": len(exchanges),
        "exchanges_mean": float(np.mean(exchanges)),
        "exchanges_median": float(np.median(exchanges)),
        "exchanges_min": int(min(exchanges)),
        "exchanges_max": int(max(exchanges)),
        "chars_per_turn_mean": {s: float(np.mean(chars[s])) for s in order},
        "chars_per_turn_median": {s: float(np.median(chars[s])) for s in order},
        "turns": {s: len(chars[s]) for s in order},
        "chars_per_dialogue_mean": float(sum(sum(v) for v in chars.values()) / len(exchanges)),
        "dist": {"exchanges": exchanges, **{s: chars[s] for s in order}},
    }


def reference(path: str | os.PathLike | None) -> dict[str, Any]:
    """The reference figures: computed from a dialogue table (a run folder holding ``synth/``, or a
    folder or file of Parquet in the dialogue schema, e.g. ``jobs.import_mdd5k``'s output) when one is
    given, else the published MDD-5k figures."""
    if path is None:
        return reference_figures()
    store = open_store(path)
    src = "synth" if store.parquet_files("synth") else ""
    names = store.read_schema_names(src) or []
    st = shape(store.read_table(src, ["turns", "n_exchanges"])) if "turns" in names else None
    if st is None:
        raise FileNotFoundError(f"{store.display()}: no dialogue table (Parquet with a 'turns' column) to use as "
                                "reference")
    st["label"] = f"reference ({posixpath.basename(store.uri.rstrip('/'))}, n={st['dialogues']})"
    st["source"] = store.display()
    return st


def icd_prefix(code: str | None) -> str:
    """The primary code's prefix: 'F32.900,F41.100' -> 'F32'."""
    if not code:
        return "(none)"
    first = str(code).replace("，", ",").split(",")[0].strip()
    return first.split(".")[0][:3].upper() or "(none)"


def rule_counts(rules: pa.Table | None) -> dict[str, dict[str, int]]:
    """Per rule: passed, failed, skipped (not triggered) dialogues."""
    out: dict[str, dict[str, int]] = {}
    if rules is None or rules.num_rows == 0:
        return out
    for name, trig, score in zip(rules.column("rule").to_pylist(), rules.column("triggered").to_pylist(),
                                 rules.column("score").to_pylist()):
        d = out.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
        if not trig:
            d["skipped"] += 1
        elif score is not None and score >= 1.0:
            d["passed"] += 1
        else:
            d["failed"] += 1
    return dict(sorted(out.items()))


def headline(run: RunData, ref: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures a reader wants first (the report's top table, the dataset card, run.json['report'])."""
    ref = ref or reference_figures()
    st = shape(run.synth)
    syn = run.synthesis
    ev = run.section("evaluate") or {}
    h: dict[str, Any] = {
        "dialogues": run.synth.num_rows if run.synth is not None else 0,
        "cases": len(set(run.column("synth", "case_id") or [])),
        "engine": syn.engine.name,
        "model": syn.engine.model,
    }
    if st:
        h["exchanges_mean"] = round(st["exchanges_mean"], 2)
        h["chars_per_turn_mean"] = {k: round(v, 1) for k, v in st["chars_per_turn_mean"].items()}
    h["reference"] = {"label": ref.get("label"), "source": ref.get("source"),
                      "exchanges_mean": ref.get("exchanges_mean"),
                      "chars_per_turn_mean": {k: round(v, 1)
                                              for k, v in (ref.get("chars_per_turn_mean") or {}).items()}}
    if ev:
        h["exchanges_evaluated"] = ev.get("exchanges")
        h["high_quality_share"] = ev.get("high_quality_share")
    rc = rule_counts(run.rules)
    trig = sum(d["passed"] + d["failed"] for d in rc.values())
    if trig:
        h["rule_pass_rate"] = round(sum(d["passed"] for d in rc.values()) / trig, 4)
    if syn.llm_calls.per_exchange is not None:
        h["llm_calls_per_exchange"] = syn.llm_calls.per_exchange
    sources = case_sources(run)
    if sources:
        h["case_sources"] = {k: v["dialogue_share"] for k, v in sources.items()}
    h["cases_rejected"] = syn.counts.cases_rejected
    h["dialogues_failed"] = run.failures.num_rows if run.failures is not None else syn.counts.dialogues_failed
    return h


def top(counter: Counter, n: int) -> dict[str, int]:
    return dict(counter.most_common(n))


def case_sources(run: RunData) -> dict[str, dict[str, Any]]:
    """Per case source (synthetic, real, unstated: the record did not say): the dialogues and cases of the
    dialogue table and their shares ({} for a table without ``case_source``)."""
    src, ids = run.column("synth", "case_source"), run.column("synth", "case_id")
    if src is None or not src:
        return {}
    dialogues = Counter(s or "unstated" for s in src)
    cases = Counter(s or "unstated" for s in dict(zip(ids or [], src)).values())
    nd, nc = sum(dialogues.values()), max(sum(cases.values()), 1)
    return {k: {"dialogues": dialogues[k], "dialogue_share": round(dialogues[k] / nd, 4), "cases": cases[k],
                "case_share": round(cases[k] / nc, 4)}
            for k in ("synthetic", "real", "unstated") if dialogues[k]}
