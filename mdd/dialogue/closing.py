"""The doctor's closing turn, spoken: the diagnosis in lay words, the treatment plan as a doctor
says it, follow-up and safety advice (``mdd/knowledge/closing.yaml``).

The case's 处理意见 is prescription text ("舍曲林片（左洛复） 50mg*14片/盒 1盒 每日一次 …; (可以线上)
…量表 1 …; 1.… 2.两周后复诊。 防消极"): drugs keep their name and how to take them, package sizes and
dispensed quantities go, rating scales become one sentence, numbered advice is said in words, and
the ICD code is never read out. The labels stay exact in the dialogue's columns.
"""
from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.cases import Case

# prescription strings no spoken closing may hold (tests/test_closing.py checks every sample case)
PRESCRIPTION = re.compile(
    r"\d+(?:\.\d+)?\s*(?:mg|g|ml|μg|ug)\b|[\*×]\s*\d+|/\s*[盒瓶板袋]|\d+\s*[盒板瓶]|\d+片\s+\d+片|可以线上|ICD"
    r"|[A-Z]\d{2}\.[0-9xX]", re.IGNORECASE)
_PACKAGE = re.compile(r"\d+(?:\.\d+)?\s*(?:mg|g|ml|μg|ug)(?:\s*[\*×xX]\s*\d+\s*[片粒袋支丸]\s*/\s*[盒瓶板袋])?"
                      r"(?:\s+\d+\s*[片粒盒板瓶袋支](?=\s|$))*", re.IGNORECASE)
_DRUG = re.compile(r"^(?P<name>[^\s\d（(]+?(?:片|胶囊|粒|缓释片|口服液|颗粒|滴剂)(?:[（(][^）)]*[）)])?)"
                   r"\s*(?P<rest>.*)$")
_FORM = re.compile(r"(?:肠溶|缓释)?(?:片|胶囊|口服液|颗粒|滴剂)(?=[（(]|$)")
_SCALE = re.compile(r"[^\s；;。]*?(?:量表|问卷|指数|检查)(?:[（(][^）)]*[）)])?\s*\d*")
_NUMBERED = re.compile(r"\s(?=\d+\s*[\.、．](?!\d))")


@lru_cache(maxsize=None)
def book() -> dict[str, Any]:
    return knowledge.load_yaml("closing.yaml")


def _spoken(text: str) -> str:
    for pattern, rep in book()["spoken"]:
        text = re.sub(pattern, rep, text)
    return re.sub(r"\s+", "，", text.strip(" ，,；;。")).strip("，")


def meaning(icd: str) -> str:
    codes = [c.strip() for c in re.split(r"[,，、;；/]", icd or "") if c.strip()]
    m = book()["meaning"]
    for code in codes:
        best = max((k for k in m if k and code.upper().startswith(k)), key=len, default=None)
        if best:
            return m[best]
    return m[""]


def plan(treatment: str) -> dict[str, Any]:
    """The parts of a 处理意见: drugs (spoken), tests, side-effect note, advice, follow-up, risk."""
    text = re.sub(r"[（(]可以线上[）)]", "", treatment or "")
    out: dict[str, Any] = {"drugs": [], "notes": [], "advice": [], "tests": False, "side_effects": False,
                           "followup": None, "risk": any(w in text for w in book()["risk_words"])}
    head, *numbered = _NUMBERED.split(" " + text)
    out["side_effects"] = "不良反应" in head
    head = re.sub(r"已告知常见药物不良反应.*$", "", head)
    for seg in re.split(r"[；;。]", head):
        seg, n = _SCALE.subn("", seg)
        out["tests"] |= bool(n) and "量表" in "".join(_SCALE.findall(head)) or bool(n)
        seg = seg.strip()
        if not seg or seg in ("防消极",):
            continue
        m = _DRUG.match(seg)
        if m and _PACKAGE.search(seg):
            name = _FORM.sub("", m.group("name"))
            rest = re.sub(r"，吃(?=，|$)", "", _spoken(_PACKAGE.sub(" ", m.group("rest"), count=1)))
            out["drugs"].append(f"{name}，{rest}" if rest else name)
        else:
            for sentence in re.split(r"[。]", seg):
                if sentence.strip():
                    out["notes"].append(_spoken(sentence))
    when = re.compile(book()["followup_pattern"])
    for item in numbered:
        item = re.sub(r"^\s*\d+\s*[\.、．]\s*", "", item.replace("防消极", "")).strip()
        f = when.search(item)
        if f:
            rest = (item[: f.start()] + item[f.end():]).strip(" ，,。")
            out["followup"] = f.group(1) if not rest else "said"  # said inside its item (如暂不住院，三日后复诊)
            if not rest:
                continue
            item = item.replace("复诊", "来复诊")
        spoken = _spoken(item)
        if spoken and not PRESCRIPTION.search(spoken):
            out["advice"].append(spoken)
    return out


def spoken_closing(case: Case, rng: random.Random) -> str:
    """The closing turn for ``case``: diagnosis, meaning, plan, follow-up, safety, in speech."""
    b, p = book(), plan(case.treatment)
    parts = [rng.choice(b["openers"]), b["diagnosis"].format(diagnosis=case.diagnosis, meaning=meaning(case.icd_code))]
    parts += [n + "。" for n in p["notes"]]
    if p["drugs"]:
        parts.append(b["medication"].format(drugs="；".join(p["drugs"])))
        if p["side_effects"]:
            parts.append(b["side_effects"])
    if p["tests"]:
        parts.append(b["tests"])
    if p["advice"]:
        parts.append(b["advice"].format(items="；".join(p["advice"])))
    if p["followup"] and p["followup"] not in ("定期", "said"):
        parts.append(b["followup"].format(when=p["followup"]))
    elif p["followup"] != "said":
        parts.append(b["followup_default"])
    if p["risk"]:
        parts.append(b["safety"])
    parts.append(rng.choice(b["end"]))
    text = "".join(parts)
    return re.sub(r"。{2,}", "。", text.replace("，。", "。"))
