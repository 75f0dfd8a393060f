"""Multi-turn rule judge ("N auto").

A rule says *what the doctor should do at which turn*. Its id is
``multi_turn:{N_th|FIRST_N}:{conv|ask}:{name}``:

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
exchange). Precondition anchors are computed once per (dialogue, precondition) and shared
by every rule that uses the same precondition.

Outcomes (one row per dialogue x rule, columns of :data:`mdd.schema.RULE_RESULT`):

* precondition never met        -> ``triggered=False, score=None`` (logged at warning level)
* N (or the window) past the end -> ``triggered=False, score=None``
* otherwise                      -> ``triggered=True, score=1.0`` (pass) or ``0.0`` (fail)

A rule whose precondition fails is never counted as passed. ``kwargs`` is a JSON string
with the evidence (resolved N, anchor, offset, window, matched turn, keywords or judge
answer); ``reason`` says in words what happened.

Row column ``n``: the resolved exchange index; for ``N_th`` the judged exchange, for
``FIRST_N`` the last exchange of the (clipped) window; null when the rule was skipped
before N could be resolved (precondition never met).

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

A third speaker, the companion (``speaker = "companion"`` in the turns), answers some doctor
turns and interjects after some patient answers: both go to the exchange's ``companion`` text.
Two-speaker dialogues read as before.

A rule set with ``checklist: true`` also holds one rule per item of the required-items
checklist (``mdd/knowledge/checklists.yaml``, :func:`checklist_rules`):
``multi_turn:FIRST_N:ask:required_<item>``, judged on the whole dialogue of every dialogue
whose diagnosis requires the item: some doctor question must ask it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

log = logging.getLogger(__name__)

RULES_DIR = Path(__file__).resolve().parent.parent / "knowledge" / "rules"

RULE_ID = re.compile(r"^multi_turn:(N_th|FIRST_N):(conv|ask):([A-Za-z0-9_][A-Za-z0-9_.\-]*)$")
MODES = ("N_th", "FIRST_N")
KINDS = ("conv", "ask")
SPEAKERS = ("doctor", "patient", "companion", "any")
SCOPES = ("cumulative", "turn")
DEFAULT_ROLES = {"doctor": "医生", "patient": "患者", "companion": "家属"}

_DOCTOR = {"doctor", "bot", "assistant", "医生", "助手"}
_PATIENT = {"patient", "user", "患者", "用户"}
_COMPANION = {"companion", "家属", "陪同者"}
_MALE = {"male", "m", "男", "男性"}
_FEMALE = {"female", "f", "女", "女性"}


class RuleError(ValueError):
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
              icd_code: Any = None) -> tuple[bool, dict[str, Any]]:
        ev: dict[str, Any] = {"age": age, "gender": gender}
        ok = True
        if self.companion is not None:
            ev["companion"] = companion
            ok = bool(companion) == self.companion
        if self.age_min is not None or self.age_max is not None:
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


# --- dialogues -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Exchange:
    index: int
    doctor: str
    patient: str | None  # None: a doctor turn without answer (e.g. the final diagnosis)
    companion: str | None = None  # what the family member in the room said in this exchange


@dataclass(frozen=True)
class DialogueView:
    """A dialogue as 0-based exchanges, with the metadata preconditions may test."""

    dialogue_id: str
    exchanges: tuple[Exchange, ...]
    age: Any = None
    gender: Any = None
    diagnosis: str | None = None
    icd_code: str | None = None
    companion: str | None = None  # the companion's relation (母亲, 丈夫 …); None: the patient came alone

    def __len__(self) -> int:
        return len(self.exchanges)

    def text(self, i: int, speaker: str) -> str:
        """The text of ``speaker`` (doctor | patient | companion | any) in exchange ``i``."""
        ex = self.exchanges[i]
        if speaker == "doctor":
            return ex.doctor
        if speaker == "patient":
            return ex.patient or ""
        if speaker == "companion":
            return ex.companion or ""
        return "\n".join(t for t in (ex.doctor, ex.patient or "", ex.companion) if t is not None)

    def upto(self, i: int, speaker: str) -> str:
        """The text of ``speaker`` in exchanges ``0..i`` (cumulative)."""
        return "\n".join(self.text(j, speaker) for j in range(i + 1))

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], position: int = 0) -> "DialogueView":
        did = str(rec.get("dialogue_id") if rec.get("dialogue_id") is not None else f"#{position}")
        turns = rec.get("turns")
        if turns is None:
            raise ValueError(f"dialogue {did!r}: field 'turns' is missing")
        exchanges: list[list] = []  # [doctor, patient|None, companion|None]
        for k, t in enumerate(list(turns)):
            spk = str(t.get("speaker", "")).strip().lower()
            text = str(t.get("text") or "")
            if spk in _DOCTOR:
                exchanges.append([text, None, None])
                continue
            slot = 1 if spk in _PATIENT else 2 if spk in _COMPANION else None
            if slot is None:
                raise ValueError(f"dialogue {did!r}: turn {k} has unknown speaker {t.get('speaker')!r}")
            if not exchanges:
                exchanges.append(["", None, None])  # the patient (or companion) spoke first
            ex = exchanges[-1]
            ex[slot] = text if ex[slot] is None else ex[slot] + "\n" + text  # two turns in a row
        return cls(
            dialogue_id=did,
            exchanges=tuple(Exchange(i, d, p, c) for i, (d, p, c) in enumerate(exchanges)),
            age=rec.get("age"),
            gender=rec.get("gender"),
            diagnosis=rec.get("diagnosis"),
            icd_code=rec.get("icd_code"),
            companion=rec.get("companion"),
        )


_NEG_CUES = ("没有", "没", "不", "无", "从未", "未曾", "并未", "否认")
_QUESTION_FORMS = ("有没有", "是不是", "会不会", "能不能", "要不要", "有无", "是否")
_CLAUSE_END = set("，。！？；：,.!?;:\n")
_NEG_WINDOW = 12


def _negated_at(text: str, pos: int, length: int) -> bool:
    """Whether the hit ``text[pos:pos+length]`` is negated: a cue (没有, 不, 从未...) in the
    same clause within a few characters on either side (``没有幻听``, ``幻听倒是没有遇到过``),
    question forms (有没有, 是不是) excepted. A heuristic for the offline judge."""
    lo, hi = pos, pos + length
    while lo > 0 and pos - lo < _NEG_WINDOW and text[lo - 1] not in _CLAUSE_END:
        lo -= 1
    while hi < len(text) and hi - (pos + length) < _NEG_WINDOW and text[hi] not in _CLAUSE_END:
        hi += 1
    context = text[lo:pos] + " " + text[pos + length:hi]
    for q in _QUESTION_FORMS:
        context = context.replace(q, " ")
    return any(c in context for c in _NEG_CUES)


def _hit(text: str, kw: str, skip_negated: bool) -> bool:
    """Whether ``kw`` occurs in ``text`` (lower-cased), at least once not negated if asked."""
    k = kw.lower()
    start = text.find(k)
    while start >= 0:
        if not (skip_negated and _negated_at(text, start, len(k))):
            return True
        start = text.find(k, start + 1)
    return False


@dataclass(frozen=True, slots=True)
class Hits:
    """Keyword hits of a condition on some text. Hits on a concatenation are the union of the
    hits on its parts (keywords never span exchanges), so cumulative tests add up ``Hits``."""

    any: frozenset[str] = frozenset()
    all: tuple[frozenset[str], ...] = ()
    none: frozenset[str] = frozenset()

    def __or__(self, other: "Hits") -> "Hits":
        groups = other.all if not self.all else tuple(a | b for a, b in zip(self.all, other.all))
        return Hits(self.any | other.any, groups, self.none | other.none)


def keyword_hits(cond: Condition, text: str) -> Hits:
    low = text.lower()
    neg = cond.skip_negated
    return Hits(
        frozenset(k for k in cond.any if _hit(low, k, neg)),
        tuple(frozenset(k for k in g if _hit(low, k, neg)) for g in cond.all),
        frozenset(k for k in cond.none if k.lower() in low),
    )


def decide(cond: Condition, hits: Hits) -> tuple[bool, dict[str, Any]]:
    """``any`` needs one hit, every ``all`` group one hit each, ``none`` no hit."""
    groups = hits.all or tuple(frozenset() for _ in cond.all)
    ok = (not cond.any or bool(hits.any)) and all(groups) and not hits.none
    ev: dict[str, Any] = {}
    if cond.any:
        ev["matched_any"] = [k for k in cond.any if k in hits.any]
    if cond.all:
        ev["matched_all"] = [[k for k in g if k in h] for g, h in zip(cond.all, groups)]
    if cond.none:
        ev["forbidden_found"] = [k for k in cond.none if k in hits.none]
    return ok, ev


def match_keywords(cond: Condition, text: str) -> tuple[bool, dict[str, Any]]:
    """The offline test on one text: ``any`` (one hit), every ``all`` group (one hit each),
    no ``none`` hit.

    With ``cond.skip_negated`` (default for patient speech) a positive hit only counts when
    some occurrence is not negated (``没有幻听`` is not a mention of hallucinations); ``none``
    hits always count.
    """
    return decide(cond, keyword_hits(cond, text))


# --- verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where a precondition's text test first holds (``turn`` None: never)."""

    turn: int | None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    turn: int | None = None  # the exchange where the criterion held, when known
    evidence: dict[str, Any] = field(default_factory=dict)


