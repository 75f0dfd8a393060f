"""Lay words: nothing a speaking agent is shown from the case reads like a record or an exam."""
import glob
from pathlib import Path

import pytest

from mdd import knowledge
from mdd.cases import load_cases
from mdd.dialogue.lay import lay
from mdd.record.speech import leak_pattern
from mdd.tree import Topic, parse_node

ROOT = Path(__file__).resolve().parents[1]
PA20 = ROOT.parent / "shared" / "mdd5k" / "cases" / "pa20.json"


@pytest.fixture(scope="module")
def cases():
    samples, _ = load_cases(ROOT / "data" / "cases")
    real, rejects = load_cases(PA20)
    assert not rejects and len(samples) == 27
    return samples + real


def _all_topics():
    """Every leaf, probe and group of every tree and module, with the file it is in."""
    out = []

    def walk(t: Topic, where: str):
        out.append((where, t))
        for c in t.children + t.probes:
            walk(c, where)

    for f in sorted(glob.glob(str(knowledge.HERE / "trees" / "*.yaml"))):
        walk(parse_node(knowledge.load_yaml(f"trees/{Path(f).name}")["root"], f), Path(f).name)
    for mod in knowledge.module_data():
        for n in mod.get("nodes") or ():
            walk(parse_node(n, mod["id"]), f"modules/{mod['id']}")
    return out


def test_every_topic_has_a_lay_phrase_free_of_clinical_terms():
    l = lay()
    missing = sorted({f"{where}: {t.id} ({t.topic})" for where, t in _all_topics()
                      if t.is_leaf and not (t.lay or t.id in l.topics)})
    assert not missing, "topics without a lay phrase (add `lay:` to the node or an entry to lay_terms.yaml):\n" + \
        "\n".join(missing)
    for phrase in list(l.topics.values()) + list(l.groups.values()) + [t.lay for _, t in _all_topics()]:
        assert not leak_pattern().search(phrase), phrase


def test_case_text_in_lay_words_holds_no_record_or_exam_term(cases):
    l = lay()
    raw_hits = lay_hits = 0
    for c in cases:
        for name in ("主诉", "现病史", "家族史", "重要或相关躯体疾病史", "个人史", "精神检查"):
            raw = c.get(name)
            raw_hits += bool(leak_pattern().search(raw))
            for who in ("我", "她"):
                text = l.text(raw, who)
                lay_hits += bool(leak_pattern().search(text))
                assert not leak_pattern().search(text), (c.case_id, name, leak_pattern().findall(text))
        assert not leak_pattern().search(l.appearance(c))
    assert raw_hits > 50 and lay_hits == 0  # the raw record is full of them: the check can fail


def test_known_translations(cases):
    l = lay()
    pa20 = next(c for c in cases if c.case_id == "1")
    present = l.text(pa20.present_illness)
    assert "被诊断为中度抑郁" in pa20.present_illness
    assert "诊断" not in present and "中度抑郁" not in present and "舍曲林" in present  # drug names stay
    assert l.text("思维迟缓，自我评价低") == "脑子转得慢，觉得自己哪儿都不好"
    assert l.text("患者否认幻听。") == "我没有听到别人听不到的声音。"
    assert l.text("患者否认幻听。", "她") == "她没有听到别人听不到的声音。"
    assert l.text("意识清晰，未引出幻觉、错觉") == ""  # normal exam findings are no patient's words
    assert l.text("情绪低落伴心慌6月，加重2周") == "心情不好，还心慌6个月，最近2周更严重了"
    assert "及格" in l.text("本学期两门课不及格")
    # an untranslatable clause is left out rather than shown
    assert "情感平淡" not in l.terms and l.text("情感平淡，心情尚可") == "心情尚可"
