"""The case-writer role: a :class:`~mdd.cases.plan.CasePlan` in, a case record (MDD-5k schema) out.

A writer is a role like the doctor or the patient: ``write(plan, failed)`` where ``failed`` names the
checker's findings of an earlier pass (empty on the first). The scripted writer here is the offline
default: it words the plan deterministically (the plan fixes every choice) in the register of the
sample cases. A writer on an engine (an LLM through :mod:`mdd.engines`) keeps the same signature:
``prompt(plan, failed)`` gives it the brief, the plan's facts and the failed rules to mend.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import zlib
from collections import Counter
from typing import Any, Protocol, Sequence

from mdd import knowledge
from mdd.cases.plan import CasePlan, diagnosis_symptoms
from mdd.errors import MddError

MSE_KEYS = ("意识", "定向", "接触对答", "注意", "感知", "思维", "情感", "意志、行为", "智能", "躯体症状", "自知力")
PERSONAL_KEYS = ("孕产情况", "发育情况", "婚恋情况", "工作、学习情况", "月经情况", "病前性格", "特殊嗜好")


class CaseWriter(Protocol):
    name: str

    def write(self, plan: CasePlan, failed: Sequence[Any] = ()) -> dict[str, Any]:
        """The record; ``failed``: :class:`mdd.cases.check.Finding` of the previous pass, to mend."""


def provenance(plan: CasePlan) -> dict[str, Any]:
    return {"source": "synthetic", "profile": plan.profile, "plan_seed": plan.plan_seed}


def _phrase(plan: CasePlan, symptom: str) -> str:
    s = knowledge.load_yaml("case_plans.yaml")["symptoms"][symptom]
    text = s["present"][plan.phrasing.get(symptom, 0) % len(s["present"])]
    return text.format(**plan.fill)


def complaint(plan: CasePlan) -> str:
    symptoms = knowledge.load_yaml("case_plans.yaml")["symptoms"]
    words = [symptoms[s]["complaint"] for s in plan.present if symptoms[s].get("complaint")]
    words = list(dict.fromkeys(w for w in words if w != "曾有兴奋话多"))[:3] or ["心理困扰"]
    lead = "产后" if plan.postpartum else ""
    text = f"{lead}{'、'.join(words)}{plan.duration_text}"
    if plan.worse_text:
        text += f"，{plan.worse_text}"
    if "mania_screen" in plan.present and "F31" in plan.prefixes:
        text += "，既往曾有兴奋话多"
    return text


_SET = {  # set phrases of a record, several ways each (the plan's ``wording`` seed picks)
    "consciousness": ["意识清晰", "神志清楚", "意识清"],
    "orientation": ["定向完整", "定向力好", "时间、地点、人物定向准确", "定向准确"],
    "contact": ["接触合作，对答切题", "接触好，对答切题", "主动接触，对答切题", "接触尚可，问答合理"],
    "contact_low": ["接触被动，语速偏慢，对答切题", "接触被动，少语，对答切题", "接触尚合作，语音低，对答切题"],
    "attention": ["注意力集中", "注意力尚集中", "注意无明显异常"],
    "perception": ["未引出幻觉、错觉", "未引出感知觉障碍", "未引出幻觉及感知综合障碍"],
    "no_delusion": ["未引出妄想", "未引出明显妄想", "未引出思维内容障碍"],
    "mood_even": ["情绪平稳", "情感反应协调", "情绪尚稳定"],
    "will": ["意志行为无明显异常", "意志活动尚可", "行为未见明显异常"],
    "intellect": ["智能无异常", "智能正常", "智能粗测正常", "记忆、计算粗测正常"],
    "body": ["无明显躯体不适", "未诉明显躯体不适", "躯体症状不明显"],
    "informed": ["已告知常见药物不良反应，详见说明书，按时按量服药，勿自行停药或加量。",
                 "已告知药物常见不良反应，遵医嘱服药，不可自行停药。",
                 "告知药物作用及不良反应，按时服药，勿擅自增减药量。"],
    "review": ["两周后复诊", "2周后门诊复诊", "一周后复诊，评估疗效", "定期门诊复诊"],
    "come_back": ["如有明显不适或病情加重及时来院就诊", "如病情变化随时就诊", "症状加重时及时就诊"],
    "no_drugs": ["暂不予药物治疗。", "暂不用药。", "以心理治疗为主，暂不予药物。"],
}


def _say(plan: CasePlan, key: str, salt: int = 0) -> str:
    options = _SET[key]
    return options[random.Random(plan.wording * 1009 + zlib.crc32(key.encode()) + salt).randrange(len(options))]


def present_illness(plan: CasePlan) -> str:
    symptoms = knowledge.load_yaml("case_plans.yaml")["symptoms"]
    if plan.postpartum:
        onset = f"患者{plan.duration_text}前分娩后逐渐出现"
    elif plan.stressor:
        onset = f"患者{plan.duration_text}前因{plan.stressor}，此后逐渐出现"
    else:
        onset = f"患者{plan.duration_text}前无明显诱因出现"
    current = [s for s in plan.present if s not in ("mania_screen", "risk_ideation")]
    # no symptom drawn (a counselling case, Z71): the history says what brings the person, never "出现。"
    parts = [onset + ("，".join(_phrase(plan, s) for s in current[:3]) or "心理困扰，希望得到咨询和建议") + "。"]
    if current[3:]:
        parts.append("此外" + "，".join(_phrase(plan, s) for s in current[3:]) + "。")
    if "mania_screen" in plan.present:
        if "F30" in plan.prefixes:
            parts.append("近来兴奋话多、精力旺盛、睡眠需求减少，花钱明显增多，自觉能力很强。")
        else:
            parts.append(_phrase(plan, "mania_screen") + "，当时未就诊。")
    if plan.worse_text:
        parts.append(f"近{plan.worse_text[2:]}上述症状加重。")
    if "risk_ideation" in plan.present:
        parts.append(_phrase(plan, "risk_ideation") + "。")
    outs = [symptoms[s]["absent"] for s in plan.absent if symptoms[s].get("absent")]
    random.Random(plan.wording).shuffle(outs)
    if outs:
        parts.append("，".join(outs) + "。")
    if plan.breastfeeding:
        parts.append("目前母乳喂养。")
    if plan.pregnant_weeks:
        parts.append(f"目前孕{plan.pregnant_weeks}周，产检未见异常。")
    parts.append(plan.prior_care)
    parts.append(f"此次由{plan.companion}陪同来诊。" if plan.companion else "此次独自来诊。")
    return "".join(parts)


def mental_state(plan: CasePlan) -> dict[str, str]:
    symptoms = knowledge.load_yaml("case_plans.yaml")["symptoms"]
    found: dict[str, list[str]] = {k: [] for k in MSE_KEYS}
    for s in plan.present:
        if s == "mania_screen" and "F30" not in plan.prefixes:
            continue
        for key, text in (symptoms[s].get("mse") or {}).items():
            found[key].append(text)
    if "mania_screen" in plan.present and "F30" in plan.prefixes:
        found["情感"].append("情感高涨，易激惹")
        found["思维"].append("思维奔逸，言语增多")
    calm = "接触主动，言语增多" if "F30" in plan.prefixes else _say(plan, "contact")
    thought = found["思维"]
    return {
        "意识": _say(plan, "consciousness"),
        "定向": _say(plan, "orientation"),
        "接触对答": calm if "mood_low" not in plan.present else _say(plan, "contact_low"),
        "注意": "，".join(found["注意"]) or _say(plan, "attention"),
        "感知": "，".join(found["感知"]) or _say(plan, "perception"),
        "思维": "，".join(["思维连贯"] + thought
                        + ([] if "delusions" in plan.present else [_say(plan, "no_delusion")])),
        "情感": "，".join(found["情感"]) or _say(plan, "mood_even"),
        "意志、行为": "，".join(found["意志、行为"]) or _say(plan, "will"),
        "智能": _say(plan, "intellect"),
        "躯体症状": "，".join(found["躯体症状"]) or _say(plan, "body"),
        "自知力": plan.insight,
    }


def treatment(plan: CasePlan) -> str:
    content = knowledge.load_yaml("case_plans.yaml")
    drugs = content["drugs"]
    young_or_old = plan.age < 18 or plan.age >= 60
    lines = [drugs[d]["text"].format(boxes=1 if young_or_old else 2, dose="半片" if young_or_old else "1片")
             for d in plan.drugs]
    text = "； ".join(lines) + "； " if lines else _say(plan, "no_drugs") + " "
    scales = content["diagnoses"][plan.prefixes[0]]["scales"]
    text += " ".join(f"{s} 1" for s in scales) + " "
    if lines:
        text += _say(plan, "informed") + " "
    advice = [content["diagnoses"][p]["therapy"] for p in plan.prefixes]
    if plan.breastfeeding and lines:
        advice.append("哺乳期用药已告知利弊，服药期间注意观察婴儿睡眠、吃奶情况")
    if plan.pregnant_weeks:
        advice.append("妊娠期以心理治疗为主，用药已告知利弊，建议产科共同随访")
    risk = "risk_ideation" in plan.present
    if risk:
        advice.append("家属加强看护，妥善保管药品及危险物品，防止自伤、消极等意外，如病情加重及时就诊，必要时住院治疗")
    else:
        advice.append(_say(plan, "come_back"))
    advice.append(_say(plan, "review"))
    text += " ".join(f"{i}.{a}。" for i, a in enumerate(advice, 1))
    return text + (" 防消极" if risk else "")


def _drug_classes(key: str) -> set[str]:
    """The checker's classes of a plan drug (its record text read by :func:`mdd.cases.check.prescribed`)."""
    from mdd.cases.check import _k, prescribed

    text = knowledge.load_yaml("case_plans.yaml")["drugs"][key]["text"]
    return {_k()["drugs"][n]["class"] for n in prescribed(text)}


