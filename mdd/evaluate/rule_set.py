"""The multi-turn rule language ("N auto"): the rule model, the rule-set parser and loader.

A rule says *what the doctor should do at which turn*; :mod:`mdd.evaluate.rules` judges it on
dialogues. Its id is ``multi_turn:{N_th|FIRST_N}:{conv|ask}:{name}``:

* ``N_th``    the criterion is judged at exactly exchange N;
* ``FIRST_N`` the criterion must hold at some exchange of a window: exchanges ``0..N-1``
  for an int N, ``anchor+offset .. anchor+offset+window-1`` for ``auto``;
* ``ask``     judges one exchange's text (by default the doctor's question);
* ``conv``    judges the whole conversation up to (and including) the exchange.

Turn indices are 0-based *exchange* indices: an exchange is a doctor turn plus the patient
answer that follows it (a final doctor-only turn is an exchange without answer).

``n`` is an int, ``"all"`` (FIRST_N only: the whole dialogue), ``"auto"`` or
``{"value": "auto", "offset": k, "window": w}``. With ``auto``
the rule is anchored at the first exchange where its precondition holds (read
cumulatively, so "the patient has mentioned both X and Y" is met at the exchange by which
both have appeared) and judged at ``anchor + offset`` (offset 1 by default, 0 = the same
exchange).

Rule sets are YAML files in ``mdd/knowledge/rules/`` (see ``psychiatric.yaml``)::

    name: psychiatric
    roles: {doctor: 医生, patient: 患者}        # optional labels used in LLM prompts
    preconditions:                              # optional named, shareable preconditions
      selfharm: {text: 患者提到自伤或自杀的想法, speaker: patient, any: [自杀, 自残]}
    rules:
      - id: "multi_turn:N_th:ask:suicide_risk_after_selfharm"
        n: {value: auto, offset: 1}
        precondition: selfharm                  # a name above, or an inline mapping
        criterion: {text: 医生评估自杀风险, speaker: doctor, any: [计划, 频率]}

A condition mapping has ``text`` (natural language, for the LLM judge), keyword hints for
the offline judge (``any``: at least one; ``all``: a list of groups, each needing one hit;
``none``: none may appear), ``speaker`` (doctor | patient | companion | any), ``scope``
(cumulative | turn: whether the hints may be satisfied across exchanges), ``answered`` (only
exchanges that have an answer count: a doctor's question, not the closing turn), and, for
preconditions only, ``meta`` (``age_min``, ``age_max``, ``gender``, ``companion``: whether a
family member is in the room, ``icd_prefix``: a list of ICD-10 prefixes, one of which a code of
the dialogue must have) with ``combine`` (all | any) saying how the metadata test and the
keyword test combine.

A rule set with ``checklist: true`` also holds one rule per item of the required-items
checklist (``mdd/knowledge/checklists.yaml``, :func:`checklist_rules`):
``multi_turn:FIRST_N:ask:required_<item>``, judged on the whole dialogue of every dialogue
whose diagnosis requires the item: some doctor question must ask it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from mdd.errors import MddError

RULES_DIR = Path(__file__).resolve().parent.parent / "knowledge" / "rules"

RULE_ID = re.compile(r"^multi_turn:(N_th|FIRST_N):(conv|ask):([A-Za-z0-9_][A-Za-z0-9_.\-]*)$")
MODES = ("N_th", "FIRST_N")
KINDS = ("conv", "ask")
SPEAKERS = ("doctor", "patient", "companion", "any")
SCOPES = ("cumulative", "turn")
DEFAULT_ROLES = {"doctor": "医生", "patient": "患者", "companion": "家属"}

_MALE = {"male", "m", "男", "男性"}
_FEMALE = {"female", "f", "女", "女性"}


class RuleError(MddError, ValueError):
    """An invalid rule or rule set; the message names the rule and the field."""


# --- rules ---------------------------------------------------------------------------------


def parse_rule_id(rule_id: str) -> tuple[str, str, str]:
    """``multi_turn:N_th:ask:name`` -> ``("N_th", "ask", "name")``; ValueError otherwise."""
    m = RULE_ID.match(rule_id or "")
    if not m:
        raise RuleError(
            f"rule {rule_id!r}: id must look like multi_turn:{{N_th|FIRST_N}}:{{conv|ask}}:{{name}}"
        )
    return m.group(1), m.group(2), m.group(3)


def normalize_gender(value: Any) -> str | None:
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in _MALE:
        return "male"
    if v in _FEMALE:
        return "female"
    return None


@dataclass(frozen=True, slots=True)
class Meta:
    """A test on the dialogue's metadata. Unknown values (age None) never satisfy it."""

    age_min: int | None = None
    age_max: int | None = None
    gender: str | None = None  # "male" | "female"
    companion: bool | None = None  # a family member is (True) / is not (False) in the room
    icd_prefix: tuple[str, ...] = ()  # one code of the dialogue must start with one of these

    def check(self, age: Any, gender: Any, companion: Any = None,
              icd_code: Any = None, age_range: Any = None) -> tuple[bool, dict[str, Any]]:
        ev: dict[str, Any] = {"age": age, "gender": gender}
        ok = True
        if self.companion is not None:
            ev["companion"] = companion
            ok = bool(companion) == self.companion
        if (self.age_min is not None or self.age_max is not None) and age_range is not None and len(age_range) == 2:
            # the published age is rounded to tens; the row's age_range (decided from the exact age, cut at
            # every age any rule or checklist item tests: age_cuts) says which side of each test it is on
            lo, hi = int(age_range[0]), int(age_range[1])
            ev["age_range"] = [lo, hi]
            ok = ok and (self.age_min is None or lo >= self.age_min) and (self.age_max is None or hi <= self.age_max)
        elif self.age_min is not None or self.age_max is not None:
            try:
                a = int(age) if age is not None else None
            except (TypeError, ValueError):
                a = None
            if a is None:
                ok = False
            else:
                ok = ok and (self.age_min is None or a >= self.age_min)
                ok = ok and (self.age_max is None or a <= self.age_max)
        if self.gender is not None:
            ok = ok and normalize_gender(gender) == self.gender
        if self.icd_prefix:
            from mdd.checklist import icd_prefixes

            ev["icd_code"] = icd_code
            ok = ok and bool(set(icd_prefixes(icd_code)) & set(self.icd_prefix))
        return ok, ev

    def describe(self) -> str:
        parts = []
        if self.age_min is not None:
            parts.append(f"age>={self.age_min}")
        if self.age_max is not None:
            parts.append(f"age<={self.age_max}")
        if self.gender is not None:
            parts.append(f"gender={self.gender}")
        if self.companion is not None:
            parts.append(f"companion={self.companion}")
        if self.icd_prefix:
            parts.append(f"icd in {'/'.join(self.icd_prefix)}")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class Condition:
    """A precondition or criterion: text for the LLM judge, keyword hints for the offline one."""

    text: str
    speaker: str = "any"
    any: tuple[str, ...] = ()
    all: tuple[tuple[str, ...], ...] = ()
    none: tuple[str, ...] = ()
    scope: str = "cumulative"
    meta: Meta | None = None
    combine: str = "all"  # how `meta` and the keyword/text test combine: all | any
    negation: bool | None = None  # ignore negated hits (没有幻听); default: on for patient speech
    answered: bool = False  # only exchanges with an answer count (a question, not the closing turn)

    @property
    def skip_negated(self) -> bool:
        return self.speaker == "patient" if self.negation is None else self.negation

    @property
    def has_text_test(self) -> bool:
        """Whether the condition tests the dialogue's text (it has keyword hints)."""
        return bool(self.any or self.all or self.none)


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    mode: str  # N_th | FIRST_N
    kind: str  # conv | ask
    name: str
    criterion: Condition
    n: int | None = None  # None when auto or all
    auto: bool = False
    whole: bool = False  # FIRST_N over the whole dialogue (n: all)
    offset: int = 1
    window: int | None = None  # FIRST_N + auto only
    precondition: Condition | None = None
    description: str = ""
    rule_set: str = ""
    roles: tuple[tuple[str, str], ...] = tuple(DEFAULT_ROLES.items())

    @property
    def role_labels(self) -> dict[str, str]:
        return dict(self.roles)

    def n_spec(self) -> Any:
        if self.whole:
            return "all"
        if not self.auto:
            return self.n
        spec: dict[str, Any] = {"value": "auto", "offset": self.offset}
        if self.window is not None:
            spec["window"] = self.window
        return spec


