"""The order a run submits its dialogues in: its last dialogues longest first.

When the queue runs dry, the slots empty one by one as the last dialogues finish, and the run ends
with the longest of them (the tail: the engine batch shrinks while the run waits). Submitting the
run's last ``2 x in_flight`` dialogues longest-planned first (LPT, longest processing time first)
makes the last ones to start the shortest, so the slots stay full longer and the tail is shorter.
A dialogue's planned length is its agenda's length target, drawn from its seed before any call
(:func:`mdd.dialogue.loop.planned_exchanges`). Only the order of submission changes: which shard
holds a dialogue, and what the dialogue says, do not (``synth.tail_order: plan`` keeps plan order).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


def longest_first_tail(items: Sequence[T], length: Callable[[T], int], window: int) -> list[T]:
    """``items`` with the last ``window`` of them sorted by ``length``, longest first (stable)."""
    window = max(0, min(window, len(items)))
    head, tail = list(items[: len(items) - window]), list(items[len(items) - window:])
    return head + sorted(tail, key=lambda it: -length(it))


def submission_order(items: Sequence[Any], cases: dict[str, Any], cfg: Any, in_flight: int) -> list[Any]:
    """The run's items (``driver.Item``) in submission order under ``cfg.tail_order`` (``cfg``: the
    synth section; ``cases``: by case id)."""
    if cfg.tail_order == "plan" or len(items) <= 1:
        return list(items)
    from mdd.dialogue import ops
    from mdd.dialogue.loop import planned_exchanges

    personas = ops.all_personas()

    def length(it: Any) -> int:
        return planned_exchanges(cases[it.case_id], it.variant, cfg.seed, cfg.dialogue, personas)

    return longest_first_tail(items, length, 2 * in_flight)
