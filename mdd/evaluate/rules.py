"""Multi-turn rule judge ("N auto"): judges the rules of :mod:`mdd.evaluate.rule_set` (their ids,
``n`` and conditions are described there) on dialogues.

Turn indices are 0-based *exchange* indices here: the judge reads a dialogue by rounds
(``mdd.record.rounds``: a doctor turn and the turns that answer it; a final doctor-only turn is a
round without answer), so exchange i is the i-th round.

With ``auto`` the rule is anchored at the first exchange where its precondition holds;
precondition anchors are computed once per (dialogue, precondition) and shared by every rule
that uses the same precondition.

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

A third speaker, the companion (``speaker = "companion"`` in the turns), answers some doctor
turns and interjects after some patient answers: both go to the exchange's ``companion`` text.
Two-speaker dialogues read as before.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from mdd.evaluate.judges import make_judge
from mdd.evaluate.rule_set import Condition, Rule, load_rules
from mdd.evaluate.rule_view import Anchor, DialogueView

log = logging.getLogger(__name__)



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
            meta_ok, mev = cond.meta.check(view.age, view.gender, view.companion, view.icd_code, view.age_range)
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
            assert rule.n is not None  # a rule has its N unless auto or over the whole dialogue
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
                assert rule.window is not None  # FIRST_N + auto has its window
                end = min(start + rule.window - 1, L - 1)
                kw["window_size"] = rule.window
                kw["truncated"] = start + rule.window > L
        elif anchor is not None and anchor.turn is not None and anchor.turn > end:  # (None: returned above)
            assert rule.precondition is not None  # the anchor is the precondition's
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
    ``age``, ``gender``, ``diagnosis``, ``icd_code``. ``rules``: from
    :func:`mdd.evaluate.rule_set.load_rules` (or rule-set names). ``judge``: a judge object from
    :func:`mdd.evaluate.judges.make_judge` (``make_judge("llm", engine_cfg)``) or the name ``"keyword"``.

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


__all__ = ["evaluate_rules", "evaluate_rules_async"]
