"""mdd.privacy: the pattern set, the keyed case ids, safe reject reasons and log lines."""
from __future__ import annotations

import copy
import json
import logging
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdd import privacy
from mdd.cases import load_cases, validate_record
from pii_forms import datum, embedded, leaks

from test_cases import SHARED, pa20  # noqa: F401 (the published case pa20, a fixture)


@pytest.mark.parametrize("text, kind", [
    ("13812345678", "mobile"), ("１３８１２３４５６７８", "mobile"), ("138.1234.5678", "mobile"),
    ("138 1234 5678", "mobile"), ("138-1234-5678", "mobile"), ("+86 138 1234 5678", "mobile"),
    ("0086-13812345678", "mobile"), ("8613812345678", "mobile"), ("一三八一二三四五六七八", "mobile"),
    ("1 3 8 1 2 3 4 5 6 7 8", "mobile"), ("(010)12345678", "landline"), ("（０１０）１２３４５６７８", "landline"),
    ("010-1234-5678", "landline"), ("0755 8888 8888", "landline"), ("110101199003071234", "id_card"),
    ("11010119900307123X", "id_card"), ("１１０１０１１９９００３０７１２３ｘ", "id_card"), ("110101900307123", "id_card"),
    ("6222021234567890123", "bank_card"), ("6222 0212 3456 7890", "bank_card"), ("a.b@example.com", "email"),
    ("张三@例子.中国", "email"), ("abc＠qq.com", "email"), ("QQ：123456789", "qq"), ("微信号：wxid_abc123", "wechat"),
    ("住院号：2023012345", "record_number"), ("座机 8888 8888", "phone"), ("家住解放路123号5栋2单元301室", "address"),
])
def test_each_form_is_found_and_masked(text, kind):
    masked, kinds = privacy.scrub(f"患者自诉：{text}。")
    assert kinds == [kind]
    assert masked.startswith("患者自诉：") and masked.endswith("。") and privacy.KINDS[kind] in masked
    assert not any(ch.isdigit() for ch in privacy.normalise(masked)), masked


@pytest.mark.parametrize("text", [
    "2013年起病", "血压120/80mmHg，心率88次/分", "每天1-2次，每次0.5 mg", "2019年3月起失眠，3月前加重，近2周就诊",
    "13岁初潮，其父亲65岁时去世", "舍曲林片（左洛复）50mg，眠浅易醒，当地医院就诊", "县人民医院诊断抑郁，在精神专科医院住院",
    "微信上聊聊也不错", "近3年来反复发作", "HAMD 24分，HAMA 18分", "一二年三四月份", "服用舍曲林50mg qd",
])
def test_clinical_text_is_left_alone(text):
    assert privacy.scrub(text) == (text, [])


@pytest.mark.parametrize("text, masked", [
    ("2013.10.15-2014.01.20 起病", "某年某月某日-某年某月某日 起病"),  # exact dates identify (a visit, an onset)
    ("2020-01-02 12:30就诊", "某年某月某日 12:30就诊"),
    ("出生日期：一九八七年五月十二日", "出生日期：某年某月某日"), ("生于1987年", "生于某年某月某日"),
    ("2023年3月入院", "某年某月某日入院"), ("5月12日来诊", "某年某月某日来诊"),
])
def test_identifying_dates_masked_durations_kept(text, masked):
    assert privacy.mask(text) == masked


def test_no_false_positive_on_the_published_corpus():
    """Negative control: 12k strings of MDD-5k cases, dialogues and labels hold no personal data but
    the names of two hospitals (新纪元医院, 湘雅医院: specific places the standard wants vague)."""
    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, x in v.items():
                yield k
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    files = sorted(SHARED.rglob("*.json"))
    assert len(files) >= 40
    texts = [t for f in files for t in strings(json.loads(f.read_text(encoding="utf-8")))]
    assert len(texts) > 10_000
    found = {t[h.start:h.end]: h.kind for t in texts for h in privacy.find(t)}
    # its two hospital names, and the doctor's surname in "你可以随便叫我张医生" (a name with a title: 某医生)
    assert found == {"新纪元医院": "org", "湘雅医院": "org", "张": "name"}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(embedded())
def test_property_any_form_in_any_context_is_masked(pair):
    text, d = pair
    masked, kinds = privacy.scrub(text)
    assert leaks(text, [d]) == [d]  # the scanner sees it in the input (a control for the next line)
    assert leaks(masked, [d]) == [], (text, masked)
    assert kinds


@settings(max_examples=100, deadline=None)
@given(st.lists(datum, min_size=2, max_size=5), st.sampled_from(["", " ", "，", "和", "或"]))
def test_property_several_data_side_by_side(data, sep):
    text = sep.join(d.text for d in data)
    assert leaks(privacy.mask(text), data) == [], text


def test_case_ids_serials_kept_personal_ones_hashed():
    deid = privacy.Deidentifier(b"k1")
    for plain in ("1", "S01", "pa20", "patient_12", "case-000123", "K07"):
        assert deid.case_id(plain) == (plain, False)
    for personal in ("张三", "13812345678", "zhangsan", "2023012345", "a.b@example.com", "S01 张三", "zhangwei1987",
                     "zw1987", "S1987", "case-870512", "liu_fang_03"):
        safe, hashed = deid.case_id(personal)
        assert hashed and safe.startswith("anon-") and len(safe) == 21
    assert deid.case_id("张三")[0] == privacy.Deidentifier(b"k1").case_id("张三")[0]  # stable
    assert deid.case_id("张三")[0] != privacy.Deidentifier(b"k2").case_id("张三")[0]  # keyed
    assert deid.case_id("１３８１２３４５６７８")[0] == deid.case_id("13812345678")[0]  # width-normalised
    always = privacy.Deidentifier(b"k1", "always")
    assert always.case_id("S01")[0].startswith("anon-") and privacy.looks_personal_id(always.case_id("S01")[0])