_COND_KEYS = {"text", "speaker", "any", "all", "none", "scope", "meta", "combine", "negation", "answered"}
_META_KEYS = {"age_min", "age_max", "gender", "companion", "icd_prefix"}
_RULE_KEYS = {"id", "n", "precondition", "criterion", "description"}
_SET_KEYS = {"name", "description", "roles", "preconditions", "rules", "checklist"}


def _str_list(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, (str, int)) and str(x).strip() for x in v):
        raise RuleError(f"{where}: expected a list of non-empty strings, got {v!r}")
    return tuple(str(x).strip() for x in v)


def _int(v: Any, where: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise RuleError(f"{where}: expected an integer >= {minimum}, got {v!r}")
    return v


def _condition(raw: Any, where: str, *, allow_meta: bool) -> Condition:
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where}: expected a mapping, got {raw!r}")
    unknown = set(raw) - _COND_KEYS
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_COND_KEYS)}")
    text = raw.get("text")
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"{where}.text: a non-empty description is required")
    speaker = raw.get("speaker", "any")
    if speaker not in SPEAKERS:
        raise RuleError(f"{where}.speaker: expected one of {SPEAKERS}, got {speaker!r}")
    scope = raw.get("scope", "cumulative")
    if scope not in SCOPES:
        raise RuleError(f"{where}.scope: expected one of {SCOPES}, got {scope!r}")
    combine = raw.get("combine", "all")
    if combine not in ("all", "any"):
        raise RuleError(f"{where}.combine: expected all or any, got {combine!r}")
    any_ = _str_list(raw.get("any"), f"{where}.any")
    none = _str_list(raw.get("none"), f"{where}.none")
    groups_raw = raw.get("all") or []
    if not isinstance(groups_raw, (list, tuple)):
        raise RuleError(f"{where}.all: expected a list of keyword groups, got {groups_raw!r}")
    all_ = tuple(_str_list(g, f"{where}.all[{i}]") for i, g in enumerate(groups_raw))
    if any(not g for g in all_):
        raise RuleError(f"{where}.all: empty keyword group")
    meta = None
    if raw.get("meta") is not None:
        if not allow_meta:
            raise RuleError(f"{where}.meta: metadata tests are allowed in preconditions only")
        m = raw["meta"]
        if not isinstance(m, Mapping) or not m:
            raise RuleError(f"{where}.meta: expected a mapping with {sorted(_META_KEYS)}")
        bad = set(m) - _META_KEYS
        if bad:
            raise RuleError(f"{where}.meta: unknown field(s) {sorted(bad)}; allowed: {sorted(_META_KEYS)}")
        gender = None
        if m.get("gender") is not None:
            gender = normalize_gender(m["gender"])
            if gender is None:
                raise RuleError(f"{where}.meta.gender: expected male/female (男/女), got {m['gender']!r}")
        companion = m.get("companion")
        if companion is not None and not isinstance(companion, bool):
            raise RuleError(f"{where}.meta.companion: expected true or false, got {companion!r}")
        meta = Meta(
            age_min=_int(m["age_min"], f"{where}.meta.age_min", 0) if m.get("age_min") is not None else None,
            age_max=_int(m["age_max"], f"{where}.meta.age_max", 0) if m.get("age_max") is not None else None,
            gender=gender,
            companion=companion,
            icd_prefix=_str_list(m.get("icd_prefix"), f"{where}.meta.icd_prefix"),
        )
    negation = raw.get("negation")
    if negation is not None and not isinstance(negation, bool):
        raise RuleError(f"{where}.negation: expected true or false, got {negation!r}")
    answered = raw.get("answered", False)
    if not isinstance(answered, bool):
        raise RuleError(f"{where}.answered: expected true or false, got {answered!r}")
    cond = Condition(
        text=text.strip(), speaker=speaker, any=any_, all=all_, none=none, scope=scope, meta=meta,
        combine=combine, negation=negation, answered=answered,
    )
    if not cond.has_text_test and meta is None:
        raise RuleError(f"{where}: needs keyword hints (any / all / none) for the offline judge")
    return cond


