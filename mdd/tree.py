"""The dynamic diagnostic tree.

A fixed *symptom inquiry tree* (chosen by gender and age band, with per-disorder modules
attached when the referral text warrants them) plus an *experience inquiry tree* grafted at
the ``graft: experience`` point from what the patient says about their past (ParseExp).

The tree is walked by :func:`rand_visit`: parent topics in their fixed order, leaves in a
seeded random order, none twice. The walk in progress is :class:`mdd.dialogue.agenda.TopicAgenda`.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from mdd import knowledge
from mdd.cases import Case

GRAFT = "experience"
# Who a topic's question goes to: the patient (default), the companion in the room (dropped from
# the agenda when nobody came with the patient), or either (the companion when present, by chance).
AUDIENCES = ("patient", "companion", "either")


@dataclass(frozen=True, slots=True)
class Topic:
    """A node of the tree. Leaves are asked about; internal nodes group them."""

    id: str
    topic: str
    ask: str = ""
    keywords: tuple[str, ...] = ()
    case_fields: tuple[str, ...] = ()
    max_exchanges: int = 2
    children: tuple["Topic", ...] = ()
    order: str | None = None  # fixed | random; None: fixed for groups, random for leaf lists
    when: dict[str, Any] = field(default_factory=dict)
    probes: tuple["Topic", ...] = ()
    if_answer: tuple[str, ...] = ()  # for probes: opened when the answer contains any of these
    graft: str | None = None  # the graft point of the experience inquiry tree
    group: str = ""  # id of the top-level group (event, symptoms, personal, family ...)
    kind: str = "symptom"  # symptom | graft | experience | probe
    audience: str = "patient"  # patient | companion | either (see AUDIENCES)
    lay: str = ""  # what is asked, in the patient's words (else mdd/knowledge/lay_terms.yaml by id)
    anchor: str | None = None  # first | last: keeps that place inside a randomly ordered group
    after: tuple[str, ...] = ()  # sibling ids it must follow inside a randomly ordered group
    module: str = ""  # the module that attached it ("" for the tree's own topics)
    urgent: bool = False  # a probe that, once opened, is always asked (a disclosed risk is followed up)

    @property
    def is_leaf(self) -> bool:
        return not self.children


def _tuple(v: Any) -> tuple:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(v)
    return (v,)


def parse_node(data: dict[str, Any], where: str, inherit: str = "patient") -> Topic:
    """A node and its subtree; ``inherit``: the audience of the enclosing group (or module)."""
    if not isinstance(data, dict):
        raise knowledge.KnowledgeError(f"{where}: a node must be a mapping, got {data!r}")
    if "graft" in data:
        return Topic(
            id=f"graft_{data['graft']}",
            topic=data.get("topic", "近期生活事件与经历"),
            ask=data.get("ask", "最近生活中有没有发生让你困扰或难受的事情，具体经过怎样"),
            keywords=_tuple(data.get("keywords", ("事情", "发生", "经历", "压力"))),
            case_fields=_tuple(data.get("case_fields", ("现病史",))),
            max_exchanges=int(data.get("max_exchanges", 1)),
            graft=str(data["graft"]),
            kind="graft",
            anchor=data.get("anchor"),
        )
    for key in ("id", "topic"):
        if not data.get(key):
            raise knowledge.KnowledgeError(f"{where}: node without `{key}`: {data!r}")
    nid = str(data["id"])
    audience = data.get("audience", inherit)
    if audience not in AUDIENCES:
        raise knowledge.KnowledgeError(f"{where}/{nid}: audience must be one of {AUDIENCES}, got {audience!r}")
    children = tuple(parse_node(c, f"{where}/{nid}", audience) for c in data.get("children") or ())
    probes = tuple(
        replace(parse_node(p, f"{where}/{nid}/probes", audience), kind="probe") for p in data.get("probes") or ()
    )
    order = data.get("order")
    if order not in (None, "fixed", "random"):
        raise knowledge.KnowledgeError(f"{where}/{nid}: order must be fixed or random, got {order!r}")
    anchor = data.get("anchor")
    if anchor not in (None, "first", "last"):
        raise knowledge.KnowledgeError(f"{where}/{nid}: anchor must be first or last, got {anchor!r}")
    return Topic(
        id=nid,
        topic=str(data["topic"]),
        ask=str(data.get("ask", "")),
        keywords=tuple(str(k) for k in _tuple(data.get("keywords"))),
        case_fields=tuple(str(k) for k in _tuple(data.get("case_fields"))),
        max_exchanges=int(data.get("max_exchanges", 2)),
        children=children,
        order=order,
        when=dict(data.get("when") or {}),
        probes=probes,
        if_answer=tuple(str(k) for k in _tuple(data.get("if_answer"))),
        audience=audience,
        lay=str(data.get("lay", "")),
        anchor=anchor,
        after=tuple(str(k) for k in _tuple(data.get("after"))),
        urgent=bool(data.get("urgent", False)),
    )


def condition_holds(when: dict[str, Any], case: Case) -> bool:
    """A node's ``when``: gender, age_min, age_max, complaint_any (referral text), has_any (case
    fields of which one must hold something other than 无)."""
    if not when:
        return True
    if "gender" in when and when["gender"] != case.gender:
        return False
    if "age_min" in when and case.age < int(when["age_min"]):
        return False
    if "age_max" in when and case.age > int(when["age_max"]):
        return False
    words = when.get("complaint_any")
    if words and not mentions(case.complaint + "。" + case.present_illness, words):
        return False
    fields = when.get("has_any")
    return not fields or any(case.get(f).strip() not in ("", "无", "无特殊", "不详") for f in fields)


_CLAUSE_END = re.compile(r"[。；;，,！!？?\n]")
_NEGATION = re.compile(r"否认|没有|无|未|不伴|并非")


def mentions(text: str, words: Iterable[str]) -> bool:
    """Whether the text affirms any of the words: "否认幻听" does not mention 幻听."""
    for w in words:
        start = 0
        while (i := text.find(w, start)) >= 0:
            start = i + 1
            clause_start = max((m.end() for m in _CLAUSE_END.finditer(text, 0, i)), default=0)
            if not _NEGATION.search(text, clause_start, i):
                return True
    return False


def _prune(node: Topic, case: Case, group: str | None = None) -> Topic | None:
    """Drop nodes whose condition fails; stamp every node with its top-level group."""
    if not condition_holds(node.when, case):
        return None
    kids = [k for c in node.children if (k := _prune(c, case, c.id if group is None else group))]
    if node.children and not kids:
        return None
    probes = tuple(replace(p, group=group or "") for p in node.probes if condition_holds(p.when, case))
    return replace(node, children=tuple(kids), probes=probes, group=group or "")


def _attach(node: Topic, target: str, extra: Iterable[Topic]) -> tuple[Topic, bool]:
    if node.id == target:
        return replace(node, children=node.children + tuple(extra)), True
    kids, done = [], False
    for c in node.children:
        if not done:
            c, done = _attach(c, target, extra)
        kids.append(c)
    return replace(node, children=tuple(kids)), done


def _module_group(mod: dict[str, Any]) -> Topic:
    """A module's nodes as one group (its questions stay together wherever the group lands)."""
    where = f"modules/{mod['id']}"
    nodes = tuple(_stamp(parse_node(n, where, mod.get("audience", "patient")), mod["id"])
                  for n in mod.get("nodes") or ())
    group = parse_node({"id": f"module_{mod['id']}", "topic": mod.get("topic") or mod["id"],
                        "order": mod.get("order", "random"), "anchor": mod.get("anchor"),
                        "after": mod.get("after")}, where)
    return replace(group, children=nodes, module=mod["id"])


