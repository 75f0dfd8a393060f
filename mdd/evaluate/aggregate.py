"""Small partial aggregates of one evaluated shard, and their merge into the run's summary.

A shard worker (``mdd/evaluate/streaming.py``) writes its tables itself and returns only
``shard_partial(...)``: counts, metric sums, first-failed-gate counts, per-rule counts and the
coverage cells of its dialogues: a few kilobytes whatever the shard holds. The driver merges
the partials of every shard of the run (those evaluated now and those kept from an earlier
run, ``eval/state.json``) into ``run.json["evaluate"]`` and ``eval/coverage/``: nothing of the
size of the corpus passes through it.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from mdd.evaluate.coverage import coverage_summary
from mdd.evaluate.gates import reason_counts
from mdd.evaluate.rule_set import checklist_item
from mdd.schema import DIALOGUE_EVAL, METRICS

log = logging.getLogger(__name__)

RULE_COUNTS = ("rows", "triggered", "passed", "failed", "skipped")


def _passed(triggered: Any, score: Any) -> bool:
    return bool(triggered) and score is not None and score >= 1.0


def dialogue_eval(turns: pa.Table, rules: pa.Table) -> pa.Table:
    """Per-dialogue means (over the known values), counts and rule tallies (DIALOGUE_EVAL), sorted by
    dialogue id; dialogues without exchanges have no row. ``overall`` is the exchanges' mean times one
    minus the share of exchanges that fail a turn guard."""
    failed = pc.greater(pc.fill_null(pc.list_value_length(turns.column("turn_guards")), 0), 0) \
        if "turn_guards" in turns.column_names else pa.array([False] * turns.num_rows)
    turns = turns.append_column("_guard_failed", pc.cast(failed, pa.float64()))
    agg = turns.group_by("dialogue_id").aggregate(
        [(m, "mean") for m in METRICS] + [("high_quality", "sum"), ("turn", "count"), ("case_id", "min"),
                                          ("_guard_failed", "mean")])
    ids = agg.column("dialogue_id").to_pylist()
    share = agg.column("_guard_failed_mean")
    trig: dict[str, int] = {}
    passed: dict[str, int] = {}
    for d, t, s in zip(rules.column("dialogue_id").to_pylist(), rules.column("triggered").to_pylist(),
                       rules.column("score").to_pylist()):
        trig[d] = trig.get(d, 0) + int(bool(t))
        passed[d] = passed.get(d, 0) + int(_passed(t, s))
    data: dict[str, Any] = {
        "dialogue_id": ids,
        "case_id": agg.column("case_id_min"),
        "n_exchanges": agg.column("turn_count"),
        **{m: agg.column(f"{m}_mean") for m in METRICS},
        "n_high_quality": agg.column("high_quality_sum"),
        "rules_triggered": [trig.get(d, 0) for d in ids],
        "rules_passed": [passed.get(d, 0) for d in ids],
        "guard_failed_share": share,
    }
    data["overall"] = pc.multiply(agg.column("overall_mean"), pc.subtract(1.0, share))
    table = pa.Table.from_pydict(data).cast(DIALOGUE_EVAL)
    return table.take(pc.sort_indices(table, sort_keys=[("dialogue_id", "ascending")]))


def rule_counts(rules: pa.Table) -> dict[str, dict[str, int]]:
    per_rule: dict[str, dict[str, int]] = {}
    for name, t, s in zip(rules.column("rule").to_pylist(), rules.column("triggered").to_pylist(),
                          rules.column("score").to_pylist()):
        d = per_rule.setdefault(name, dict.fromkeys(RULE_COUNTS, 0))
        d["rows"] += 1
        if not t:
            d["skipped"] += 1
        else:
            d["triggered"] += 1
            d["passed" if _passed(t, s) else "failed"] += 1
    return per_rule


def coverage_cells(rules: pa.Table, icd_of: Mapping[str, str | None]) -> list[list]:
    """[icd_prefix, item, dialogues, asked] per cell of the required-items matrix (see coverage.py)."""
    from mdd.evaluate.coverage import coverage_table

    t = coverage_table(rules, icd_of)
    return [list(r) for r in zip(*(t.column(c).to_pylist() for c in ("icd_prefix", "item", "dialogues", "asked")))]


def shard_partial(n_dialogues: int, turns: pa.Table, rules: pa.Table, dialogues: pa.Table,
                  icd_of: Mapping[str, str | None]) -> dict[str, Any]:
    """What the driver needs of one shard's tables (JSON-able, a few KB)."""
    sums, counts = {}, {}
    for m in METRICS:
        col = turns.column(m)
        counts[m] = len(col) - col.null_count
        sums[m] = float(pc.sum(col).as_py() or 0.0)
    hq = int(pc.sum(turns.column("high_quality").cast(pa.int64())).as_py() or 0) if turns.num_rows else 0
    return {
        "dialogues": int(n_dialogues),
        "dialogues_evaluated": int(dialogues.num_rows),
        "exchanges": int(turns.num_rows),
        "high_quality": hq,
        "faithfulness_known": counts["faithfulness"],
        "metric_sum": sums,
        "metric_n": counts,
        "hq_reasons": {k: v for k, v in reason_counts(turns.column("hq_reason").to_pylist()).items() if v},
        "rules": rule_counts(rules),
        "rule_rows": int(rules.num_rows),
        "coverage": coverage_cells(rules, icd_of),
    }


