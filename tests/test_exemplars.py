"""Exemplar retrieval: the choice rules on a hand-made index, the two-round main job, the prompt layout
for the prefix cache, and the with/without comparison."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdd.config import ExemplarConfig, load_config
from mdd.dialogue.exemplars import ExemplarError, ExemplarRetriever, resolve_index

ROOT = Path(__file__).resolve().parents[1]

PAIRS = [  # (case_id, topic, question, answer)
    ("A", "睡眠", "最近晚上入睡要多久？一周有几天睡不好？", "要一两个小时才能睡着，一周有四五天。"),
    ("A", "睡眠", "早上会不会比平时醒得早？", "天没亮就醒了，醒了就睡不着。"),
    ("B", "睡眠", "睡不好这种情况持续多久了？", "差不多三个月了。"),
    ("B", "睡眠", "夜里会醒几次？", "两三次吧。"),
    ("C", "睡眠", "最近晚上入睡要多久？一周有几天睡不好？", "半个小时左右，偶尔睡不好。"),
    ("D", "食欲", "最近胃口怎么样？体重有没有变化？", "吃不下，瘦了五斤。"),
    ("E", "自伤", "有没有想过伤害自己？", "有过这种念头，但没做过。"),
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    from mdd.index import build_index

    out = tmp_path_factory.mktemp("exemplar-index")
    rows = pa.Table.from_pylist([{"dialogue_id": f"{c}-v0", "case_id": c, "turn": i, "topic": t, "question": q,
                                  "answer": a, "overall": 0.8} for i, (c, t, q, a) in enumerate(PAIRS)])
    build_index(out, rows, embedder_name="hashing")
    return out


def test_never_the_same_case_same_topic_first_one_per_case(index_dir):
    r = ExemplarRetriever(ExemplarConfig(index=str(index_dir), k=3))
    picked = r.pick("A", "睡眠", "入睡时间和频率", "晚上睡不着")
    sidecar = {row["id"]: row for row in pq.read_table(index_dir / "index" / "qa.parquet").to_pylist()}
    assert len(picked) == 3 and {e.case_id for e in picked[:2]} == {"B", "C"} and picked[2].case_id in ("D", "E")
    assert [e.topic for e in picked][:2] == ["睡眠", "睡眠"]  # the other cases' sleep pairs before any other topic
    assert len({e.case_id for e in picked}) == len(picked)  # per_case = 1
    for e in picked:
        assert sidecar[e.id]["question"] == e.question and sidecar[e.id]["case_id"] == e.case_id
    assert r.pick("A", "睡眠", "入睡时间和频率", "晚上睡不着") == picked  # deterministic
    # per_case 2 lets a case give two pairs; a repeated question is still shown once
    r2 = ExemplarRetriever(ExemplarConfig(index=str(index_dir), k=3, per_case=2))
    p2 = r2.pick("A", "睡眠", "入睡时间和频率", "")
    assert [e.case_id for e in p2].count("B") == 2 and len({e.question for e in p2}) == len(p2)
    # another case gets the sleep pairs of the others; k and min_score bound the list
    assert [e.case_id for e in ExemplarRetriever(ExemplarConfig(index=str(index_dir), k=1)).pick("B", "睡眠")] in (["A"], ["C"])
    assert ExemplarRetriever(ExemplarConfig(index=str(index_dir), min_score=0.999)).pick("A", "食欲") == []


def test_a_pair_said_in_several_cases_is_never_shown_to_any_of_them(tmp_path):
    """The index stores an exact duplicate once; the case that said it second must not get it back."""
    from mdd.index import build_index

    pairs = [("G", "睡眠", "睡不好这种情况持续多久了？", "差不多三个月了。"),
             ("A", "睡眠", "睡不好这种情况持续多久了？", "差不多三个月了。"),  # the same pair, from case A
             ("H", "睡眠", "夜里会醒几次？", "两三次吧。")]
    rows = pa.Table.from_pylist([{"dialogue_id": f"{c}-v0", "case_id": c, "turn": i, "topic": t, "question": q,
                                  "answer": a, "overall": 0.8} for i, (c, t, q, a) in enumerate(pairs)])
    build_index(tmp_path, rows, embedder_name="hashing")
    sidecar = pq.read_table(tmp_path / "index" / "qa.parquet").to_pylist()
    merged = [r for r in sidecar if r["count"] == 2]
    assert len(sidecar) == 2 and len(merged) == 1 and merged[0]["case_ids"] == ["A", "G"]
    r = ExemplarRetriever(ExemplarConfig(index=str(tmp_path), k=3))
    assert [e.case_id for e in r.pick("A", "睡眠", "病程")] == ["H"]
    assert [e.case_id for e in r.pick("G", "睡眠", "病程")] == ["H"]
    assert len(r.pick("B", "睡眠", "病程")) == 2  # any other case gets both


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(ExemplarError, match=r"synth\.dialogue\.exemplars\.index: .*qa\.faiss not found"):
        resolve_index(ExemplarConfig(index=str(tmp_path)))
    from jobs.synthesize import main as synth_main

    assert synth_main(["--out", str(tmp_path / "o"), "--exemplars", str(tmp_path), "--limit", "1",
                       "--variants", "1", "--no-progress"]) == 2


def test_two_rounds_round_two_cites_round_one_never_its_own_case(main_run):
    """`mdd run --rounds 2`: round one's dialogues see no exemplars and its evaluation writes an index;
    round two's doctor turns cite ids of that index, never from their own case."""
    r1 = main_run / "rounds" / "1"
    first = pq.read_table(r1 / "synth").to_pylist()
    assert all(not t.get("exemplars") for d in first for t in d["turns"]) and {d["exemplar_index"] for d in first} == {None}
    sidecar = {row["id"]: row for row in pq.read_table(r1 / "index" / "qa.parquet").to_pylist()}
    assert sidecar
    second = pq.read_table(main_run / "synth").to_pylist()
    assert {d["exemplar_index"] for d in second} == {str(r1)}
    cited = firsts = 0
    for d in second:
        for i, t in enumerate(d["turns"]):
            ids = t.get("exemplars") or []
            if ids:
                assert t["speaker"] == "doctor" and 1 <= len(ids) <= 2
                assert all(sidecar[x]["case_id"] != d["case_id"] for x in ids)
                assert all(i2 in sidecar for i2 in ids)
                cited += 1
            if t["speaker"] == "doctor" and i > 0 and t["topic"] != d["turns"][i - 2]["topic"] and t["topic"] != "诊断结果":
                firsts += 1  # a topic's first question
    assert cited >= 0.9 * firsts > 0
    # the scripted doctor asks the way the shown same-topic exemplar asked
    copied = sum(1 for d in second for t in d["turns"] if t.get("exemplars") and any(
        sidecar[x]["topic"] == t["topic"] and sidecar[x]["question"].split("。")[-1] in t["text"] for x in t["exemplars"]))
    assert copied > 0
    assert (main_run / "report.html").is_file() and (main_run / "README.md").is_file()


