"""The scale benchmark (mdd/perf/scale.py): synthesis and evaluation at several sizes.

    python -m jobs.bench_scale --scale 200,800 --out out/bench-scale.json
"""
from __future__ import annotations

import sys

from mdd.perf.scale import main

if __name__ == "__main__":
    sys.exit(main())
