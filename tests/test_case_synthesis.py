"""Synthetic case records (mdd/cases/plan.py, write.py, synth.py), the clinical consistency checker
(mdd/cases/check.py) and their provenance in cases.parquet and the dialogue table."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from mdd.cases import load_cases, validate_record
from mdd.cases.check import RULES, check_case, complaint_days
from mdd.cases.plan import ProfileError, load_profile, synthesize_plans
from mdd.cases.synth import synthesize_cases
from mdd.cases.write import ScriptedCaseWriter

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"
SHARED_LABELS = ROOT.parent / "shared" / "mdd5k" / "labels"


def mdd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mdd", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    out = tmp_path_factory.mktemp("cases1000")
    return synthesize_cases(1000, "mdd5k", out, seed=1)


# --- the profile ------------------------------------------------------------------------------

def test_mdd5k_profile_carries_the_published_figures():
    p = load_profile("mdd5k")
    assert p.n_diagnoses == {1: 845, 2: 74, 3: 6} and sum(p.n_diagnoses.values()) == 925
    published = {"F32": 410, "F41": 339, "F39": 65, "F98": 30, "F51": 28, "F42": 21, "G47": 17, "F31": 11}
    assert {k: p.prefixes[k] for k in published} == published
    assert list(p.prefixes)[:10] == [*published, "F43", "F45"] and {"Z71", "F50", "F34", "F22", "F90", "F28"} <= set(p.prefixes)
    assert "MDD-5k" in p.source and "925" in p.source
    # every shared label's prefix is one the profile draws (the shared README's F48 is in no published count)
    prefixes = {json.loads(f.read_text(encoding="utf-8"))["ICD_Code"][:3] for f in SHARED_LABELS.glob("*_label.json")}
    assert prefixes - set(p.prefixes) <= {"F48"}


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile("nope")
    bad = (ROOT / "mdd" / "knowledge" / "profiles" / "mdd5k.yaml").read_text(encoding="utf-8")
    (tmp_path / "p.yaml").write_text(bad.replace("F32+F41: 30", "F32+F99: 30"), encoding="utf-8")
    with pytest.raises(ProfileError, match="co_occurrence.F32\\+F99"):
        load_profile(str(tmp_path / "p.yaml"))


# --- 1,000 synthetic cases --------------------------------------------------------------------

def test_thousand_cases_are_written_valid_consistent_and_match_the_profile(thousand):
    r = thousand
    assert r.requested == 1000 and r.written >= 980 and r.rejected == 1000 - r.written  # at most 2% rejects
    cases, rejects = load_cases(r.out / "cases.jsonl")
    assert len(cases) == r.written and rejects == []
    assert all(c.source == "synthetic" and c.profile == "mdd5k" and c.plan_seed is not None for c in cases)
    assert all(c.masked == () for c in cases)  # no personal data by construction: the masks find nothing
    assert all(check_case(c) == [] for c in cases)
    d = r.diversity
    assert d["js_distance"]["icd_prefix"] < 0.05 and d["js_distance"]["n_diagnoses"] < 0.05
    assert d["js_distance"]["age_band"] < 0.1 and d["js_distance"]["gender"] < 0.1
    for k, share in {"1": 845 / 925, "2": 74 / 925, "3": 6 / 925}.items():
        assert abs(d["n_diagnoses_share"][k] - share) <= 0.02
    assert d["near_duplicates"]["share"] == 0.0 and d["near_duplicates"]["max_jaccard"] < 0.8
    assert d["symptom_sets"]["F32"]["distinct"] >= 50
    summary = json.loads((r.out / "synthesis.json").read_text(encoding="utf-8"))
    assert summary["written"] == r.written and summary["diversity"]["js_distance"] == d["js_distance"]
    assert len((r.out / "plans.jsonl").read_text(encoding="utf-8").splitlines()) == r.written


def test_plans_fit_diagnosis_age_gender_and_criteria():
    plans = synthesize_plans(load_profile("mdd5k"), 1000, seed=5)
    drugs_min_age = {"escitalopram": 12, "paroxetine": 18, "venlafaxine": 18, "quetiapine": 13, "eszopiclone": 18}
    for p in plans:
        if set(p.prefixes) & {"F90", "F93", "F98"}:
            assert p.age <= 17
        if p.postpartum:
            assert p.gender == "女" and 22 <= p.age <= 40 and "F32" in p.prefixes
        if "F32" in p.prefixes:
            assert p.days >= 14 and "mood_low" in p.present
        codes = [c for c, _ in p.codes]
        if any(c.startswith("F41.2") for c in codes):  # mixed: anxiety and depression both present (by_code)
            assert {"mood_low", "worry"} <= set(p.present), (p.case_id, codes, p.present)
        if any(c.startswith("F41.0") for c in codes):  # panic disorder: panic attacks
            assert "panic" in p.present, (p.case_id, codes, p.present)
        assert all(p.age >= drugs_min_age.get(d, 0) for d in p.drugs)
        if p.pregnant_weeks or p.breastfeeding:
            assert not set(p.drugs) & {"paroxetine", "lithium", "valproate", "lorazepam", "eszopiclone", "zolpidem"}
    assert any(p.postpartum for p in plans)


def test_same_seed_same_cases_and_ids_unique_across_seeds(tmp_path):
    a = synthesize_cases(60, "mdd5k", tmp_path / "a", seed=3)
    b = synthesize_cases(60, "mdd5k", tmp_path / "b", seed=3)
    c = synthesize_cases(60, "mdd5k", tmp_path / "c", seed=4)
    assert (a.out / "cases.jsonl").read_bytes() == (b.out / "cases.jsonl").read_bytes()
    ids = lambda r: {json.loads(x)["患者"] for x in (r.out / "cases.jsonl").read_text(encoding="utf-8").splitlines()}
    assert not ids(a) & ids(c)


# --- the checker --------------------------------------------------------------------------------

def test_the_27_sample_cases_pass_every_rule(tmp_path):
    cases, rejects = load_cases(SAMPLES)
    assert len(cases) == 27 and rejects == []
    assert [f for c in cases for f in check_case(c)] == []
    res = mdd("cases", "check", str(SAMPLES), "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert pq.read_table(tmp_path / "rejects.parquet").num_rows == 0


def _sample(i: int) -> dict:
    return copy.deepcopy(json.loads(SAMPLES.read_text(encoding="utf-8"))[i])


_N = iter(range(10**6))


def _probe(i: int, **edits) -> dict:
    rec = _sample(i)
    for k, v in edits.items():
        if "." in k:
            head, sub = k.split(".", 1)
            rec[head][sub] = v
        else:
            rec[k] = v
    rec["患者"] = f"P{i:02d}x{next(_N)}"
    return rec


PROBES = [  # records that break one rule each (from sample cases S01 15女 F32, S05 19女 F50, S06 20男 F31 …)
    ("age_occupation", _probe(0, **{"个人史.工作、学习情况": "大三学生，成绩中上。"})),
    ("age_occupation", _probe(10, **{"年龄": 30, "个人史.工作、学习情况": "已退休，在家。"})),
    ("age_marital", _probe(0, **{"个人史.婚恋情况": "已婚，育有一子。"})),
    ("gender_specific", _probe(5, **{"个人史.月经情况": "13岁初潮，周期规律。"})),
    ("gender_specific", _probe(20, **{"个人史.月经情况": "周期规律，末次月经半月前。"})),
    ("diagnosis_symptoms", _probe(15, ICD编码="F30.100")),  # insomnia relabelled mania
    ("duration_criteria", _probe(9, 主诉="产后情绪低落、哭泣、失眠10天")),
    ("duration_criteria", _probe(13, 主诉="全身多处不适反复就医半年")),
    ("treatment_age", _probe(0, 处理意见="帕罗西汀片 20mg 每日一次 每次半片 口服。两周后复诊。")),
    ("treatment_diagnosis", _probe(5, 处理意见="舍曲林片 50mg 每日一次 每次1片 口服。两周后复诊。")),
    ("treatment_diagnosis", _probe(0, 处理意见="盐酸哌甲酯缓释片 18mg 每日一次 口服。")),
    ("treatment_pregnancy", _probe(9, 处理意见="帕罗西汀片 20mg 每日一次 口服。两周后复诊。")),
    # ADHD relabelled on records whose exam finds attention intact (注意力尚集中 / 注意力集中 no longer count)
    ("diagnosis_symptoms", _probe(3, ICD编码="F90.000")),
    ("diagnosis_symptoms", _probe(21, ICD编码="F90.000")),
    ("diagnosis_symptoms", _probe(0, ICD编码="Z71.900", 主诉="来诊2周", 现病史="患者2周前来院，要求开具证明。")),
    ("mse_history", _probe(1, **{"精神检查.感知": "可引出言语性幻听"})),
    ("mse_history", _probe(1, **{"精神检查.情感": "情绪低落"}, 现病史="患者1年前出现厌学、脾气暴躁，否认持续情绪低落。")),
]


@pytest.mark.parametrize("rule,rec", PROBES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(PROBES)])
def test_each_probe_is_caught_by_its_rule(rule, rec):
    case, problems = validate_record(rec, "probe", 0)
    assert case is not None, problems
    assert rule in {f.rule for f in check_case(case)}
    assert rule in RULES


def test_check_command_writes_rule_rows_and_exits_1(tmp_path):
    path = tmp_path / "probes.jsonl"
    broken = [rec for _, rec in PROBES[:3]] + [_sample(2), {"患者": "bad", "年龄": "old"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in broken), encoding="utf-8")
    res = mdd("cases", "check", str(path), "--out", str(tmp_path / "o"))
    assert res.returncode == 1, res.stderr
    rows = pq.read_table(tmp_path / "o" / "rejects.parquet").to_pylist()
    assert {r["rule"] for r in rows} == {"age_occupation", "age_marital", "validation"}
    assert "S03" not in {r["case_id"] for r in rows}
    assert mdd("cases", "check", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")).returncode == 2
    assert mdd("cases", "synthesize", "--n", "0", "--out", str(tmp_path / "o2")).returncode == 2


def test_complaint_durations():
    assert complaint_days("失眠20余年，加重伴安眠药用量增加2年") == 20 * 365
    assert complaint_days("反复暴食后催吐1年半") == 1.5 * 365
    assert complaint_days("情绪低落、懒动2月，1年前曾有兴奋话多") == 60  # "1年前" is a time ago, not a duration
    assert complaint_days("反复清洗、担心污染3年，加重半年") == 3 * 365 and complaint_days("心烦") is None


# --- repair and reject ----------------------------------------------------------------------------

class FaultyWriter(ScriptedCaseWriter):
    """Writes a retired schoolchild on the first pass; mends it when told (or never, ``stubborn``)."""

    name = "faulty"

    def __init__(self, stubborn: bool = False):
        self.stubborn, self.told = stubborn, []

    def write(self, plan, failed=()):
        rec = super().write(plan, failed)
        self.told.append([f.rule for f in failed])
        if not failed or self.stubborn:
            rec["年龄"] = 12
            rec["个人史"]["工作、学习情况"] = "已退休。"
            rec["处理意见"] = "暂不予药物治疗。"
        return rec


def test_a_failed_record_is_repaired_once_told_or_rejected_with_its_rules(tmp_path):
    w = FaultyWriter()
    r = synthesize_cases(20, "mdd5k", tmp_path / "a", seed=2, writer=w)
    assert r.written == 20 and r.repaired == 20 and r.failed_first_pass_by_rule["age_occupation"] == 20
    assert ["age_occupation"] in w.told
    s = synthesize_cases(20, "mdd5k", tmp_path / "b", seed=2, writer=FaultyWriter(stubborn=True))
    assert s.written == 0 and s.rejected == 20 and s.rejected_by_rule["age_occupation"] == 20
    rows = pq.read_table(tmp_path / "b" / "rejects.parquet").to_pylist()
    assert {r["rule"] for r in rows} >= {"age_occupation"} and all(r["case_id"].startswith("syn") for r in rows)


# --- into the dialogues --------------------------------------------------------------------------

def test_synthetic_cases_run_through_the_main_job_with_provenance(tmp_path, thousand):
    res = subprocess.run([sys.executable, "-m", "jobs.synthesize", "--config", "configs/local.yaml",
                          "--cases", str(thousand.out / "cases.jsonl"), "--limit", "6", "--variants", "2",
                          "--out", str(tmp_path / "run"), "--no-progress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    df = pl.read_parquet(tmp_path / "run" / "synth" / "*.parquet")
    assert df.height == 12 and set(df["case_source"]) == {"synthetic"} and set(df["case_profile"]) == {"mdd5k"}
    assert df["case_plan_seed"].null_count() == 0
    cases = pq.read_table(tmp_path / "run" / "cases.parquet").to_pylist()
    assert len(cases) == 6 and all(c["source"] == "synthetic" and c["plan_seed"] is not None for c in cases)
    syn = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert syn["counts"]["cases_by_source"] == {"synthetic": 6} and syn["mixed_sources"] is False
    assert syn["synthetic_cases"]["mdd5k"]["cases"] == 6 and "cases by source: synthetic 6" in res.stderr
    assert all(r["guard_events"] == [] or r["regenerations"] >= 0 for r in df.iter_rows(named=True))


def test_cases_parquet_of_an_older_run_gains_null_provenance(tmp_path):
    import pyarrow as pa

    from mdd.synthesize.run import write_cases
    from mdd.storage import Store

    old = pa.table({"case_id": ["S99"], "age": pa.array([30], pa.int32()), "gender": ["女"], "icd_code": ["F32.900"],
                    "diagnosis": ["抑郁状态"], "treatment": ["x"],
                    "fields": pa.array([[("主诉", "情绪低落1月")]], pa.map_(pa.string(), pa.string())),
                    "masked": pa.array([[]], pa.list_(pa.string()))})
    pq.write_table(old, tmp_path / "cases.parquet")
    cases, _ = load_cases(SAMPLES)
    write_cases(Store(str(tmp_path)), cases[:2])
    rows = {r["case_id"]: r for r in pq.read_table(tmp_path / "cases.parquet").to_pylist()}
    assert set(rows) == {"S99", "S01", "S02"} and rows["S99"]["source"] is None and rows["S01"]["source"] is None


# --- sources: never mixed silently ---------------------------------------------------------------

def _mixed_folder(tmp_path, thousand, n_synthetic=3, n_samples=2):
    folder = tmp_path / "mixed"
    folder.mkdir()
    lines = (thousand.out / "cases.jsonl").read_text(encoding="utf-8").splitlines()[:n_synthetic]
    (folder / "a_synthetic.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    samples = json.loads(SAMPLES.read_text(encoding="utf-8"))[:n_samples]
    (folder / "b_samples.json").write_text(json.dumps(samples, ensure_ascii=False), encoding="utf-8")
    return folder


def test_a_run_refuses_mixed_sources_unless_allowed_and_says_so(tmp_path, thousand):
    folder = _mixed_folder(tmp_path, thousand)
    base = [sys.executable, "-m", "jobs.run", "--config", "configs/local.yaml", "--cases", str(folder),
            "--variants", "1", "--no-progress"]
    res = subprocess.run(base + ["--out", str(tmp_path / "refused")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 2
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "synthetic 3" in errors[0] and "unstated 2" in errors[0]
    assert "--allow-mixed-sources" in errors[0] and str(folder) not in errors[0]  # the path by its label
    assert not (tmp_path / "refused" / "synth").exists()

    out = tmp_path / "allowed"
    res = subprocess.run(base + ["--out", str(out), "--allow-mixed-sources"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "mixing case sources (synthetic 3, unstated 2)" in res.stderr
    syn = json.loads((out / "run.json").read_text(encoding="utf-8"))["synthesize"]
    assert syn["counts"]["cases_by_source"] == {"synthetic": 3, "unstated": 2} and syn["mixed_sources"] is True
    assert syn["config"]["synth"]["allow_mixed_sources"] is True
    figs = syn["synthetic_cases"]["mdd5k"]
    assert figs["cases"] == 3 and set(figs["js_distance"]) == {"icd_prefix", "n_diagnoses", "age_band", "gender"}
    card = (out / "README.md").read_text(encoding="utf-8")
    section = card.split("## Case sources", 1)[1].split("\n## ", 1)[0]
    assert "| synthetic |" in section and "60.0%" in section and "| unstated |" in section and "40.0%" in section
    assert "This run mixes sources" in section and "Synthetic cases of profile `mdd5k` (3)" in section
    page = (out / "report.html").read_text(encoding="utf-8")
    panel = page.split("<section id='synthetic_cases'>", 1)[1].split("</section>", 1)[0]
    assert "JS icd_prefix" in panel and "near-duplicate share" in panel and "Not available" not in panel
    report = json.loads((out / "run.json").read_text(encoding="utf-8"))["report"]
    assert report["panels"]["synthetic_cases"] == "ok"
    assert report["headline"]["case_sources"] == {"synthetic": 0.6, "unstated": 0.4}


def test_run_figures_from_records_agree_with_the_plans(thousand):
    from mdd.cases.diversity import by_source, mixed, run_figures

    cases, _ = load_cases(thousand.out / "cases.jsonl")
    samples, _ = load_cases(SAMPLES)
    figs = run_figures(cases)["mdd5k"]
    # the run reads records only; its symptom sets (stated in the histories) match the plans' within a few
    for k in ("F32", "F41"):
        assert abs(figs["symptom_sets"][k]["distinct"] - thousand.diversity["symptom_sets"][k]["distinct"]) <= 3
    assert figs["js_distance"] == thousand.diversity["js_distance"]
    assert by_source(cases + samples) == {"synthetic": len(cases), "unstated": 27} and mixed(by_source(cases + samples))
    assert not mixed(by_source(cases)) and not mixed(by_source(samples)) and run_figures(samples) is None


def test_attention_intact_is_no_adhd_symptom_and_z71_has_its_words():
    from mdd.cases.check import _hits, _k, _lookup

    words = _lookup(_k()["symptoms"], "F90.000")
    assert _hits("注意力集中，注意力尚集中，注意力尚可", words) == (False, False)
    assert _hits("注意力不集中", words)[0] and _hits("注意力稍差", words)[0] and _hits("上课坐不住", words)[0]
    assert _lookup(_k()["symptoms"], "Z71.900")


def test_z71_cases_run_through_synthesis_evaluation_and_report(tmp_path, thousand):
    """Z71 (counselling) has no checklist entry: its cases still make whole dialogues, scored and reported."""
    lines = [l for l in (thousand.out / "cases.jsonl").read_text(encoding="utf-8").splitlines() if '"Z71' in l]
    assert len(lines) >= 3
    recs = [json.loads(l) for l in lines]
    assert all(check_case(validate_record(r, "z", 0)[0]) == [] and "出现。" not in r["现病史"] for r in recs)
    (tmp_path / "z71.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "jobs.run", "--config", "configs/local.yaml", "--cases",
                          str(tmp_path / "z71.jsonl"), "--variants", "1", "--out", str(out), "--no-progress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    df = pl.read_parquet(out / "synth" / "*.parquet")
    assert df.height == len(lines) and all(c.startswith("Z71") for c in df["icd_code"])
    assert (df["n_exchanges"] >= 5).all() and not (out / "failures.parquet").exists()
    scored = pl.read_parquet(out / "eval" / "dialogues" / "*.parquet")
    assert set(scored["dialogue_id"]) == set(df["dialogue_id"])
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["report"]["panels"]["synthetic_cases"] == "ok"


def test_synthetic_ids_are_plain_serials_to_the_privacy_masks():
    from mdd.cases.plan import id_tag
    from mdd.privacy import looks_personal_id

    tags = {id_tag(seed, "mdd5k") for seed in range(200)}
    assert len(tags) == 200 and not any(set(t) & set("aeiouymn") for t in tags)
    assert not any(looks_personal_id(f"syn{t}-000001") for t in tags)
    assert looks_personal_id("synwang-000001") and looks_personal_id("zhangwei1987")  # a name is still hashed


# --- the case writer on an engine, and the scripted writer's repair --------------------------------

class RecordEngine:
    """A test double of an engine (mdd.engines.base: ``generate(Request) -> Completion``) playing a model:
    its first record of a plan is a retired 12-year-old in a code fence under a name it made up; told the
    failed rules, it writes the plan's record; for plans in ``garbage`` it answers no JSON at all."""

    name, model = "double", "double-model"

    def __init__(self, garbage=()):
        self.requests, self.garbage = [], set(garbage)

    async def generate(self, request):
        from mdd.cases.plan import CasePlan
        from mdd.engines.base import Completion

        self.requests.append(request)
        plan = CasePlan.from_dict(request.context["plan"])
        if plan.case_id in self.garbage:
            text = "好的，病历如下：患者情绪低落……"
        else:
            rec = ScriptedCaseWriter().write(plan)
            if "age_occupation" not in request.messages[-1].content:
                rec.update({"患者": "张三", "source": "real", "年龄": 12})
                rec["个人史"]["工作、学习情况"] = "已退休。"
                rec["处理意见"] = "暂不予药物治疗。"
            text = "```json\n" + json.dumps(rec, ensure_ascii=False) + "\n```"
        return Completion(text=text, prompt_tokens=len(request.messages[-1].content), output_tokens=len(text))


