import copy
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdd.cases import CaseFileError, load_cases, validate_record

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "mdd5k"
PA20 = SHARED / "cases" / "pa20.json"


@pytest.fixture(scope="module")
def pa20() -> dict:
    return json.loads(PA20.read_text(encoding="utf-8"))[0]


def test_published_case_is_valid_with_sectioned_fields(pa20):
    case, problems = validate_record(pa20, "pa20.json", 0)
    assert problems == []
    assert case.case_id == "1" and case.age == 20 and case.gender == "女"
    assert case.icd_prefix == "F32" and case.age_band == "teen"
    assert case.get("个人史.工作、学习情况") == "高一学生。"
    assert "意识清晰" in case.get("精神检查")


def test_string_sections_are_accepted(pa20):
    rec = dict(pa20, 个人史="足月顺产，高一学生。", 精神检查="意识清晰，情绪低落。")
    case, problems = validate_record(rec, "f", 0)
    assert problems == [] and case.section("个人史", "工作、学习情况") == "足月顺产，高一学生。"


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda r: r.pop("诊断结果"), "诊断结果", "missing"),
        (lambda r: r.__setitem__("年龄", "abc"), "年龄", "integer"),
        (lambda r: r.__setitem__("年龄", 130), "年龄", "1 to 120"),
        (lambda r: r.__setitem__("性别", "X"), "性别", "男 or 女"),
        (lambda r: r.__setitem__("主诉", "  "), "主诉", "empty"),
        (lambda r: r.__setitem__("现病史", 12345), "现病史", "must be text"),
        (lambda r: r.__setitem__("ICD编码", "depression"), "ICD编码", "ICD-10"),
        (lambda r: r.__setitem__("现病史", "很" * 20_001), "现病史", "oversized"),
        (lambda r: r["个人史"].__setitem__("婚恋情况", 3), "个人史.婚恋情况", "must be text"),
    ],
)
def test_each_problem_names_field_and_reason(pa20, mutate, field, words):
    rec = copy.deepcopy(pa20)
    mutate(rec)
    case, problems = validate_record(rec, "cases.json", 7)
    assert case is None
    assert [p.field for p in problems] == [field]
    assert words in problems[0].reason
    assert problems[0].position == 7 and problems[0].case_id == "1" and problems[0].source == "cases.json"


def test_icd_code_forms(pa20):
    for code in ("F32.901", "F41.200x002", "F39.x00x001", "F32.900,F41.100", "G47.000"):
        case, problems = validate_record(dict(pa20, ICD编码=code), "f", 0)
        assert problems == [], code
    assert validate_record(dict(pa20, ICD编码="F32.900,xx"), "f", 0)[0] is None


def test_personal_data_is_masked_and_recorded(pa20):
    rec = copy.deepcopy(pa20)
    rec["现病史"] += " 联系电话13812345678，邮箱 a.b@example.com，身份证110101199003071234。"
    case, problems = validate_record(rec, "f", 0)
    assert problems == []
    assert "13812345678" not in case.present_illness and "example.com" not in case.present_illness
    assert "110101199003071234" not in case.present_illness
    assert {m.split(":")[1] for m in case.masked} == {"mobile", "email", "id_card", "org"}  # org: pa20's 新纪元医院


def test_mixed_file_rejects_broken_copies_and_keeps_good(tmp_path, pa20):
    broken = []
    for mutate in (lambda r: r.pop("诊断结果"), lambda r: r.__setitem__("年龄", "abc"),
                   lambda r: r.__setitem__("性别", "X"), lambda r: r.__setitem__("主诉", ""),
                   lambda r: r.__setitem__("现病史", 42)):
        r = copy.deepcopy(pa20)
        mutate(r)
        broken.append(r)
    f = tmp_path / "mixed.json"
    f.write_text(json.dumps([broken[0], pa20, *broken[1:]], ensure_ascii=False), encoding="utf-8")
    cases, rejects = load_cases(f)
    assert [c.case_id for c in cases] == ["1"]
    assert sorted(r.field for r in rejects) == sorted(["诊断结果", "年龄", "性别", "主诉", "现病史"])
    assert sorted(r.position for r in rejects) == [0, 2, 3, 4, 5]


def test_duplicate_ids_are_rejected(tmp_path, pa20):
    f = tmp_path / "dup.jsonl"
    f.write_text("\n".join(json.dumps(pa20, ensure_ascii=False) for _ in range(2)), encoding="utf-8")
    cases, rejects = load_cases(f)
    assert len(cases) == 1 and len(rejects) == 1 and "duplicate" in rejects[0].reason


