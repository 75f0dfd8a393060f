"""Rebuild a run's report and dataset card: ``python -m jobs.report --out DIR [--reference REF]`` (``mdd report``).

Writes DIR/report.html (self-contained), DIR/report/*.png, DIR/README.md (Hugging Face dataset card)
and the ``report`` key of DIR/run.json. The main job (``jobs.run``) does the same after evaluating.
"""
from __future__ import annotations

import argparse
import logging
import sys

from jobs import add_wait_flag
from mdd.errors import entry_point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mdd report",
                                description="Write the run report (HTML + PNG) and the dataset card.")
    p.add_argument("--config", default=None, help="YAML config (licence and title of the card; default: the run's)")
    p.add_argument("--out", default=None, help="run folder (default: synth.out of the config)")
    p.add_argument("--reference", default=None, help="dialogue table to compare with (a run folder or Parquet, e.g. "
                   "the output of jobs.import_mdd5k); default: publish.reference, else the published MDD-5k figures")
    add_wait_flag(p)
    return p


def publish(cfg, out: str, reference: str | None = None) -> int:
    """Report + card for ``out``; prints where they are. Returns an exit code."""
    from mdd.publish.card import write_card
    from mdd.publish.report import FIGURE_DIR, REPORT_FILE, build_report
    from mdd.publish.run_data import RunData
    from mdd.storage import dialogue_shards, open_store

    ref = reference or cfg.publish.reference
    try:
        store = open_store(out)
        dialogue_shards(store, quarantine=False)  # ShardError: a damaged shard, named, before anything is written
        RunData(store).check_readable()  # likewise a damaged evaluation table, cases.parquet, rejects.parquet
        # written aside, then swapped in: a failed report or card never replaces the last good one
        with store.staged("report", (REPORT_FILE, FIGURE_DIR, "README.md")) as st:
            summary = build_report(store, ref, dest=st.out)
            st.run_json["report"] = summary
            card = write_card(store, cfg, ref, dest=st.out, sections={"report": summary})
    except FileNotFoundError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    bad = {k: v for k, v in summary["panels"].items() if v.startswith("error")}
    print(f"report: {store.display(summary['file'])} ({len(summary['figures'])} figures in "
          f"{store.display('report')}/), "
          f"dataset card {card}" + (f"; panels that failed: {', '.join(bad)}" if bad else ""))
    return 0


@entry_point("report")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from mdd.config import load_config

    cfg = load_config(args.config)
    from mdd.storage import open_store, run_lock

    out = args.out or cfg.synth.out
    store = open_store(out)
    with run_lock(store, "report", wait=args.wait, create=False):
        if not store.parquet_files("synth"):
            print(f"report: {store.display('synth')}: no dialogues here (run the main job or jobs.synthesize "
                  f"first)", file=sys.stderr)
            return 2
        return publish(cfg, out, args.reference)


if __name__ == "__main__":
    sys.exit(main())