def _stamp(node: Topic, module: str) -> Topic:
    return replace(node, module=module, children=tuple(_stamp(c, module) for c in node.children),
                   probes=tuple(_stamp(p, module) for p in node.probes))


def attached_modules(case: Case, named: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The modules a case gets: ``always`` ones (their ``when`` permitting), those whose cues
    (``when``) the referral text meets, and those its diagnoses name (``named``, from the
    checklist), whatever the referral text says."""
    named = set(named)
    out = []
    for mod in knowledge.module_data():
        when = mod.get("when") or {}
        if mod["id"] in named or (condition_holds(when, case) and (mod.get("always") or when)):
            out.append(mod)
    return out


def build_tree(case: Case, modules: Iterable[str] = ()) -> Topic:
    """The symptom inquiry tree for a case: by gender x age band, modules attached (``modules``:
    those its diagnoses name in the checklist), pruned. A module node whose id the case's tree
    already asks is left out (the tree's own question stands)."""
    data = knowledge.tree_data(case.gender, case.age_band)
    name = data.get("name", knowledge.tree_name(case.gender, case.age_band))
    root = _prune(parse_node(data["root"], name), case)
    if root is None:
        raise knowledge.KnowledgeError(f"{name}: no topics left for case {case.case_id}")
    have = {t.id for t in all_topics(root)}
    for mod in attached_modules(case, modules):
        group = _module_group(mod)
        group = replace(group, children=tuple(c for c in group.children if c.id not in have))
        root, ok = _attach(root, mod["attach_to"], [group])
        if not ok:
            raise knowledge.KnowledgeError(f"module {mod['id']}: attach_to {mod['attach_to']!r} "
                                           f"is not a node of {name}")
    pruned = _prune(root, case)
    assert pruned is not None
    return pruned


def for_audience(node: Topic, companion_present: bool,
                 companion_knows: Callable[[Topic], bool] | None = None) -> Topic:
    """The tree as asked in this room: without a companion, ``audience: companion`` topics (and
    groups left empty by that) are dropped; with one, those it cannot speak to (``companion_knows``)
    are. A topic's own audience decides (an ``either`` topic in a companion group stays)."""
    if companion_present and companion_knows is None:
        return node

    def keep(n: Topic) -> Topic | None:
        if n.is_leaf and n.audience == "companion" and not (companion_present and companion_knows is not None
                                                            and companion_knows(n)):
            return None
        kids = [k for c in n.children if (k := keep(c))]
        if n.children and not kids:
            return None
        return replace(n, children=tuple(kids), probes=tuple(p for p in n.probes if keep(p)))

    return keep(node) or replace(node, children=())


def promote(node: Topic, ids: Iterable[str]) -> Topic:
    """Probes named in ``ids`` (required items) become leaves asked right after the leaf that
    holds them, in their listed order (the leaf and they form a fixed-order group, so a random
    walk of their siblings cannot separate them)."""
    ids = set(ids)
    if not ids:
        return node
    kids: list[Topic] = []
    for c in node.children:
        if c.is_leaf:
            up = tuple(replace(p, kind="symptom") for p in c.probes if p.id in ids)
            if up:
                leaf = replace(c, probes=tuple(p for p in c.probes if p.id not in ids), anchor=None)
                c = replace(c, id=f"{c.id}+", children=(leaf, *up), probes=(), order="fixed")
            kids.append(c)
        else:
            kids.append(promote(c, ids))
    return replace(node, children=tuple(kids))


def all_topics(node: Topic) -> Iterable[Topic]:
    """Every leaf and probe of a tree (depth first)."""
    if node.is_leaf:
        yield node
    for c in node.children:
        yield from all_topics(c)
    for p in node.probes:
        yield from all_topics(p)


def rand_visit(node: Topic, rng: random.Random) -> list[Topic]:
    """RandVisit: the leaves in visiting order. A group is walked in its fixed order unless it
    says ``order: random`` (a list of leaves is random by default); inside a random group,
    children anchored ``first`` or ``last`` keep that place, and a child that must come
    ``after`` some siblings moves right behind the last of them when the draw put it earlier."""
    order = node.order or ("fixed" if any(not c.is_leaf for c in node.children) else "random")
    children = list(node.children)
    if order == "random":
        free = [c for c in children if c.anchor is None]
        rng.shuffle(free)
        for c in [c for c in free if c.after]:
            ids = [x.id for x in free]
            behind = max((ids.index(a) for a in c.after if a in ids), default=-1)
            if behind > ids.index(c.id):
                free.remove(c)
                free.insert(behind, c)
        children = ([c for c in children if c.anchor == "first"] + free
                    + [c for c in children if c.anchor == "last"])
    out: list[Topic] = []
    for c in children:
        out.extend([c] if c.is_leaf else rand_visit(c, rng))
    seen: set[str] = set()
    first: list[Topic] = []  # each topic once, where it first comes
    for t in out:
        if t.id not in seen:
            seen.add(t.id)
            first.append(t)
    return first


def experience_topics(items: Iterable[str], group: str) -> list[Topic]:
    """The experience inquiry subtree (ParseExp's output) as leaves to graft."""
    out = []
    for i, text in enumerate(items):
        text = text.strip()
        if not text:
            continue
        out.append(
            Topic(
                id=f"exp_{i + 1}",
                topic=text,
                ask=f"围绕患者提到的经历「{text}」追问：发生的时间、经过、当时和现在的感受、对情绪和生活的影响",
                keywords=tuple(w for w in (text[:4], "经历", "那件事") if w),
                case_fields=("现病史",),
                max_exchanges=2,
                group=group,
                kind="experience",
            )
        )
    return out
