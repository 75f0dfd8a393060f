"""Train on synthetic, test on real (mdd/publish/utility.py, ``mdd utility``): labels, the leakage guard,
splits by case, the controls, and the end-to-end command on small synthetic fixtures."""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from mdd.publish import utility as U
from mdd.schema import DIALOGUE
from mdd.storage import open_store

# --- fixtures -----------------------------------------------------------------------------

CLASS_CODES = {"depression": ("F32.900", "抑郁状态"), "anxiety": ("F41.100", "焦虑状态"),
               "mixed": ("F41.200", "混合性焦虑和抑郁障碍"), "other": ("F51.000", "非器质性失眠症")}
SIGNS = {"depression": ["心情一直很低落", "对什么都没兴趣", "常常想哭", "觉得自己没用", "整天没精力"],
         "anxiety": ["总是很紧张", "心慌出汗", "控制不住地担心", "坐立不安", "怕有坏事发生"],
         "mixed": ["心情低落又很紧张", "没兴趣还总担心", "想哭又心慌", "没精力也坐立不安", "低落和担心都有"],
         "other": ["晚上睡不着", "半夜醒来好几次", "白天犯困", "入睡要两个小时", "早上四点就醒"]}
FILLER = ["我平时在公司上班", "家里人都挺好的", "周末会出去走走", "最近工作有点忙", "我一般自己做饭",
          "我住在城里", "孩子在上学", "以前身体还可以", "我喜欢看电视", "和同事关系一般"]
QUESTIONS = ["最近怎么样？", "能多说一点吗？", "这种情况多久了？", "家里人知道吗？", "平时生活怎么安排？"]


def dialogue_rows(n_cases: int, variants: int, seed: int, *, signal: bool, closing: bool, prefix: str,
                  classes: tuple[str, ...] = ("depression", "anxiety", "mixed", "other")) -> list[dict]:
    """Dialogues whose patient turns carry class signs (``signal``) or only shared filler, with or without
    a doctor's closing (topic 诊断结果) that names the diagnosis."""
    rng = random.Random(seed)
    rows = []
    for c in range(n_cases):
        cls = classes[c % len(classes)]
        code, diag = CLASS_CODES[cls]
        for v in range(variants):
            turns = []
            for q in QUESTIONS:
                turns.append({"speaker": "doctor", "text": q, "topic": "症状"})
                words = rng.sample(FILLER, 2) + (rng.sample(SIGNS[cls], 2) if signal else [])
                rng.shuffle(words)
                turns.append({"speaker": "patient", "text": "，".join(words) + "。", "topic": "症状"})
            if closing:
                turns.append({"speaker": "doctor", "text": f"好的。根据今天了解的情况，初步诊断是{diag}。按时复诊。",
                              "topic": "诊断结果"})
            rows.append({"dialogue_id": f"{prefix}{c}-{v}", "case_id": f"{prefix}{c}", "variant": v, "seed": 0,
                         "turns": turns, "icd_code": code, "diagnosis": diag, "source": prefix})
    return rows


def write_run(path, rows) -> str:
    open_store(str(path)).write_table(pa.Table.from_pylist(rows, schema=DIALOGUE), "synth/part-00000.parquet")
    return str(path)


FAST = dict(n_boot=200, permutations=5, repeats=2)


# --- labels -------------------------------------------------------------------------------

@pytest.mark.parametrize("icd,four,binary", [
    ("F32.900", "depression", "depression"), ("F32.300", "depression", "depression"),
    ("F41.100", "anxiety", "anxiety"), ("F41.000", "anxiety", "anxiety"),
    ("F41.200", "mixed", None), ("F41.200x002", "mixed", None), ("F32.900,F41.100", "mixed", None),
    ("F39.x00", "other", None), ("F33.100", "other", None), ("F51.000", "other", None), ("G47.000", "other", None),
    (None, None, None), ("", None, None),
])
def test_labels_from_icd_codes(icd, four, binary):
    assert U.diagnosis_class(icd) == four
    assert U.task_label(icd, "four") == four
    assert U.task_label(icd, "binary") == binary


def test_tasks_come_from_the_yaml():
    assert U.task_classes("binary") == ["depression", "anxiety"]
    assert U.task_classes("four") == ["depression", "anxiety", "mixed", "other"]
    with pytest.raises(ValueError, match="unknown task"):
        U.task_classes("twelve")


# --- the leakage guard --------------------------------------------------------------------