def test_parquet_and_folder_inputs(tmp_path, pa20):
    rec = dict(pa20, 个人史=json.dumps(pa20["个人史"], ensure_ascii=False), 精神检查="意识清晰")
    pq.write_table(pa.Table.from_pylist([rec]), tmp_path / "a.parquet")
    cases, rejects = load_cases(tmp_path)
    assert len(cases) == 1 and not rejects


@pytest.mark.parametrize("content, words", [("{not json", "not valid JSON"), ("[1, 2", "not valid JSON"),
                                            ('"13812345678"', "expected a JSON array"), (b"\xff\xfe[", "not UTF-8")])
def test_unparseable_file_is_a_file_level_reject(tmp_path, content, words):
    f = tmp_path / "bad.json"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    cases, rejects = load_cases(f)
    assert cases == [] and len(rejects) == 1
    r = rejects[0]
    assert (r.source, r.position, r.field, r.line) == (f.name, -1, "(file)", None) and words in r.reason
    assert "13812345678" not in r.reason


def test_missing_path_or_empty_folder_is_an_error(tmp_path):
    with pytest.raises(CaseFileError, match="no such file"):
        load_cases(tmp_path / "nope.json")
    with pytest.raises(CaseFileError, match="no case files"):
        load_cases(tmp_path)


def test_broken_jsonl_line_is_a_line_reject_and_the_good_lines_go_on(tmp_path, pa20):
    good = [dict(pa20, 患者=f"L{i}") for i in range(3)]
    lines = [json.dumps(good[0], ensure_ascii=False), '{"患者": "L9", "主诉": "电话13812345678', "",
             json.dumps(good[1], ensure_ascii=False), "[1, 2]", json.dumps(good[2], ensure_ascii=False)]
    f = tmp_path / "cases.jsonl"
    f.write_text("\n".join(lines), encoding="utf-8")
    cases, rejects = load_cases(f)
    assert [c.case_id for c in cases] == ["L0", "L1", "L2"]
    assert [(r.position, r.line, r.field) for r in rejects] == [(1, 2, "(line)"), (3, 5, "(record)")]
    assert "not valid JSON" in rejects[0].reason and "line 2" in rejects[0].reason
    assert "13812345678" not in rejects[0].reason


def test_a_bad_file_in_a_folder_is_a_file_reject_and_the_good_files_go_on(tmp_path, pa20):
    (tmp_path / "a.json").write_text(json.dumps([dict(pa20, 患者="A1")], ensure_ascii=False), encoding="utf-8")
    (tmp_path / "b.json").write_text("[{broken", encoding="utf-8")
    (tmp_path / "c.parquet").write_bytes(b"PAR1 not really parquet")
    (tmp_path / "d.jsonl").write_text(json.dumps(dict(pa20, 患者="D1"), ensure_ascii=False), encoding="utf-8")
    cases, rejects = load_cases(tmp_path)
    assert [c.case_id for c in cases] == ["A1", "D1"]
    assert [(Path(r.source).name, r.position, r.field) for r in rejects] == [("b.json", -1, "(file)"),
                                                                             ("c.parquet", -1, "(file)")]
    assert "Parquet" in rejects[1].reason


def test_sample_cases_cover_the_field():
    cases, rejects = load_cases(ROOT / "data" / "cases")
    assert rejects == []
    assert len(cases) >= 24
    assert len({c.icd_prefix for c in cases}) >= 8
    assert min(c.age for c in cases) <= 15 and max(c.age for c in cases) > 60
    assert {c.gender for c in cases} == {"男", "女"}
    assert not any(c.masked for c in cases)


def test_duplicate_id_messages_name_the_jsonl_line_the_case_and_the_field(tmp_path, pa20):
    """JSONL: every message says "line N" (the line an editor shows; blank lines count), never a position."""
    f = tmp_path / "cases.jsonl"
    f.write_text("\n" + "\n\n".join(json.dumps(pa20, ensure_ascii=False) for _ in range(3)), encoding="utf-8")
    _, rejects = load_cases(f)
    assert [(r.line, r.position, r.field, r.case_id) for r in rejects] == [(4, 1, "患者", "1"), (6, 2, "患者", "1")]
    assert rejects[0].reason == "duplicate case id 1: already used at line 2 of cases.jsonl"
    assert "position" not in rejects[1].reason
    g = tmp_path / "sample.json"  # a JSON array has no lines: positions there
    g.write_text(json.dumps([pa20, pa20], ensure_ascii=False), encoding="utf-8")
    assert load_cases(g)[1][0].reason == "duplicate case id 1: already used at position 0 of sample.json"


