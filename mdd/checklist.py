"""Required items per diagnosis (``mdd/knowledge/checklists.yaml``).

One list drives asking and checking: :func:`plan_for` gives a case's required items and the
modules its diagnoses attach; the agenda (:mod:`mdd.dialogue.agenda`) asks every required
item's topic, and every item becomes a rule (:func:`mdd.evaluate.rule_set.checklist_rules`) for
the diagnoses that require it, judged by :mod:`mdd.evaluate.rules`. :func:`coverage_matrix` reports the
result as ICD prefix x item.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mdd import knowledge

_ICD_SPLIT = re.compile(r"[,，、;；/]")
CHECK_FORMS = ("any", "all")


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    label: str
    topics: tuple[str, ...]  # topic ids that ask it; the first one in the case's tree is used
    any: tuple[str, ...] = ()  # doctor keywords: one of them ...
    all: tuple[tuple[str, ...], ...] = ()  # ... or one of each group

    def check_words(self) -> tuple[str, ...]:
        return self.any + tuple(w for g in self.all for w in g)

    def asked_in(self, text: str) -> bool:
        """Whether a doctor's question asks this item (the offline rule judge's test)."""
        if self.any and not any(w in text for w in self.any):
            return False
        return all(any(w in text for w in g) for g in self.all)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    prefix: str
    label: str
    cls: str
    modules: tuple[str, ...]
    items: tuple[str, ...]  # its own items, its bundles and its class's bundles, in order
    decision: str = ""  # why no module serves it, when none does


@dataclass(frozen=True, slots=True)
class Plan:
    """What a case's diagnoses require: ICD prefixes, classes, items (in order), modules."""

    prefixes: tuple[str, ...]
    classes: tuple[str, ...]
    items: tuple[str, ...]
    modules: tuple[str, ...]
    unlisted: tuple[str, ...] = ()  # prefixes with no checklist entry (default items only)


@dataclass(frozen=True, slots=True)
class AgeRule:
    age_min: int
    age_max: int
    items: tuple[str, ...]


@dataclass(frozen=True)
class Checklist:
    items: Mapping[str, Item]
    bundles: Mapping[str, tuple[str, ...]]
    classes: Mapping[str, tuple[str, ...]]  # class -> bundles
    diagnoses: Mapping[str, Diagnosis]
    default: tuple[str, ...]
    by_age: tuple[AgeRule, ...] = ()

    def plan(self, icd_code: str, age: int | None = None) -> Plan:
        prefixes = tuple(dict.fromkeys(icd_prefixes(icd_code)))
        items: list[str] = []
        modules: list[str] = []
        classes: list[str] = []
        unlisted: list[str] = []
        for p in prefixes:
            d = self.diagnoses.get(p)
            if d is None:
                unlisted.append(p)
                continue
            classes.append(d.cls)
            items.extend(d.items)
            modules.extend(d.modules)
        items.extend(self.default)
        for rule in self.by_age:
            if age is not None and rule.age_min <= age <= rule.age_max:
                items.extend(rule.items)
        return Plan(prefixes, tuple(dict.fromkeys(classes)), tuple(dict.fromkeys(items)),
                    tuple(dict.fromkeys(modules)), tuple(unlisted))

    def prefixes_requiring(self, item: str) -> tuple[str, ...]:
        return tuple(p for p, d in self.diagnoses.items() if item in d.items)


def icd_prefixes(icd_code: str | None) -> list[str]:
    """"F32.900,F41.100" -> ["F32", "F41"]; the leading diagnosis first."""
    return [c.strip()[:3].upper() for c in _ICD_SPLIT.split(icd_code or "") if c.strip()]


def leading_prefix(icd_code: str | None) -> str:
    p = icd_prefixes(icd_code)
    return p[0] if p else ""


def _words(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(w, str) and w.strip() for w in v):
        raise knowledge.KnowledgeError(f"{where}: expected a non-empty list of words, got {v!r}")
    return tuple(w.strip() for w in v)


