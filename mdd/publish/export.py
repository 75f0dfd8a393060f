"""Fine-tuning exports of a finished run: ``mdd export --out OUT --format sft|sharegpt``.

One row per dialogue, sorted by ``dialogue_id`` (the same run gives the same files, byte for
byte), as Parquet (``OUT/export/<format>/part-NNNNN.parquet``) and JSONL (``OUT/export/<format>.jsonl``).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from mdd import knowledge
from mdd.errors import MddError
from mdd.publish.run_data import RunData
from mdd.record import exchanges
from mdd.schema import SFT_ROW, SHAREGPT_ROW
from mdd.storage import Store

SHARD_ROWS = 50_000
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


@dataclass(frozen=True)
class ExportFormat:
    """An export format: its name (``--format``), the Arrow schema of its rows, and ``shape``: a dialogue's
    chat messages (``to_messages``) -> the format's own columns (besides dialogue_id, case_id, icd_code,
    diagnosis, quality). A new format is one entry of ``FORMATS``."""

    name: str
    schema: pa.Schema
    shape: Callable[[list[dict[str, Any]]], dict[str, Any]]


def _sft(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"messages": msgs}


def _sharegpt(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"system": msgs[0]["content"],
            "conversations": [{"from": SHAREGPT_FROM[m["role"]], "value": m["content"], "weight": m["weight"]}
                              for m in msgs[1:]]}


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (ExportFormat("sft", SFT_ROW, _sft),
                                                        ExportFormat("sharegpt", SHAREGPT_ROW, _sharegpt))}

CARD_TEXT = (
    "`mdd export --out OUT --format sft|sharegpt [--min-quality Q] [--metric overall] [--min-rule-pass R] "
    "[--mask-below Q]` writes one row per dialogue, sorted by `dialogue_id`, as Parquet "
    "(`export/<format>/`) and JSONL (`export/<format>.jsonl`). The doctor is the model being trained: "
    "`sft` rows hold OpenAI-style `messages` (a system prompt for a diagnosing psychiatrist, then the patient "
    "as `user` and the doctor as `assistant`); `sharegpt` rows hold `system` and `conversations` (`human` = "
    "patient, `gpt` = doctor). The first user message is a fixed stage cue (the patient walks in), because "
    "most chat templates want a user turn first and the doctor opens these dialogues; roles then alternate "
    "and the last assistant message is the doctor's closing diagnosis and treatment. A companion's (family "
    "member's) turn becomes part of a user message, labelled with who speaks (`家属（母亲）：…`, and `患者：…` "
    "beside it); consecutive turns of one side are joined. Filters use the evaluation: `--min-quality` keeps "
    "dialogues whose mean `--metric` score (eval/dialogues) reaches Q, `--min-rule-pass` those that passed at "
    "least that share of their triggered rules; `--mask-below` trims instead of dropping: doctor turns whose "
    "exchange scores under that `doctor_quality` keep their place as context with `weight` 0 (OpenAI's "
    "fine-tuning convention), every other assistant turn has `weight` 1. Dialogues without a closing doctor "
    "turn are left out and counted in `run.json` (`export`)."
)


class ExportError(MddError, ValueError):
    pass


@dataclass(frozen=True)
class Filters:
    min_quality: float | None = None
    metric: str = "overall"
    min_rule_pass: float | None = None
    mask_below: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _texts() -> dict[str, Any]:
    texts = dict(knowledge.load_yaml("export.yaml"))
    texts["system_prompt"] = "".join(line.strip() for line in texts["system_prompt"].splitlines())
    return texts


def _label(turn: dict, relation: str | None, labels: dict[str, str]) -> str:
    if turn.get("speaker") == "companion":
        rel = turn.get("relation") or relation
        return labels["companion_with_relation"].format(relation=rel) if rel else labels["companion"]
    return labels.get(turn.get("speaker") or "patient", labels["patient"])


def to_messages(turns: list[dict], *, weights: dict[int, int] | None = None, relation: str | None = None,
                texts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A dialogue's turns as chat messages: system, the opening cue, then user / assistant alternating.

    ``weights``: turn position → 0/1 for doctor turns (default 1); a message joined from several doctor
    turns is trained on if any of them is.
    """
    texts = texts or _texts()
    labels = texts["speaker_labels"]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": texts["system_prompt"].strip(), "weight": None},
                                  {"role": "user", "content": texts["opening_cue"].strip(), "weight": None}]
    groups: list[tuple[str, list[tuple[int, dict]]]] = []
    for i, t in enumerate(turns or []):
        if not t or not (t.get("text") or "").strip():
            continue
        role = "assistant" if t.get("speaker") == "doctor" else "user"
        if groups and groups[-1][0] == role:
            groups[-1][1].append((i, t))
        else:
            groups.append((role, [(i, t)]))
    for role, items in groups:
        if role == "assistant":
            w = max((weights or {}).get(i, 1) for i, _ in items)
            content = "\n".join(t["text"].strip() for _, t in items)
        else:
            w = None
            labelled = any(t.get("speaker") == "companion" for _, t in items)
            content = "\n".join((f"{_label(t, relation, labels)}：" if labelled else "") + t["text"].strip()
                                for _, t in items)
        if msgs[-1]["role"] == role:  # the dialogue opens with the patient: join with the cue
            msgs[-1]["content"] += "\n" + content
        else:
            msgs.append({"role": role, "content": content, "weight": w})
    return msgs


def _exchange_positions(turns: list[dict]) -> list[int]:
    """Positions of the doctor turns that open an exchange, in exchange order (``mdd.record.exchanges``):
    eval/turns' ``turn`` k is the k-th of them."""
    return [e.position for e in exchanges(turns)]


