"""Data for the evaluator's tests: the shared MDD-5k slice (imported with jobs.import_mdd5k) and
dialogues the scripted engine synthesizes in-process (no Ray), with their case records."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
MDD5K = ROOT.parent / "shared" / "mdd5k"
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def import_shared(out: Path) -> pa.Table:
    """The 100 shared MDD-5k dialogues as the dialogue table (fails loudly when the slice is missing)."""
    from jobs.import_mdd5k import import_mdd5k

    counts = import_mdd5k(MDD5K / "dialogues", MDD5K / "labels", out)
    assert counts["dialogues"] == 100, counts
    return pq.read_table(out / "synth")


def synthesize_scripted(out: Path, n_cases: int = 6, variants: int = 2) -> pa.Table:
    """Scripted dialogues of the first sample cases, plus OUT/cases.parquet; returns the dialogue table."""
    from mdd.cases import load_cases
    from mdd.config import DialogueConfig
    from mdd.synthesize.run import write_cases
    from mdd.synthesize.worker import DialogueWorker
    from mdd.dialogue.dryrun.engine import ScriptedEngine
    from mdd.schema import DIALOGUE
    from mdd.storage import open_store

    cases, rejects = load_cases(SAMPLES)
    assert not rejects and len(cases) >= n_cases
    cases = cases[:n_cases]
    worker = DialogueWorker({c.case_id: c for c in cases}, ScriptedEngine(), DialogueConfig(), 7)

    async def run_all():
        return await asyncio.gather(*(worker.run(c.case_id, v) for c in cases for v in range(variants)))

    results = asyncio.run(run_all())
    assert all(r["ok"] for r in results), [r.get("error") for r in results if not r["ok"]]
    out.mkdir(parents=True, exist_ok=True)
    write_cases(open_store(out), cases)
    table = pa.Table.from_pylist([r["row"] for r in results], schema=DIALOGUE)
    (out / "synth").mkdir(exist_ok=True)
    pq.write_table(table, out / "synth" / "part-test.parquet")
    return table


def shared_labels() -> dict[str, dict]:
    return {p.stem.replace("_label", ""): json.loads(p.read_text(encoding="utf-8"))
            for p in (MDD5K / "labels").glob("patient_*_label.json")}
