"""The interview a psychiatrist would sign: required items per diagnosis (checklists.yaml), the
risk assessment and its order, modules for every label, children, length and variant diversity.

The dialogues are made in-process with the scripted engine (no Ray), on the sample cases with
the main job's seed and variants, so the figures are the main job's."""
import asyncio
import random
import re
import statistics
from pathlib import Path

import pytest

from mdd import checklist, knowledge
from mdd.synthesize import interview
from mdd.cases import load_cases, validate_record
from mdd.config import DialogueConfig, InterviewConfig, load_config
from mdd.dialogue import ops
from mdd.dialogue.agenda import TopicAgenda
from mdd.dialogue.loop import run_dialogue
from mdd.dialogue.dryrun.engine import ScriptedEngine
from mdd.evaluate.rule_set import checklist_item, load_rules
from mdd.evaluate.rules import evaluate_rules
from mdd.tree import all_topics, attached_modules, build_tree, parse_node

ROOT = Path(__file__).resolve().parents[1]
MDD5K_README = ROOT.parent / "shared" / "mdd5k" / "README.md"
MAIN = load_config(ROOT / "configs" / "local.yaml")
RISK_ORDER = ["self_harm", "si_plan", "si_past_attempt", "si_means", "harm_others", "protective_factors"]
CHILD = {
    "患者": "C01", "年龄": 9, "性别": "男", "ICD编码": "F90.000", "诊断结果": "注意缺陷多动障碍",
    "主诉": "上课坐不住、注意力不集中2年，成绩下降半年",
    "现病史": "患儿自一年级起上课坐不住，小动作多，老师多次反映其上课讲话。写作业拖拉，需家长反复催促，丢三落四。"
              "做事冲动，排队时插队。半年前升入三年级后成绩明显下降。否认情绪低落，否认抽动。此次由母亲陪同来诊。",
    "家族史": "父亲小时候也好动，未诊治。",
    "个人史": {"孕产情况": "足月顺产。", "发育情况": "1岁会走路，1岁半会说话。", "工作、学习情况": "小学三年级。"},
    "精神检查": {"注意": "注意力不集中，易分心", "意志、行为": "活动多，坐不住", "自知力": "无"},
    "处理意见": "哌甲酯缓释片18mg 每日一次；家长行为训练。",
}


@pytest.fixture(scope="module")
def samples():
    cases, rejects = load_cases(ROOT / "data" / "cases")
    assert len(cases) == 27 and not rejects
    return cases


def run(case, variant, cfg=MAIN.synth.dialogue, seed=MAIN.synth.seed, engine=None):
    persona = ops.choose_persona(ops.all_personas(), seed, case.case_id, variant)
    triple = ops.sample_triples(case, seed, variant + 1)[variant]
    return asyncio.run(run_dialogue(case, variant, seed, engine or ScriptedEngine(), cfg, persona, triple))[0]


@pytest.fixture(scope="module")
def main_rows(samples):
    """The main job's dialogues (27 cases x 5 variants, its seed and config)."""
    return [run(c, v) for c in samples for v in range(MAIN.synth.variants)]


def mdd5k_prefixes() -> list[str]:
    """The label prefixes ../shared/mdd5k/README.md lists for the released corpus."""
    text = MDD5K_README.read_text(encoding="utf-8")
    start = text.index("Label prefixes")
    found = re.findall(r"\b([A-Z]\d{2})\b", text[start:text.index("\n\n", start)])
    assert len(found) >= 15, found
    return sorted(set(found))


# --- the checklist and the knowledge it points at -------------------------------------------


def test_every_label_prefix_is_served_by_a_module_or_a_decision(samples):
    cl = checklist.load()
    prefixes = set(mdd5k_prefixes()) | {p for c in samples for p in checklist.icd_prefixes(c.icd_code)}
    assert {"F32", "F41", "F98", "G47", "F45", "F51", "F90", "F93", "F23"} <= prefixes
    for p in sorted(prefixes):
        d = cl.diagnoses.get(p)
        assert d is not None, f"{p}: no checklist entry"
        assert d.modules or len(d.decision) > 40, f"{p}: neither a module nor a documented decision"
        assert d.items, p