def _relation(value: Any) -> str | None:
    """The companion's relation from the dialogue table's ``companion`` column (a string, or a struct
    with ``relation``); None when nobody accompanies the patient."""
    if isinstance(value, dict):
        value = value.get("relation")
    return str(value) if value not in (None, "", False, True) else None


def export(out: str | os.PathLike | Store, fmt: str, filters: Filters = Filters(),
           dest: Store | None = None) -> dict[str, Any]:
    """Write the export of ``OUT``; returns its summary (also ``run.json['export'][fmt]``). ``dest``:
    write the files there instead (a staging area, ``jobs.export``), run.json left to the caller."""
    if fmt not in FORMATS:
        raise ExportError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    form = FORMATS[fmt]
    run = RunData(out)
    store = run.store
    if run.synth is None:
        raise ExportError(f"{store.display('synth')}: no dialogues to export")
    needs_eval = filters.min_quality is not None or filters.min_rule_pass is not None
    de = run.dialogue_eval
    if (needs_eval or filters.mask_below is not None) and de is None:
        raise ExportError(f"{store.display('eval')}: the filters need the evaluation's tables; run "
                          f"`mdd evaluate --out {store.display()}` first")
    scores: dict[str, dict[str, Any]] = {}
    if de is not None:
        if filters.metric not in de.column_names:
            raise ExportError(f"--metric: {filters.metric!r} is not a column of eval/dialogues "
                              f"({', '.join(c for c in de.column_names if de.schema.field(c).type == pa.float64())})")
        scores = {r["dialogue_id"]: r for r in de.to_pylist()}
    doc_q: dict[tuple[str, int], float] = {}
    if filters.mask_below is not None:
        te = run.turn_eval
        assert te is not None  # eval/turns is written with eval/dialogues (checked above)
        for d, k, q in zip(te.column("dialogue_id").to_pylist(), te.column("turn").to_pylist(),
                           te.column("doctor_quality").to_pylist()):
            doc_q[(d, k)] = q

    texts = _texts()
    syn = run.synth
    relations = [_relation(v) for v in (run.column("synth", "companion") or [None] * syn.num_rows)]
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    masked = trained = 0
    cols = {c: run.column("synth", c) or [None] * syn.num_rows
            for c in ("dialogue_id", "case_id", "icd_code", "diagnosis", "turns")}
    for i in sorted(range(syn.num_rows), key=lambda k: cols["dialogue_id"][k]):
        did, turns = cols["dialogue_id"][i], [t for t in cols["turns"][i] or [] if t]
        s = scores.get(did)
        if not turns or turns[-1].get("speaker") != "doctor":
            dropped["no closing doctor turn"] += 1
            continue
        if needs_eval and s is None:
            dropped["not evaluated (no exchanges)"] += 1
            continue
        # (s is None only when no filter needs the evaluation: see needs_eval)
        if filters.min_quality is not None and s is not None and s[filters.metric] < filters.min_quality:
            dropped[f"{filters.metric} < {filters.min_quality}"] += 1
            continue
        if filters.min_rule_pass is not None and s is not None and (s.get("rules_triggered") or 0) and \
                (s.get("rules_passed") or 0) / s["rules_triggered"] < filters.min_rule_pass:
            dropped[f"rule pass rate < {filters.min_rule_pass}"] += 1
            continue
        weights = None
        if filters.mask_below is not None:
            weights = {pos: int(doc_q.get((did, k), 1.0) >= filters.mask_below)
                       for k, pos in enumerate(_exchange_positions(turns))}
        msgs = to_messages(turns, weights=weights, relation=relations[i], texts=texts)
        for m in msgs:
            if m["role"] == "assistant":
                masked += m["weight"] == 0
                trained += m["weight"] == 1
        row = {"dialogue_id": did, "case_id": cols["case_id"][i], "icd_code": cols["icd_code"][i],
               "diagnosis": cols["diagnosis"][i], "quality": s[filters.metric] if s else None}
        row.update(form.shape(msgs))
        rows.append(row)

    schema = form.schema
    folder = f"export/{fmt}"
    files = [f"{folder}/part-{k:05d}.parquet" for k in range(max(1, -(-len(rows) // SHARD_ROWS)))]
    sink = dest or store
    if dest is None:
        for old in store.files(folder, ".parquet"):  # a smaller export than the last one leaves no stale shard behind
            if f"{folder}/{old}" not in files:
                store.delete(f"{folder}/{old}")
    for k, rel in enumerate(files):
        sink.write_table(pa.Table.from_pylist(rows[k * SHARD_ROWS:(k + 1) * SHARD_ROWS], schema=schema), rel)
    sink.write_text(f"export/{fmt}.jsonl", "".join(json.dumps(_jsonl(r), ensure_ascii=False) + "\n" for r in rows))
    files.append(f"export/{fmt}.jsonl")
    summary = {"rows": len(rows), "dropped": dict(sorted(dropped.items())), "filters": filters.as_dict(),
               "assistant_messages": {"trained": trained, "masked": masked}, "files": files}
    if dest is None:
        section = run.section("export") or {}
        section[fmt] = summary
        store.update_run_json("export", section)
    return summary


def _jsonl(row: dict[str, Any]) -> dict[str, Any]:
    """A row for JSONL: weights only on assistant messages (nulls dropped)."""
    def clean(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if v is not None}

    return {k: [clean(m) if isinstance(m, dict) else m for m in v] if isinstance(v, list) else v
            for k, v in row.items()}
