"""The scripted dry run reads coherently: over the README main job's dialogues (the session's
``sample_run``: 27 sample cases x 5 variants, scripted engine) no turn has an unbalanced quotation mark
or bracket, no denial ends on a complaint, no speaker flatly denies a topic it affirmed earlier, and a
follow-up on how long or how often is answered with a time. Each detector is first shown to catch the
defects it was written for (phrases of the dry run before it was fixed)."""
import re
from collections import defaultdict

from mdd.dialogue.lay import clip, lay, split_clauses
from mdd.evaluate.gates import gate_spec
from mdd.dialogue.dryrun.speech import negated

PAIRS = ("“”", "‘’", "（）", "()", "「」", "《》", "【】", "[]")
_CLAUSE = re.compile(r"[，,。；;！!？?…\n]+")
_LEADS = r"(?:说实话|其实吧?|嗯|哎|这个|倒|真|应该|好像|我想想|反正|[，,…])*"
# 没力气, 没胃口 … say a symptom, not a denial
_SYMPTOM = r"(?!力气|精神|胃口|意思|兴趣|劲|用|盼头|心思)"
_DENIAL = re.compile(f"^{_LEADS}(?:没有|没|不会|不是|从来没有|从没){_SYMPTOM}")
_NEGATION = re.compile(f"(?:没有|没|未|不会|不是|从不|无){_SYMPTOM}")
_DISTRESS = re.compile(r"难受|痛苦|害怕|绝望|哭|崩溃|委屈|无助|困扰|着急|不知道该怎么办|没用|不对劲|撑不下去|控制不住")
# what a flat denial says besides no: nothing that names what it denies
_GENERIC = re.compile(r"说实话|其实|这个|倒|应该|好像|平时|没怎么|感觉到|注意到|这种情况|这方面|还好|吧|我|也|说不好|"
                      r"记不太清了|真|问这个干什么|哪有|的|了|过|是|没有|没|不会|不是|啊|嗯|呢|有|什么|[^\u4e00-\u9fff]")


_LEAD_ONLY = re.compile(r"^(?:说实话|其实吧?|嗯+|哎|这个嘛|怎么说呢|我跟您说啊|说起这个|我想想|是的)$")


def _clauses(text: str) -> list[str]:
    """The clauses of a turn, lead-ins that say nothing (说实话，嗯，…) left out."""
    return [c for c in _CLAUSE.split(text or "") if c.strip() and not _LEAD_ONLY.match(c.strip())]


def unbalanced(text: str) -> bool:
    for a, b in PAIRS:
        depth = 0
        for ch in text:
            depth += (ch == a) - (ch == b)
            if depth < 0:
                return True
        if depth:
            return True
    return text.count('"') % 2 == 1


def denial_with_tail(text: str) -> bool:
    """A turn that says no (every clause a denial) and then complains (a clause with no negation
    that voices distress): 没有特别兴奋…，这让我挺困扰的."""
    cs = _clauses(text)
    tails = [c for c in cs if _DISTRESS.search(c) and not _NEGATION.search(c)]
    rest = [c for c in cs if c not in tails]
    return bool(cs) and bool(tails) and bool(rest) and _DENIAL.search(cs[0]) is not None and \
        all(_DENIAL.search(c) or _NEGATION.search(c) for c in rest)


def says_no(text: str) -> bool:
    cs = [c for c in _clauses(text) if not (_DISTRESS.search(c) and not _NEGATION.search(c))]
    return bool(cs) and all(_DENIAL.search(c) for c in cs)


def flat_denial(text: str) -> bool:
    cs = _clauses(text)
    return bool(cs) and _DENIAL.search(cs[0]) is not None and len(_GENERIC.sub("", text)) < 3


