"""What a run's interviews covered, read from its dialogue rows (``run.json["interview"]``).

- length: exchanges per dialogue (mean, min, max) against the released corpus's 23.4;
- coverage: the checklist's required items, ICD prefix x item (:func:`mdd.checklist.coverage_matrix`);
- diversity: per case, the mean pairwise Kendall tau of the order in which its variants asked
  the topics they share (1: the same order; 0: unrelated orders);
- modules: which disorder modules each case attached, and the cases served by the general
  trees alone (their diagnoses' checklist ``decision``).
"""
from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mdd import checklist
from mdd.cases import Case

CORPUS_EXCHANGES = 23.4  # the released MDD-5k corpus, 500-dialogue sample (shared/FACTS.md)
EXPERIENCE_PREFIX = "exp_"  # experience points differ in content between variants: not compared


def kendall_tau(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Kendall's tau-a of the order of the items both sequences hold (first occurrence);
    None when they share fewer than two."""
    pos_a = {x: i for i, x in reversed(list(enumerate(a)))}
    pos_b = {x: i for i, x in reversed(list(enumerate(b)))}
    common = [x for x in pos_a if x in pos_b]
    n = len(common)
    if n < 2:
        return None
    s = 0
    for x, y in itertools.combinations(common, 2):
        s += 1 if (pos_a[x] - pos_a[y]) * (pos_b[x] - pos_b[y]) > 0 else -1
    return s / (n * (n - 1) / 2)


def topic_order(row: Mapping[str, Any]) -> list[str]:
    ids = row.get("topic_ids") or row.get("topics") or []
    return [t for t in ids if not str(t).startswith(EXPERIENCE_PREFIX)]


def variant_tau(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per case: the mean pairwise Kendall tau of its variants' topic orders."""
    by_case: dict[str, list[list[str]]] = defaultdict(list)
    for r in rows:
        by_case[str(r["case_id"])].append(topic_order(r))
    out = {}
    for case, orders in sorted(by_case.items()):
        taus = [t for a, b in itertools.combinations(orders, 2) if (t := kendall_tau(a, b)) is not None]
        if taus:
            out[case] = round(statistics.fmean(taus), 4)
    return out


def modules_by_case(cases: Iterable[Case]) -> dict[str, list[str]]:
    """The disorder modules (not the always-on ones) each case's tree attaches."""
    from mdd.tree import attached_modules

    return {c.case_id: [m["id"] for m in attached_modules(c, checklist.plan_for(c.icd_code, c.age).modules)
                        if not m.get("always")] for c in cases}


INTERVIEW_COLUMNS = ("case_id", "icd_code", "n_exchanges", "topic_ids", "topics", "required_items", "items_asked")


def read_rows(store: Any) -> list[dict[str, Any]]:
    """The columns :func:`summarize` needs from a run's dialogue shards (``store``: the run's
    :class:`mdd.storage.Store`; shards written before the interview columns give None there)."""
    from mdd.storage import SYNTH

    try:
        table = store.read_table(SYNTH, columns=list(INTERVIEW_COLUMNS))
    except FileNotFoundError:
        return []
    return table.to_pylist()


def summarize(rows: Sequence[Mapping[str, Any]], modules_by_case: Mapping[str, Sequence[str]] | None = None
              ) -> dict[str, Any]:
    """The ``interview`` section of run.json for a run's dialogue rows."""
    lengths = [int(r["n_exchanges"]) for r in rows]
    tau = variant_tau(rows)
    matrix = checklist.coverage_matrix(rows)
    cells = [c for cs in matrix.values() for c in cs.values()]
    out: dict[str, Any] = {
        "dialogues": len(rows),
        "exchanges": {
            "mean": round(statistics.fmean(lengths), 2) if lengths else None,
            "min": min(lengths, default=None),
            "max": max(lengths, default=None),
            "corpus_mean": CORPUS_EXCHANGES,
            "ratio_to_corpus": round(statistics.fmean(lengths) / CORPUS_EXCHANGES, 3) if lengths else None,
        },
        "required_items": {
            "asked": sum(c["asked"] for c in cells),
            "required": sum(c["of"] for c in cells),
            "dialogues_missing_some": sum(1 for r in rows
                                          if set(r.get("required_items") or ()) - set(r.get("items_asked") or ())),
            "missing_cells": checklist.missing_cells(matrix),
        },
        "coverage": matrix,
        "variant_kendall_tau": {
            "mean": round(statistics.fmean(tau.values()), 4) if tau else None,
            "max": max(tau.values(), default=None),
            "per_case": tau,
        },
    }
    if modules_by_case is not None:
        diagnoses = checklist.load().diagnoses
        general = {}
        for case, mods in modules_by_case.items():
            if not mods:
                code = next((str(r.get("icd_code")) for r in rows if str(r["case_id"]) == case), "")
                d = diagnoses.get(checklist.leading_prefix(code))
                general[case] = d.decision if d is not None and d.decision else "no module, no decision"
        out["modules"] = {"by_case": {c: list(m) for c, m in sorted(modules_by_case.items())}, "general": general}
    return out


def format_summary(s: Mapping[str, Any]) -> str:
    ex, req, tau = s["exchanges"], s["required_items"], s["variant_kendall_tau"]
    lines = [
        f"interview: {s['dialogues']} dialogues, {ex['mean']} exchanges per dialogue ({ex['min']}-{ex['max']}; "
        f"corpus {ex['corpus_mean']}); required items asked {req['asked']}/{req['required']}; "
        f"variants' mean Kendall tau of topic order {tau['mean']}",
    ]
    if req["missing_cells"]:
        lines.append("required items not always asked: " + ", ".join(req["missing_cells"][:12]))
    return "\n".join(lines)
