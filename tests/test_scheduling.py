"""Submission order (mdd/synthesize/plan.py): the run's last dialogues longest-planned first."""
from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from mdd.cases import load_cases
from mdd.config import load_config
from mdd.synthesize.plan import Item
from mdd.synthesize.plan import longest_first_tail, submission_order

REPO = Path(__file__).resolve().parent.parent


def test_only_the_tail_window_is_reordered_longest_first():
    items = list("abcdefg")
    length = {"a": 1, "b": 9, "c": 3, "d": 2, "e": 8, "f": 2, "g": 5}.__getitem__
    assert longest_first_tail(items, length, 4) == list("abc") + ["e", "g", "d", "f"]  # stable on ties
    assert longest_first_tail(items, length, 0) == items
    assert longest_first_tail(items, length, 99) == sorted(items, key=lambda x: -length(x))


def test_submission_order_keeps_the_set_and_plan_order_is_kept_on_request():
    cfg = load_config(REPO / "configs" / "local.yaml")
    cases, _ = load_cases(REPO / "data" / "cases")
    by_id = {c.case_id: c for c in cases}
    items = [Item(c.case_id, v) for c in cases for v in range(5)]
    got = submission_order(items, by_id, cfg.synth, in_flight=20)
    assert got[:-40] == items[:-40] and sorted(got[-40:], key=items.index) == items[-40:] and got != items
    plan = cfg.synth.model_copy(update={"tail_order": "plan"})
    assert submission_order(items, by_id, plan, in_flight=20) == items


def test_the_planned_length_is_the_one_the_dialogue_draws_and_predicts_its_length():
    """The plan is the dialogue's own length target (the same seeded draw), and on the scripted engine
    the planned lengths order the dialogues' actual lengths (negative control: another variant's plan)."""
    from mdd.dialogue import ops
    from mdd.dialogue.loop import Dialogue
    from mdd.dialogue.setting import plan_dialogue, setting
    from mdd.dialogue.dryrun.engine import ScriptedEngine

    cfg = load_config(REPO / "configs" / "local.yaml")
    cases, _ = load_cases(REPO / "data" / "cases")
    personas = ops.all_personas()
    planned, actual = [], []
    for case in cases[:8]:
        for v in range(3):
            persona, triple = setting(personas, case, cfg.synth.seed, v)
            d = Dialogue(case, v, cfg.synth.seed, ScriptedEngine(), cfg.synth.dialogue, persona, triple)
            row = asyncio.run(d.run())
            p = plan_dialogue(case, v, cfg.synth.seed, cfg.synth.dialogue, personas)
            assert p.target == min(d.agenda.target, cfg.synth.dialogue.max_exchanges)
            assert (p.persona, p.triple, p.style, p.companion) == (row["doctor_persona"], tuple(
                row["experience_triple"].values()), row["patient_style"], row["companion"])
            planned.append(d.agenda.target)
            actual.append(row["n_exchanges"])
    r = statistics.correlation(planned, actual)
    shuffled = planned[1:] + planned[:1]
    assert r > 0.6 and statistics.correlation(shuffled, actual) < r - 0.3, (r, planned, actual)


def test_the_run_plan_is_pure_and_resumes():
    """plan() needs no I/O: every (case, variant) in case order, the ones already written left out, the rest in
    shards whose names depend only on their ids."""
    from mdd.synthesize.plan import plan, shard_name

    cases, _ = load_cases(REPO / "data" / "cases")
    whole = plan(cases[:4], 3, shard_size=5)
    assert [(it.case_id, it.variant) for it in whole.items] == [(c.case_id, v) for c in cases[:4] for v in range(3)]
    assert whole.todo == whole.items and [len(s) for s in whole.shards] == [5, 5, 2]
    done = {it.dialogue_id for it in whole.items[:5]}
    resumed = plan(cases[:4], 3, done, shard_size=5)
    assert resumed.already_written == 5 and resumed.todo == whole.items[5:]
    assert [shard_name([it.dialogue_id for it in s]) for s in resumed.shards] == \
        [shard_name([it.dialogue_id for it in s]) for s in plan(cases[:4], 3, done, shard_size=5).shards]