def test_key_from_env_else_one_key_file_per_output(tmp_path, monkeypatch):
    monkeypatch.delenv("MDD_PRIVACY_KEY", raising=False)
    k1, src = privacy.output_key(tmp_path / "a")
    assert src == "file" and (tmp_path / "a" / privacy.KEY_FILE).stat().st_mode & 0o077 == 0
    assert privacy.output_key(tmp_path / "a") == (k1, "file")  # a rerun into the same output: same key
    assert privacy.output_key(tmp_path / "b")[0] != k1
    monkeypatch.setenv("MDD_PRIVACY_KEY", "secret")
    assert privacy.output_key(tmp_path / "a") == (b"secret", "env")


def test_rejects_name_field_and_kind_never_the_value(pa20):
    rec = copy.deepcopy(pa20)
    rec.update({"患者": "张三13812345678", "性别": "13812345678", "年龄": "110101199003071234",
                "ICD编码": "a.b@example.com", "主诉": 13912345678})
    rec["个人史"] = {"联系13712345678": 5}
    case, problems = validate_record(rec, "家属13612345678.json", 3, privacy.Deidentifier(b"k"))
    assert case is None
    assert {p.field for p in problems} == {"性别", "年龄", "ICD编码", "主诉", "个人史.联系[手机号已隐去]"}
    text = json.dumps([p.as_row() for p in problems], ensure_ascii=False)
    assert leaks(text, [d for d in _data("13812345678", "110101199003071234", "a.b", "13912345678",
                                         "13712345678", "13612345678")]) == []
    assert all(p.case_id.startswith("anon-") for p in problems)
    gender = next(p for p in problems if p.field == "性别")
    assert "mobile" in gender.reason and "男 or 女" in gender.reason


def _data(*cores):
    from pii_forms import Datum

    return [Datum("x", c, c) for c in cores]


def test_free_text_masked_and_recorded_by_field(pa20):
    rec = copy.deepcopy(pa20)
    rec["现病史"] += " 联系电话138.1234.5678，邮箱 张三@例子.中国。"
    rec["个人史"]["住址"] = "解放路12号3单元401室，QQ：123456789"
    case, problems = validate_record(rec, "f", 0, privacy.Deidentifier(b"k"))
    assert problems == []
    assert set(case.masked) == {"现病史:mobile", "现病史:email", "个人史.住址:address", "个人史.住址:qq",
                                "现病史:org"}  # pa20's own 新纪元医院
    assert leaks(json.dumps(case.to_record(), ensure_ascii=False), _data("13812345678", "张三@", "123456789")) == []


def test_duplicate_personal_ids_are_one_case(tmp_path, pa20):
    f = tmp_path / "dup.json"
    f.write_text(json.dumps([dict(pa20, 患者="张三"), dict(pa20, 患者=" 张三 ")], ensure_ascii=False), encoding="utf-8")
    cases, rejects = load_cases(f, privacy.Deidentifier(b"k"))
    assert len(cases) == 1 and [r.field for r in rejects] == ["患者"] and "张三" not in rejects[0].reason


def test_log_filter_masks_what_a_message_echoes(caplog):
    logger = logging.getLogger("mdd.test_privacy")
    caplog.handler.addFilter(privacy.MaskingFilter())
    with caplog.at_level(logging.INFO):
        logger.info("case %s: bad value %s", "S01", "１３８-1234-5678")
    assert "[手机号已隐去]" in caplog.text and leaks(caplog.text, _data("13812345678")) == []


def test_log_filter_keeps_timings_and_decimals(caplog):
    """A vLLM pool's log dict once came out as {'start_s': [银行卡号已隐去]}: a decimal number or a
    timing is a measurement, not an identifier; an identifier beside it is still masked."""
    logger = logging.getLogger("mdd.test_privacy")
    caplog.handler.addFilter(privacy.MaskingFilter())
    info = {"index": 0, "model": "tiny", "start_s": 41.234567890123456, "pid": 4242, "t": 0.000123456789012,
            "wall": 1723456789.123456, "started_ms": 1723456789123, "elapsed_ns": 1723456789123456789}
    with caplog.at_level(logging.INFO):
        logger.info("engine pool ready: %s; contact 13812345678", info)
    text = caplog.text
    assert "已隐去" in text and "13812345678" not in text  # the mobile
    for v in ("start_s", "t", "wall", "started_ms", "elapsed_ns"):
        assert f"'{v}': {info[v]!r}" in text, v
    assert "[银行卡号已隐去]" not in text


@pytest.mark.parametrize("text,kind", [("138.12345678", "[手机号已隐去]"), ("13812345678.5", "[手机号已隐去]"),
                                       ("110101199003071234.0", "[身份证号已隐去]"),
                                       ("6222.0212.3456.7890", "[银行卡号已隐去]")])
def test_a_decimal_point_does_not_hide_an_identifier(text, kind):
    assert kind in privacy.mask(text)


def test_decimals_in_case_text_are_kept():
    for text in ("体温36.5度", "评分 12345678901234.5", "耗时 0.000123456789012 秒"):
        assert privacy.mask(text) == text