def test_closing_topic_and_everything_after_it_is_dropped():
    turns = [{"speaker": "doctor", "text": "睡得怎么样？", "topic": "睡眠"},
             {"speaker": "patient", "text": "睡不好。", "topic": "睡眠"},
             {"speaker": "doctor", "text": "初步诊断是抑郁状态。", "topic": "诊断结果"},
             {"speaker": "patient", "text": "谢谢医生。", "topic": "诊断结果"}]
    interview, closing = U.split_closing(turns)
    assert [t["text"] for t in interview] == ["睡得怎么样？", "睡不好。"]
    assert len(closing) == 2


def test_trailing_diagnosis_statement_is_dropped_but_not_a_question_about_one():
    asked = [{"speaker": "doctor", "text": "你家里有没有人被诊断为精神疾病？"},
             {"speaker": "patient", "text": "没有。"}]
    assert U.split_closing(asked) == (asked, [])
    told = asked + [{"speaker": "doctor", "text": "综合来看，我的诊断是焦虑状态。"}]
    interview, closing = U.split_closing(told)
    assert interview == asked and [t["text"] for t in closing] == ["综合来看，我的诊断是焦虑状态。"]


def test_diagnosis_words_and_icd_codes_are_masked():
    text, n = U.mask_labels("我的抑郁状态加重了，病历上写着F32.900和F41.200x002。", "抑郁状态")
    assert n == 3 and "抑郁状态" not in text and "F32" not in text and "F41" not in text
    assert U.mask_labels("我一天吃3片药", "抑郁状态") == ("我一天吃3片药", 0)


def test_no_closing_text_reaches_any_view():
    rows = dialogue_rows(4, 2, 0, signal=True, closing=True, prefix="s")
    for r in rows:
        item = U.prepare(r)
        assert item.closing_turns == 1 and "初步诊断" in item.closing
        for view in U.VIEWS:
            assert "初步诊断" not in item.views[view] and r["diagnosis"] not in item.views[view]
        assert "医生" not in item.views["patient"] and all(q in item.views["doctor"] for q in QUESTIONS)


# --- splits -------------------------------------------------------------------------------

def test_folds_never_split_a_case():
    rows = dialogue_rows(12, 5, 1, signal=True, closing=False, prefix="r")
    groups = [r["case_id"] for r in rows]
    labels = [U.diagnosis_class(r["icd_code"]) for r in rows]
    folds = U.group_folds(groups, labels, n_splits=5, seed=0)
    assert len(folds) == 5
    seen = []
    for tr, te in folds:
        assert not {groups[i] for i in tr} & {groups[i] for i in te}
        seen += list(te)
    assert sorted(seen) == list(range(len(rows)))  # every dialogue tested exactly once
    small = U.group_folds(["a", "a", "b", "b", "c", "c", "d", "d"], ["x", "x", "y", "y", "x", "x", "y", "y"])
    assert len(small) == 4  # at most as many folds as the largest class has dialogues
    with pytest.raises(ValueError, match="at least 2 cases"):
        U.group_folds(["a", "a"], ["x", "y"])


def test_bootstrap_interval_resamples_cases_and_brackets_the_estimate():
    y = ["a"] * 20 + ["b"] * 20
    p = ["a"] * 15 + ["b"] * 5 + ["b"] * 15 + ["a"] * 5
    groups = [f"c{i // 5}" for i in range(40)]
    m = U.scores(y, p, groups, ["a", "b"], n_boot=500, seed=0, n_train=10)
    assert m["macro_f1"] == pytest.approx(0.75) and m["accuracy"] == pytest.approx(0.75)
    lo, hi = m["macro_f1_ci"]
    assert lo < 0.75 < hi and m["n_test_cases"] == 8
    assert U.scores(y, y, groups, ["a", "b"], n_boot=200, seed=0, n_train=1)["macro_f1_ci"] == [1.0, 1.0]


# --- the comparisons, end to end ----------------------------------------------------------

@pytest.fixture(scope="module")
def signal_report():
    run = dialogue_rows(24, 3, 2, signal=True, closing=True, prefix="syn")
    ref = dialogue_rows(12, 3, 3, signal=True, closing=False, prefix="patient_")
    return U.utility(run, ref, U.Settings(**FAST))


