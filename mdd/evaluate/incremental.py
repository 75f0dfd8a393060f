"""Incremental evaluation: which synth shards need evaluating, and the state that says so.

``eval/state.json`` records the evaluator fingerprint and, per evaluated shard, its size and its
partial aggregate (``mdd/evaluate/aggregate.py``). A rerun evaluates only the shards that are new
(or whose file changed) when the fingerprint is the same; the tables of the others are carried over
unchanged, the outputs of shards no longer in ``synth/`` are dropped, and the summary is merged
from every shard's partial, so it covers the whole run.

The fingerprint hashes what decides a shard's scores: the embedder, the judge (and its engine when
it is an LLM), faithfulness mode, threshold, distractors and scoring batch size, the relevance
vectors, the index vectors' projection, the lexicon file (gates, word lists), the rule sets and the
checklist, the evaluator's code (``mdd/evaluate/*.py``, ``mdd/index*``) and the IDF below. Settings
of speed only (workers, GPUs) and of the run-level checks (validity sample, index type) are left
out: they are recomputed every run. The case records are the synthesis's input and not hashed here.

**The IDF.** The calibrated relevance weighs character n-grams by document frequencies learnt from
a sample of the run (``evaluate.idf_sample_dialogues``). The sample would move as the run grows,
and with it every score, so it is fitted once and kept: ``eval/idf.parquet``, its hash part of the
fingerprint. It is refitted (and so everything re-evaluated) only when the fingerprint changes
otherwise, when asked (``--full``, ``evaluate.incremental: false``), or while it was fitted on fewer
dialogues than the sample size and the run now has more (a run that started small).
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mdd.storage import SYNTH, Store

log = logging.getLogger(__name__)

STATE_FILE = "eval/state.json"
IDF_FILE = "eval/idf.parquet"
STATE_VERSION = 1
FINGERPRINT_KEY = "mdd.eval_fingerprint"
_PKG = Path(__file__).resolve().parents[1]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _files_hash(paths: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in paths:
        name = f.relative_to(root).as_posix() if f.is_relative_to(root) else f.name
        h.update(name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"") + b"\0")
    return h.hexdigest()[:16]


def code_hash() -> str:
    """The evaluator's code: every module of mdd/evaluate/ and the index."""
    files = sorted((_PKG / "evaluate").glob("*.py")) + sorted((_PKG / "index").glob("*.py"))
    return _files_hash(files, _PKG)


def components(cfg: Any, faith_mode: str, per_batch: int) -> dict[str, Any]:
    """The fingerprint's components, without the IDF (``with_idf`` adds it)."""
    from mdd.evaluate.quality import LEXICON_FILE
    from mdd.evaluate.rule_set import _resolve_path

    ev = cfg.evaluate
    lexicon = Path(ev.lexicon) if ev.lexicon else _PKG / "knowledge" / LEXICON_FILE
    rule_files = [_resolve_path(r) for r in ev.rule_sets]
    llm = ev.judge == "llm" or faith_mode == "llm"
    judge = cfg.engine_for("judge")  # roles.judge with named engines
    return {
        "embedder": ev.embedder, "embedder_model": ev.embedder_model,
        "judge": ev.judge, "faithfulness": faith_mode, "faithfulness_default": ev.faithfulness_default,
        "judge_engine": f"{judge.name}:{judge.model}" if llm and judge is not None else None,
        "threshold": ev.threshold, "distractors": ev.distractors, "per_batch": per_batch,
        "relevance_spaces": ev.relevance_spaces,
        "index_vectors": {"dim": ev.index.dim, "seed": ev.index.seed},
        "lexicon": _files_hash([lexicon], lexicon.parent),
        "rule_sets": [str(r) for r in ev.rule_sets],
        "rules": _files_hash(rule_files + [_PKG / "knowledge" / "checklists.yaml"], _PKG),
        "code": code_hash(),
    }


def fingerprint(comp: dict[str, Any]) -> str:
    return _sha(json.dumps(comp, sort_keys=True, ensure_ascii=False, default=str).encode())


# --- the IDF ------------------------------------------------------------------------------


@dataclass
class Idf:
    df: np.ndarray
    n_docs: int
    dialogues: int  # dialogues the sample held

    @property
    def sha(self) -> str:
        return _sha(np.ascontiguousarray(self.df, dtype=np.int64).tobytes() + str(self.n_docs).encode())

    def table(self) -> pa.Table:
        t = pa.table({"df": pa.array(self.df, pa.int64())})
        return t.replace_schema_metadata({b"n_docs": str(self.n_docs).encode(),
                                          b"dialogues": str(self.dialogues).encode()})


