"""KV-aware admission (mdd/engines/vllm/admission.py): the gate's rule, learning and waking."""
from __future__ import annotations

import asyncio

import pytest

from mdd.engines.vllm.admission import AdmissionGate


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_fixed_mode_admits_everything():
    gate = AdmissionGate(100, mode="fixed", prior_tokens=1000)
    for i in range(10):
        await gate.enter(f"s{i}")
    assert gate.stats()["live_sessions"] == 10 and gate.waited == 0


async def test_kv_mode_holds_new_dialogues_until_the_cache_has_room():
    clock = Clock()
    gate = AdmissionGate(1000, mode="kv", fill=1.0, prior_tokens=300, clock=clock)
    for s in ("a", "b", "c"):  # 3 x 300 fit in 1000, a 4th does not
        await gate.enter(s)
        gate.leave(s, chain=1, tokens=100)
    fourth = asyncio.ensure_future(gate.enter("d"))
    await settle()
    assert not fourth.done() and gate.stats()["waiting_sessions"] == 1
    # a live dialogue's later calls are never held back
    await asyncio.wait_for(gate.enter("a"), 1)
    gate.leave("a", chain=1, tokens=150)
    clock.t = 10.0
    gate.end("b")
    await settle()
    assert fourth.done() and set(gate.sessions) == {"a", "c", "d"}
    assert gate.waited == 1 and gate.admitted == 4


async def test_demand_counts_every_prompt_chain_of_a_dialogue():
    gate = AdmissionGate(10_000, mode="kv", prior_tokens=100)
    await gate.enter("s")
    gate.leave("s", chain=1, tokens=400)  # the doctor's view
    await gate.enter("s")
    gate.leave("s", chain=2, tokens=300)  # the patient's view
    await gate.enter("s")
    gate.leave("s", chain=1, tokens=380)  # a verdict branching off an earlier doctor prompt
    assert gate.demand() == 700
    await gate.enter("s")
    gate.leave("s", chain=1, tokens=0)  # a failed call changes nothing
    assert gate.demand() == 700


async def test_live_demand_blocks_even_when_the_learnt_footprint_is_small():
    gate = AdmissionGate(1000, mode="kv", fill=1.0, prior_tokens=100)
    await gate.enter("big")
    gate.leave("big", chain=1, tokens=950)
    waiting = asyncio.ensure_future(gate.enter("next"))
    await settle()
    assert not waiting.done()  # 950 live + 100 expected > 1000
    gate.end("big")
    await settle()
    assert waiting.done()


async def test_footprint_is_learnt_as_a_time_average_of_finished_dialogues():
    clock = Clock()
    gate = AdmissionGate(100_000, mode="kv", prior_tokens=5000, clock=clock)
    assert gate.expected() == 5000  # the prior, before any dialogue finished
    await gate.enter("s")
    gate.leave("s", chain=1, tokens=100)  # 100 tokens for 10 s
    clock.t = 10.0
    await gate.enter("s")
    gate.leave("s", chain=1, tokens=300)  # then 300 for 10 s
    clock.t = 20.0
    gate.end("s")
    assert gate.expected() == pytest.approx(200.0)
    assert gate.stats()["mean_peak_footprint_tokens"] == 300
    assert gate.target() == int(0.9 * 100_000 / 200)
    # a dialogue that failed midway does not teach a footprint
    await gate.enter("f")
    gate.leave("f", chain=1, tokens=10)
    clock.t = 30.0
    gate.end("f", learn=False)
    assert gate.expected() == pytest.approx(200.0) and not gate.sessions


async def test_a_cancelled_waiter_leaves_no_trace_and_the_next_one_enters():
    gate = AdmissionGate(100, mode="kv", fill=1.0, prior_tokens=60)
    await gate.enter("a")
    w1 = asyncio.ensure_future(gate.enter("b"))
    w2 = asyncio.ensure_future(gate.enter("c"))
    await settle()
    w1.cancel()
    await settle()
    gate.end("a")
    await settle()
    assert w2.done() and set(gate.sessions) == {"c"}


async def test_an_empty_engine_always_admits_and_idle_sessions_expire():
    clock = Clock()
    gate = AdmissionGate(10, mode="kv", prior_tokens=1000, idle_s=60, clock=clock)
    await asyncio.wait_for(gate.enter("huge"), 1)  # nothing live: enters even if it cannot fit
    gate.leave("huge", chain=1, tokens=5)
    clock.t = 100.0  # its worker died without ending it
    await asyncio.wait_for(gate.enter("next"), 1)
    assert set(gate.sessions) == {"next"}


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="fixed.*kv"):
        AdmissionGate(10, mode="lru")