def _rule(raw: Any, set_name: str, named: Mapping[str, Condition], roles: tuple, pos: int) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(f"rule set {set_name!r}, rule #{pos}: expected a mapping, got {raw!r}")
    rid = raw.get("id")
    if not isinstance(rid, str):
        raise RuleError(f"rule set {set_name!r}, rule #{pos}: field 'id' is required")
    where = f"rule {rid!r}"
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise RuleError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}")
    mode, kind, name = parse_rule_id(rid)

    # n: int | "all" | "auto" | {value: auto, offset, window}
    if "n" not in raw:
        raise RuleError(f"{where}.n: required (an int, 'all', 'auto' or {{value: auto, offset: k}})")
    n_raw = raw["n"]
    auto, n, offset, window, whole = False, None, 1, None, False
    if isinstance(n_raw, Mapping):
        bad = set(n_raw) - {"value", "offset", "window"}
        if bad:
            raise RuleError(f"{where}.n: unknown field(s) {sorted(bad)}; allowed: value, offset, window")
        if n_raw.get("value") != "auto":
            raise RuleError(f"{where}.n.value: the mapping form is for auto; got {n_raw.get('value')!r}")
        auto = True
        if n_raw.get("offset") is not None:
            offset = _int(n_raw["offset"], f"{where}.n.offset", 0)
        if n_raw.get("window") is not None:
            window = _int(n_raw["window"], f"{where}.n.window", 1)
    elif n_raw == "auto":
        auto = True
    elif n_raw == "all":
        if mode != "FIRST_N":
            raise RuleError(f"{where}.n: 'all' (the whole dialogue) is for FIRST_N rules only")
        whole = True
    elif isinstance(n_raw, int) and not isinstance(n_raw, bool):
        n = _int(n_raw, f"{where}.n", 1 if mode == "FIRST_N" else 0)
    else:
        raise RuleError(f"{where}.n: expected an int, 'auto' or {{value: auto, offset: k}}, got {n_raw!r}")
    if auto and mode == "FIRST_N" and window is None:
        raise RuleError(f"{where}.n.window: FIRST_N with auto needs a window (turns after the anchor)")
    if window is not None and mode != "FIRST_N":
        raise RuleError(f"{where}.n.window: only FIRST_N rules have a window")

    pre = None
    pre_raw = raw.get("precondition")
    if isinstance(pre_raw, str):
        if pre_raw not in named:
            raise RuleError(f"{where}.precondition: unknown named precondition {pre_raw!r}; known: {sorted(named)}")
        pre = named[pre_raw]
    elif pre_raw is not None:
        pre = _condition(pre_raw, f"{where}.precondition", allow_meta=True)
    if auto and pre is None:
        raise RuleError(f"{where}.n: 'auto' needs a precondition to anchor on, and this rule has none")

    if raw.get("criterion") is None:
        raise RuleError(f"{where}.criterion: required")
    crit = _condition(raw["criterion"], f"{where}.criterion", allow_meta=False)
    if kind == "ask" and "speaker" not in raw["criterion"]:
        crit = dataclasses.replace(crit, speaker="doctor")
    desc = raw.get("description") or ""
    if not isinstance(desc, str):
        raise RuleError(f"{where}.description: expected a string")
    return Rule(
        id=rid, mode=mode, kind=kind, name=name, criterion=crit, n=n, auto=auto, offset=offset,
        window=window, precondition=pre, description=desc.strip(), rule_set=set_name, roles=roles, whole=whole,
    )


