"""Figures of a run on a trained model (``jobs.bench_trained``): what the guards caught and let through,
how the dialogues that were written clean read against MDD-5k, what they cost.

Everything is read back from the run's own files (``run.json``, ``synth/``, ``failures.parquet``,
``eval/``), so the same figures come out of any run folder, on any engine. Two checks stand beside the
run's own accounting: every written turn is checked again by the guards (``check_dialogue``: a clean
dialogue must pass them all, the count says so), and a plain prefix-echo count that knows nothing of the
guards (an answer that starts with the doctor's first ten characters).
"""
from __future__ import annotations

import glob
import json
import statistics
from pathlib import Path
from typing import Any, Sequence

import pyarrow.parquet as pq

from mdd import knowledge
from mdd.dialogue import guards as G
from mdd.record import ANSWERERS, count_exchanges


def _spread(xs: Sequence[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "mean": round(statistics.fmean(xs), 2)}


def _rows(pattern: str) -> list[dict[str, Any]]:
    files = sorted(glob.glob(pattern))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def prefix_echoes(turns: list[dict[str, Any]], chars: int = 10) -> int:
    """Answers that start with the doctor's last question's first ``chars`` characters."""
    n, last = 0, ""
    for t in turns:
        if t["speaker"] == "doctor":
            last = t["text"]
        elif t["speaker"] in ANSWERERS and len(last) >= chars and t["text"].startswith(last[:chars]):
            n += 1
    return n


def figures(run: Path, one_in_flight: Path | None = None) -> dict[str, Any]:
    meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    syn = meta["synthesize"]
    rows = _rows(str(run / "synth" / "*.parquet"))
    fails = pq.read_table(run / "failures.parquet").to_pylist() if (run / "failures.parquet").exists() else []
    ref = knowledge.load_yaml("mdd5k_reference.yaml")

    lengths: dict[str, list[int]]
    exchanges, lengths, closing_ok, recheck, spoken, echo10 = [], {"doctor": [], "patient": []}, 0, 0, 0, 0
    for r in rows:
        turns = r["turns"]
        exchanges.append(count_exchanges(turns))
        for t in turns:
            if t["speaker"] in lengths:
                lengths[t["speaker"]].append(len(t["text"]))
        closing_ok += bool(turns) and turns[-1]["speaker"] == "doctor" and r["diagnosis"] in turns[-1]["text"]
        recheck += len(G.check_dialogue(turns).failures)
        spoken += sum(1 for t in turns if t["speaker"] in ("doctor",) + ANSWERERS)
        echo10 += prefix_echoes(turns)

    engine = (syn.get("engine") or {}).get("metrics") or {}
    wall = float(syn.get("wall_time_s") or 0)
    out_tok = float(engine.get("output_tokens") or 0)
    ev = meta.get("evaluate") or {}
    out: dict[str, Any] = {
        "run": str(run),
        "model": (syn.get("engine") or {}).get("model"),
        "in_flight": ((syn.get("config") or {}).get("synth") or {}).get("in_flight"),
        "dialogues": len(rows) + len(fails),
        "clean": len(rows),
        "failed": len(fails),
        "clean_share": round(len(rows) / max(1, len(rows) + len(fails)), 3),
        "failed_reasons": [{"dialogue_id": f["dialogue_id"], "error": f["error"]} for f in fails],
        "guards": syn.get("guards"),
        "clean_dialogues": {
            "exchanges": _spread(exchanges),
            "at_least_12_exchanges": sum(e >= 12 for e in exchanges),
            "closing_names_diagnosis": closing_ok,
            "turns": spoken,
            "guard_failures_on_recheck": recheck,
            "prefix_echoes_10_chars": echo10,
            "regenerations": sum(int(r.get("regenerations") or 0) for r in rows),
            "trimmed_turns": sum(int(r.get("trimmed_turns") or 0) for r in rows),
            "topics_skipped": sum(int(r.get("topics_skipped") or 0) for r in rows),
        },
        "chars_per_turn": {sp: {"run": round(statistics.fmean(v), 1) if v else None,
                                "mdd5k": ref["chars_per_turn_mean"][sp]} for sp, v in lengths.items()},
        "required_items": (meta.get("interview") or {}).get("required_items"),
        "evaluator": {"high_quality_share": ev.get("high_quality_share"), "exchanges": ev.get("exchanges"),
                      "overall_mean": (ev.get("metric_means") or {}).get("overall")},
        "prefix_cache_hit_rate": engine.get("prefix_cache_hit_rate"),
        "engine_requests": engine.get("requests"),
        "calls_per_exchange_clean": (syn.get("llm_calls") or {}).get("per_exchange"),
        "wall_s": wall,
        "output_tokens": out_tok,
        "output_tok_s": round(out_tok / wall, 2) if wall else None,
        "usage_by_model_and_role": syn.get("usage_by_model_and_role"),
    }
    if one_in_flight is not None:
        seq = json.loads((one_in_flight / "run.json").read_text(encoding="utf-8"))["synthesize"]
        sm = (seq.get("engine") or {}).get("metrics") or {}
        sw = float(seq.get("wall_time_s") or 0)
        rate = float(sm.get("output_tokens") or 0) / sw if sw else None
        out["one_in_flight"] = {"run": str(one_in_flight), "wall_s": sw, "output_tokens": sm.get("output_tokens"),
                                "output_tok_s": round(rate, 2) if rate else None}
        out["output_tok_s_ratio"] = round(out["output_tok_s"] / rate, 2) if rate and out["output_tok_s"] else None
    return out