def parse(data: Any, source: str = "checklists.yaml") -> Checklist:
    """Validate the parsed YAML; every error names the entry and the field."""
    if not isinstance(data, dict):
        raise knowledge.KnowledgeError(f"{source}: expected a mapping with items, bundles, classes, diagnoses")
    items: dict[str, Item] = {}
    for iid, raw in (data.get("items") or {}).items():
        where = f"{source}: items.{iid}"
        if not isinstance(raw, dict) or not raw.get("label"):
            raise knowledge.KnowledgeError(f"{where}: needs a label")
        check = raw.get("check")
        if not isinstance(check, dict) or not check or set(check) - set(CHECK_FORMS):
            raise knowledge.KnowledgeError(f"{where}.check: expected {{any: [...]}} or {{all: [[...], ...]}}")
        any_ = _words(check["any"], f"{where}.check.any") if "any" in check else ()
        all_ = tuple(_words(g, f"{where}.check.all[{i}]") for i, g in enumerate(check.get("all") or []))
        items[str(iid)] = Item(str(iid), str(raw["label"]), _words(raw.get("topics"), f"{where}.topics"), any_, all_)

    def known(ids: Any, where: str) -> tuple[str, ...]:
        ids = tuple(ids or ())
        bad = [i for i in ids if i not in items]
        if bad:
            raise knowledge.KnowledgeError(f"{where}: unknown item(s) {bad}")
        return ids

    bundles = {str(b): known(v, f"{source}: bundles.{b}") for b, v in (data.get("bundles") or {}).items()}

    def expand(names: Any, where: str) -> tuple[str, ...]:
        out: list[str] = []
        for b in names or ():
            if b not in bundles:
                raise knowledge.KnowledgeError(f"{where}: unknown bundle {b!r}; known: {sorted(bundles)}")
            out.extend(bundles[b])
        return tuple(out)

    classes = {str(c): expand((v or {}).get("bundles"), f"{source}: classes.{c}.bundles")
               for c, v in (data.get("classes") or {}).items()}
    module_ids: set[Any] = {m.get("id") for m in knowledge.module_data()}  # each module file's `id`
    diagnoses: dict[str, Diagnosis] = {}
    for prefix, raw in (data.get("diagnoses") or {}).items():
        where = f"{source}: diagnoses.{prefix}"
        if not re.fullmatch(r"[A-Z]\d{2}", str(prefix)):
            raise knowledge.KnowledgeError(f"{where}: a key is a three-character ICD-10 prefix such as F32")
        if not isinstance(raw, dict) or raw.get("class") not in classes:
            raise knowledge.KnowledgeError(f"{where}.class: one of {sorted(classes)}")
        modules = tuple(raw.get("modules") or ())
        bad = [m for m in modules if m not in module_ids]
        if bad:
            raise knowledge.KnowledgeError(f"{where}.modules: unknown module(s) {bad}; known: {sorted(module_ids)}")
        decision = str(raw.get("decision") or "").strip()
        if not modules and not decision:
            raise knowledge.KnowledgeError(f"{where}: names no module, so it needs a `decision` saying why")
        own = known(raw.get("items"), f"{where}.items") + expand(raw.get("bundles"), f"{where}.bundles")
        diagnoses[str(prefix)] = Diagnosis(str(prefix), str(raw.get("label", "")), str(raw["class"]), modules,
                                           tuple(dict.fromkeys(own + classes[raw["class"]])), decision)
    by_age = []
    for i, raw in enumerate(data.get("by_age") or []):
        where = f"{source}: by_age[{i}]"
        try:
            lo, hi = int(raw.get("age_min", 0)), int(raw.get("age_max", 200))
        except (AttributeError, TypeError, ValueError) as exc:
            raise knowledge.KnowledgeError(f"{where}: age_min / age_max must be integers") from exc
        by_age.append(AgeRule(lo, hi, known(raw.get("items"), f"{where}.items")))
    return Checklist(items, bundles, classes, diagnoses, known(data.get("default"), f"{source}: default"),
                     tuple(by_age))


@lru_cache(maxsize=None)
def load() -> Checklist:
    return parse(knowledge.load_yaml("checklists.yaml"))


def plan_for(icd_code: str, age: int | None = None) -> Plan:
    return load().plan(icd_code, age)


# --- reports ------------------------------------------------------------------------------


def coverage_matrix(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """ICD prefix (of the leading diagnosis) x item: ``{"asked": k, "of": n}`` over dialogues
    whose case requires the item. ``rows`` carry ``icd_code``, ``required_items`` and
    ``items_asked`` (dialogue rows of a run)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rows:
        required = r.get("required_items")
        if required is None:
            continue
        asked = set(r.get("items_asked") or ())
        cells = out.setdefault(leading_prefix(r.get("icd_code")) or "?", {})
        for item in required:
            cell = cells.setdefault(item, {"asked": 0, "of": 0})
            cell["of"] += 1
            cell["asked"] += int(item in asked)
    return {p: dict(sorted(c.items())) for p, c in sorted(out.items())}


def missing_cells(matrix: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    """``"F32:risk_plan 4/5"`` for every cell where some dialogue did not ask the item."""
    return [f"{p}:{i} {c['asked']}/{c['of']}" for p, cells in matrix.items() for i, c in cells.items()
            if c["asked"] < c["of"]]


# --- ages: what an exact age means to the checklist and the rules --------------------------


AGE_TOP = 150


@lru_cache(maxsize=1)
def age_cuts() -> tuple[int, ...]:
    """Every age at which a test of the checklist (``by_age``) or of a rule set's ``meta`` (``age_min``,
    ``age_max`` + 1) changes its answer: the bounds of a row's ``age_range``."""
    cuts: set[int] = set()
    for r in load().by_age:
        cuts.update(x for x in (r.age_min, None if r.age_max is None else r.age_max + 1) if x is not None)
    for path in sorted((knowledge.HERE / "rules").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        cuts.update(int(x) for x in re.findall(r"age_min:\s*(\d+)", text))
        cuts.update(int(x) + 1 for x in re.findall(r"age_max:\s*(\d+)", text))
    return tuple(sorted(c for c in cuts if 0 < c < AGE_TOP))


def age_range(age: int) -> list[int]:
    """The span between two of :func:`age_cuts` that holds ``age`` (e.g. 13-17): what the rules need
    to know of an exact age that every output rounds to tens."""
    lo = max((c for c in age_cuts() if c <= age), default=0)
    hi = min((c for c in age_cuts() if c > age), default=AGE_TOP + 1) - 1
    return [lo, hi]
