"""The clinical consistency checker: named rules over a case record (real or synthetic).

Each rule reads the validated record (:class:`mdd.cases.Case`) and returns :class:`Finding` rows
(case id, rule, field, reason); reasons name the rule's own words and figures, never a quoted span of
the record. The rules' knowledge is ``mdd/knowledge/case_rules.yaml``.

The rules, and what each catches:

- ``age_occupation``: a school stage that does not fit the age, a job under 16, retirement under 45
- ``age_marital``: married, divorced, widowed or with children under 18
- ``gender_specific``: menstruation, pregnancy or childbirth of a man; male-only items of a woman;
  menstruation before 8, pregnancy outside 14-50, a regular cycle at 60+
- ``diagnosis_symptoms``: a diagnosis none of whose symptoms the history or the exam asserts
- ``duration_criteria``: a chief complaint's duration under (or over) the diagnosis' criteria
- ``treatment_age``: a drug below the age it is written for
- ``treatment_diagnosis``: a stimulant without ADHD, an antidepressant in bipolar disorder without a mood
  stabilizer or an antipsychotic, a psychotic disorder treated with drugs but no antipsychotic
- ``treatment_pregnancy``: a drug avoided in pregnancy or breastfeeding given to a pregnant or breastfeeding woman
- ``mse_history``: the mental state exam asserting what the history denies and never affirms
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable

from mdd import knowledge
from mdd.cases import Case

RULES: dict[str, Callable[[Case], list["Finding"]]] = {}


@dataclass(frozen=True, slots=True)
class Finding:
    case_id: str
    rule: str
    field: str
    reason: str

    def as_row(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "rule": self.rule, "field": self.field, "reason": self.reason}


def rule(name: str) -> Callable[[Callable[[Case], list[Finding]]], Callable[[Case], list[Finding]]]:
    def deco(fn: Callable[[Case], list[Finding]]) -> Callable[[Case], list[Finding]]:
        RULES[name] = fn
        return fn
    return deco


@lru_cache(maxsize=1)
def _k() -> dict[str, Any]:
    return knowledge.load_yaml("case_rules.yaml")


_CLAUSE = re.compile(r"[，,。；;！!？?\n]")


def clauses(text: str) -> list[str]:
    return [c for c in _CLAUSE.split(text or "") if c.strip()]


_NOT_NEGATION = re.compile(r"无明显诱因|无诱因|无明显原因")


def negated(clause: str) -> bool:
    clause = _NOT_NEGATION.sub("", clause)  # "without a clear cause" negates no symptom
    return any(w in clause for w in _k()["negations"])


def _hits(text: str, words: Iterable[str]) -> tuple[bool, bool]:
    """(asserted somewhere, denied somewhere): a word in a clause without / with a negation word."""
    pat = re.compile("|".join(words))
    asserted = denied = False
    for c in clauses(text):
        if pat.search(c):
            if negated(c):
                denied = True
            else:
                asserted = True
    return asserted, denied


def _lookup(table: dict[str, Any], code: str) -> Any:
    for key in (code[:5], code[:3], code[:2]):
        if key in table:
            return table[key]
    return None


def _history(case: Case) -> str:
    return case.complaint + "。" + case.present_illness


def _work(case: Case) -> str:
    return case.section("个人史", "工作、学习情况") if isinstance(case.personal, dict) else str(case.personal or "")


# --- age --------------------------------------------------------------------------------------

@rule("age_occupation")
def age_occupation(case: Case) -> list[Finding]:
    k, out = _k(), []
    work = _work(case)
    stage_hit = False
    for st in k["school_stages"]:
        if re.search(st["pattern"], work):
            stage_hit = True
            lo, hi = st["ages"]
            if not lo <= case.age <= hi:
                out.append(Finding(case.case_id, "age_occupation", "个人史.工作、学习情况",
                                   f"school stage {st['label']} fits ages {lo}-{hi}, the patient is {case.age}"))
    if "退休" in work and case.age < k["min_retired_age"]:
        out.append(Finding(case.case_id, "age_occupation", "个人史.工作、学习情况",
                           f"retired at {case.age} (under {k['min_retired_age']})"))
    if case.age < k["min_work_age"] and not stage_hit and any(j in work for j in k["jobs"]):
        out.append(Finding(case.case_id, "age_occupation", "个人史.工作、学习情况",
                           f"a job at {case.age} (under {k['min_work_age']}) and no school stage"))
    return out


@rule("age_marital")
def age_marital(case: Case) -> list[Finding]:
    k = _k()
    text = case.section("个人史", "婚恋情况") if isinstance(case.personal, dict) else str(case.personal or "")
    if case.age >= k["min_married_age"]:
        return []
    asserted, _ = _hits(text, k["married_words"])
    if asserted:
        return [Finding(case.case_id, "age_marital", "个人史.婚恋情况",
                        f"married, divorced, widowed or a parent at {case.age} (under {k['min_married_age']})")]
    return []


# --- gender -----------------------------------------------------------------------------------

_OTHER_PERSON = re.compile(r"妻子|爱人|老婆|女友|女朋友|丈夫|老公|男友|男朋友|"
                           r"母亲|妈妈|姐姐|妹妹|女儿|儿媳|嫂|父亲|儿子")


def _own_clauses(case: Case) -> list[tuple[str, str]]:
    """(field, clause) of the patient's own history: other people's clauses (a wife's pregnancy) left out."""
    fields = [("主诉", case.complaint), ("现病史", case.present_illness),
              ("重要或相关躯体疾病史", case.physical_history)]
    if isinstance(case.personal, dict):
        fields += [(f"个人史.{k}", v) for k, v in case.personal.items() if k != "婚恋情况"]
    else:
        fields.append(("个人史", str(case.personal or "")))
    return [(f, c) for f, text in fields for c in clauses(text) if not _OTHER_PERSON.search(c)]


@rule("gender_specific")
def gender_specific(case: Case) -> list[Finding]:
    k, out = _k(), []
    own = _own_clauses(case)
    wrong = k["female_only"] if case.gender == "男" else k["male_only"]
    pat = re.compile("|".join(wrong))
    for f, c in own:
        if pat.search(c) and not negated(c) and not re.fullmatch(r"\s*无\s*", c):
            out.append(Finding(case.case_id, "gender_specific", f,
                               f"{'female' if case.gender == '男' else 'male'}-only item in the record of a "
                               f"{'man' if case.gender == '男' else 'woman'}"))
            break
    if case.gender == "女":
        menses = case.section("个人史", "月经情况") if isinstance(case.personal, dict) else ""
        affirmed = any(re.search(w, c) and not negated(c) and "未初潮" not in c
                       for c in clauses(menses) for w in k["menstrual_affirmed"])
        if affirmed and case.age < k["min_menarche_age"]:
            out.append(Finding(case.case_id, "gender_specific", "个人史.月经情况",
                               f"menstruation at {case.age} (under {k['min_menarche_age']})"))
        if case.age >= 60 and "规律" in menses and "绝经" not in menses:
            out.append(Finding(case.case_id, "gender_specific", "个人史.月经情况",
                               f"a regular cycle at {case.age} and no menopause"))
        lo, hi = k["pregnancy_ages"]
        preg = re.compile("|".join(k["pregnancy_words"]))
        if not lo <= case.age <= hi and any(preg.search(c) and not negated(c) for _, c in own):
            out.append(Finding(case.case_id, "gender_specific", "现病史",
                               f"pregnancy or childbirth at {case.age} (outside {lo}-{hi})"))
    return out


# --- diagnosis --------------------------------------------------------------------------------

@rule("diagnosis_symptoms")
def diagnosis_symptoms(case: Case) -> list[Finding]:
    k, out = _k(), []
    text = _history(case) + "。" + case.get("精神检查")
    for code in case.icd_codes:
        words = _lookup(k["symptoms"], code.upper())
        if not words:
            continue
        asserted, _ = _hits(text, words)
        if not asserted:
            out.append(Finding(case.case_id, "diagnosis_symptoms", "现病史",
                               f"{code}: none of its symptoms ({'、'.join(words[:5])}…) is asserted in the history "
                               "or the mental state exam"))
    return out


_CN = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_DUR = re.compile(r"(\d+(?:\.\d+)?|[一二两三四五六七八九十]+|半)\s*(?:余|多)?\s*个?\s*"
                  r"(天|日|周|星期|月|年)(余|多)?(半)?(?!前)")
_UNIT = {"天": 1, "日": 1, "周": 7, "星期": 7, "月": 30, "年": 365}


def _number(s: str) -> float:
    if s == "半":
        return 0.5
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    if "十" in s:
        head, _, tail = s.partition("十")
        return (_CN.get(head, 1) if head else 1) * 10 + (_CN.get(tail, 0) if tail else 0)
    return float(_CN.get(s, 0))


def complaint_days(text: str) -> float | None:
    """The longest duration a chief complaint states, in days (None: it states none)."""
    best = None
    for m in _DUR.finditer(text or ""):
        days = (_number(m.group(1)) + (0.5 if m.group(4) else 0)) * _UNIT[m.group(2)]
        best = days if best is None else max(best, days)
    return best


@rule("duration_criteria")
def duration_criteria(case: Case) -> list[Finding]:
    k, out = _k(), []
    days = complaint_days(case.complaint)
    if days is None:
        return []
    for code in case.icd_codes:
        crit = _lookup(k["durations"], code.upper())
        if not crit:
            continue
        if "min" in crit and days < crit["min"]:
            out.append(Finding(case.case_id, "duration_criteria", "主诉",
                               f"{code}: the complaint states {days:g} days, the criteria need at least {crit['min']} "
                               f"({crit['why']})"))
        if "max" in crit and days > crit["max"]:
            out.append(Finding(case.case_id, "duration_criteria", "主诉",
                               f"{code}: the complaint states {days:g} days, the criteria allow at most {crit['max']} "
                               f"({crit['why']})"))
    return out


# --- treatment --------------------------------------------------------------------------------

def prescribed(treatment: str) -> list[str]:
    """The drugs a treatment prescribes (by the checker's names), leaving out those it stops."""
    k = _k()
    names = sorted(k["drugs"], key=len, reverse=True)
    out: list[str] = []
    for c in re.split(r"[；;。\n]|\s{1,}", treatment or ""):
        if any(w in c for w in k["stop_words"]):
            continue
        for n in names:
            if n in c and not any(n in o for o in out):  # 艾司西酞普兰 is not also 西酞普兰
                out.append(n)
    return out


def _classes(drugs: list[str]) -> set[str]:
    return {_k()["drugs"][d]["class"] for d in drugs}


@rule("treatment_age")
def treatment_age(case: Case) -> list[Finding]:
    k, out = _k(), []
    drugs = prescribed(case.treatment)
    if drugs and case.age < k["min_drug_age"]:
        return [Finding(case.case_id, "treatment_age", "处理意见",
                        f"psychotropic drugs at {case.age} (under {k['min_drug_age']})")]
    for d in drugs:
        if case.age < k["drugs"][d]["min_age"]:
            out.append(Finding(case.case_id, "treatment_age", "处理意见",
                               f"{d} is written for ages {k['drugs'][d]['min_age']}+, the patient is {case.age}"))
    return out


@rule("treatment_diagnosis")
def treatment_diagnosis(case: Case) -> list[Finding]:
    k, out = _k(), []
    drugs = prescribed(case.treatment)
    classes = _classes(drugs)
    prefixes = {c[:3].upper() for c in case.icd_codes}
    if "stimulant" in classes and not prefixes & set(k["stimulant_prefixes"]):
        out.append(Finding(case.case_id, "treatment_diagnosis", "处理意见",
                           "a stimulant without an ADHD diagnosis (F90)"))
    if (prefixes & set(k["bipolar_prefixes"]) and "antidepressant" in classes
            and not classes & {"mood_stabilizer", "antipsychotic"}):
        out.append(Finding(case.case_id, "treatment_diagnosis", "处理意见",
                           "an antidepressant in bipolar disorder or mania without a mood stabilizer or antipsychotic"))
    if prefixes & set(k["psychotic_prefixes"]) and drugs and "antipsychotic" not in classes:
        out.append(Finding(case.case_id, "treatment_diagnosis", "处理意见",
                           "a psychotic disorder treated with drugs but no antipsychotic"))
    return out


@rule("treatment_pregnancy")
def treatment_pregnancy(case: Case) -> list[Finding]:
    k = _k()
    if case.gender != "女":
        return []
    text = _history(case) + "。" + case.get("个人史")
    preg = re.compile("|".join(w for w in k["pregnancy_words"] if w != "产后"))  # postpartum alone is not nursing
    if not any(preg.search(c) and not negated(c) and "未孕" not in c for c in clauses(text)):
        return []
    bad = [d for d in prescribed(case.treatment) if k["drugs"][d].get("pregnancy") == "avoid"]
    return [Finding(case.case_id, "treatment_pregnancy", "处理意见",
                    f"{d} is avoided in pregnancy and breastfeeding") for d in bad]


# --- mental state exam ------------------------------------------------------------------------

@rule("mse_history")
def mse_history(case: Case) -> list[Finding]:
    out = []
    history = _history(case)
    for item in _k()["mse_vs_history"]:
        mse = case.section("精神检查", item["mse"]) if isinstance(case.exam, dict) else str(case.exam or "")
        said, _ = _hits(mse, item["words"])
        if not said:
            continue
        ignore = item.get("deny_ignore") or []
        asserted, denied = _hits(history, item["history"])
        if denied and ignore:  # a denied plan or act is not a denied thought
            denied = any(re.search("|".join(item["history"]), c) and negated(c) and not any(w in c for w in ignore)
                         for c in clauses(history))
        if denied and not asserted:
            out.append(Finding(case.case_id, "mse_history", f"精神检查.{item['mse']}",
                               f"the exam finds {item['rule_item']}, the history denies it and never affirms it"))
    return out


def check_case(case: Case, rules: Iterable[str] | None = None) -> list[Finding]:
    names = list(rules) if rules is not None else list(RULES)
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise ValueError(f"unknown rule {unknown[0]!r} (known: {', '.join(RULES)})")
    return [f for n in names for f in RULES[n](case)]


def check_cases(cases: Iterable[Case]) -> list[Finding]:
    return [f for c in cases for f in check_case(c)]
