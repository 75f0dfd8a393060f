"""The walk in progress over the dynamic diagnostic tree.

:class:`TopicAgenda`: the loop pops topics from it, grafts experience topics and opens
follow-up probes behind the current topic, and removes topics the conversation already
covered (DupDetect).
"""
from __future__ import annotations

import random
from typing import Iterable

from mdd.tree import Topic, rand_visit


class TopicAgenda:
    """The walk in progress over the dynamic diagnostic tree."""

    def __init__(self, root: Topic, rng: random.Random):
        self.pending: list[Topic] = rand_visit(root, rng)
        self.visited: list[Topic] = []
        self._ids = {t.id for t in self.pending}

    def __len__(self) -> int:
        return len(self.pending)

    def next(self) -> Topic | None:
        if not self.pending:
            return None
        t = self.pending.pop(0)
        self.visited.append(t)
        return t

    def insert_next(self, topics: Iterable[Topic]) -> list[Topic]:
        """Put topics right after the current one (grafts, probes); never a topic twice."""
        new = [t for t in topics if t.id not in self._ids]
        self._ids.update(t.id for t in new)
        self.pending[0:0] = new
        return new

    def remove(self, ids: Iterable[str]) -> list[Topic]:
        ids = set(ids)
        gone = [t for t in self.pending if t.id in ids]
        self.pending = [t for t in self.pending if t.id not in ids]
        return gone

    def upcoming_in_group(self, group: str) -> list[Topic]:
        return [t for t in self.pending if t.group == group]
