"""The walk in progress over the dynamic diagnostic tree, and when the interview is sufficient.

:class:`TopicAgenda`: the loop pops topics from it, grafts experience topics and opens
follow-up probes behind the current topic, and removes topics the conversation already
covered (DupDetect).

With a checklist and a length target (:meth:`TopicAgenda.for_case`) it also decides what the
interview can leave out:

- a *required* topic (one that asks a required item of the case's diagnoses, see
  :mod:`mdd.checklist`, an opened ``urgent`` probe that follows up a disclosed risk, or the
  experience graft and its first point) is always asked; DupDetect never removes it;
- an *optional* topic is asked only while the length target leaves room after the required
  topics still pending; when it does not, the optional topics with the lowest priority are
  skipped (priority: opened probes and experience points first, then the case's own modules
  and topics the case record affirms, each with a seeded jitter, so variants differ in depth);
- a follow-up question on the current topic needs the same room;
- the interview is sufficient (IsDialEnd) once no required topic is pending and the length
  target is reached or nothing is left; the hard cap ends it in any case.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from mdd import checklist
from mdd.cases import Case
from mdd.tree import (
    Topic,
    all_topics,
    attached_modules,
    build_tree,
    for_audience,
    mentions,
    promote,
    rand_visit,
)

FIRST_EXPERIENCE = "exp_1"  # the first point ParseExp grafts (mdd.tree.experience_topics)
# priority of an optional topic, before the seeded jitter (0 .. JITTER)
EXPERIENCE, PROBE, MODULE, AFFIRMED = 1.5, 2.0, 1.0, 1.0
JITTER = 1.5


class TopicAgenda:
    """The walk in progress over the dynamic diagnostic tree."""

    def __init__(self, root: Topic, rng: random.Random, *, required: Mapping[str, Iterable[str]] | None = None,
                 target: int | None = None, cap: int | None = None,
                 weight: Callable[[Topic], float] | None = None, missing: Iterable[str] = (),
                 modules: Iterable[str] = ()):
        self.pending: list[Topic] = rand_visit(root, rng)
        self.visited: list[Topic] = []
        self.skipped: list[Topic] = []  # optional topics the length target left out
        self._ids = {t.id for t in self.pending}
        self.rng = rng
        self.required = {tid: tuple(items) for tid, items in (required or {}).items()}
        self.target, self.cap = target, cap
        self.missing = tuple(missing)  # required items no topic of the case's tree asks
        self.modules = tuple(modules)  # disorder modules attached (not the always-on ones)
        self._weight = weight or (lambda t: 0.0)
        self._priority: dict[str, float] = {}

    @classmethod
    def for_case(cls, case: Case, rng: random.Random, cfg: Any = None, *, speed: str = "normal",
                 cap: int | None = None, companion: bool = False,
                 companion_knows: Callable[[Topic], bool] | None = None,
                 companion_required: Iterable[str] = ()) -> TopicAgenda:
        """The agenda for a case: its tree with the modules and required items of its diagnoses,
        as asked in this room (``companion``: a family member came along; without one, companion
        topics are dropped, except required ones, which the patient is asked; ``companion_knows``:
        which companion topics this one can speak to; ``companion_required``: topic ids always asked
        when a companion is in the room), and a length
        target (``cfg``: :class:`mdd.config.InterviewConfig`; None: no target)."""
        use = cfg is None or cfg.checklist
        plan = checklist.plan_for(case.icd_code, case.age) if use else checklist.Plan((), (), (), ())
        root = build_tree(case, plan.modules)
        present = {t.id for t in all_topics(root)}
        required: dict[str, list[str]] = {}
        missing: list[str] = []
        items = checklist.load().items
        for item in plan.items:
            tid = next((t for t in items[item].topics if t in present), None)
            if tid is None:
                missing.append(item)
            else:
                required.setdefault(tid, []).append(item)
        if companion:  # with a family member in the room its collateral history is always asked
            for tid in companion_required:  # (no checklist item: the rule set judges it on its own)
                if tid in present:
                    required.setdefault(tid, [])
        if not companion:
            root = for_audience(_ask_patient(root, set(required)), False)
        elif companion_knows is not None:  # companion topics this companion cannot speak to (a spouse on birth):
            unknown = {t.id for t in all_topics(root) if t.id in required and not companion_knows(t)}
            root = for_audience(_ask_patient(root, unknown), True, companion_knows)  # required ones to the patient
        root = promote(root, required)
        modules = [m["id"] for m in attached_modules(case, plan.modules) if not m.get("always")]
        agenda = cls(root, rng, required=required, cap=cap, weight=topic_weight(case, modules), missing=missing,
                     modules=modules)
        if cfg is not None:
            agenda.target = length_target(cfg, speed, rng, floor=1 + agenda.required_pending())
        return agenda

    def __len__(self) -> int:
        return len(self.pending)

    # --- required and optional topics ------------------------------------------------------

    def is_required(self, topic: Topic) -> bool:
        """Required: it asks a required item, it is an opened urgent probe (a disclosed risk),
        or it is the experience graft or the first point grafted from it (MDD-5k's experience
        inquiry is part of every interview)."""
        return (topic.id in self.required or topic.urgent or topic.kind == "graft"
                or topic.id == FIRST_EXPERIENCE)

    def required_pending(self) -> int:
        return sum(1 for t in self.pending if self.is_required(t))

    def priority(self, topic: Topic) -> float:
        """An optional topic's priority (fixed once drawn: the same topic keeps its rank)."""
        p = self._priority.get(topic.id)
        if p is None:
            p = self._priority[topic.id] = self._weight(topic) + JITTER * self.rng.random()
        return p

    def _limit(self) -> int | None:
        limits = [x for x in (self.target, self.cap) if x is not None]
        return min(limits) if limits else None

    def room(self, exchanges: int) -> int | None:
        """Exchanges left for optional topics and follow-ups once the pending required topics
        are asked (None: no length limit)."""
        limit = self._limit()
        return None if limit is None else limit - exchanges - self.required_pending()

    def _affordable(self, topic: Topic, exchanges: int) -> bool:
        room = self.room(exchanges)
        if room is None:
            return True
        if room <= 0:
            return False
        mine = self.priority(topic)
        ahead = sum(1 for t in self.pending if not self.is_required(t) and self.priority(t) > mine)
        return ahead < room

    def allows_followup(self, exchanges: int) -> bool:
        room = self.room(exchanges)
        return room is None or room > 0

    def finished(self, exchanges: int) -> bool:
        """IsDialEnd's clinical part: no required topic pending, and the length target reached
        or nothing left to ask; the hard cap ends the interview in any case."""
        if self.cap is not None and exchanges >= self.cap:
            return True
        if self.required_pending():
            return False
        return not self.pending or (self.target is not None and exchanges >= self.target)

    def items_asked(self, topic_ids: Iterable[str]) -> list[str]:
        """The required items the given (asked) topics cover, in checklist order."""
        asked = {i for tid in topic_ids for i in self.required.get(tid, ())}
        return [i for items in self.required.values() for i in items if i in asked]

    @property
    def required_items(self) -> list[str]:
        return [i for items in self.required.values() for i in items] + list(self.missing)

    # --- the walk -------------------------------------------------------------------------

    def next(self, exchanges: int = 0) -> Topic | None:
        """The next topic to ask: required ones always, optional ones while the length target
        leaves room for them (the others are skipped)."""
        while self.pending:
            t = self.pending.pop(0)
            if self.is_required(t) or self._affordable(t, exchanges):
                self.visited.append(t)
                return t
            self.skipped.append(t)
        return None

    def insert_next(self, topics: Iterable[Topic]) -> list[Topic]:
        """Put topics right after the current one (grafts, probes); never a topic twice."""
        new = [t for t in topics if t.id not in self._ids]
        self._ids.update(t.id for t in new)
        self.pending[0:0] = new
        return new

    def remove(self, ids: Iterable[str]) -> list[Topic]:
        """Drop pending topics the conversation already covered; required ones stay."""
        ids = set(ids)
        gone = [t for t in self.pending if t.id in ids and not self.is_required(t)]
        self.pending = [t for t in self.pending if t not in gone]
        return gone

    def upcoming_in_group(self, group: str) -> list[Topic]:
        return [t for t in self.pending if t.group == group]