def mend(plan: CasePlan, failed: Sequence[Any]) -> CasePlan:
    """A copy of ``plan`` changed where the checker's findings ``failed`` point: the offending items are
    dropped or rewritten, the rest kept (what a second writing pass told of the rules does)."""
    from mdd.cases.check import _k, _lookup
    from mdd.cases.plan import _duration, _work

    rules = {f.rule for f in failed}
    content, k = knowledge.load_yaml("case_plans.yaml"), _k()
    p = CasePlan.from_dict(plan.to_dict())
    rng = random.Random(plan.wording + 7)
    if "age_occupation" in rules:  # school stage or job as the age has it
        p.work = _work(rng, p.age, p.gender, content)
    if "age_marital" in rules and p.age < k["min_married_age"]:
        p.marital = "未婚。"
    if "gender_specific" in rules:
        lo, hi = k["pregnancy_ages"]
        if p.gender == "男" or not lo <= p.age <= hi:
            p.postpartum, p.breastfeeding, p.pregnant_weeks = False, False, 0
        if p.gender == "男":
            p.menstrual = "无"
        elif p.age < k["min_menarche_age"]:
            p.menstrual = "未初潮。"
        elif p.age >= 60:
            p.menstrual = "已绝经。"
    if "diagnosis_symptoms" in rules:  # each diagnosis' core symptom (its highest prevalence) is present
        for prefix, (code, _) in zip(p.prefixes, p.codes):
            core = max(diagnosis_symptoms(content["diagnoses"][prefix], code).items(), key=lambda kv: kv[1])[0]
            if core not in p.present:
                p.present.append(core)
            p.absent = [a for a in p.absent if a != core]
    if "duration_criteria" in rules:  # the complaint's duration inside every code's criteria
        crits = [c for code, _ in p.codes if (c := _lookup(k["durations"], code.upper()))]
        lo = max([c["min"] for c in crits if "min" in c], default=1)
        hi = min([c["max"] for c in crits if "max" in c], default=10**6)
        p.days, p.duration_text = _duration(min(max(p.days, lo), max(hi, lo)), lo)
        if p.days < 120:
            p.worse_text = ""
    if "treatment_age" in rules:
        drugs = content["drugs"]
        p.drugs = [] if p.age < k["min_drug_age"] else [d for d in p.drugs if drugs[d].get("min_age", 0) <= p.age]
    if "treatment_pregnancy" in rules:
        p.drugs = [d for d in p.drugs if content["drugs"][d].get("pregnancy") != "avoid"]
    if "treatment_diagnosis" in rules:
        prefixes = {c[:3] for c, _ in p.codes}
        classes = set().union(*(_drug_classes(d) for d in p.drugs)) if p.drugs else set()
        drop = set()
        if not prefixes & set(k["stimulant_prefixes"]):
            drop.add("stimulant")
        if prefixes & set(k["bipolar_prefixes"]) and not classes & {"mood_stabilizer", "antipsychotic"}:
            drop.add("antidepressant")
        p.drugs = [d for d in p.drugs if not _drug_classes(d) & drop]
        if prefixes & set(k["psychotic_prefixes"]) and not any("antipsychotic" in _drug_classes(d) for d in p.drugs):
            p.drugs = []  # no drug rather than a psychotic disorder treated without an antipsychotic
    return p


