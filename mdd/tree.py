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
from typing import Any, Iterable

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
    )


def condition_holds(when: dict[str, Any], case: Case) -> bool:
    """A node's ``when``: gender, age_min, age_max, complaint_any (referral text)."""
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
    return True


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


def build_tree(case: Case) -> Topic:
    """The symptom inquiry tree for a case: by gender x age band, modules attached, pruned."""
    data = knowledge.tree_data(case.gender, case.age_band)
    name = data.get("name", knowledge.tree_name(case.gender, case.age_band))
    root = parse_node(data["root"], name)
    for mod in knowledge.module_data():
        if not condition_holds(mod.get("when") or {}, case):
            continue
        nodes = [parse_node(n, f"modules/{mod['id']}", mod.get("audience", "patient")) for n in mod.get("nodes") or ()]
        root, ok = _attach(root, mod["attach_to"], nodes)
        if not ok:
            raise knowledge.KnowledgeError(f"module {mod['id']}: attach_to {mod['attach_to']!r} is not a node of {name}")
    pruned = _prune(root, case)
    if pruned is None:
        raise knowledge.KnowledgeError(f"{name}: no topics left for case {case.case_id}")
    return pruned


def for_audience(node: Topic, companion_present: bool) -> Topic:
    """The tree as asked in this room: without a companion, ``audience: companion`` topics (and
    groups left empty by that) are dropped; with one, every topic stays. A topic's own audience
    decides (an ``either`` topic in a companion group stays)."""
    if companion_present:
        return node

    def keep(n: Topic) -> Topic | None:
        if n.is_leaf and n.audience == "companion":
            return None
        kids = [k for c in n.children if (k := keep(c))]
        if n.children and not kids:
            return None
        return replace(n, children=tuple(kids), probes=tuple(p for p in n.probes if p.audience != "companion"))

    return keep(node) or replace(node, children=())


def rand_visit(node: Topic, rng: random.Random) -> list[Topic]:
    """RandVisit: the leaves in visiting order. Groups keep their order; leaves are shuffled."""
    order = node.order or ("fixed" if any(not c.is_leaf for c in node.children) else "random")
    children = list(node.children)
    if order == "random":
        rng.shuffle(children)
    out: list[Topic] = []
    for c in children:
        out.extend([c] if c.is_leaf else rand_visit(c, rng))
    seen: set[str] = set()
    return [t for t in out if not (t.id in seen or seen.add(t.id))]


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