def test_tstr_learns_real_signal_and_the_shuffled_control_falls_to_chance(signal_report):
    for name, k in (("four", 4), ("binary", 2)):
        T = signal_report["tasks"][name]
        assert T["available"]
        assert T["tstr"]["macro_f1"] > 0.9 and T["tstr"]["beats_majority"]
        assert T["tstr"]["macro_f1_ci"][0] > T["majority"]["macro_f1"]
        assert T["trtr"]["macro_f1"] > 0.9
        lo, hi = T["chance"]["macro_f1_range"]
        assert T["shuffled"]["within_chance"] and lo <= T["shuffled"]["macro_f1"] <= hi
        assert abs(T["shuffled"]["macro_f1"] - 1 / k) < 0.15
        assert T["majority"]["macro_f1"] < 0.5


def test_utility_json_shape(signal_report):
    for name in ("binary", "four"):
        T = signal_report["tasks"][name]
        for key in ("tstr", "trtr", "majority", "shuffled"):
            assert {"macro_f1", "macro_f1_ci", "accuracy", "n_train", "n_test"} <= set(T[key])
            lo, hi = T[key]["macro_f1_ci"]
            assert 0 <= lo <= T[key]["macro_f1"] <= hi <= 1 or T[key]["macro_f1"] in (lo, hi)
        classes = T["classes"]
        assert set(T["per_class"]["tstr"]) == set(classes)
        assert len(T["confusion"]["tstr"]) == len(classes)
        assert sum(map(sum, T["confusion"]["tstr"])) == T["tstr"]["n_test"]
        curve = T["learning_curve"]
        assert len(curve) == 4 and [p["n_train"] for p in curve] == sorted(p["n_train"] for p in curve)
        assert curve[-1]["n_train"] == T["tstr"]["n_train"]
        assert set(T["views"]) == {"full", "doctor", "patient"}
    four = signal_report["tasks"]["four"]
    assert four["tstr"]["n_test"] == 36 and four["tstr"]["n_train"] == 72 and four["shuffled"]["n_test"] == 5 * 36
    assert signal_report["tasks"]["binary"]["tstr"]["n_test"] == 18  # mixed and other are left out
    # the signs are in the patient's turns; the doctor's questions are the same for every class
    assert four["views"]["patient"]["tstr"]["macro_f1"] > 0.9
    assert four["views"]["doctor"]["tstr"]["macro_f1"] < 0.5
    g = signal_report["guard"]
    assert g["closings_in_classifier_input"] == 0
    assert g["run"]["closing_turns_dropped"] == 72 and g["reference"]["closing_turns_dropped"] == 0


def test_guard_matters_closing_alone_is_near_perfect_the_guarded_interview_is_not():
    """Interviews without any class signal, closings that name the diagnosis: given only the closing, a
    classifier is near-perfect; given the guarded interview, it is at chance."""
    run = dialogue_rows(16, 3, 4, signal=False, closing=True, prefix="syn")
    ref = dialogue_rows(12, 3, 5, signal=False, closing=False, prefix="patient_")
    rep = U.utility(run, ref, U.Settings(**FAST))
    four = rep["tasks"]["four"]
    assert four["leakage"]["closing_only"]["macro_f1"] >= 0.95
    assert four["leakage"]["interview"]["macro_f1"] < 0.45
    assert four["leakage"]["doctor_only"]["macro_f1"] < 0.45 and four["leakage"]["patient_only"]["macro_f1"] < 0.45
    assert four["tstr"]["macro_f1"] < 0.45 and not four["tstr"]["beats_majority"]
    # without the guard (the closing left in the interview), the same classifier reads the answer
    items = [U.prepare(r) for r in run]
    y = [it.label for it in items]
    pred, _ = U.cv_predict([it.views["full"] + "\n" + it.closing for it in items], y, [it.case_id for it in items],
                           U.model_factory("tfidf"), n_splits=4, seed=0)
    assert U.macro_f1(y, pred, U.task_classes("four")) >= 0.95


def test_a_run_with_one_class_is_not_available_with_the_reason():
    run = dialogue_rows(4, 2, 6, signal=True, closing=True, prefix="syn", classes=("depression",))
    ref = dialogue_rows(8, 2, 7, signal=True, closing=False, prefix="patient_")
    rep = U.utility(run, ref, U.Settings(**FAST))
    assert rep["tasks"]["four"]["available"] is False
    assert "1 of this task's classes" in rep["tasks"]["four"]["reason"]


