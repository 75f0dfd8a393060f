"""Synthetic case records end to end: plans → writer → validation → consistency checker → repair or reject.

    from mdd.cases.synth import synthesize_cases
    result = synthesize_cases(1000, "mdd5k", "out/cases", seed=1)

writes ``out/cases/cases.jsonl`` (the accepted records in the MDD-5k case schema plus ``source``,
``profile``, ``plan_seed``; ``--cases`` reads it like any case file), ``plans.jsonl`` (the plan of
each accepted case), ``rejects.parquet`` (case id, rule, field, reason of every case rejected after
its repair pass) and ``synthesis.json`` (counts by rule, the diversity figures).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mdd.cases import validate_record
from mdd.cases.check import Finding, check_case
from mdd.cases.diversity import diversity
from mdd.cases.plan import CasePlan, load_profile, synthesize_plans
from mdd.cases.write import CaseWriteError, CaseWriter, ScriptedCaseWriter

REJECT_SCHEMA = pa.schema([pa.field("case_id", pa.string()), pa.field("rule", pa.string()),
                           pa.field("field", pa.string()), pa.field("reason", pa.string())])


@dataclass
class SynthesisResult:
    out: Path
    requested: int
    written: int
    repaired: int
    rejected: int
    failed_first_pass_by_rule: dict[str, int] = field(default_factory=dict)
    rejected_by_rule: dict[str, int] = field(default_factory=dict)
    diversity: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def review(record: dict[str, Any], position: int = 0) -> tuple[Any, list[Finding]]:
    """The validated case (or None) and every finding: validation problems as rule ``validation``."""
    case, problems = validate_record(record, "synthetic", position)
    if case is None:
        cid = str(record.get("患者")) if isinstance(record, dict) else "?"
        return None, [Finding(cid, "validation", p.field, p.reason) for p in problems]
    return case, check_case(case)


def _write_all(writer: CaseWriter, jobs: list[tuple[CasePlan, list[Finding]]]) -> list[Any]:
    """Each job's record or :class:`CaseWriteError`: a writer's ``write_many`` (an engine's calls in
    flight together) when it has one, else ``write`` one by one."""
    many = getattr(writer, "write_many", None)
    if many is not None:
        return list(many(jobs))
    out: list[Any] = []
    for plan, failed in jobs:
        try:
            out.append(writer.write(plan, failed))
        except CaseWriteError as exc:
            out.append(exc)
    return out


def _review(plan: CasePlan, written: Any, position: int) -> list[Finding]:
    if isinstance(written, CaseWriteError):
        return [Finding(plan.case_id, "writer_output", "(record)", str(written))]
    return review(written, position)[1]


def write_passes(writer: CaseWriter,
                 plans: list[CasePlan]) -> list[tuple[dict[str, Any] | None, list[Finding], list[Finding]]]:
    """Per plan: (record or None, first-pass findings, findings left after the repair pass). The first
    pass writes every plan; the second rewrites those with findings, told which rules failed."""
    first = _write_all(writer, [(p, []) for p in plans])
    found = [_review(p, w, i) for i, (p, w) in enumerate(zip(plans, first))]
    redo = [i for i, f in enumerate(found) if f]
    second = dict(zip(redo, _write_all(writer, [(plans[i], found[i]) for i in redo])))
    out: list[tuple[dict[str, Any] | None, list[Finding], list[Finding]]] = []
    for i, plan in enumerate(plans):
        if not found[i]:
            out.append((first[i], [], []))
            continue
        left = _review(plan, second[i], i)
        out.append((None if left else second[i], found[i], left))
    return out


def write_one(writer: CaseWriter, plan: CasePlan,
              position: int) -> tuple[dict[str, Any] | None, list[Finding], list[Finding]]:
    """(record or None, first-pass findings, findings left after the repair pass) of one plan."""
    return write_passes(writer, [plan])[0]


def synthesize_cases(n: int, profile: str, out: str | Path, seed: int = 0,
                     writer: CaseWriter | None = None) -> SynthesisResult:
    t0 = time.perf_counter()
    prof = load_profile(profile)
    writer = writer or ScriptedCaseWriter()
    plans = synthesize_plans(prof, n, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records, kept, rejects = [], [], []
    first_by_rule: Counter[str] = Counter()
    rejected_by_rule: Counter[str] = Counter()
    repaired = 0
    for plan, (record, first, left) in zip(plans, write_passes(writer, plans)):
        first_by_rule.update({r: 1 for r in {f.rule for f in first}})
        if record is None:
            rejected_by_rule.update({r: 1 for r in {f.rule for f in left}})
            rejects += [f.as_row() for f in left]
            continue
        repaired += bool(first)
        records.append(record)
        kept.append(plan)
    _write_jsonl(out / "cases.jsonl", records)
    _write_jsonl(out / "plans.jsonl", [p.to_dict() for p in kept])
    pq.write_table(pa.Table.from_pylist(rejects, schema=REJECT_SCHEMA), out / "rejects.parquet")
    result = SynthesisResult(out=out, requested=n, written=len(records), repaired=repaired,
                             rejected=n - len(records), failed_first_pass_by_rule=dict(first_by_rule),
                             rejected_by_rule=dict(rejected_by_rule), diversity=diversity(records, kept, prof))
    result.seconds = round(time.perf_counter() - t0, 2)
    (out / "synthesis.json").write_text(json.dumps({"profile": prof.name, "profile_source": prof.source, "seed": seed,
                                                    "writer": writer.name,
                                                    "writer_model": getattr(writer, "model", None),
                                                    "writer_usage": dict(getattr(writer, "usage", {}) or {}),
                                                    **result.summary()},
                                                   ensure_ascii=False, indent=2), encoding="utf-8")
    return result


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)
