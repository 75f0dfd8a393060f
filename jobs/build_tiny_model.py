"""Build the tiny random-weight Qwen2 model for CPU runs: ``python -m jobs.build_tiny_model [DIR]``.

The vLLM engine builds it on first use anyway (model ``tiny`` or ``tiny:DIR``); this job does it
ahead of time, e.g. in a container image.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mdd build-tiny-model", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", default=".cache/models/mdd-tiny")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from mdd.engines.tiny_model import build_tiny_model

    print(build_tiny_model(args.dir, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
