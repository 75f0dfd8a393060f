"""Fictitious experiences whose parts fit: (time, people, event) triples from the case's knowledge
graph that fit each other, the patient's age, gender and situation, and the illness timeline
(``mdd/knowledge/experience_fit.yaml`` says how)."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.cases import Case

SELF = "我自己"
_PARTNER_SINGLE = ("男朋友", "女朋友", "恋爱对象", "暧昧对象", "前男友", "前女友")
_PARTNER_MARRIED = ("妻子", "丈夫", "老公", "老婆", "公公", "婆婆", "岳父", "岳母", "儿媳", "女婿")
_CN = {"半": 0.5, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_DURATION = re.compile(r"(\d+(?:\.\d+)?|[半一两二三四五六七八九十]+)\s*(年半|年|个月|月|周|天)")


@lru_cache(maxsize=None)
def rules() -> dict[str, Any]:
    return knowledge.load_yaml("experience_fit.yaml")


def life_situations(case: Case) -> set[str]:
    work = case.section("个人史", "工作、学习情况") + case.section("个人史", "工作情况")
    love = case.section("个人史", "婚恋情况")
    s: set[str] = set()
    if "退休" in work or (case.age >= 60 and not re.search(r"在职|仍在工作|返聘", work)):
        s.add("retired")
    elif case.age <= 18 or (case.age <= 35
                            and re.search(r"学生|在读|上学|读书|初[一二三]|高[一二三]|大[一二三四]|研究生|休学", work)):
        s.add("student")
    if "retired" not in s and case.age >= 16 and (
            "student" not in s or re.search(r"工作|职员|工人|公司|上班|经商|个体|兼职|打工", work)):
        s.add("worker")
    if re.search(r"已婚|结婚|丈夫|妻子|爱人", love) and "未婚" not in love:
        s.add("married")
    if re.search(r"子|女儿|儿子|孙", love):
        s.add("parent")
    if re.search(r"未婚|单身|离异|丧偶", love) or (not love and case.age < 22):
        s.add("single")
    return s


def person_fits(person: str, situations: set[str]) -> bool:
    if any(w in person for w in _PARTNER_MARRIED):
        return "married" in situations or "parent" in situations
    if any(w in person for w in _PARTNER_SINGLE):
        return "married" not in situations
    return True


def onset_months(case: Case) -> float | None:
    """How long ago the illness began, from the durations in 主诉 (the longest one)."""
    out = []
    for num, unit in _DURATION.findall(case.complaint):
        n = float(num) if num[0].isdigit() else sum(_CN.get(ch, 0) for ch in num) or 1
        months = {"年半": 12 * n + 6, "年": 12 * n, "个月": n, "月": n, "周": n / 4.3, "天": n / 30}[unit]
        out.append(months)
    return max(out) if out else None


def stages_then(case: Case, situations: set[str], months_ago: float) -> set[str]:
    """The patient's stage(s) of life ``months_ago`` months ago."""
    age = case.age - months_ago / 12
    if age <= 12:
        return {"child"}
    if age < 18 or ("student" in situations and case.age <= 18):
        return {"school"}
    if "student" in situations and months_ago <= 12 * (case.age - 18) + 12:
        return {"college"}
    if "retired" in situations and months_ago <= 60:
        return {"retired"}
    return {"work"}


def event_rule(event: str) -> dict[str, Any] | None:
    """The first ``event_stages`` rule whose words the event holds (its stages and ages)."""
    return next((r for r in rules().get("event_stages") or () if any(w in event for w in r["any"])), None)


def named_person(event: str, graph_people: list[str]) -> str | None:
    """The person an event names (the graph's person holding the word, else the word), or None."""
    words = [w for w in rules()["named"] if w in event]
    if not words:
        return None
    word = max(words, key=len)
    return next((p for p in graph_people if p == word), None) or \
        next((p for p in graph_people if word in p and p in event), None) or word


def triple_fits(case: Case, time: str, person: str, event: str, graph_people: list[str] | None = None,
                situations: set[str] | None = None) -> tuple[bool, str]:
    """Whether a triple fits together and fits the case, with the reason when it does not."""
    r = rules()
    situations = life_situations(case) if situations is None else situations
    named = named_person(event, graph_people or [])
    if named is not None and person != named:
        return False, f"the event is about {named}, not {person}"
    if named is None and person != SELF:
        return False, f"the event names nobody: it is the patient's own, not {person}'s"
    need = (r.get("people_require") or {}).get(person) or {}
    history = f"{case.family_history}{case.present_illness}{case.get('个人史')}"
    if need.get("case_any") and not any(w in history for w in need["case_any"]):
        return False, f"the case mentions no {person}"
    if case.age < int(need.get("age_min", 0)) or (need.get("for") and not situations & set(need["for"])):
        return False, f"{person} does not fit a patient of {case.age} {sorted(situations)}"
    if not person_fits(person, situations):
        return False, f"{person} does not fit the patient's situation {sorted(situations)}"
    t = (r.get("times") or {}).get(time)
    if t is None:
        return False, f"time {time!r} is not described in experience_fit.yaml"
    if t.get("for") and not situations & set(t["for"]):
        return False, f"{time} needs one of {t['for']}"
    if case.age < int(t.get("min_age", 0)):
        return False, f"{time} at {case.age}"
    if any(a in time and b in event for a, b in r.get("incompatible") or ()):
        return False, f"{time} and {event} exclude each other"
    months = t.get("months_ago")
    stages = set(t["stages"]) if months is None else stages_then(case, situations, months)
    rule = event_rule(event)
    if rule and not stages & set(rule["stages"]):
        return False, f"{time} ({sorted(stages)}) and the event ({rule['stages']}) are different stages of life"
    if rule and rule.get("dated") and months is None:
        return False, f"{event} happens now, not {time}"
    if rule and rule.get("at_age"):
        lo, hi = rule["at_age"]
        slack = 1 if months is not None else 0  # a dated time's age is rounded
        then = (case.age - months / 12, case.age - months / 12) if months is not None else t.get("at_age")
        if then is not None and (then[1] < lo - slack or then[0] > hi + slack):
            return False, f"{time} (age {then}) is not when the event happens (age {lo}-{hi})"
        if case.age < lo:
            return False, f"the event happens at {lo} or later, the patient is {case.age}"
    onset = onset_months(case)
    if months is not None and onset is not None and months > onset + r["max_months_before_onset"]:
        return False, f"{time} is long before the illness began ({onset:.0f} months ago)"
    return True, ""


def _item(v: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(v, dict):
        return str(v.get("text", "")), v
    return str(v), {}


def fitting_triples(case: Case) -> list[tuple[str, str, str]]:
    """Every (time, people, event) of the case's knowledge graph that fits (see the module doc)."""
    g = knowledge.graph_data(case.gender, case.age_band)
    situations = life_situations(case)
    times = [t for t, meta in map(_item, g.get("time") or []) if t and int(meta.get("min_age", 0)) <= case.age
             <= int(meta.get("max_age", 200))]
    people = [p for group in (g.get("people") or {}).values() for p, _ in map(_item, group or [])]
    out: list[tuple[str, str, str]] = []
    for grp, events in (g.get("events") or g.get("experience") or {}).items():
        for e, meta in map(_item, events or []):
            fits = meta.get("for")
            if not e or (fits and not situations & set(fits)):
                continue
            person = named_person(e, people) or SELF
            out.extend((t, person, e) for t in times if triple_fits(case, t, person, e, people, situations)[0])
    return out