def parse_rule_set(data: Any, source: str = "<memory>") -> list[Rule]:
    """Validate one parsed YAML rule set (a mapping with ``name`` and ``rules``)."""
    if not isinstance(data, Mapping):
        raise RuleError(f"{source}: a rule set is a mapping with 'name' and 'rules'")
    unknown = set(data) - _SET_KEYS
    if unknown:
        raise RuleError(f"{source}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_SET_KEYS)}")
    set_name = str(data.get("name") or Path(source).stem)
    roles_raw = data.get("roles") or {}
    if not isinstance(roles_raw, Mapping) or set(roles_raw) - set(DEFAULT_ROLES):
        raise RuleError(f"rule set {set_name!r}.roles: expected {{doctor: label, patient: label, companion: label}}")
    roles = tuple({**DEFAULT_ROLES, **{k: str(v) for k, v in roles_raw.items()}}.items())
    named_raw = data.get("preconditions") or {}
    if not isinstance(named_raw, Mapping):
        raise RuleError(f"rule set {set_name!r}.preconditions: expected a mapping name -> condition")
    named = {
        str(k): _condition(v, f"rule set {set_name!r}.preconditions.{k}", allow_meta=True)
        for k, v in named_raw.items()
    }
    rules_raw = data.get("rules")
    if not isinstance(rules_raw, list) or not rules_raw:
        raise RuleError(f"rule set {set_name!r}.rules: expected a non-empty list")
    rules = [_rule(r, set_name, named, roles, i) for i, r in enumerate(rules_raw)]
    use_checklist = data.get("checklist", False)
    if not isinstance(use_checklist, bool):
        raise RuleError(f"rule set {set_name!r}.checklist: expected true or false, got {use_checklist!r}")
    if use_checklist:
        rules += checklist_rules(set_name, roles)
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise RuleError(f"rule {r.id!r}: duplicate id in rule set {set_name!r}")
        seen.add(r.id)
    return rules


