"""Prompt layouts and sampling under A/B on a real model (mdd/perf/prompt_ab.py).

    python -m jobs.bench_prompts --config configs/local-real.yaml --limit 5 --variants 2 --max-exchanges 12
"""
from __future__ import annotations

import sys

from mdd.perf.prompt_ab import main

if __name__ == "__main__":
    sys.exit(main())
