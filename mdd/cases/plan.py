"""Case plans drawn from a profile's priors (``mdd/knowledge/profiles/<name>.yaml``).

A plan is what a synthetic case record will say, before anyone writes it: the diagnoses, who the
patient is, how long it has lasted, which symptoms are present and which are ruled out, the stressor,
the histories, the mental state exam and the treatment. :mod:`mdd.cases.write` words it as a record.

The mix of diagnoses is allocated, not sampled: for ``n`` cases the number of diagnoses (1, 2, 3),
the pairs and the single codes get their counts by largest remainder, so the generated mix is the
profile's up to rounding at any ``n`` (a sampled mix of 19 codes misses it by a Jensen-Shannon
distance of about 0.05 at n = 1,000). Everything else of a case is drawn from its own ``plan_seed``.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mdd import knowledge
from mdd.errors import MddError

CHILD_PREFIXES = ("F90", "F93", "F98")  # a child's disorder decides the age of the case


class ProfileError(MddError, ValueError):
    """A profile that cannot be used (names the file, the key and the reason)."""


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    path: str
    n_diagnoses: dict[int, float]
    prefixes: dict[str, float]  # patients per prefix
    pairs: dict[tuple[str, str], float]
    codes: dict[str, list[tuple[str, str, float]]]
    age_bands: dict[str, tuple[int, int]]
    age: dict[str, dict[str, float]]
    female_share: dict[str, float]
    postpartum_share: float

    def mix(self) -> dict[str, float]:
        """The profile's ICD-prefix mix (shares of diagnoses, summing to 1)."""
        total = sum(self.prefixes.values())
        return {k: v / total for k, v in self.prefixes.items()}

    def n_mix(self) -> dict[int, float]:
        total = sum(self.n_diagnoses.values())
        return {k: v / total for k, v in self.n_diagnoses.items()}


def profile_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    return knowledge.HERE / "profiles" / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in (knowledge.HERE / "profiles").glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ProfileError(f"profile {name_or_path!r}: no such profile (known: {', '.join(available_profiles())})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path.name}: not valid YAML ({exc.__class__.__name__})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path.name}: expected a mapping of profile keys")

    def need(key: str, kind: type) -> Any:
        v = data.get(key)
        if not isinstance(v, kind) or not v:
            raise ProfileError(f"{path.name}: {key}: missing or not a {kind.__name__}")
        return v

    plans = knowledge.load_yaml("case_plans.yaml")["diagnoses"]
    n_diag = {int(k): float(v) for k, v in need("n_diagnoses", dict).items()}
    if not set(n_diag) <= {1, 2, 3} or any(v < 0 for v in n_diag.values()):
        raise ProfileError(f"{path.name}: n_diagnoses: keys must be 1, 2, 3 with counts >= 0")
    prefixes: dict[str, float] = {}
    for k, v in need("prefixes", dict).items():
        count = v.get("count") if isinstance(v, dict) else v
        if not isinstance(count, (int, float)) or count <= 0:
            raise ProfileError(f"{path.name}: prefixes.{k}: count must be a positive number")
        if k not in plans:
            raise ProfileError(f"{path.name}: prefixes.{k}: no case plan for this prefix in case_plans.yaml")
        prefixes[k] = float(count)
    pairs: dict[tuple[str, str], float] = {}
    for k, w in (data.get("co_occurrence") or {}).items():
        a, _, b = str(k).partition("+")
        if a not in prefixes or b not in prefixes or a == b:
            raise ProfileError(f"{path.name}: co_occurrence.{k}: both sides must be distinct prefixes of the profile")
        if not _compatible([a, b]):
            raise ProfileError(f"{path.name}: co_occurrence.{k}: the two diagnoses' durations (case_plans.yaml days) "
                               "do not overlap")
        pairs[tuple(sorted((a, b)))] = float(w)  # type: ignore[index]
    if n_diag.get(2, 0) + n_diag.get(3, 0) > 0 and not pairs:
        raise ProfileError(f"{path.name}: co_occurrence: needed when cases may have two or three diagnoses")
    codes: dict[str, list[tuple[str, str, float]]] = {}
    for k in prefixes:
        rows = (data.get("codes") or {}).get(k)
        if not rows:
            raise ProfileError(f"{path.name}: codes.{k}: missing")
        codes[k] = [(str(c), str(n), float(w)) for c, n, w in rows]
        bad = [c for c, _, _ in codes[k] if not c.startswith(k)]
        if bad:
            raise ProfileError(f"{path.name}: codes.{k}: {bad[0]} does not start with {k}")
    bands = {k: (int(v[0]), int(v[1])) for k, v in need("age_bands", dict).items()}
    age = {k: {b: float(w) for b, w in v.items()} for k, v in need("age", dict).items()}
    for k, v in age.items():
        unknown = set(v) - set(bands)
        if unknown:
            raise ProfileError(f"{path.name}: age.{k}: unknown band {sorted(unknown)[0]}")
    if "default" not in age:
        raise ProfileError(f"{path.name}: age.default: missing")
    female = {k: float(v) for k, v in need("female_share", dict).items()}
    return Profile(name=str(data.get("name") or path.stem), source=str(data.get("source") or ""), path=str(path),
                   n_diagnoses=n_diag, prefixes=prefixes, pairs=pairs, codes=codes, age_bands=bands, age=age,
                   female_share=female, postpartum_share=float(data.get("postpartum_share") or 0.0))


