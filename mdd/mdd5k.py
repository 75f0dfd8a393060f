"""The released MDD-5k layout: ``patient_N.json`` dialogue files (a list of ``{"conversation":
[{"doctor": …, "patient": …}, …]}``) and ``patient_N_label.json`` label files, read as rows of the
dialogue table. ``jobs.import_mdd5k`` writes them as shards; ``mdd compare`` reads a reference
corpus in place.

Cases are keyed by their number: a second file for the same number (``patient_01.json`` after
``patient_1.json``) is a reject, and so is a dialogue file without a label file (its dialogues
come without diagnosis). Turn text passes through the de-identification patterns
(``mdd.privacy``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mdd import privacy
from mdd.record import count_exchanges, doctor_turns
from mdd.record.speech import jargon_turns

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


def _by_number(folder: str | Path | None, pattern: re.Pattern, what: str, rejects: list[dict]) -> dict[int, Path]:
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


def _row(n: int, k: int, turns: list[dict], code: str | None, diag: str | None) -> dict:
    n_doc, n_ex = doctor_turns(turns), count_exchanges(turns)  # the evaluation's exchanges (mdd.record)
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


def read_mdd5k(dialogues_dir: str | Path, labels_dir: str | Path | None) -> tuple[list[dict], list[dict], dict]:
    """Every dialogue of the ``patient_N.json`` files in ``dialogues_dir`` as a DIALOGUE row (sorted
    by case number and variant), the reject rows (REJECT columns) and counts."""
    dialogues_dir = Path(dialogues_dir)
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
    counts = {
        "files": len(files),
        "files_ok": n_files_ok,
        "files_rejected": n_files_bad,
        "duplicate_files": n_duplicates,
        "dialogues": len(rows),
        "exchanges": sum(r["n_exchanges"] for r in rows),
        "unlabelled_cases": n_unlabelled,
    }
    return rows, rejects, counts