_CALM = {"情感": "mood_even", "感知": "perception", "意志、行为": "will", "注意": "attention", "躯体症状": "body"}


class ScriptedCaseWriter:
    """The offline writer: words a plan in the register of the sample cases. A second pass told of
    failed rules writes the :func:`mend`-ed plan (offending items dropped or rewritten) and puts an exam
    finding the history denies back to its normal wording; what the checker still finds then is a fault
    of the plan or of this writer, and the case is rejected with the rule names."""

    name = "scripted"

    def write(self, plan: CasePlan, failed: Sequence[Any] = ()) -> dict[str, Any]:
        if failed:
            plan = mend(plan, failed)
        rec = self._record(plan)
        for f in failed:  # mse_history: the exam's sub-field the history denies, in its normal wording
            if f.rule == "mse_history" and f.field.startswith("精神检查."):
                key = f.field.split(".", 1)[1]
                if key == "思维":
                    rec["精神检查"][key] = "思维连贯，" + _say(plan, "no_delusion")
                elif key in _CALM:
                    rec["精神检查"][key] = _say(plan, _CALM[key])
        return rec

    def _record(self, plan: CasePlan) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "患者": plan.case_id,
            "年龄": plan.age,
            "性别": plan.gender,
            "ICD编码": ",".join(c for c, _ in plan.codes),
            "诊断结果": "，".join(n for _, n in plan.codes),
            "主诉": complaint(plan),
            "现病史": present_illness(plan),
            "重要或相关躯体疾病史": plan.physical_history
            if plan.physical_history.endswith("。") or plan.physical_history == "无" else plan.physical_history + "。",
            "家族史": plan.family_history if plan.family_history == "无" else plan.family_history + "。",
            "个人史": {
                "孕产情况": plan.birth,
                "发育情况": "生长发育正常。",
                "婚恋情况": plan.marital,
                "工作、学习情况": plan.work,
                "月经情况": plan.menstrual,
                "病前性格": plan.personality,
                "特殊嗜好": plan.habits,
            },
            "精神检查": mental_state(plan),
            "处理意见": treatment(plan),
        }
        rec.update(provenance(plan))
        return rec