# --- evaluation ----------------------------------------------------------------------------


class _Run:
    """One evaluation: the precondition cache and the per-rule logic."""

    def __init__(self, judge: Any):
        self.judge = judge
        self.anchors: dict[tuple[int, Condition], asyncio.Task] = {}
        self.warned: set[str] = set()  # one warning per rule and call; the rest at debug level

    async def _precondition(self, view: DialogueView, cond: Condition, rule: Rule) -> Anchor:
        ev: dict[str, Any] = {}
        if cond.meta is not None:
            meta_ok, mev = cond.meta.check(view.age, view.gender, view.companion, view.icd_code)
            ev["meta"] = {**mev, "test": cond.meta.describe(), "ok": meta_ok}
            if meta_ok and (cond.combine == "any" or not cond.has_text_test):
                return Anchor(0, {**ev, "source": "meta"})
            if not meta_ok and (cond.combine == "all" or not cond.has_text_test):
                return Anchor(None, {**ev, "source": "meta"})
        a = await self.judge.find_anchor(view, cond, rule)
        return Anchor(a.turn, {**ev, **a.evidence, "source": "text"})

    def precondition(self, pos: int, view: DialogueView, cond: Condition, rule: Rule) -> "asyncio.Task[Anchor]":
        key = (pos, cond)
        task = self.anchors.get(key)
        if task is None:
            task = asyncio.ensure_future(self._precondition(view, cond, rule))
            self.anchors[key] = task
        return task

    async def evaluate(self, pos: int, view: DialogueView, rule: Rule) -> dict[str, Any]:
        L = len(view)
        kw: dict[str, Any] = {"mode": rule.mode, "kind": rule.kind, "n_spec": rule.n_spec(), "n_exchanges": L}

        def row(n: int | None, triggered: bool, score: float | None, reason: str) -> dict[str, Any]:
            return {
                "dialogue_id": view.dialogue_id,
                "rule": rule.id,
                "n": n,
                "triggered": triggered,
                "score": score,
                "kwargs": json.dumps(kw, ensure_ascii=False, sort_keys=True, default=str),
                "reason": reason,
            }

        def skip(n: int | None, reason: str, warn: bool = False) -> dict[str, Any]:
            kw["skipped"] = True
            if warn:
                first = rule.id not in self.warned
                self.warned.add(rule.id)
                # INFO: the driver's summary warns once per rule with the count (shard workers would print
                # one line per rule and shard, after the summary)
                log.log(logging.INFO if first else logging.DEBUG, "rule %s skipped on dialogue %s: %s%s", rule.id,
                        view.dialogue_id, reason, " (more such skips in this batch: debug level)" if first else "")
            return row(n, False, None, reason)

        if L == 0:
            return skip(None, "the dialogue has no exchanges")

        # 1. the judged range [start, end], before the precondition where possible (it costs a call)
        if rule.whole:
            start, end = 0, L - 1
        elif not rule.auto:
            if rule.mode == "N_th":
                start = end = rule.n
                if start >= L:
                    kw["resolved_n"] = start
                    return skip(start, f"N={start} is beyond the dialogue ({L} exchanges, last index {L - 1})")
            else:
                start, end = 0, min(rule.n, L) - 1
                kw["truncated"] = rule.n > L

        anchor = None
        if rule.precondition is not None:
            anchor = await self.precondition(pos, view, rule.precondition, rule)
            kw["precondition"] = rule.precondition.text
            kw["precondition_evidence"] = anchor.evidence
            kw["anchor"] = anchor.turn
            if anchor.turn is None:
                # a rule that does not apply to this dialogue's metadata is not worth a warning
                applies = rule.precondition.has_text_test or rule.precondition.meta is None
                return skip(None, f"precondition never met: {rule.precondition.text}", warn=applies)

        if rule.auto:
            assert anchor is not None and anchor.turn is not None
            start = anchor.turn + rule.offset
            kw["offset"] = rule.offset
            kw["resolved_n"] = start
            if start >= L:
                return skip(
                    start,
                    f"precondition met at turn {anchor.turn}; turn {anchor.turn}+{rule.offset}={start} "
                    f"is beyond the dialogue ({L} exchanges)",
                )
            if rule.mode == "N_th":
                end = start
            else:
                end = min(start + rule.window - 1, L - 1)
                kw["window_size"] = rule.window
                kw["truncated"] = start + rule.window > L
        elif anchor is not None and anchor.turn > end:
            return skip(
                end,
                f"precondition first met at turn {anchor.turn}, after the judged turn(s) {start}..{end}: "
                f"{rule.precondition.text}",
                warn=True,
            )

        kw["window"] = [start, end]
        n = start if rule.mode == "N_th" else end
        kw["resolved_n"] = n
        verdict = await self.judge.check(view, rule.criterion, rule, start, end)
        kw["matched_turn"] = verdict.turn
        kw["evidence"] = verdict.evidence
        where = f"turn {start}" if start == end else f"turns {start}..{end}"
        if verdict.ok:
            at = f" (at turn {verdict.turn})" if verdict.turn is not None and start != end else ""
            reason = f"passed at {where}{at}: {rule.criterion.text}"
        else:
            reason = f"failed at {where}: {rule.criterion.text}"
        if anchor is not None and rule.auto:
            reason = f"precondition met at turn {anchor.turn}; " + reason
        return row(n, True, 1.0 if verdict.ok else 0.0, reason)