# --- allocation of the diagnosis mix -------------------------------------------------------

def largest_remainder(weights: dict[Any, float], n: int) -> dict[Any, int]:
    """Integer counts summing to ``n`` in proportion to ``weights`` (Hamilton's method)."""
    total = sum(weights.values())
    if n <= 0 or total <= 0:
        return {k: 0 for k in weights}
    exact = {k: n * w / total for k, w in weights.items()}
    out = {k: int(math.floor(v)) for k, v in exact.items()}
    rest = n - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), str(k)))[:rest]:
        out[k] += 1
    return out


def _days_range(prefix: str) -> tuple[int, int]:
    lo, hi = knowledge.load_yaml("case_plans.yaml")["diagnoses"][prefix]["days"]
    return int(lo), int(hi)


def _compatible(prefixes: list[str]) -> bool:
    lo = max(_days_range(p)[0] for p in prefixes)
    hi = min(_days_range(p)[1] for p in prefixes)
    return lo <= hi


def allocate_diagnoses(profile: Profile, n: int, rng: random.Random) -> list[tuple[str, ...]]:
    """``n`` sets of ICD prefixes (first: the one that decides the age), matching the profile's mix."""
    per_k = largest_remainder(profile.n_mix(), n)
    sets: list[tuple[str, ...]] = []
    pair_counts = largest_remainder(profile.pairs, per_k.get(2, 0))
    for pair, c in pair_counts.items():
        sets += [pair] * c
    for pair in rng.choices(list(profile.pairs), weights=list(profile.pairs.values()), k=per_k.get(3, 0)):
        third = {p: w for (a, b), w in profile.pairs.items() for p in (a, b)
                 if (a in pair or b in pair) and p not in pair and _compatible([*pair, p])}
        if not third:
            third = {p: w for p, w in profile.prefixes.items() if p not in pair and _compatible([*pair, p])}
        sets.append((*pair, rng.choices(list(third), weights=list(third.values()))[0]))
    # the single-diagnosis counts make up what the pairs and triples do not give each prefix
    mentions = per_k.get(1, 0) + sum(len(s) for s in sets)
    target = {p: share * mentions for p, share in profile.mix().items()}
    for s in sets:
        for p in s:
            target[p] -= 1
    singles = largest_remainder({p: max(v, 0.0) for p, v in target.items()}, per_k.get(1, 0))
    for p, c in singles.items():
        sets += [(p,)] * c
    rng.shuffle(sets)
    order = {p: i for i, p in enumerate(profile.prefixes)}
    return [tuple(sorted(s, key=lambda p: (p not in CHILD_PREFIXES, order[p]))) for s in sets]


# --- one case ------------------------------------------------------------------------------