def test_every_sample_case_attaches_a_module_or_is_listed_as_general(samples):
    by_case = interview.modules_by_case(samples)
    diagnoses = checklist.load().diagnoses
    for c in samples:
        d = diagnoses[c.icd_prefix]
        assert by_case[c.case_id] or d.decision, c.case_id
        always = {m["id"] for m in knowledge.module_data() if m.get("always")}
        assert set(d.modules) - always <= set(by_case[c.case_id]), (c.case_id, d.modules, by_case[c.case_id])


def _known_topics() -> dict[str, list]:
    """Every topic of every tree and module, by id."""
    out: dict[str, list] = {}
    for path in sorted((knowledge.HERE / "trees").glob("*.yaml")):
        for t in all_topics(parse_node(knowledge.load_yaml(f"trees/{path.name}")["root"], path.stem)):
            out.setdefault(t.id, []).append(t)
    for mod in knowledge.module_data():
        for n in mod["nodes"]:
            for t in all_topics(parse_node(n, mod["id"])):
                out.setdefault(t.id, []).append(t)
    return out


def test_items_name_real_topics_whose_question_the_judge_recognises():
    """The judge's keywords are in every topic that asks an item, in its label (what a fast
    persona says) and in its question: the same list drives asking and checking."""
    topics = _known_topics()
    for item in checklist.load().items.values():
        assert any(t in topics for t in item.topics), f"{item.id}: none of {item.topics} is a topic"
        for tid in item.topics:
            for t in topics.get(tid, []):
                assert item.asked_in(t.topic), f"{item.id}: label {t.topic!r} lacks {item.check_words()}"
                assert item.asked_in(t.ask), f"{item.id}: question {t.ask!r} lacks {item.check_words()}"


def test_required_items_resolve_in_every_tree_band():
    """Every listed diagnosis, for a case of every gender x age band its items make sense for,
    finds a topic for each required item."""
    base = {"患者": "X", "诊断结果": "x", "主诉": "情绪低落", "现病史": "情绪低落半年。", "处理意见": "随访",
            "个人史": {"孕产情况": "足月顺产。", "发育情况": "正常。"}}
    for prefix, d in checklist.load().diagnoses.items():
        ages = (9, 15) if d.cls == "child" else (15, 35, 70)
        for age in ages:
            for gender in ("男", "女"):
                case, rejects = validate_record({**base, "年龄": age, "性别": gender, "ICD编码": f"{prefix}.000"}, "t", 0)
                assert not rejects
                agenda = TopicAgenda.for_case(case, random.Random(0))
                assert not agenda.missing, (prefix, age, gender, agenda.missing)


def test_checklist_errors_name_the_entry():
    bad = {"items": {"a": {"label": "x", "topics": ["sleep"], "check": {"any": ["睡"]}}},
           "classes": {"mood": {}}, "diagnoses": {"F32": {"class": "mood", "items": ["a"]}}}
    with pytest.raises(knowledge.KnowledgeError, match=r"diagnoses.F32.*decision"):
        checklist.parse(bad)
    bad["diagnoses"]["F32"] = {"class": "mood", "modules": ["depression"], "items": ["b"]}
    with pytest.raises(knowledge.KnowledgeError, match=r"diagnoses.F32.items.*'b'"):
        checklist.parse(bad)


# --- asking: the agenda ---------------------------------------------------------------------


def test_required_topics_survive_dupdetect_and_a_tight_cap(samples):
    case = next(c for c in samples if c.icd_prefix == "F32")
    agenda = TopicAgenda.for_case(case, random.Random(1), cap=10**6)
    required = [t.id for t in agenda.pending if agenda.is_required(t)]
    gone = agenda.remove([t.id for t in agenda.pending])
    assert [t.id for t in agenda.pending] == required and all(not agenda.is_required(t) for t in gone)
    # a cap that leaves room for the required topics only: every optional topic is skipped
    cap = 1 + len(required)
    agenda = TopicAgenda.for_case(case, random.Random(1), cap=cap)
    asked, ex = [], 1
    while not agenda.finished(ex) and (t := agenda.next(ex)) is not None:
        asked.append(t.id)
        ex += 1
    assert ex <= cap and set(agenda.items_asked(asked)) == set(agenda.required_items)