def merge(partials: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of shard partials (in the order given: sorted shard names for a stable float sum)."""
    total: dict[str, Any] = {"dialogues": 0, "dialogues_evaluated": 0, "exchanges": 0, "high_quality": 0,
                             "faithfulness_known": 0, "rule_rows": 0, "metric_sum": dict.fromkeys(METRICS, 0.0),
                             "metric_n": dict.fromkeys(METRICS, 0), "hq_reasons": reason_counts([]), "rules": {},
                             "coverage": {}}
    for p in partials:
        for k in ("dialogues", "dialogues_evaluated", "exchanges", "high_quality", "faithfulness_known", "rule_rows"):
            total[k] += int(p[k])
        for m in METRICS:
            total["metric_sum"][m] += float(p["metric_sum"][m])
            total["metric_n"][m] += int(p["metric_n"][m])
        for k, v in p["hq_reasons"].items():
            total["hq_reasons"][k] = total["hq_reasons"].get(k, 0) + int(v)
        for name, d in p["rules"].items():
            acc = total["rules"].setdefault(name, dict.fromkeys(RULE_COUNTS, 0))
            for k in RULE_COUNTS:
                acc[k] += int(d[k])
        for prefix, item, n, asked in p["coverage"]:
            cell = total["coverage"].setdefault((prefix, item), [0, 0])
            cell[0] += int(n)
            cell[1] += int(asked)
    return total


def coverage_of(total: Mapping[str, Any]) -> pa.Table:
    """The merged coverage cells as the COVERAGE table (sorted by prefix, item)."""
    from mdd.evaluate.coverage import cells_table

    return cells_table(total["coverage"])


def summary_counts(total: Mapping[str, Any], coverage: pa.Table) -> dict[str, Any]:
    """The count and mean fields of ``run.json["evaluate"]`` from the merged partials."""
    n_ex = total["exchanges"]
    for name, d in total["rules"].items():
        if d["skipped"] and checklist_item(name) is None:  # a checklist item applies to some diagnoses only
            log.warning("rule %s skipped on %d of %d dialogues (reasons in eval/rules/)", name, d["skipped"], d["rows"])
    return {
        "dialogues": total["dialogues"],
        "dialogues_evaluated": total["dialogues_evaluated"],
        "exchanges": n_ex,
        "high_quality": total["high_quality"],
        "high_quality_share": (total["high_quality"] / n_ex) if n_ex else 0.0,
        "metric_means": {m: (total["metric_sum"][m] / total["metric_n"][m]) if total["metric_n"][m] else None
                         for m in METRICS},
        "rules": total["rules"],
        "rule_rows": total["rule_rows"],
        "coverage": coverage_summary(coverage),
        "skipped": {"dialogues_without_exchanges": total["dialogues"] - total["dialogues_evaluated"]},
        "faithfulness_known": total["faithfulness_known"],
        "hq_reasons": total["hq_reasons"],
    }