def problems(rows) -> dict[str, list]:
    spec = gate_spec()
    bad = defaultdict(list)
    for r in rows:
        turns, affirmed, last_topic = r["turns"], defaultdict(set), None
        for i, t in enumerate(turns):
            who, text, topic = t["speaker"], t["text"], t["topic"]
            if not text.strip():
                bad["empty"].append((r["dialogue_id"], i))
            if unbalanced(text):
                bad["unbalanced"].append((r["dialogue_id"], text))
            if who == "doctor":
                followup = topic == last_topic
                if followup and spec.duration_question.search(text) and i + 1 < len(turns) \
                        and not spec.time_answer.search(turns[i + 1]["text"]):
                    bad["followup_without_time"].append((r["dialogue_id"], text, turns[i + 1]["text"]))
                last_topic = topic
                continue
            if denial_with_tail(text):
                bad["denial_with_tail"].append((r["dialogue_id"], text))
            if flat_denial(text) and topic in affirmed[who]:
                bad["self_contradiction"].append((r["dialogue_id"], who, topic, text))
            if not says_no(text):
                affirmed[who].add(topic)
    return dict(bad)


def test_the_detectors_catch_the_old_dry_runs_defects():
    assert unbalanced("是的，有时觉得“拖累了老，我自己也挺着急的…") and unbalanced("（国外定居")
    assert not unbalanced("担心自己“得了老年痴呆”，育有一女（国外定居）")
    assert denial_with_tail("说实话，没有特别兴奋、话特别多、听到别人听不到的声音和被害感，这让我挺困扰的")
    assert denial_with_tail("没有，主要是身体难受。")
    assert not denial_with_tail("没有具体计划，有不想活的念头，这让我挺困扰的")
    assert not denial_with_tail("没有，最近生活里没有发生让我难受的事。")
    assert not denial_with_tail("嗯……没力气、食欲差……我真的不知道该怎么办了。")
    assert flat_denial("这个应该没有，平时没怎么感觉到。") and flat_denial("没有！")
    assert not flat_denial("没有具体计划和准备。")
    old = {"dialogue_id": "x", "turns": [
        {"speaker": "doctor", "text": "以前喜欢做的事情现在还有没有兴趣？", "topic": "兴趣"},
        {"speaker": "patient", "text": "是的，以前喜欢的书法、合唱团活动都停了。", "topic": "兴趣"},
        {"speaker": "companion", "text": "我插一句，有时觉得“拖累了老。", "topic": "兴趣"},
        {"speaker": "doctor", "text": "你女儿讲的对吗？", "topic": "兴趣"},
        {"speaker": "patient", "text": "这个应该没有，平时没怎么感觉到。", "topic": "兴趣"},
        {"speaker": "doctor", "text": "这种情况大概多久出现一次？每次持续多长时间？", "topic": "兴趣"},
        {"speaker": "patient", "text": "这个倒没有，我没注意到有这种情况。", "topic": "兴趣"},
    ]}
    assert set(problems([old])) == {"unbalanced", "self_contradiction", "followup_without_time"}


def test_record_phrases_are_cut_at_clause_boundaries():
    l = lay()
    assert l.text("与老伴同住，夫妻关系好") == "与老伴同住，夫妻关系好"  # 伴 of 老伴 is not "with"
    assert l.text("有时觉得“拖累了老伴，不如早点走”，否认具体计划") == "有时觉得“拖累了老伴，不如早点走”，没有具体计划"
    assert [c for c, _ in split_clauses("觉得“拖累了老伴，不如早点走”，没有计划")] == ["觉得“拖累了老伴，不如早点走”", "没有计划"]
    assert clip("常独自发呆、叹气，觉得生活没有意义，以前喜欢的书法都停了", 20) == "常独自发呆、叹气，觉得生活没有意义"
    assert negated("有没有听到别人听不到的声音，或者觉得有人要害你") == "没有听到别人听不到的声音"
    assert negated("那种突然的难受多久来一次、会不会一直担心它再来") == "不会一直担心它再来"


def test_main_job_dry_run_is_coherent(sample_run):
    """README: the main job's dry-run dialogues have no clipped quotes or brackets, no denial with a
    distress tail, no speaker going back on what it affirmed, and time answers to follow-ups on how
    long or how often."""
    rows = sample_run["rows"]
    asked = sum(1 for r in rows for i, t in enumerate(r["turns"])
                if t["speaker"] == "doctor" and i > 2 and t["topic"] == next(
                    x["topic"] for x in reversed(r["turns"][:i]) if x["speaker"] == "doctor")
                and gate_spec().duration_question.search(t["text"]))
    assert asked >= 30, asked  # the check has follow-ups to look at
    bad = problems(rows)
    assert not bad, {k: v[:5] for k, v in bad.items()}