@dataclass
class CasePlan:
    case_id: str
    profile: str
    plan_seed: int
    prefixes: list[str]
    codes: list[tuple[str, str]]  # (ICD code, diagnosis name)
    age: int
    gender: str
    band: str  # child | teen | adult | elderly (the stressor and companion tables)
    days: int  # duration of the illness, as the chief complaint says it
    duration_text: str
    worse_text: str  # "加重2周" or ""
    postpartum: bool = False
    breastfeeding: bool = False
    pregnant_weeks: int = 0
    present: list[str] = field(default_factory=list)  # symptom ids (checklist items)
    absent: list[str] = field(default_factory=list)
    phrasing: dict[str, int] = field(default_factory=dict)  # which wording of each present symptom
    fill: dict[str, int] = field(default_factory=dict)  # numbers the wordings name (kg, months, hours, weeks)
    stressor: str = ""
    work: str = ""
    marital: str = ""
    menstrual: str = ""
    birth: str = ""
    personality: str = ""
    habits: str = ""
    family_history: str = "无"
    physical_history: str = "无"
    prior_care: str = ""
    companion: str = ""
    drugs: list[str] = field(default_factory=list)
    insight: str = "自知力存在"
    wording: int = 0  # the seed of the writer's own wording choices (set phrases, their order)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CasePlan":
        d = dict(d)
        d["codes"] = [tuple(c) for c in d["codes"]]
        return cls(**d)


def case_seed(run_seed: int, profile: str, index: int) -> int:
    h = hashlib.sha256(f"{run_seed}:{profile}:{index}".encode()).digest()
    return int.from_bytes(h[:6], "big")


ID_LETTERS = "bcdfghjklpqrstvwxz"  # no vowel, no m or n: a tag never spells a pinyin syllable (a name)


def id_tag(run_seed: int, profile: str) -> str:
    """Four letters naming (seed, profile), so ids of different runs do not collide; the id stays a
    plain serial to ``mdd.privacy`` (``syn`` + four of :data:`ID_LETTERS`, a dash, six digits)."""
    h = hashlib.sha256(f"{run_seed}:{profile}".encode()).digest()
    return "".join(ID_LETTERS[b % len(ID_LETTERS)] for b in h[:4])


def _pick_weighted(rng: random.Random, table: dict[str, float]) -> str:
    return rng.choices(list(table), weights=list(table.values()))[0]


def _duration(days: int, min_days: int) -> tuple[int, str]:
    """The duration as a chief complaint says it, and the days that text means (never under ``min_days``)."""
    for unit, name, upto in ((1, "天", 20), (7, "周", 62), (30, "月", 540), (365, "年", 10**6)):
        if days <= upto:
            value = max(round(days / unit), math.ceil(min_days / unit), 1)
            label = "半年" if (unit == 30 and value == 6) else f"{value}{name}"
            return value * unit, label
    raise AssertionError("unreachable")


def diagnosis_symptoms(plan: dict[str, Any], code: str) -> dict[str, float]:
    """A diagnosis' symptom prevalences: the ``by_code`` table of the longest prefix of ``code`` that has one
    (F41.2 mixed anxiety and depression is not F41.1 generalised anxiety), else its prefix's ``symptoms``."""
    tables = plan.get("by_code") or {}
    best = max((c for c in tables if code.upper().startswith(str(c).upper())), key=len, default=None)
    return dict(tables[best]["symptoms"]) if best is not None else dict(plan["symptoms"])