CHECKLIST_RULE = "required_"  # name prefix of the rules made from the required-items checklist


def checklist_rules(set_name: str = "checklist", roles: tuple = tuple(DEFAULT_ROLES.items())) -> list[Rule]:
    """One rule per checklist item: for the dialogues whose diagnosis requires it (an ICD prefix
    of theirs requires it; default items: every dialogue), some doctor question of the dialogue
    must ask it (the item's keywords in one answered doctor turn)."""
    from mdd import checklist

    cl = checklist.load()
    out = []
    for item in cl.items.values():
        prefixes = cl.prefixes_requiring(item.id)
        ages = [r for r in cl.by_age if item.id in r.items]
        if item.id in cl.default:
            pre = None
        elif prefixes and not ages:
            pre = Condition(text=f"患者的诊断属于 {'、'.join(prefixes)}", meta=Meta(icd_prefix=prefixes))
        elif ages and not prefixes and len(ages) == 1:
            pre = Condition(text=f"患者{ages[0].age_min}到{ages[0].age_max}岁",
                            meta=Meta(age_min=ages[0].age_min, age_max=ages[0].age_max))
        elif not prefixes and not ages:
            continue  # no diagnosis requires it
        else:
            raise RuleError(f"checklist item {item.id!r}: required both by diagnosis and by age (or by two age "
                            "ranges); one rule cannot say that")
        out.append(Rule(
            id=f"multi_turn:FIRST_N:ask:{CHECKLIST_RULE}{item.id}", mode="FIRST_N", kind="ask",
            name=f"{CHECKLIST_RULE}{item.id}", whole=True, precondition=pre, rule_set=set_name, roles=roles,
            criterion=Condition(text=f"医生在问诊中问到：{item.label}", speaker="doctor", any=item.any,
                                all=item.all, answered=True),
            description=f"必问条目（checklists.yaml）：{item.label}",
        ))
    return out


def checklist_item(rule_name: str) -> str | None:
    """``multi_turn:FIRST_N:ask:required_sleep`` (or its name) -> ``sleep``; None for other rules."""
    name = rule_name.rsplit(":", 1)[-1]
    return name[len(CHECKLIST_RULE):] if name.startswith(CHECKLIST_RULE) else None


def _resolve_path(item: str | Path) -> Path:
    p = Path(item)
    if isinstance(item, Path) or p.suffix in (".yaml", ".yml") or len(p.parts) > 1:
        if not p.is_file():
            raise RuleError(f"rule set file not found: {p}")
        return p
    cand = RULES_DIR / f"{item}.yaml"
    if not cand.is_file():
        known = sorted(x.stem for x in RULES_DIR.glob("*.yaml"))
        raise RuleError(f"unknown rule set {item!r}; known: {known} (or give a path to a .yaml file)")
    return cand


def load_rules(names_or_paths: str | Path | Iterable[str | Path]) -> list[Rule]:
    """Load rule sets by name (``mdd/knowledge/rules/{name}.yaml``) or path, in order."""
    items = [names_or_paths] if isinstance(names_or_paths, (str, Path)) else list(names_or_paths)
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for item in items:
        path = _resolve_path(item)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise RuleError(f"{path}: invalid YAML: {e}") from e
        for r in parse_rule_set(data, str(path)):
            if r.id in seen:
                raise RuleError(f"rule {r.id!r}: defined in both {seen[r.id]!r} and {r.rule_set!r}")
            seen[r.id] = r.rule_set
            rules.append(r)
    return rules


__all__ = [
    "Condition",
    "Meta",
    "Rule",
    "RuleError",
    "checklist_item",
    "checklist_rules",
    "load_rules",
    "parse_rule_id",
    "parse_rule_set",
]
