"""Patient cases in the MDD-5k case schema: loading, validation, de-identification.

A bad case never stops a run: every problem becomes a :class:`Reject` (file, position,
case id when there is one, field, reason in words) and the good cases go on. A file that
cannot be read is a file-level reject, a JSONL line that is not JSON a line-level one; only a
path that holds no case file raises :class:`CaseFileError`.

De-identification is :mod:`mdd.privacy`'s: every free-text field (and sub-field name) is
scrubbed, the case id is replaced by its safe id when it looks personal, and no reject reason
ever quotes an input value (it names the kind of value instead).
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mdd import privacy
from mdd.errors import MddError

MAX_FIELD_CHARS = 20_000
MAX_KEY_CHARS = 60  # a sub-field name longer than this is cut

REQUIRED_TEXT = ("诊断结果", "主诉", "现病史", "处理意见")
OPTIONAL_TEXT = ("重要或相关躯体疾病史", "家族史")
SECTIONED = ("个人史", "精神检查")  # an object of named sub-fields, or one string

_ICD_ONE = re.compile(r"^[A-Z][0-9]{2}(\.[0-9Xx]{1,8})?$")
_ICD_SPLIT = re.compile(r"[,，、;；/]")
_AGE_TEXT = re.compile(r"^\s*(\d{1,3})\s*(岁)?\s*$")
_GENDERS = {"男": "男", "女": "女", "男性": "男", "女性": "女"}



class CaseFileError(MddError, ValueError):
    """The path holds no case file at all (the run stops with exit code 2); within ``read_records``,
    a file that cannot be read (a file-level reject)."""


@dataclass(frozen=True, slots=True)
class Reject:
    source: str
    position: int
    case_id: str | None
    field: str
    reason: str
    line: int | None = None  # the line of a JSONL file

    def as_row(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "position": self.position,
            "case_id": self.case_id,
            "field": self.field,
            "reason": self.reason,
            "line": self.line,
        }


@dataclass(frozen=True, slots=True)
class Case:
    """One validated case. ``personal`` and ``exam`` keep the object-or-string shape."""

    case_id: str  # the safe id (mdd.privacy): the raw id when it is plainly a serial, else its keyed hash
    age: int
    gender: str  # 男 | 女
    icd_code: str
    diagnosis: str
    complaint: str
    present_illness: str
    treatment: str
    physical_history: str = "无"
    family_history: str = "无"
    personal: dict[str, str] | str = field(default_factory=dict)
    exam: dict[str, str] | str = field(default_factory=dict)
    masked: tuple[str, ...] = ()  # "field:kind" of personal data that was masked (患者:hashed for the id)
    # provenance: "synthetic" (with the profile and the plan seed it was drawn from) or "real"; None when
    # the record does not say (a hand-written or hospital record)
    source: str | None = None
    profile: str | None = None
    plan_seed: int | None = None

    @property
    def icd_codes(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in _ICD_SPLIT.split(self.icd_code) if c.strip())

    @property
    def icd_prefix(self) -> str:
        return self.icd_codes[0][:3]

    @property
    def age_band(self) -> str:
        """Decided from the exact age, before rounding (the tree and graph to use)."""
        return age_band(self.age)

    @property
    def age_public(self) -> int:
        """The age as every output shows it: rounded to the nearest ten (GB/T 39725-2020 as the
        MDD-5k paper applies it). ``age`` (exact) stays in memory for the symbolic decisions (age
        band and tree, a minor's companion, the timing of the fictitious experience) and is never
        written: tables, prompts and run.json get ``age_public``."""
        return privacy.round_age(self.age)

    def get(self, path: str) -> str:
        """A field by name; ``个人史.X`` and ``精神检查.X`` address sub-fields."""
        head, _, sub = path.partition(".")
        value: Any = {
            "主诉": self.complaint,
            "现病史": self.present_illness,
            "重要或相关躯体疾病史": self.physical_history,
            "家族史": self.family_history,
            "个人史": self.personal,
            "精神检查": self.exam,
            "诊断结果": self.diagnosis,
            "处理意见": self.treatment,
        }.get(head, "")
        if isinstance(value, dict):
            if sub:
                return value.get(sub, "")
            return "；".join(f"{k}：{v}" for k, v in value.items())
        return value if isinstance(value, str) else ""

    def section(self, name: str, key: str) -> str:
        """A sub-field of 个人史 / 精神检查, also when the section is a single string."""
        value = self.personal if name == "个人史" else self.exam
        if isinstance(value, dict):
            return value.get(key, "")
        return value

    def to_record(self) -> dict[str, Any]:
        """Back to the MDD-5k schema (with the masked text)."""
        return {
            "患者": self.case_id,
            "年龄": self.age_public,
            "性别": self.gender,
            "ICD编码": self.icd_code,
            "诊断结果": self.diagnosis,
            "主诉": self.complaint,
            "现病史": self.present_illness,
            "重要或相关躯体疾病史": self.physical_history,
            "家族史": self.family_history,
            "个人史": self.personal,
            "精神检查": self.exam,
            "处理意见": self.treatment,
            **({"source": self.source} if self.source else {}),
            **({"profile": self.profile, "plan_seed": self.plan_seed} if self.source == "synthetic" else {}),
        }


def age_band(age: int) -> str:
    """child (12 or younger), teen (13-20), adult, elderly (60 and over): the tree and graph to use."""
    if age <= 12:
        return "child"
    if age <= 20:
        return "teen"
    if age >= 60:
        return "elderly"
    return "adult"


# --- reading ------------------------------------------------------------------------

CASE_SUFFIXES = (".json", ".jsonl", ".parquet")


Record = tuple[str, int, Any, "int | None"]  # (source file, position in the file, record, JSONL line number)


def read_records(path: str | Path, deid: privacy.Deidentifier | None = None) -> tuple[list[Record], list[Reject]]:
    """Raw records, and the file- and line-level problems met while reading them.

    ``path`` is a file (JSON array, JSON object, JSONL, Parquet) or a folder of them, read with its
    subfolders. A JSONL line that is not JSON is a line-level reject (the other lines go on); a
    file that cannot be read at all, or a file in the folder with another extension, is a
    file-level reject (position -1, field ``(file)``; the folder's other files go on). Only a path
    that is neither a file nor a folder holding a case file raises :class:`CaseFileError`.
    """
    deid = deid or privacy.default()
    p = Path(path)
    out: list[Record] = []
    rejects: list[Reject] = []
    if p.is_dir():
        found = _folder_files(p)
        files = [f for f in found if f.suffix.lower() in CASE_SUFFIXES]
        for f in found:  # every other file is reported, never skipped in silence
            if f.suffix.lower() not in CASE_SUFFIXES:
                what = (f"extension {f.suffix.lower()!r}" if _SHOWN_SUFFIX.fullmatch(f.suffix.lower())
                        else "an unusual extension" if f.suffix else "no extension")
                rejects.append(Reject(deid.source(f, root=p), -1, None, "(file)",
                                      f"not a case file ({what}; accepted: {', '.join(CASE_SUFFIXES)})"))
        if not files:
            others = f" ({len(found)} other file(s) reported as rejects)" if found else ""
            raise CaseFileError(f"{deid.source(p)}: no case files (*.json, *.jsonl, *.parquet) in this folder or "
                                f"its subfolders{others}")
    elif p.is_file():
        files = [p]
    else:
        raise CaseFileError(f"{deid.source(p)}: no such file or folder")
    for f in files:
        source = deid.source(f, root=p if p.is_dir() else None)
        try:
            for position, (rec, line) in enumerate(_read_file(f)):
                if isinstance(rec, _BadLine):
                    rejects.append(Reject(source, position, None, "(line)", f"line {line}: {rec.reason}", line))
                else:
                    out.append((source, position, rec, line))
        except CaseFileError as exc:
            rejects.append(Reject(source, -1, None, "(file)", str(exc)))
    return out, rejects


_SHOWN_SUFFIX = re.compile(r"\.[a-z][a-z0-9]{0,4}")  # .txt, .csv, .xlsx: an extension named in a reason


def _folder_files(folder: Path) -> list[Path]:
    """Every file under ``folder``, subfolders included (symlinked folders are not followed, so a
    link loop cannot hang a run), in a stable order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found += [Path(dirpath) / n for n in sorted(filenames)]
    return [f for f in found if f.is_file()]


@dataclass(frozen=True, slots=True)
class _BadLine:
    reason: str


def _read_file(f: Path) -> list[tuple[Any, int | None]]:
    """(record, JSONL line number or None) pairs; a JSONL line that is not JSON gives a ``_BadLine``."""
    suffix = f.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return [(r, None) for r in pq.read_table(f).to_pylist()]
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise CaseFileError(f"not a readable Parquet file ({type(exc).__name__})") from exc
    try:
        text = f.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CaseFileError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise CaseFileError(f"cannot be read ({exc.strerror or type(exc).__name__})") from exc
    if suffix == ".jsonl" or (suffix != ".json" and "\n{" in text):
        records: list[tuple[Any, int | None]] = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((json.loads(line), lineno))
            except json.JSONDecodeError as exc:  # the message names the problem, never the text
                records.append((_BadLine(f"not valid JSON ({exc.msg}, column {exc.colno})"), lineno))
        return records
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseFileError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from exc
    if isinstance(data, dict) and isinstance(data.get("cases"), list):
        data = data["cases"]
    elif isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise CaseFileError(f"expected a JSON array of cases, got {privacy.describe_value(data)}")
    return [(r, None) for r in data]


# --- validation ---------------------------------------------------------------------

_describe = privacy.describe_value


def validate_record(rec: Any, source: str, position: int, deid: privacy.Deidentifier | None = None,
                    line: int | None = None) -> tuple[Case | None, list[Reject]]:
    """Validate and de-identify one raw record. Returns the case (or None) and its problems."""
    deid = deid or privacy.default()
    source = privacy.mask(source)  # already a label (read_records); a caller's own string is masked
    problems: list[tuple[str, str]] = []
    if not isinstance(rec, dict):
        return None, [Reject(source, position, None, "(record)",
                             f"expected an object with the case fields, got {_describe(rec)}", line)]

    masked: list[str] = []
    raw_id = rec.get("患者")
    case_id: str | None = None
    if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
        problems.append(("患者", "missing case id"))
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        problems.append(("患者", f"case id must be text or an integer, got {_describe(raw_id)}"))
    else:
        cleaned, removed = privacy.strip_controls(str(raw_id))
        if removed:
            masked.append("患者:control")
            deid.controls_removed += removed
        case_id, hashed = deid.case_id(cleaned.strip())
        if hashed:
            masked.append("患者:hashed")

    age: int | None = None
    raw_age = rec.get("年龄")
    if raw_age is None or raw_age == "":
        problems.append(("年龄", "missing"))
    elif isinstance(raw_age, bool):
        problems.append(("年龄", "must be an integer from 1 to 120, got a boolean"))
    elif isinstance(raw_age, int) or (isinstance(raw_age, float) and raw_age.is_integer()):
        age = int(raw_age)
    elif isinstance(raw_age, str) and (m := _AGE_TEXT.match(raw_age)):
        age = int(m.group(1))
    else:
        problems.append(("年龄", f"must be an integer from 1 to 120, got {_describe(raw_age)}"))
    if age is not None and not 1 <= age <= 120:
        problems.append(("年龄", "out of range (must be from 1 to 120)"))
        age = None

    raw_gender = rec.get("性别")
    gender = _GENDERS.get(raw_gender.strip()) if isinstance(raw_gender, str) else None
    if raw_gender is None or raw_gender == "":
        problems.append(("性别", "missing"))
    elif gender is None:
        problems.append(("性别", f"must be 男 or 女, got {_describe(raw_gender)}"))

    raw_icd = rec.get("ICD编码")
    icd = ""
    if not isinstance(raw_icd, str) or not raw_icd.strip():
        problems.append(("ICD编码", "missing" if raw_icd in (None, "") else f"must be text, got {_describe(raw_icd)}"))
    else:
        codes = [c.strip() for c in _ICD_SPLIT.split(raw_icd) if c.strip()]
        bad = [c for c in codes if not _ICD_ONE.match(c.upper())]
        if not codes or bad:
            problems.append(("ICD编码", f"not an ICD-10 code ({len(bad) or 1} of {len(codes) or 1} malformed; expected "
                                        f"e.g. F32.900, or several separated by commas)"))
        else:
            icd = ",".join(c.upper().replace("X", "x") if "." in c else c.upper() for c in codes)

    texts: dict[str, str] = {}
    for name in REQUIRED_TEXT + OPTIONAL_TEXT:
        v = rec.get(name)
        required = name in REQUIRED_TEXT
        if v is None or (isinstance(v, str) and not v.strip()):
            if required:
                problems.append((name, "missing" if v is None else "empty"))
            else:
                texts[name] = "无"
            continue
        if not isinstance(v, str):
            problems.append((name, f"must be text, got {_describe(v)}"))
            continue
        if len(v) > MAX_FIELD_CHARS:
            problems.append((name, f"oversized: {len(v):,} characters (limit {MAX_FIELD_CHARS:,})"))
            continue
        texts[name] = deid.text(v.strip(), name, masked)

    sections: dict[str, dict[str, str] | str] = {}
    for name in SECTIONED:
        v = rec.get(name)
        if v is None or v == "" or v == {}:
            sections[name] = {}
            continue
        if isinstance(v, str):
            if len(v) > MAX_FIELD_CHARS:
                problems.append((name, f"oversized: {len(v):,} characters (limit {MAX_FIELD_CHARS:,})"))
            else:
                sections[name] = deid.text(v.strip(), name, masked)
            continue
        if not isinstance(v, dict):
            problems.append((name, f"must be an object of named sub-fields or text, got {_describe(v)}"))
            continue
        clean: dict[str, str] = {}
        for k, sub in v.items():
            key = deid.text(str(k)[:MAX_KEY_CHARS], f"{name}.(name)", masked)  # a sub-field's name is free text too
            if sub is None:
                continue
            if not isinstance(sub, str):
                problems.append((f"{name}.{key}", f"must be text, got {_describe(sub)}"))
            elif len(sub) > MAX_FIELD_CHARS:
                problems.append((f"{name}.{key}", f"oversized: {len(sub):,} characters (limit {MAX_FIELD_CHARS:,})"))
            else:
                clean[key] = deid.text(sub.strip(), f"{name}.{key}", masked)
        sections[name] = clean

    origin, profile, plan_seed = _provenance(rec, problems)
    if problems:
        return None, [Reject(source, position, case_id, f, r, line) for f, r in problems]
    assert age is not None and gender is not None and case_id is not None
    return (
        Case(
            case_id=case_id,
            age=age,
            gender=gender,
            icd_code=icd,
            diagnosis=texts["诊断结果"],
            complaint=texts["主诉"],
            present_illness=texts["现病史"],
            treatment=texts["处理意见"],
            physical_history=texts.get("重要或相关躯体疾病史", "无"),
            family_history=texts.get("家族史", "无"),
            personal=sections["个人史"],
            exam=sections["精神检查"],
            masked=tuple(dict.fromkeys(masked)),
            source=origin,
            profile=profile,
            plan_seed=plan_seed,
        ),
        [],
    )


SOURCES = ("synthetic", "real")


def _provenance(rec: dict[str, Any], problems: list[tuple[str, str]]) -> tuple[str | None, str | None, int | None]:
    """``source`` (synthetic | real, optional) and, for a synthetic case, its ``profile`` and ``plan_seed``."""
    origin = rec.get("source")
    if origin is None or origin == "":
        return None, None, None
    if origin not in SOURCES:
        problems.append(("source", f"must be one of {', '.join(SOURCES)}, got {_describe(origin)}"))
        return None, None, None
    if origin == "real":
        return origin, None, None
    profile, seed = rec.get("profile"), rec.get("plan_seed")
    if not isinstance(profile, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", profile):
        problems.append(("profile", "a synthetic case needs its profile name (letters, digits, _ . -), "
                                    f"got {_describe(profile)}"))
        profile = None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        problems.append(("plan_seed", f"a synthetic case needs its plan seed (an integer >= 0), got {_describe(seed)}"))
        seed = None
    return origin, profile, seed


def validate_records(records: Iterable[Record],
                     deid: privacy.Deidentifier | None = None) -> tuple[list[Case], list[Reject]]:
    """Validate all records; later duplicates of a case id are rejected."""
    deid = deid or privacy.default()
    cases: list[Case] = []
    rejects: list[Reject] = []
    seen: dict[str, tuple[str, int, int | None]] = {}
    for source, position, rec, line in records:
        case, problems = validate_record(rec, source, position, deid, line)
        if case is None:
            rejects.extend(problems)
            continue
        if case.case_id in seen:
            first = seen[case.case_id]
            rejects.append(Reject(privacy.mask(source), position, case.case_id, "患者",
                                  f"duplicate case id {case.case_id}: already used at {where(first[1], first[2])} of "
                                  f"{privacy.mask(first[0])}", line))
            continue
        seen[case.case_id] = (source, position, line)
        cases.append(case)
    return cases, rejects


def where(position: int, line: int | None) -> str:
    """Where a record is, as every message says it: ``line N`` in a JSONL file (the line number an
    editor shows), ``position N`` (0-based, in the array or table) otherwise, ``the file`` for -1."""
    if line is not None:
        return f"line {line}"
    return "the file" if position < 0 else f"position {position}"


_NUMBER = re.compile(r"[0-9][0-9,]*")


def reject_kind(r: Reject) -> str:
    """A reject's kind: its field and its reason with the numbers and the case id left out (10,000
    copies of one case give one kind: a duplicate case id)."""
    reason = r.reason.replace(f"case id {r.case_id}", "case id ID") if r.case_id else r.reason
    return f"{r.field}: {_NUMBER.sub('N', reason)}"


def log_rejects(rejects: list[Reject], logger: logging.Logger, first: int = 3) -> dict[str, int]:
    """One warning for each of the first ``first`` rejects of a kind (:func:`reject_kind`), then one
    summary line per kind for the rest (every reject keeps its row in rejects.parquet). Returns the
    count per kind."""
    counts: dict[str, int] = {}
    for r in rejects:
        k = reject_kind(r)
        counts[k] = counts.get(k, 0) + 1
        if counts[k] <= first:
            logger.warning("rejected case %s (%s, %s): %s: %s", r.case_id, r.source, where(r.position, r.line),
                           r.field, r.reason)
    for k, n in counts.items():
        if n > first:
            logger.warning("... and %d more of kind %r (see rejects.parquet)", n - first, k)
    return counts


def load_cases(path: str | Path, deid: privacy.Deidentifier | None = None) -> tuple[list[Case], list[Reject]]:
    """Read, validate and de-identify; ``deid``: the run's (``privacy.for_output``), else ``privacy.default()``.

    Unreadable files and JSONL lines come first among the rejects."""
    deid = deid or privacy.default()
    records, rejects = read_records(path, deid)
    cases, problems = validate_records(records, deid)
    return cases, rejects + problems


def case_fields(case: Any) -> dict[str, str]:
    """A validated ``mdd.cases.Case`` as the record map of ``cases.parquet``: field path → text."""
    out = {}
    for name in ("主诉", "现病史", "重要或相关躯体疾病史", "家族史"):
        out[name] = case.get(name)
    for name, value in (("个人史", case.personal), ("精神检查", case.exam)):
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{name}.{k}"] = str(v)
        elif value:
            out[name] = str(value)
    return {k: v for k, v in out.items() if v}