def test_risk_probes_are_promoted_in_safe_order_for_mood_psychotic_trauma(samples):
    for case in samples:
        agenda = TopicAgenda.for_case(case, random.Random(3))
        ids = [t.id for t in agenda.pending]
        cls = checklist.load().diagnoses[case.icd_prefix].cls
        if cls in ("mood", "psychotic", "trauma"):
            pos = [ids.index(t) for t in RISK_ORDER]
            assert pos == sorted(pos) and pos[-1] - pos[0] == len(RISK_ORDER) - 1, (case.case_id, ids)
            assert "substance_use" in ids
        else:
            assert "self_harm" in ids and "si_plan" not in ids  # ideation always; the rest when it is affirmed


def test_child_tree_graph_and_companion_questions():
    case, rejects = validate_record(CHILD, "t", 0)
    assert not rejects and case.age_band == "child"
    triples = ops.sample_triples(case, 1, 5)
    graph = knowledge.graph_data(case.gender, "child")
    assert all(t[2] in str(graph["events"]) for t in triples)
    tree = build_tree(case, checklist.plan_for(case.icd_code, case.age).modules)
    topics = {t.id: t for t in all_topics(tree)}
    assert topics["dev_history"].audience == "companion" and topics["school_function"].audience == "companion"
    assert "substance_use" not in topics  # children are not asked about alcohol and drugs
    assert [m["id"] for m in attached_modules(case) if not m.get("always")] == ["childhood"]
    rows = [run(case, v) for v in range(3)]
    for r in rows:
        assert set(r["required_items"]) >= {"development", "school_report", "attention_hyperactivity", "adhd_onset"}
        assert set(r["items_asked"]) == set(r["required_items"]), r["dialogue_id"]


# --- the main job's dialogues -----------------------------------------------------------------


def test_main_job_asks_every_required_item_and_the_risk_assessment(samples, main_rows):
    classes = {c.case_id: checklist.load().diagnoses[c.icd_prefix].cls for c in samples}
    bundles = checklist.load().bundles
    for r in main_rows:
        assert r["required_items"] and set(r["items_asked"]) == set(r["required_items"]), r["dialogue_id"]
        if classes[r["case_id"]] in ("mood", "psychotic", "trauma"):
            assert set(bundles["risk"]) | set(bundles["substance"]) <= set(r["items_asked"]), r["dialogue_id"]
            ids = r["topic_ids"]
            pos = [ids.index(t) for t in RISK_ORDER]
            assert pos == sorted(pos), (r["dialogue_id"], ids)
    # the rule judge, reading the doctor's words only, agrees: every applicable checklist rule passes
    rows = evaluate_rules(main_rows, load_rules("psychiatric"))
    judged = [x for x in rows if checklist_item(x["rule"]) and x["triggered"]]
    assert len(judged) == sum(len(r["required_items"]) for r in main_rows)
    assert all(x["score"] == 1.0 for x in judged)
    order = [x for x in rows if "risk_ideation_before" in x["rule"] and x["triggered"]]
    assert len(order) >= 2 * 50 and all(x["score"] == 1.0 for x in order)


def test_main_job_length_and_variant_diversity(main_rows):
    s = interview.summarize(main_rows)
    assert abs(s["exchanges"]["mean"] - 23.4) <= 0.15 * 23.4, s["exchanges"]
    assert 12 <= s["exchanges"]["min"] and s["exchanges"]["max"] <= 40
    tau = s["variant_kendall_tau"]
    assert len(tau["per_case"]) == 27 and tau["mean"] <= 0.8 and tau["max"] <= 0.8, tau
    # variants also differ in depth (length) and in which optional topics they reach
    by_case: dict[str, list] = {}
    for r in main_rows:
        by_case.setdefault(r["case_id"], []).append(r)
    lengths = [len({r["n_exchanges"] for r in rs}) for rs in by_case.values()]
    topic_sets = [len({frozenset(r["topic_ids"]) for r in rs}) for rs in by_case.values()]
    assert min(lengths) >= 2 and statistics.fmean(lengths) >= 3.5, lengths
    assert min(topic_sets) >= 2 and statistics.fmean(topic_sets) >= 4, topic_sets
    assert s["required_items"]["dialogues_missing_some"] == 0 and not s["required_items"]["missing_cells"]


