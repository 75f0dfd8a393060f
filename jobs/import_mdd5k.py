"""Import the released MDD-5k dialogues into the DIALOGUE table.

    python -m jobs.import_mdd5k --src SRC --out DIR
        # SRC/MDD_5k/patient_N.json, SRC/Label/patient_N_label.json
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
import sys
from pathlib import Path

import pyarrow as pa

from jobs import add_wait_flag
from mdd.errors import entry_point
from mdd.mdd5k import read_mdd5k
from mdd.schema import DIALOGUE, REJECT
from mdd.storage import open_store


def import_mdd5k(dialogues_dir: Path, labels_dir: Path | None, out: str | Path, shard_size: int = 1000) -> dict:
    """Import every ``patient_N.json`` in ``dialogues_dir``; returns counts."""
    out = open_store(out)
    rows, rejects, counts = read_mdd5k(dialogues_dir, labels_dir)
    for old in out.files("synth", ".parquet"):
        if old.startswith("mdd5k-"):
            out.delete(f"synth/{old}")
    shards = 0
    for start in range(0, len(rows), shard_size):
        chunk = rows[start : start + shard_size]
        out.write_table(pa.Table.from_pylist(chunk, schema=DIALOGUE), f"synth/mdd5k-{shards:05d}.parquet")
        shards += 1
    if rejects:
        out.write_table(pa.Table.from_pylist(rejects, schema=REJECT), "rejects.parquet")
    else:
        out.delete("rejects.parquet")
    return {**counts, "rejects": len(rejects), "shards": shards}


@entry_point("import-mdd5k")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mdd import-mdd5k", description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", help="release root holding MDD_5k/ and Label/")
    ap.add_argument("--dialogues", help="folder of patient_N.json (flat layout)")
    ap.add_argument("--labels", help="folder of patient_N_label.json (flat layout)")
    ap.add_argument("--out", required=True, help="output root; writes OUT/synth/mdd5k-*.parquet")
    ap.add_argument("--shard-size", type=int, default=1000)
    add_wait_flag(ap)
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
    from mdd.storage import StorageError, run_lock

    try:
        with run_lock(args.out, "import-mdd5k", wait=args.wait):
            counts = import_mdd5k(dialogues, labels, args.out, shard_size=args.shard_size)
    except (FileNotFoundError, StorageError) as exc:
        print(f"import-mdd5k: {exc}", file=sys.stderr)
        return 2
    print(
        f"imported {counts['dialogues']} dialogues ({counts['exchanges']} exchanges) from "
        f"{counts['files_ok']}/{counts['files']} case files into {counts['shards']} shard(s) under "
        f"{open_store(args.out).display('synth')}; {counts['rejects']} reject rows ({counts['duplicate_files']} "
        f"duplicate files), {counts['unlabelled_cases']} case(s) without label"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
