"""Search the FAISS index of high-quality QA pairs.

    python -m jobs.search --out DIR -k 5 "最近睡眠怎么样"
"""
from __future__ import annotations

import argparse
import sys

from mdd.errors import entry_point


def _short(text: str | None, n: int = 80) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _times(hit: dict) -> str:
    n = hit.get("count") or 1
    return f" (and {n - 1} more identical)" if n > 1 else ""


def _at_least_one(value: str) -> int:
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of pairs, got {value!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {k}")
    return k


@entry_point("search")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mdd search", description="nearest high-quality QA pairs")
    ap.add_argument("--out", required=True, help="run folder (or s3:// / gs:// URI) holding index/")
    ap.add_argument("-k", type=_at_least_one, default=5, help="number of pairs (at least 1)")
    ap.add_argument("--full", action="store_true", help="print whole questions and answers")
    ap.add_argument("text", nargs="+", help="query text")
    args = ap.parse_args(argv)
    from mdd.index import search
    from mdd.storage import StorageError

    try:
        hits = search(args.out, " ".join(args.text), args.k)
    except FileNotFoundError as exc:
        print(f"search: {exc}", file=sys.stderr)
        return 2
    if not hits:
        print("no results (empty index)")
        return 0
    n = 100000 if args.full else 80
    for rank, h in enumerate(hits, 1):
        print(f"{rank}. score={h['score']:.3f}  {h['dialogue_id']} turn {h['turn']}{_times(h)}  "
              f"diagnosis={h.get('diagnosis') or '-'} ({h.get('icd_code') or '-'})")
        print(f"   问: {_short(h.get('question'), n)}")
        print(f"   答: {_short(h.get('answer'), n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