def test_negative_controls_checklist_off_and_questions_removed(samples):
    """Without the checklist the judge finds items unasked; a dialogue whose risk questions are
    dropped, or that asks the plan before the ideation, fails the rules."""
    off = DialogueConfig(interview=InterviewConfig(checklist=False))
    cases = [c for c in samples if c.icd_prefix in ("F32", "F43", "F20")][:4]
    rows = [run(c, v, cfg=off) for c in cases for v in range(2)]
    assert all(r["required_items"] == [] for r in rows)  # nothing planned ...
    judged = [x for x in evaluate_rules(rows, load_rules("psychiatric")) if checklist_item(x["rule"]) and x["triggered"]]
    assert sum(x["score"] == 0.0 for x in judged) >= len(rows) * 5  # ... and the judge sees the holes

    row = run(cases[0], 0)
    risk_topics = {"自杀计划与准备", "危险物品与药物的获取", "支撑与保护因素"}
    cut = [t for i, t in enumerate(row["turns"]) if t["topic"] not in risk_topics]
    verdicts = {x["rule"].rsplit(":", 1)[-1]: x["score"]
                for x in evaluate_rules([{**row, "turns": cut}], load_rules("psychiatric"))}
    assert verdicts["required_risk_plan"] == 0.0 and verdicts["required_risk_means"] == 0.0
    assert verdicts["required_risk_protective"] == 0.0 and verdicts["required_risk_ideation"] == 1.0

    turns = row["turns"]
    plan = next(i for i, t in enumerate(turns) if t["topic"] == "自杀计划与准备")
    ideation = next(i for i, t in enumerate(turns) if t["topic"] == "自伤、自杀想法或行为")
    swapped = list(turns)
    swapped[ideation:ideation + 2], swapped[plan:plan + 2] = turns[plan:plan + 2], turns[ideation:ideation + 2]
    verdicts = {x["rule"].rsplit(":", 1)[-1]: x["score"]
                for x in evaluate_rules([{**row, "turns": swapped}], load_rules("psychiatric"))}
    assert verdicts["risk_ideation_before_plan"] == 0.0


def test_kendall_tau_known_answers():
    assert interview.kendall_tau(list("abcd"), list("abcd")) == 1.0
    assert interview.kendall_tau(list("abcd"), list("dcba")) == -1.0
    assert interview.kendall_tau(list("abcx"), list("bacy")) == pytest.approx(1 / 3)
    assert interview.kendall_tau(["a"], ["a"]) is None
    rows = [{"case_id": "A", "topic_ids": ["a", "b", "c", "exp_1"]}, {"case_id": "A", "topic_ids": ["exp_1", "a", "b", "c"]}]
    assert interview.variant_tau(rows) == {"A": 1.0}  # experience points are not compared


def test_coverage_matrix_counts_required_and_asked():
    rows = [{"icd_code": "F32.900,F41.100", "required_items": ["a", "b"], "items_asked": ["a"]},
            {"icd_code": "F32.100", "required_items": ["a"], "items_asked": ["a"]},
            {"icd_code": "F41.000", "required_items": None, "items_asked": None}]
    m = checklist.coverage_matrix(rows)
    assert m == {"F32": {"a": {"asked": 2, "of": 2}, "b": {"asked": 0, "of": 1}}}
    assert checklist.missing_cells(m) == ["F32:b 0/1"]


def test_age_band_child_and_plan_by_age():
    assert [knowledge.tree_name("男", b) for b in ("child",)] == ["male_child"]
    plan = checklist.plan_for("F32.900", 15)
    assert "parents_aware" in plan.items and "parents_aware" not in checklist.plan_for("F32.900", 30).items
    assert checklist.plan_for("F32.900,F41.100").prefixes == ("F32", "F41")
    assert checklist.plan_for("Z99.000").unlisted == ("Z99",)


def test_promoted_probe_stays_behind_its_parent(samples):
    """A required probe inside a randomly ordered group is asked right after its parent."""
    case = next(c for c in samples if c.icd_prefix == "F32" and c.age_band == "adult")
    for seed in range(10):
        ids = [t.id for t in TopicAgenda.for_case(case, random.Random(seed)).pending]
        assert ids.index("low_mood_course") == ids.index("low_mood") + 1