def _flat(messages) -> str:
    return "".join(f"<{m.role}>{m.content}" for m in messages)


@pytest.mark.parametrize("keep", [True, False])
def test_doctor_prompts_extend_each_other_with_exemplars_in_the_history(index_dir, keep):
    """With the exemplars kept in the doctor's history every doctor prompt begins with the previous one
    (the prefix cache reuses it whole); dropping them after their turn breaks that (negative control)."""
    import asyncio

    from mdd.cases import load_cases
    from mdd.dialogue import ops
    from mdd.dialogue.loop import run_dialogue
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    class Recording(ScriptedEngine):
        def __init__(self):
            super().__init__()
            self.requests = []

        async def generate(self, request):
            c = await super().generate(request)
            self.requests.append((request, c.text))
            return c

    cfg = load_config(ROOT / "configs" / "local.yaml").synth.dialogue
    cfg = cfg.model_copy(update={"exemplars": ExemplarConfig(index=str(index_dir), keep_in_history=keep)})
    cases, _ = load_cases(ROOT / "data" / "cases")
    case = cases[0]
    engine = Recording()
    persona = ops.choose_persona(ops.all_personas(), 1, case.case_id, 0)
    triple = ops.sample_triples(case, 1, 1)[0]
    row, _ = asyncio.run(run_dialogue(case, 0, 1, engine, cfg, persona, triple, ExemplarRetriever(cfg.exemplars)))
    doc = [(r, text) for r, text in engine.requests if r.op == "DocGen"]
    with_ex = [k for k, (r, _) in enumerate(doc) if "参考：其他问诊中" in r.messages[-1].content]
    assert with_ex and sum(1 for t in row["turns"] if t.get("exemplars")) == len(with_ex)
    breaks = [k for k in range(1, len(doc)) if not _flat(doc[k][0].messages).startswith(
        _flat(doc[k - 1][0].messages) + f"<assistant>{doc[k - 1][1]}")]
    if keep:
        assert breaks == []
    else:
        assert breaks and set(breaks) <= {k + 1 for k in with_ex}


def test_comparison_reports_with_and_without(ray_session, tmp_path):
    from mdd.dialogue.dryrun.engine import ScriptedEngine
    from mdd.perf.exemplars import exemplar_comparison

    cfg = load_config(ROOT / "configs" / "local.yaml", {"synth.num_workers": 1})
    res = exemplar_comparison(cfg, ScriptedEngine(), str(tmp_path), limit=2, variants=1)
    ph = res["phases"]
    assert set(ph) == {"without", "with", "with_dropped"}
    assert ph["without"]["exemplars_shown"] == 0 and ph["with"]["doctor_turns_with_exemplars"] > 0
    assert ph["with"]["dialogues"] == ph["without"]["dialogues"] == 2
    for name in ("with", "with_dropped"):
        c = res["compared"][name]
        assert c["doctor_quality_minus_without"] == pytest.approx(ph[name]["doctor_quality"] - ph["without"]["doctor_quality"], abs=1e-3)
        assert "rule_pass_rate_minus_without" in c and "prompt_tokens_vs_without" in c
    json.dumps(res)  # the benchmark writes it as JSON
