"""The required-items coverage matrix as the rule judge sees it (``eval/coverage/``).

The checklist's rules (:func:`mdd.evaluate.rule_set.checklist_rules`) judge, from the doctor's
words alone, whether each required item was asked; this module folds their rows into a matrix
ICD prefix (of the leading diagnosis) x item, one row per cell: dialogues that require the
item, dialogues that asked it, the share. It reads no synthesis bookkeeping, so it also
measures dialogues made elsewhere (an imported MDD-5k corpus with its labels).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from mdd.checklist import leading_prefix
from mdd.evaluate.rule_set import checklist_item
from mdd.schema import COVERAGE


def coverage_table(rules: pa.Table, icd_of: Mapping[str, str | None]) -> pa.Table:
    """Fold the checklist rules' rows (RULE_RESULT) into the coverage matrix (COVERAGE)."""
    cells: dict[tuple[str, str], list[int]] = {}
    if rules.num_rows:
        for d, rule, trig, score in zip(rules.column("dialogue_id").to_pylist(), rules.column("rule").to_pylist(),
                                        rules.column("triggered").to_pylist(), rules.column("score").to_pylist()):
            item = checklist_item(rule)
            if item is None or not trig:
                continue
            cell = cells.setdefault((leading_prefix(icd_of.get(d)) or "?", item), [0, 0])
            cell[0] += 1
            cell[1] += int(score is not None and score >= 1.0)
    return cells_table(cells)


def cells_table(cells: Mapping[tuple[str, str], list[int]]) -> pa.Table:
    """{(icd prefix, item): [dialogues, asked]} as the COVERAGE table, sorted."""
    keys = sorted(cells)
    return pa.Table.from_pydict({
        "icd_prefix": [k[0] for k in keys],
        "item": [k[1] for k in keys],
        "dialogues": [cells[k][0] for k in keys],
        "asked": [cells[k][1] for k in keys],
        "share": [cells[k][1] / cells[k][0] for k in keys],
    }, schema=COVERAGE)


def coverage_summary(table: pa.Table) -> dict[str, Any]:
    """The run.json form: {prefix: {item: share}} and the cells below 1."""
    matrix: dict[str, dict[str, float]] = {}
    missing = []
    for r in table.to_pylist():
        matrix.setdefault(r["icd_prefix"], {})[r["item"]] = round(r["share"], 4)
        if r["asked"] < r["dialogues"]:
            missing.append(f"{r['icd_prefix']}:{r['item']} {r['asked']}/{r['dialogues']}")
    asked = sum(r["asked"] for r in table.to_pylist())
    required = sum(r["dialogues"] for r in table.to_pylist())
    return {"asked": asked, "required": required, "share": round(asked / required, 4) if required else None,
            "matrix": matrix, "missing_cells": missing}


def format_coverage(s: Mapping[str, Any], width: int = 6) -> list[str]:
    """Console lines: per ICD prefix, how many required (dialogue x item) cells were asked."""
    if not s.get("required"):
        return []
    lines = ["", f"required items (checklist), judged from the doctor's questions: {s['asked']}/{s['required']} asked",
             f"{'icd':<{width}}{'items':>7}{'asked share':>13}  items not always asked"]
    for prefix, cells in s["matrix"].items():
        low = [f"{i} {v:.2f}" for i, v in cells.items() if v < 1.0]
        share = sum(cells.values()) / len(cells)
        lines.append(f"{prefix:<{width}}{len(cells):>7}{share:>13.3f}  {', '.join(low[:6]) or '-'}")
    return lines
