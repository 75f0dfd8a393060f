"""Fine-tuning export: ``python -m jobs.export --out DIR --format sft|sharegpt [filters]`` (``mdd export``).

Writes DIR/export/<format>/part-*.parquet and DIR/export/<format>.jsonl, records the export in
DIR/run.json and rewrites the dataset card (DIR/README.md) so that it lists the export.
"""
from __future__ import annotations

import argparse
import sys

from jobs import add_wait_flag
from mdd.errors import entry_point


def build_parser() -> argparse.ArgumentParser:
    from mdd.publish.export import FORMATS

    p = argparse.ArgumentParser(prog="mdd export",
                                description="One row per dialogue as chat messages (SFT) or ShareGPT.")
    p.add_argument("--config", default=None, help="YAML config (publish.export gives the default filters)")
    p.add_argument("--out", default=None, help="run folder (default: synth.out of the config)")
    p.add_argument("--format", default="sft", choices=list(FORMATS))
    p.add_argument("--min-quality", type=float, help="keep dialogues whose mean --metric is at least this")
    p.add_argument("--metric", help="eval/dialogues column for --min-quality (default: overall)")
    p.add_argument("--min-rule-pass", type=float, help="keep dialogues that passed this share of their triggered rules")
    p.add_argument("--mask-below", type=float, help="doctor turns whose doctor_quality is below this get weight 0")
    add_wait_flag(p)
    return p


@entry_point("export")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mdd.config import load_config
    from mdd.publish.export import ExportError, Filters, export

    cfg = load_config(args.config, {"publish.export.min_quality": args.min_quality,
                                    "publish.export.metric": args.metric,
                                    "publish.export.min_rule_pass": args.min_rule_pass,
                                    "publish.export.mask_below": args.mask_below})
    from mdd.publish.card import write_card
    from mdd.publish.run_data import RunData
    from mdd.storage import dialogue_shards, open_store, run_lock

    e = cfg.publish.export
    store = open_store(args.out or cfg.synth.out)
    with run_lock(store, "export", wait=args.wait, create=False):
        fmt = args.format
        dialogue_shards(store, quarantine=False)  # a damaged input is named before anything is written
        RunData(store).check_readable()
        # written aside, then swapped in: a failed export or card never replaces the last good one
        with store.staged(f"export-{fmt}", (f"export/{fmt}", f"export/{fmt}.jsonl", "README.md"),
                          passthrough=(ExportError,)) as st:
            s = export(store, fmt, Filters(e.min_quality, e.metric, e.min_rule_pass, e.mask_below), dest=st.out)
            section = {**(store.read_run_json().get("export") or {}), fmt: s}
            st.run_json["export"] = section
            write_card(store, cfg if args.config else None, dest=st.out, sections={"export": section})
    dropped = ", ".join(f"{v} {k}" for k, v in s["dropped"].items()) or "none"
    print(f"export: {s['rows']} dialogues as {args.format} -> {', '.join(store.display(f) for f in s['files'])}; "
          f"left out: {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