def _ask_patient(node: Topic, ids: set[str]) -> Topic:
    """Required companion topics go to the patient when nobody came along."""
    if node.id in ids and node.audience == "companion":
        node = replace(node, audience="patient")
    return replace(node, children=tuple(_ask_patient(c, ids) for c in node.children),
                   probes=tuple(_ask_patient(p, ids) for p in node.probes))


def topic_weight(case: Case, modules: Iterable[str] = ()) -> Callable[[Topic], float]:
    """The priority of an optional topic before the jitter: the first experience topic, opened
    probes, topics of the case's disorder modules and topics the case record affirms first."""
    record = "。".join((case.complaint, case.present_illness, case.get("精神检查")))
    own = set(modules)
    cache: dict[str, bool] = {}

    def weight(t: Topic) -> float:
        if t.kind == "experience":
            return EXPERIENCE
        w = PROBE if t.kind == "probe" else 0.0
        if t.module in own:
            w += MODULE
        if t.id not in cache:
            cache[t.id] = bool(t.keywords) and mentions(record, t.keywords)
        return w + (AFFIRMED if cache[t.id] else 0.0)

    return weight


def length_target(cfg: Any, speed: str, rng: random.Random, floor: int = 0) -> int:
    """The length a dialogue aims at: a seeded draw around ``cfg.target_exchanges`` shifted by the
    persona's speed, and at least the opening plus the required topics (``floor``) plus a
    seeded 0..``cfg.required_slack`` exchanges (so that variants of a case with many required
    items still differ in depth), and at least ``cfg.min_exchanges``."""
    shift = {"fast": cfg.fast_shift, "slow": cfg.slow_shift}.get(speed, 0.0)
    draw = round(rng.gauss(cfg.target_exchanges + shift, cfg.target_spread))
    return max(cfg.min_exchanges, draw, floor + rng.randint(0, cfg.required_slack))


__all__ = ["TopicAgenda", "length_target", "topic_weight"]