def read_idf(store: Store) -> Idf | None:
    try:
        t = store.read_table(IDF_FILE)
        meta = t.schema.metadata or {}
        return Idf(t.column("df").to_numpy().astype(np.int64), int(meta[b"n_docs"]), int(meta[b"dialogues"]))
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None


def fit_idf(store: Store, sample: int, shards: list[str], total_dialogues: int) -> Idf:
    from mdd.evaluate.scoring import corpus_df

    df, n_docs = corpus_df(store, sample, [f"{SYNTH}/{s}" for s in shards])
    return Idf(df, n_docs, min(sample, total_dialogues))


# --- the plan -----------------------------------------------------------------------------


@dataclass
class Plan:
    fingerprint: str
    components: dict[str, Any]
    idf: Idf
    idf_refit: bool
    todo: list[str]  # shards to evaluate now
    keep: dict[str, dict[str, Any]]  # shard -> its state entry (tables carried over)
    dropped: list[str] = field(default_factory=list)  # evaluated before, gone from synth/
    reason: str = ""

    def state(self, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {"version": STATE_VERSION, "fingerprint": self.fingerprint, "components": self.components,
                "idf": {"file": IDF_FILE, "n_docs": self.idf.n_docs, "dialogues": self.idf.dialogues,
                        "sha": self.idf.sha},
                "shards": {s: entries[s] for s in sorted(entries)}}


def read_state(store: Store) -> dict[str, Any] | None:
    try:
        state = store.read_json(STATE_FILE)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("version") == STATE_VERSION else None


def plan(store: Store, cfg: Any, faith_mode: str, per_batch: int, shard_ids: dict[str, list[str]],
         full: bool = False, skip: dict[str, list[int]] | None = None) -> Plan:
    """What this run evaluates: every shard, or only those the state does not hold with this
    fingerprint (and whose tables are all present, with the same rows skipped as repeated ids:
    ``skip``, from ``storage.duplicate_rows``)."""
    skip = skip or {}
    from mdd.evaluate.streaming import TABLES, output_name

    ev = cfg.evaluate
    shards = sorted(shard_ids)
    total = sum(len(v) for v in shard_ids.values())
    base = components(cfg, faith_mode, per_batch)
    prev = None if full or not ev.incremental else read_state(store)
    prev_idf = read_idf(store) if prev else None
    reason = ""
    if prev is None:
        reason = "full evaluation" + (" (asked)" if full or not ev.incremental else "")
    elif {k: v for k, v in prev.get("components", {}).items() if k != "idf"} != base:
        changed = sorted(k for k in set(base) | set(prev.get("components", {}))
                         if k != "idf" and base.get(k) != prev["components"].get(k))
        reason = f"evaluator changed ({', '.join(changed)}): full evaluation"
    elif prev_idf is None or prev_idf.sha != prev.get("idf", {}).get("sha"):
        reason = "no usable eval/idf.parquet: full evaluation"
    elif prev_idf.dialogues < min(ev.idf_sample_dialogues, total):
        reason = (f"the IDF was fitted on {prev_idf.dialogues} dialogues, the run now has {total}: refitted, "
                  "full evaluation")
    if reason:
        idf = fit_idf(store, ev.idf_sample_dialogues, shards, total)
        comp = {**base, "idf": idf.sha}
        return Plan(fingerprint(comp), comp, idf, True, shards, {}, sorted(set(prev.get("shards", {})) - set(shards))
                    if prev else [], reason)
    assert prev is not None and prev_idf is not None  # else a reason for a full evaluation was found above
    comp = {**base, "idf": prev_idf.sha}
    fp = fingerprint(comp)
    sizes = store.file_sizes(SYNTH)
    present = {t: set(store.files(f"eval/{t}", ".parquet")) for t in TABLES}
    keep, todo = {}, []
    for s in shards:
        entry = prev["shards"].get(s)
        if (entry and prev.get("fingerprint") == fp and entry.get("bytes") == sizes.get(s)
                and entry.get("skipped", []) == skip.get(s, [])
                and all(output_name(s) in present[t] for t in TABLES)):
            keep[s] = entry
        else:
            todo.append(s)
    dropped = sorted(set(prev["shards"]) - set(shards))
    return Plan(fp, comp, prev_idf, False, todo, keep, dropped,
                f"incremental: {len(todo)} new or changed shards, {len(keep)} kept, {len(dropped)} dropped")


def carry_over(store: Store, dst: Store, keep: dict[str, dict[str, Any]]) -> None:
    """Copy the kept shards' tables into the staging area (hard links on a local disk)."""
    from mdd.evaluate.streaming import TABLES, output_name

    for s in sorted(keep):
        for t in TABLES:
            rel = f"eval/{t}/{output_name(s)}"
            store.copy_to(rel, dst, rel)