def plan_case(profile: Profile, prefixes: tuple[str, ...], plan_seed: int, case_id: str) -> CasePlan:
    """Everything of one case but its diagnoses, drawn from ``plan_seed``."""
    content = knowledge.load_yaml("case_plans.yaml")
    dx = content["diagnoses"]
    rng = random.Random(plan_seed)
    primary = prefixes[0]
    codes = []
    for p in prefixes:
        rows = profile.codes[p]
        c, name, _ = rng.choices(rows, weights=[w for _, _, w in rows])[0]
        codes.append((c, name))
    band_w = profile.age.get(primary) or profile.age["default"]
    band_name = _pick_weighted(rng, band_w)
    lo_age, hi_age = profile.age_bands[band_name]
    age = rng.randint(lo_age, hi_age)
    female = profile.female_share.get(primary, profile.female_share.get("default", 0.5))
    gender = "女" if rng.random() < female else "男"
    band = "child" if age <= 12 else "teen" if age <= 17 else "elderly" if age >= 60 else "adult"

    postpartum = primary == "F32" and gender == "女" and 22 <= age <= 40 and rng.random() < profile.postpartum_share
    breastfeeding = postpartum and rng.random() < 0.7
    pregnant_weeks = 0
    if not postpartum and gender == "女" and 22 <= age <= 40 and primary in ("F32", "F41") and rng.random() < 0.03:
        pregnant_weeks = rng.randint(8, 30)

    lo = max(_days_range(p)[0] for p in prefixes)
    hi = min(_days_range(p)[1] for p in prefixes)
    if postpartum:
        lo, hi = max(lo, 30), min(hi, 150)
    if pregnant_weeks:
        hi = min(hi, pregnant_weeks * 7)
        lo = min(lo, hi)
    raw = int(round(math.exp(rng.uniform(math.log(lo), math.log(max(hi, lo))))))
    days, duration_text = _duration(raw, lo)
    worse = ""
    if days >= 120 and rng.random() < 0.5:
        worse = rng.choice(["加重1月", "加重2周", "加重2月", "加重半月"])

    # symptoms: the union of the diagnoses' draws; a core symptom (1.0) always, one of require_any at least
    prevalence: dict[str, float] = {}
    for p, (code, _) in zip(prefixes, codes):
        for s, w in diagnosis_symptoms(dx[p], code).items():
            prevalence[s] = max(prevalence.get(s, 0.0), float(w))
    present = [s for s, w in prevalence.items() if rng.random() < w]
    for p in prefixes:
        need = dx[p].get("require_any")
        if need and not set(need) & set(present):
            present.append(rng.choice(need))
    absent: list[str] = []
    for p in prefixes:
        absent += [s for s in dx[p].get("absent", []) if s not in present and s not in absent]
    for s in ("mania_screen", "hallucinations", "risk_ideation"):  # the usual rule-outs of a history
        if s not in present and s not in absent and not (s == "risk_ideation" and band == "child"
                                                         and rng.random() < 0.5):
            absent.append(s)
    symptoms = content["symptoms"]
    phrasing = {s: rng.randrange(len(symptoms[s]["present"])) for s in present}
    fill = {"kg": rng.randint(2, 8), "months": rng.randint(1, 6), "hours": rng.randint(1, 4),
            "weeks": rng.randint(1, 4)}

    stress_key = "trauma" if any(c.startswith("F43.1") for c, _ in codes) else band
    stressor = rng.choice(content["stressors"][stress_key]) if (stress_key == "trauma" or primary == "F43"
                                                                  or rng.random() < 0.7) else ""
    if postpartum:
        stressor = "生产"
    work = _work(rng, age, gender, content)
    marital = _marital(rng, age, gender, postpartum, pregnant_weeks, days)
    menstrual = _menstrual(rng, age, gender, postpartum, pregnant_weeks)
    comp_table = content["companions"][band]
    companion = rng.choice(comp_table)
    if companion in ("丈夫", "妻子"):
        companion = "丈夫" if gender == "女" else "妻子"
    if companion == "无" or (band == "adult" and marital.startswith("未婚")):
        companion = ""
    prior = rng.choice(["既往未就诊，未服用药物。", "既往未就诊。",
                        "曾在外院就诊，服药（具体不详）效果欠佳，已自行停药。",
                        "曾在学校心理咨询室谈过2次，效果不明显。" if band in ("child", "teen")
                        else "曾在综合医院就诊，检查未见明显异常。"])
    drugs = _treatment(rng, prefixes, age, gender, postpartum or breastfeeding, bool(pregnant_weeks), content)
    psychotic = any(p[:2] == "F2" for p in prefixes)
    insight = ("自知力缺乏" if psychotic else rng.choice(["自知力存在", "自知力部分存在", "自知力存在"]))
    return CasePlan(
        case_id=case_id, profile=profile.name, plan_seed=plan_seed, prefixes=list(prefixes), codes=codes, age=age,
        gender=gender, band=band, days=days, duration_text=duration_text, worse_text=worse, postpartum=postpartum,
        breastfeeding=breastfeeding, pregnant_weeks=pregnant_weeks, present=present, absent=absent, phrasing=phrasing,
        fill=fill, stressor=stressor, work=work, marital=marital, menstrual=menstrual,
        birth=rng.choice(["足月顺产。", "足月剖宫产。", "足月顺产，出生时无窒息。"]) if age < 40 else "不详。",
        personality=rng.choice(content["personality"]) + "。", habits=rng.choice(
            [h for h in content["habits"] if age >= 18 or ("烟" not in h and "酒" not in h)]) + "。",
        family_history=rng.choice(content["family_history"]), physical_history=(
            rng.choice(content["physical_history"]) if age >= 40 else "无"),
        prior_care=prior, companion=companion, drugs=drugs, insight=insight, wording=rng.randrange(2**31))


