"""The run's plan: its work items, how they are cut into shards, and the order they are submitted in.

- Items are planned in case order, one per (case, variant); ``synth/`` already holding a dialogue
  means it is done (resume: the run takes the missing items only).
- The missing items are cut into shards of ``shard_size``; a shard's file name is a hash of its
  dialogue ids (``shard_name``), so the same work gives the same names.
- Submission order: the run's last dialogues longest first. When the queue runs dry, the slots empty one
  by one as the last dialogues finish, and the run ends with the longest of them (the tail: the engine
  batch shrinks while the run waits). Submitting the run's last ``2 x in_flight`` dialogues
  longest-planned first (LPT, longest processing time first) makes the last ones to start the shortest,
  so the slots stay full longer and the tail is shorter. A dialogue's planned length is its agenda's
  length target, drawn from its seed before any call (:func:`mdd.dialogue.setting.plan_dialogue`). Only
  the order of submission changes: which shard holds a dialogue, and what the dialogue says, do not
  (``synth.tail_order: plan`` keeps plan order).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

from mdd.cases import Case


@dataclass(frozen=True, slots=True)
class Item:
    case_id: str
    variant: int

    @property
    def dialogue_id(self) -> str:
        from mdd.dialogue.ops import dialogue_id

        return dialogue_id(self.case_id, self.variant)


@dataclass(frozen=True)
class RunPlan:
    """A run's work: every planned item, the ones still to write (resume), and those cut into shards."""

    items: list[Item]
    todo: list[Item]
    shards: list[list[Item]]

    @property
    def already_written(self) -> int:
        return len(self.items) - len(self.todo)


def plan(cases: list[Case], variants: int, done: Iterable[str] = (), shard_size: int = 64) -> RunPlan:
    """The run's plan (pure: no I/O): one item per (case, variant) in case order; ``done``: the dialogue
    ids already in the output (their items are not run again)."""
    items = [Item(c.case_id, v) for c in cases for v in range(variants)]
    held = set(done)
    todo = [it for it in items if it.dialogue_id not in held]
    return RunPlan(items, todo, shards(todo, shard_size))


def shards(items: list[Item], size: int) -> list[list[Item]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def shard_name(ids: list[str]) -> str:
    return "part-" + hashlib.sha1("\n".join(ids).encode()).hexdigest()[:16] + ".parquet"


T = TypeVar("T")


def longest_first_tail(items: Sequence[T], length: Callable[[T], int], window: int) -> list[T]:
    """``items`` with the last ``window`` of them sorted by ``length``, longest first (stable)."""
    window = max(0, min(window, len(items)))
    head, tail = list(items[: len(items) - window]), list(items[len(items) - window:])
    return head + sorted(tail, key=lambda it: -length(it))


def submission_order(items: Sequence[Any], cases: dict[str, Any], cfg: Any, in_flight: int) -> list[Any]:
    """The run's items (``Item``) in submission order under ``cfg.tail_order`` (``cfg``: the
    synth section; ``cases``: by case id)."""
    if cfg.tail_order == "plan" or len(items) <= 1:
        return list(items)
    from mdd.dialogue import ops
    from mdd.dialogue.setting import plan_dialogue

    personas = ops.all_personas()

    def length(it: Any) -> int:
        return plan_dialogue(cases[it.case_id], it.variant, cfg.seed, cfg.dialogue, personas).target

    return longest_first_tail(items, length, 2 * in_flight)