async def evaluate_rules_async(
    dialogues: Sequence[Mapping[str, Any]], rules: Sequence[Rule], judge: Any = "keyword"
) -> list[dict[str, Any]]:
    """The async core of :func:`evaluate_rules`: every call of the batch is gathered at once
    (the LLM judge bounds how many reach the engine concurrently)."""
    if isinstance(judge, str):
        from mdd.evaluate.judges import make_judge

        judge = make_judge(judge)
    rules = _as_rules(rules)
    views = [d if isinstance(d, DialogueView) else DialogueView.from_record(d, i) for i, d in enumerate(dialogues)]
    run = _Run(judge)
    coros = [run.evaluate(pos, v, r) for pos, v in enumerate(views) for r in rules]
    try:
        return list(await asyncio.gather(*coros))
    finally:
        for t in run.anchors.values():
            if not t.done():
                t.cancel()


def evaluate_rules(
    dialogues: Sequence[Mapping[str, Any]], rules: Sequence[Rule] | str | Sequence[str], judge: Any = "keyword"
) -> list[dict[str, Any]]:
    """Judge every rule on every dialogue; rows in RULE_RESULT columns, dialogue-major order
    (for each dialogue in input order, one row per rule in rule order).

    ``dialogues``: dicts with ``dialogue_id``, ``turns`` (``[{speaker, text, topic}]``),
    ``age``, ``gender``, ``diagnosis``, ``icd_code``. ``rules``: from :func:`load_rules` (or
    rule-set names). ``judge``: a judge object from :func:`mdd.evaluate.judges.make_judge`
    (``make_judge("llm", engine_cfg)``) or the name ``"keyword"``.

    Synchronous: runs the async core with ``asyncio.run``; called from inside a running
    event loop it runs it on a helper thread (prefer ``await evaluate_rules_async`` there).
    """
    coro = evaluate_rules_async(dialogues, _as_rules(rules), judge)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def _as_rules(rules: Any) -> list[Rule]:
    if isinstance(rules, (str, Path)):
        return load_rules(rules)
    rules = list(rules)
    if rules and all(isinstance(r, (str, Path)) for r in rules):
        return load_rules(rules)
    if not all(isinstance(r, Rule) for r in rules):
        raise TypeError("evaluate_rules: `rules` must be Rule objects (see load_rules) or rule-set names")
    return rules


__all__ = [
    "Anchor",
    "Condition",
    "DialogueView",
    "Exchange",
    "Meta",
    "Rule",
    "RuleError",
    "Verdict",
    "evaluate_rules",
    "evaluate_rules_async",
    "checklist_item",
    "checklist_rules",
    "load_rules",
    "decide",
    "keyword_hits",
    "match_keywords",
    "parse_rule_id",
    "parse_rule_set",
]