def test_embedder_model_plugs_in(signal_report):
    run = dialogue_rows(16, 3, 2, signal=True, closing=True, prefix="syn")
    ref = dialogue_rows(12, 3, 3, signal=True, closing=False, prefix="patient_")
    rep = U.utility(run, ref, U.Settings(model="embed:hashing", **FAST))
    T = rep["tasks"]["four"]
    assert rep["settings"]["model"] == "embed:hashing"
    assert T["tstr"]["beats_majority"] and T["shuffled"]["within_chance"]
    with pytest.raises(ValueError, match="unknown model"):
        U.model_factory("bert")


# --- the command, the report panel and the card -------------------------------------------

def test_command_writes_utility_json_report_panel_and_card_line(tmp_path, capsys):
    from jobs.utility import main
    from mdd.publish.card import write_card
    from mdd.publish.report import build_report

    out = write_run(tmp_path / "run", dialogue_rows(12, 3, 8, signal=True, closing=True, prefix="syn"))
    ref = write_run(tmp_path / "ref", dialogue_rows(8, 3, 9, signal=True, closing=False, prefix="patient_"))
    assert main(["--out", out, "--reference", ref, "--bootstrap", "100", "--permutations", "2"]) == 0
    printed = capsys.readouterr().out
    assert "tstr" in printed and "shuffled" in printed and "utility.json" in printed
    u = json.loads((tmp_path / "run" / "utility.json").read_text())
    assert set(u["tasks"]) == {"binary", "four"}
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["utility"]["four"]["tstr"]["macro_f1"] == u["tasks"]["four"]["tstr"]["macro_f1"]
    summary = build_report(out)
    assert summary["panels"]["utility"] == "ok"
    assert any("utility_learning" in f for f in summary["figures"])
    assert any("utility_confusion" in f for f in summary["figures"])
    write_card(out)
    card = (tmp_path / "run" / "README.md").read_text()
    assert "diagnosis macro-F1 (four), trained here, tested on 24 real dialogues" in card


