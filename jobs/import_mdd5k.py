"""Import the released MDD-5k dialogues into the DIALOGUE table.

    python -m jobs.import_mdd5k --src SRC --out DIR            # SRC/MDD_5k/patient_N.json, SRC/Label/patient_N_label.json
    python -m jobs.import_mdd5k --dialogues D --labels L --out DIR   # flat layout

Writes ``DIR/synth/mdd5k-00000.parquet`` … (deterministic shards, sorted by case number and
variant) and ``DIR/rejects.parquet`` (REJECT schema): malformed files or records, a second file
for the same case number (``patient_01.json`` after ``patient_1.json``: cases are keyed by the
number), and dialogue files without a label file (imported without diagnosis). Turn text passes
through the de-identification patterns (``mdd.privacy``). A rerun replaces the previous import
(old ``mdd5k-*.parquet`` shards are removed first).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from mdd import privacy
from mdd.evaluate.speech import jargon_turns
from mdd.schema import DIALOGUE, REJECT
from mdd.storage import write_table

_CASE_RE = re.compile(r"^patient_(\d+)\.json$")
_LABEL_RE = re.compile(r"^patient_(\d+)_label\.json$")


def _reject(rejects: list[dict], source: Path, position: int, case_id: str | None, field: str, reason: str) -> None:
    rejects.append(
        {"source": str(source), "position": int(position), "case_id": case_id, "field": field, "reason": reason}
    )


def _load_label(path: Path | None, case_id: str, rejects: list[dict]) -> tuple[str | None, str | None]:
    if path is None or not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _reject(rejects, path, 0, case_id, "label", f"unreadable label file: {exc}")
        return None, None
    if not isinstance(data, dict):
        _reject(rejects, path, 0, case_id, "label", "label file is not a JSON object")
        return None, None
    code, diag = data.get("ICD_Code"), data.get("Diagnosis_Result")
    code = str(code).strip() if code not in (None, "") else None
    diag = str(diag).strip() if diag not in (None, "") else None
    return code, diag


def _by_number(folder: Path | None, pattern: re.Pattern, what: str, rejects: list[dict]) -> dict[int, Path]:
    """``{case number: file}``; a second file for the same number (patient_01 beside patient_1) is a reject."""
    found: dict[int, Path] = {}
    if folder is None or not Path(folder).is_dir():
        return found
    named = [(int(m.group(1)), p) for p in Path(folder).iterdir() if (m := pattern.match(p.name))]
    for n, p in sorted(named, key=lambda t: (t[0], len(t[1].name), t[1].name)):  # patient_1 before patient_01
        if n in found:
            _reject(rejects, p, 0, f"patient_{n}", "file",
                    f"duplicate {what}: same case number as {found[n].name} (ids are normalised: patient_{n})")
        else:
            found[n] = p
    return found


def _turns(conv: Any) -> tuple[list[dict] | None, str]:
    """Conversation -> turns; (None, reason) when malformed."""
    if not isinstance(conv, list) or not conv:
        return None, "conversation is missing, empty or not a list"
    turns: list[dict] = []
    for i, ex in enumerate(conv):
        if not isinstance(ex, dict):
            return None, f"exchange {i} is not an object"
        doc, pat = ex.get("doctor"), ex.get("patient")
        if doc is not None and not isinstance(doc, str):
            return None, f"exchange {i}: doctor is not a string"
        if pat is not None and not isinstance(pat, str):
            return None, f"exchange {i}: patient is not a string"
        if not (doc or "").strip() and not (pat or "").strip():
            return None, f"exchange {i} has neither doctor nor patient text"
        if doc is not None and doc.strip():
            turns.append({"speaker": "doctor", "text": privacy.mask(doc.strip()), "topic": None})
        if pat is not None and pat.strip():
            turns.append({"speaker": "patient", "text": privacy.mask(pat.strip()), "topic": None})
    return turns, ""


def count_exchanges(turns: list[dict]) -> tuple[int, int]:
    """(doctor turns, doctor→patient exchanges)."""
    n_doc = sum(1 for t in turns if t["speaker"] == "doctor")
    n_ex = sum(
        1
        for a, b in zip(turns, turns[1:])
        if a["speaker"] == "doctor" and b["speaker"] == "patient"
    )
    return n_doc, n_ex


def _row(n: int, k: int, turns: list[dict], code: str | None, diag: str | None) -> dict:
    n_doc, n_ex = count_exchanges(turns)
    return {
        "dialogue_id": f"mdd5k-{n}-{k}",
        "case_id": f"patient_{n}",
        "variant": k,
        "seed": 0,
        "doctor_persona": None,
        "experience": None,
        "experience_triple": None,
        "topics": [],
        "turns": turns,
        "icd_code": code,
        "diagnosis": diag,
        "treatment": None,
        "gender": None,
        "age": None,
        "n_turns": n_doc,
        "n_exchanges": n_ex,
        "engine": "mdd5k",
        "model": "released",
        "llm_calls": 0,
        "prompt_tokens": 0,
        "output_tokens": 0,
        "prompt_tokens_by_role": None,
        "output_tokens_by_role": None,
        "fallbacks": 0,
        "source": "mdd5k",
        "jargon_turns": jargon_turns(turns),
    }


def import_mdd5k(dialogues_dir: Path, labels_dir: Path | None, out: Path, shard_size: int = 1000) -> dict:
    """Import every ``patient_N.json`` in ``dialogues_dir``; returns counts."""
    dialogues_dir, out = Path(dialogues_dir), Path(out)
    if not dialogues_dir.is_dir():
        raise FileNotFoundError(f"{dialogues_dir}: dialogue folder not found")
    rejects: list[dict] = []
    files = _by_number(dialogues_dir, _CASE_RE, "dialogue file", rejects)
    labels = _by_number(labels_dir, _LABEL_RE, "label file", rejects)
    n_duplicates = len(rejects)

    rows: list[dict] = []
    n_files_ok = n_files_bad = n_unlabelled = 0
    for n, path in sorted(files.items()):
        case_id = f"patient_{n}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            _reject(rejects, path, 0, case_id, "file", f"unreadable JSON: {exc}")
            n_files_bad += 1
            continue
        if not isinstance(data, list):
            _reject(rejects, path, 0, case_id, "file", "top level is not a list of dialogues")
            n_files_bad += 1
            continue
        n_files_ok += 1
        if n not in labels:
            where = Path(labels_dir) / f"patient_{n}_label.json" if labels_dir is not None else path
            _reject(rejects, where, 0, case_id, "label", "no label file: its dialogues are imported without diagnosis")
        code, diag = _load_label(labels.get(n), case_id, rejects)
        if code is None and diag is None:
            n_unlabelled += 1
        for k, rec in enumerate(data):
            if not isinstance(rec, dict):
                _reject(rejects, path, k, case_id, "record", "dialogue record is not an object")
                continue
            turns, reason = _turns(rec.get("conversation"))
            if turns is None:
                _reject(rejects, path, k, case_id, "conversation", reason)
                continue
            rows.append(_row(n, k, turns, code, diag))

    synth = out / "synth"
    synth.mkdir(parents=True, exist_ok=True)
    for old in synth.glob("mdd5k-*.parquet"):
        old.unlink()
    shards = 0
    for start in range(0, len(rows), shard_size):
        chunk = rows[start : start + shard_size]
        write_table(pa.Table.from_pylist(chunk, schema=DIALOGUE), synth / f"mdd5k-{shards:05d}.parquet")
        shards += 1
    rej_path = out / "rejects.parquet"
    if rejects:
        write_table(pa.Table.from_pylist(rejects, schema=REJECT), rej_path)
    elif rej_path.exists():
        rej_path.unlink()
    return {
        "files": len(files),
        "files_ok": n_files_ok,
        "files_rejected": n_files_bad,
        "duplicate_files": n_duplicates,
        "dialogues": len(rows),
        "exchanges": sum(r["n_exchanges"] for r in rows),
        "rejects": len(rejects),
        "unlabelled_cases": n_unlabelled,
        "shards": shards,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mdd import-mdd5k", description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", help="release root holding MDD_5k/ and Label/")
    ap.add_argument("--dialogues", help="folder of patient_N.json (flat layout)")
    ap.add_argument("--labels", help="folder of patient_N_label.json (flat layout)")
    ap.add_argument("--out", required=True, help="output root; writes OUT/synth/mdd5k-*.parquet")
    ap.add_argument("--shard-size", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.src:
        src = Path(args.src)
        dialogues = Path(args.dialogues) if args.dialogues else src / "MDD_5k"
        labels = Path(args.labels) if args.labels else src / "Label"
    elif args.dialogues:
        dialogues = Path(args.dialogues)
        labels = Path(args.labels) if args.labels else None
    else:
        ap.error("give --src SRC or --dialogues DIR [--labels DIR]")
    if args.shard_size < 1:
        ap.error("--shard-size must be >= 1")
    try:
        counts = import_mdd5k(dialogues, labels, Path(args.out), shard_size=args.shard_size)
    except FileNotFoundError as exc:
        print(f"import-mdd5k: {exc}", file=sys.stderr)
        return 2
    print(
        f"imported {counts['dialogues']} dialogues ({counts['exchanges']} exchanges) from "
        f"{counts['files_ok']}/{counts['files']} case files into {counts['shards']} shard(s) under "
        f"{Path(args.out) / 'synth'}; {counts['rejects']} reject rows ({counts['duplicate_files']} duplicate files), "
        f"{counts['unlabelled_cases']} case(s) without label"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