def test_engine_writer_sends_the_prompt_repairs_with_the_failed_rules_and_rejects_no_json(tmp_path):
    from mdd.cases.write import EngineCaseWriter

    plans = synthesize_plans(load_profile("mdd5k"), 12, seed=6)
    engine = RecordEngine(garbage={plans[3].case_id})
    writer = EngineCaseWriter(engine, in_flight=4)
    r = synthesize_cases(12, "mdd5k", tmp_path, seed=6, writer=writer)
    assert r.written == 11 and r.repaired == 11 and r.rejected == 1
    assert r.failed_first_pass_by_rule["age_occupation"] == 11 and r.rejected_by_rule == {"writer_output": 1}
    first, second = engine.requests[:12], engine.requests[12:]
    assert len(second) == 12 and {q.op for q in engine.requests} == {"CaseWrite"}
    assert all(q.agent == "case_writer" and q.messages[0].role == "system" for q in engine.requests)
    told = [q for q in second if q.session != plans[3].case_id]
    assert all("上一稿未通过以下一致性检查" in q.messages[-1].content and "age_occupation：" in q.messages[-1].content
               for q in told)
    assert all("age_occupation" not in q.messages[-1].content for q in first)
    assert {q.context["failed"][0]["rule"] for q in told} == {"age_occupation"}
    recs = [json.loads(x) for x in (tmp_path / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [x["患者"] for x in recs] == [p.case_id for p in plans if p.case_id != plans[3].case_id]  # never 张三
    assert all(x["source"] == "synthetic" and x["profile"] == "mdd5k" for x in recs)
    rows = pq.read_table(tmp_path / "rejects.parquet").to_pylist()
    assert rows == [{"case_id": plans[3].case_id, "rule": "writer_output", "field": "(record)",
                     "reason": "no JSON object in the writer's 16 characters"}]
    summary = json.loads((tmp_path / "synthesis.json").read_text(encoding="utf-8"))
    assert summary["writer"] == "engine" and summary["writer_model"] == "double-model"
    assert summary["writer_usage"]["calls"] == 24 and summary["writer_usage"]["unparseable"] == 2


def test_engine_writer_on_the_scripted_engine_and_the_command(tmp_path):
    from mdd.cases.write import EngineCaseWriter
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    a = synthesize_cases(40, "mdd5k", tmp_path / "a", seed=4, writer=EngineCaseWriter(ScriptedEngine()))
    b = synthesize_cases(40, "mdd5k", tmp_path / "b", seed=4)
    assert a.written == 40 and (tmp_path / "a" / "cases.jsonl").read_bytes() == (tmp_path / "b" / "cases.jsonl").read_bytes()
    res = mdd("cases", "synthesize", "--n", "20", "--writer", "engine", "--config", "configs/local.yaml",
              "--out", str(tmp_path / "c"), "--seed", "4")
    assert res.returncode == 0, res.stderr
    assert "writer: engine scripted" in res.stdout
    summary = json.loads((tmp_path / "c" / "synthesis.json").read_text(encoding="utf-8"))
    assert summary["writer"] == "engine" and summary["writer_usage"]["calls"] == 20 and summary["written"] == 20
    bad = mdd("cases", "synthesize", "--n", "5", "--writer", "engine", "--config", str(tmp_path / "none.yaml"),
              "--out", str(tmp_path / "d"))
    assert bad.returncode == 2 and "--writer engine" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def _broken_plans():
    import dataclasses

    plans = synthesize_plans(load_profile("mdd5k"), 60, seed=3)
    man = next(p for p in plans if p.gender == "男")
    f32 = next(p for p in plans if p.prefixes[0] == "F32")
    f41 = next(p for p in plans if p.prefixes[0] == "F41")
    return [
        (dataclasses.replace(plans[0], age=12, work="已退休。", marital="已婚，育有一子。", drugs=["paroxetine"]),
         {"age_occupation", "age_marital", "treatment_age"}),
        (dataclasses.replace(man, menstrual="13岁初潮，周期规律。"), {"gender_specific"}),
        (dataclasses.replace(f32, days=5, duration_text="5天", worse_text="", present=["sleep"], absent=["mood_low"]),
         {"diagnosis_symptoms", "duration_criteria"}),
        (dataclasses.replace(f41, gender="女", age=30, postpartum=False, pregnant_weeks=10, drugs=[*f41.drugs, "paroxetine"]),
         {"treatment_pregnancy"}),
        (dataclasses.replace(f41, drugs=["methylphenidate"]), {"treatment_diagnosis"}),
    ]


def test_the_scripted_repair_pass_mends_what_the_rules_found():
    from mdd.cases.synth import review, write_one

    w = ScriptedCaseWriter()
    for plan, rules in _broken_plans():
        first = w.write(plan)
        _, found = review(first)
        assert {f.rule for f in found} == rules
        mended = w.write(plan, found)
        assert review(mended)[1] == []
        changed = {k for k in first if first[k] != mended[k]}
        assert changed and changed <= {"主诉", "现病史", "个人史", "处理意见", "精神检查"}  # who the patient is stays
        assert mended["患者"] == first["患者"] and mended["年龄"] == first["年龄"] and mended["ICD编码"] == first["ICD编码"]
        record, before, left = write_one(w, plan, 0)
        assert record == mended and {f.rule for f in before} == rules and left == []
    # an exam finding the history denies goes back to its normal wording
    from mdd.cases.check import Finding

    plan = synthesize_plans(load_profile("mdd5k"), 5, seed=3)[0]
    rec = w.write(plan, [Finding(plan.case_id, "mse_history", "精神检查.感知", "x")])
    assert rec["精神检查"]["感知"] in ("未引出幻觉、错觉", "未引出感知觉障碍", "未引出幻觉及感知综合障碍")


def test_the_headline_runs_guard_failures_are_gone(tmp_path, thousand):
    """The 1,000 x 5 headline run (seed 1, the README's command) lost 6 dialogues of these 5 cases to guard
    failures of the scripted patient: an answer re-asked by the echo guard said again the clause the doctor's
    follow-up had just quoted (the companion's words), and an impact answer said a clause twice that both
    the record and the story held. All 25 of their dialogues are written now."""
    ids = {"000023", "000120", "000296", "000318", "000885"}
    lines = [l for l in (thousand.out / "cases.jsonl").read_text(encoding="utf-8").splitlines()
             if json.loads(l)["患者"].rsplit("-", 1)[1] in ids]
    assert len(lines) == 5
    (tmp_path / "five.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "jobs.synthesize", "--config", "configs/local.yaml", "--cases",
                          str(tmp_path / "five.jsonl"), "--variants", "5", "--out", str(tmp_path / "run"),
                          "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert pl.read_parquet(tmp_path / "run" / "synth" / "*.parquet").height == 25
    assert not (tmp_path / "run" / "failures.parquet").exists()