def _work(rng: random.Random, age: int, gender: str, content: dict[str, Any]) -> str:
    school = dict((int(a), s) for a, s in content["school"])
    if age <= 18 or (age <= 22 and rng.random() < 0.6):
        return f"{school[age]}，{rng.choice(content['school_states'])}。"
    edu = rng.choice(content["education"][2:] if age < 30 else content["education"])
    if age >= 60 or (age >= 50 and gender == "女" and rng.random() < 0.5) or (age >= 55 and rng.random() < 0.4):
        occ = rng.choice([o for o in content["occupations"] if o != "研究生在读"])
        return f"{edu}，原为{occ}，{rng.choice(content['retired'])}。"
    occs = [o for o in content["occupations"] if o != "研究生在读" or 22 <= age <= 28]
    return f"{edu}，{rng.choice(occs)}，{rng.choice(content['work_states'])}。"


def _marital(rng: random.Random, age: int, gender: str, postpartum: bool, pregnant_weeks: int, days: int) -> str:
    partner = "男友" if gender == "女" else "女友"
    child = rng.choice(["一子", "一女", "一子一女"])
    if postpartum:
        child, months = rng.choice(['子', '女']), max(2, days // 30 + 1)
        return f"已婚，育有一{child}（{months}月龄），夫妻关系{rng.choice(['尚可', '一般', '好'])}。"
    if pregnant_weeks:
        return f"已婚，现孕{pregnant_weeks}周，夫妻关系{rng.choice(['尚可', '好'])}。"
    if age < 18:
        return rng.choice(["未婚，无恋爱史。", "未婚。"])
    if age < 25:
        return rng.choice(["未婚，无恋爱史。", f"未婚，有{partner}。", "未婚，目前单身。"])
    if age < 35 and rng.random() < 0.5:
        return rng.choice([f"未婚，有{partner}，关系稳定。", "未婚，目前单身。"])
    if age >= 65 and rng.random() < 0.3:
        return f"丧偶，育有{child}，{rng.choice(['现独居', '与子女同住'])}。"
    if rng.random() < 0.1:
        return f"离异，育有{child}。"
    return f"已婚，育有{child}，夫妻关系{rng.choice(['尚可', '一般', '好', '紧张'])}。"


def _menstrual(rng: random.Random, age: int, gender: str, postpartum: bool, pregnant_weeks: int) -> str:
    if gender == "男":
        return "无。"
    if postpartum:
        return "产后月经尚未恢复。"
    if pregnant_weeks:
        return f"末次月经{pregnant_weeks}周前，现妊娠中。"
    if age < 11:
        return "未初潮。"
    if age >= 56 or (age >= 50 and rng.random() < 0.5):
        return f"{rng.randint(47, min(age, 54))}岁绝经。"
    if age >= 46:
        return "近1年月经紊乱。"
    return f"{rng.randint(11, min(age, 15))}岁初潮，{rng.choice(['周期规律', '既往规律', '周期规律，经前烦躁'])}。"


def _treatment(rng: random.Random, prefixes: tuple[str, ...], age: int, gender: str, nursing: bool, pregnant: bool,
               content: dict[str, Any]) -> list[str]:
    drugs = content["drugs"]

    def allowed(d: str) -> bool:
        info = drugs[d]
        if age < int(info.get("min_age", 18)):
            return False
        if (pregnant or nursing) and info.get("pregnancy") == "avoid":
            return False
        return not (info.get("female_avoid") and gender == "女" and 12 <= age <= 50)

    options = list(content["diagnoses"][prefixes[0]]["treatment"])
    rng.shuffle(options)
    if pregnant:
        options.sort(key=len)  # the least medication first in pregnancy
    for option in options:
        if all(allowed(d) for d in option):
            return list(option)
    return []


def synthesize_plans(profile: Profile, n: int, seed: int) -> list[CasePlan]:
    """``n`` case plans for ``profile`` from the run ``seed`` (the same inputs give the same plans)."""
    if n <= 0:
        raise ValueError("n must be a positive number of cases")
    if n > 999_999:
        raise ValueError("n must be at most 999,999 (case ids have six digits)")
    rng = random.Random(seed)
    sets = allocate_diagnoses(profile, n, rng)
    tag = id_tag(seed, profile.name)
    return [plan_case(profile, s, case_seed(seed, profile.name, i), f"syn{tag}-{i + 1:06d}")
            for i, s in enumerate(sets)]