def test_folders_are_read_recursively_and_other_files_are_rejects(tmp_path, pa20, caplog):
    (tmp_path / "part" / "b").mkdir(parents=True)
    (tmp_path / "a.json").write_text(json.dumps([dict(pa20, 患者="A1")], ensure_ascii=False), encoding="utf-8")
    (tmp_path / "part" / "b" / "a.json").write_text(json.dumps([dict(pa20, 患者="B1")], ensure_ascii=False),
                                                    encoding="utf-8")
    (tmp_path / "张伟").mkdir()
    (tmp_path / "张伟" / "cases.jsonl").write_text(json.dumps(dict(pa20, 患者="C1"), ensure_ascii=False),
                                                   encoding="utf-8")
    (tmp_path / "part" / "notes.txt").write_text("患者张伟的电话13812345678", encoding="utf-8")
    (tmp_path / "README").write_text("x", encoding="utf-8")
    cases, rejects = load_cases(tmp_path)
    assert sorted(c.case_id for c in cases) == ["A1", "B1", "C1"]
    assert len(rejects) == 2
    by_reason = {r.reason: r for r in rejects}
    assert set(by_reason) == {"not a case file (extension '.txt'; accepted: .json, .jsonl, .parquet)",
                              "not a case file (no extension; accepted: .json, .jsonl, .parquet)"}
    assert {(r.position, r.field, r.case_id) for r in rejects} == {(-1, "(file)", None)}
    assert all("张伟" not in r.source and "notes" not in r.source and "13812345678" not in r.source for r in rejects)
    # two files named a.json in two folders keep distinct labels; a folder named after a person is hashed
    from mdd.cases import read_records
    sources = sorted({s for s, *_ in read_records(tmp_path)[0]})
    assert sources[0] == "a.json" and "part/b/a.json" in sources
    assert any(s.startswith("dir-") and s.endswith("/cases.jsonl") for s in sources)
    import logging

    from mdd.cases import log_rejects
    with caplog.at_level(logging.WARNING):
        log_rejects(rejects, logging.getLogger("t"))
    assert sum("not a case file" in m for m in caplog.messages) == 2  # one line each


def test_a_folder_of_other_files_only_names_them(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cases.csv").write_text("a,b", encoding="utf-8")
    with pytest.raises(CaseFileError, match=r"no case files .* or its subfolders \(1 other file"):
        load_cases(tmp_path)


def test_ten_thousand_identical_cases_give_a_few_log_lines_and_every_row(tmp_path, pa20, caplog):
    import logging

    from mdd.cases import log_rejects

    f = tmp_path / "records.jsonl"
    f.write_text("\n".join([json.dumps(pa20, ensure_ascii=False)] * 10_000), encoding="utf-8")
    from mdd.cases import Reject, read_records, validate_records
    records, _ = read_records(f)
    assert len(records) == 10_000
    # validating costs ~20 ms a case (the tagger): 200 real ones, and the reject rows of the other 9,800 as
    # validate_records writes them (same source, field and reason, each its own line)
    cases, rejects = validate_records(records[:200])
    assert len(cases) == 1 and len(rejects) == 199 and {r.field for r in rejects} == {"患者"}
    rejects += [Reject(r.source, i, r.case_id, r.field, rejects[0].reason, i + 1)
                for i, r in ((i, rejects[0]) for i in range(200, 10_000))]
    assert len({r.line for r in rejects}) == 9_999  # every reject keeps its row
    bad = [Reject("records.jsonl", i, None, "年龄", "missing", i + 1) for i in range(50)]
    with caplog.at_level(logging.WARNING):
        counts = log_rejects(rejects + bad, logging.getLogger("t"))
    assert len(caplog.messages) == 3 + 1 + 3 + 1  # three of each kind, then one summary line per kind
    assert caplog.messages[-2] == "... and 9996 more of kind '患者: duplicate case id ID: already used at line N of " \
                                  "records.jsonl' (see rejects.parquet)"
    assert caplog.messages[-1].startswith("... and 47 more of kind '年龄: missing'")
    assert sorted(counts.values()) == [50, 9_999]