def test_command_errors_are_one_line_exit_2(tmp_path, capsys):
    from jobs.utility import main

    out = write_run(tmp_path / "run", dialogue_rows(4, 2, 10, signal=True, closing=True, prefix="syn"))
    assert main(["--out", out, "--reference", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("utility: ") and "missing" in err and "\n" not in err
    assert main(["--out", out, "--reference", out, "--model", "bert"]) == 2
    assert "unknown model 'bert'" in capsys.readouterr().err
    unlabelled = write_run(tmp_path / "ref", [{**r, "icd_code": None} for r in
                                              dialogue_rows(4, 2, 11, signal=True, closing=False, prefix="p")])
    assert main(["--out", out, "--reference", unlabelled]) == 2
    assert "the reference: no dialogue has an icd_code" in capsys.readouterr().err


def test_the_report_says_when_utility_was_not_computed(tmp_path):
    from mdd.publish.report import build_report

    out = write_run(tmp_path / "run", dialogue_rows(4, 2, 12, signal=True, closing=True, prefix="syn"))
    from mdd.storage import open_store

    assert build_report(out)["panels"]["utility"] == "ok"
    assert "Not computed for this run (no utility.json)" in open_store(out).read_text("report.html")


def test_mdd_cli_lists_utility():
    from mdd.cli import COMMANDS

    assert COMMANDS["utility"][0] == "jobs.utility"


def test_shared_mdd5k_slice_labels_and_closings():
    """The reference the project develops against (read in place, never copied): every released dialogue
    gets a class, and no closing is found (MDD-5k's closings are stripped)."""
    from collections import Counter
    from pathlib import Path

    src = Path(__file__).resolve().parents[1].parent / "shared" / "mdd5k"
    if not (src / "dialogues").is_dir():
        pytest.skip("../shared/mdd5k not here")
    classes, closings = Counter(), 0
    for f in sorted((src / "dialogues").glob("patient_*.json")):
        label = json.loads((src / "labels" / f.name.replace(".json", "_label.json")).read_text(encoding="utf-8"))
        for d in json.loads(f.read_text(encoding="utf-8")):
            classes[U.diagnosis_class(label["ICD_Code"])] += 1
            turns = [{"speaker": sp, "text": ex[sp]} for ex in d["conversation"] for sp in ("doctor", "patient")
                     if ex.get(sp)]
            closings += len(U.split_closing(turns)[1])
    assert classes == {"depression": 30, "mixed": 30, "other": 25, "anxiety": 15}
    assert closings == 0


def test_main_job_runs_utility_before_its_report(ray_session, tmp_path):
    """``mdd run --utility REF``: the main job's own dialogues (scripted engine, 4 sample cases) against a
    labelled reference; the report shows the panel with its figures."""
    from jobs.run import main as run_main

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    samples = json.loads((root / "data" / "cases" / "sample_cases.json").read_text(encoding="utf-8"))
    picked = [c for c in samples if str(c.get("ICD编码", "")).startswith(("F32", "F41"))][:4]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(picked, ensure_ascii=False), encoding="utf-8")
    ref = write_run(tmp_path / "ref", dialogue_rows(8, 2, 13, signal=True, closing=False, prefix="patient_"))
    out = tmp_path / "out"
    assert run_main(["--config", str(root / "configs" / "local.yaml"), "--cases", str(cases), "--out", str(out),
                     "--variants", "2", "--no-progress", "--utility", ref]) == 0
    u = json.loads((out / "utility.json").read_text(encoding="utf-8"))
    assert u["guard"]["run"]["closing_turns_dropped"] == u["guard"]["run"]["dialogues"] == 8
    assert u["guard"]["closings_in_classifier_input"] == 0
    rep = json.loads((out / "run.json").read_text(encoding="utf-8"))["report"]
    assert rep["panels"]["utility"] == "ok" and any("utility_learning" in f for f in rep["figures"])


# --- the default classifier: the patient's symptom concepts ------------------------------------

def test_concepts_model_counts_affirmed_symptoms_never_denials():
    from mdd.publish.classifiers import ConceptLinear

    m = ConceptLinear({})
    ix = {c: i for i, c in enumerate(m.concepts)}
    k = len(m.concepts)
    said = m.vector("我最近有自杀的想法，心情很差\n晚上睡不着")
    assert said[k + ix["suicidal"]] == 1 and said[k + ix["insomnia"]] == 1 and said[ix["insomnia"]] == 0.5
    denied = m.vector("没有自杀的想法\n没有听到别人听不到的声音")  # a screening answer affirms nothing
    assert not denied.any()
    assert U.Settings().model == "concepts" and U.Settings().view == "patient"


def test_main_job_dialogues_beat_the_majority_on_the_shared_slice(sample_run):
    """The README's main job (27 sample cases x 5, scripted dry-run writer; the rows made in-process) trained
    on, the shared MDD-5k slice (20 patients, read in place) tested on, with the default settings: TSTR beats
    the majority class on both tasks, on four classes with its 95% interval (on the binary task the slice's 9
    patients, 3 with anxiety, leave the interval's lower end at the majority's 0.40), the shuffled control
    stays in the chance band, no closing reaches the classifier, and what it learned is clinical
    (depression: low mood, appetite, suicidal ideas …; anxiety: worry, palpitations). The slice is small:
    this guards the figures README reports, it is not evidence about a large reference."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1].parent / "shared" / "mdd5k"
    if not (src / "dialogues").is_dir():
        pytest.skip("../shared/mdd5k not here")
    ref, layout = U.load_labelled(str(src))
    rep = U.utility(sample_run["rows"], ref, U.Settings(repeats=2))
    assert rep["guard"]["closings_in_classifier_input"] == 0
    assert rep["guard"]["run"]["closing_turns_dropped"] >= 135
    for name in ("binary", "four"):
        T = rep["tasks"][name]
        assert T["tstr"]["macro_f1"] > T["majority"]["macro_f1"] + 0.1, (name, T["tstr"], T["majority"])
        if name == "four":
            assert T["tstr"]["beats_majority"] and T["tstr"]["macro_f1_ci"][0] > T["majority"]["macro_f1"]
        else:  # the interval reaches down to the majority (0.40) on 9 patients, not below it
            assert T["tstr"]["macro_f1_ci"][0] >= T["majority"]["macro_f1"] - 0.02, T["tstr"]
        assert T["shuffled"]["within_chance"]
        assert T["tstr"]["macro_f1"] > T["shuffled"]["macro_f1"]
        assert len({p for row in T["confusion"]["tstr"] for p, n in enumerate(row) if n}) >= 2  # not one class
    learned = rep["tasks"]["binary"]["learned"]
    assert {"low_mood", "anhedonia", "appetite_loss", "suicidal"} & set(learned["depression"])
    assert {"anxiety", "panic"} & set(learned["anxiety"])
    # the doctor's agenda-keyed questions give the label away inside the run, and not on real dialogues
    four = rep["tasks"]["four"]
    assert four["leakage"]["doctor_only"]["macro_f1"] > 0.9
    assert four["views"]["doctor"]["tstr"]["macro_f1"] < four["tstr"]["macro_f1"]