class CaseWriteError(MddError, ValueError):
    """A writer's text that holds no case record (the checker's rule ``writer_output``)."""


_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$")


def parse_record(text: str) -> dict[str, Any]:
    """The JSON object an engine wrote (code fences and words around it allowed)."""
    body = _FENCE.sub("", text or "")
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise CaseWriteError(f"no JSON object in the writer's {len(text or '')} characters")
    try:
        rec = json.loads(body[start:end + 1])
    except json.JSONDecodeError as exc:
        raise CaseWriteError(f"the writer's JSON does not parse ({exc.msg} at character {exc.pos})") from None
    if not isinstance(rec, dict):
        raise CaseWriteError(f"the writer's JSON is a {type(rec).__name__}, not an object")
    return rec


SYSTEM = "你是精神科门诊医生，负责按要素书写门诊病历。只输出一个JSON对象，不要输出其他内容。"


class EngineCaseWriter:
    """The case writer on an engine (:mod:`mdd.engines`: scripted, vLLM, OpenAI-compatible): it sends
    :func:`prompt` (the plan's facts; on a repair pass the failed rules and their reasons) as one
    ``generate`` call (agent ``case_writer``, op ``CaseWrite``) and reads the record from the JSON it
    answers. The case id and the provenance (``source``, ``profile``, ``plan_seed``) are the plan's,
    whatever the model wrote. ``write_many`` keeps up to ``in_flight`` calls in flight (an engine
    batches them)."""

    name = "engine"

    def __init__(self, engine: Any, sampling: Any = None, in_flight: int = 16):
        from mdd.engines.base import Sampling

        self.engine = engine
        self.model = getattr(engine, "model", "")
        self.sampling = sampling or Sampling(temperature=0.7, top_p=0.9, max_tokens=3072)
        self.in_flight = in_flight
        self.usage: Counter = Counter()  # calls, prompt_tokens, output_tokens, unparseable

    def request(self, plan: CasePlan, failed: Sequence[Any] = ()) -> Any:
        from dataclasses import replace

        from mdd.engines.base import Message, Request

        return Request(messages=(Message("system", SYSTEM), Message("user", prompt(plan, failed))),
                       sampling=replace(self.sampling, seed=(plan.plan_seed + len(failed)) % 2**31),
                       agent="case_writer", op="CaseWrite", session=plan.case_id,
                       context={"plan": plan.to_dict(), "failed": [f.as_row() for f in failed]})

    async def awrite(self, plan: CasePlan, failed: Sequence[Any] = ()) -> dict[str, Any]:
        done = await self.engine.generate(self.request(plan, failed))
        self.usage.update(calls=1, prompt_tokens=done.prompt_tokens, output_tokens=done.output_tokens)
        try:
            rec = parse_record(done.text)
        except CaseWriteError:
            self.usage["unparseable"] += 1
            raise
        rec["患者"] = plan.case_id
        rec.update(provenance(plan))
        return rec

    def write(self, plan: CasePlan, failed: Sequence[Any] = ()) -> dict[str, Any]:
        return asyncio.run(self.awrite(plan, failed))

    def write_many(self, jobs: Sequence[tuple[CasePlan, Sequence[Any]]]) -> list[dict[str, Any] | CaseWriteError]:
        """Every (plan, failed) job's record, or the :class:`CaseWriteError` its text gave, in order."""
        async def run() -> list[Any]:
            gate = asyncio.Semaphore(self.in_flight)

            async def one(plan: CasePlan, failed: Sequence[Any]) -> Any:
                async with gate:
                    try:
                        return await self.awrite(plan, failed)
                    except CaseWriteError as exc:
                        return exc
            return await asyncio.gather(*(one(p, f) for p, f in jobs))
        return asyncio.run(run())


def prompt(plan: CasePlan, failed: Sequence[Any] = ()) -> str:
    """The brief an engine-backed writer gets: the plan's facts, and the rules its last record broke."""
    facts = plan.to_dict()
    lines = ["请根据以下病例要素，按门诊精神科病历格式写一份病例（JSON，字段：患者、年龄、性别、ICD编码、诊断结果、"
             "主诉、现病史、"
             "重要或相关躯体疾病史、家族史、个人史{孕产情况,发育情况,婚恋情况,工作、学习情况,月经情况,病前性格,特殊嗜好}、"
             "精神检查{" + ",".join(MSE_KEYS) + "}、处理意见）。不写姓名、具体日期和任何可识别个人的信息。",
             f"病例要素：{facts}"]
    if failed:
        lines.append("上一稿未通过以下一致性检查，请修改：" + "；".join(f"{f.rule}：{f.reason}" for f in failed))
    return "\n".join(lines)
