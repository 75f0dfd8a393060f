"""KV-aware admission: an engine takes a new dialogue only when its KV cache can hold it.

A dialogue's prompts are append-only chains (the doctor's view, the patient's view), and its
cached prefix is what makes each call cheap. Between two of its calls a dialogue holds no
running request, so vLLM's own usage figure (blocks referenced by running requests) does not
see it, but its prefix sits in the cache and is the first thing evicted when new dialogues
crowd in: then every call recomputes its whole history. A fixed number of dialogues in flight
cannot know whether they fit; this gate does:

* capacity: the engine's KV blocks × block size (vLLM reports both once the engine is up);
* demand: for every live dialogue, the sum over its prompt chains (keyed by the system prompt)
  of the longest prompt + answer seen so far: the KV its prefixes occupy;
* expected footprint: learnt from the run, the time-averaged demand of finished dialogues
  (before any has finished, a prior from the config);
* a new dialogue (a session's first call) waits until (live + 1) × expected ≤ fill × capacity and
  demand + expected ≤ fill × capacity; with nothing live it always enters.

The gate only delays first calls; a live dialogue's calls are never held back. ``mode="fixed"``
turns it off (admission is then the driver's ``in_flight``). All of it runs on the actor's event
loop; it needs no locks.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Session:
    started: float
    chains: dict[int, int] = field(default_factory=dict)  # chain key -> longest prompt + answer
    busy: int = 0  # calls in flight
    last: float = 0.0
    area: float = 0.0  # ∫ footprint dt so far
    since: float = 0.0  # when the footprint last changed

    @property
    def footprint(self) -> int:
        return sum(self.chains.values())


class AdmissionGate:
    """See the module docstring. ``clock`` is injectable for tests."""

    def __init__(self, capacity_tokens: int, *, mode: str = "fixed", fill: float = 0.9,
                 prior_tokens: int = 4096, window: int = 200, idle_s: float = 300.0,
                 clock: Any = time.monotonic) -> None:
        if mode not in ("fixed", "kv"):
            raise ValueError(f"admission mode must be 'fixed' or 'kv', got {mode!r}")
        self.capacity = max(1, int(capacity_tokens))
        self.mode = mode
        self.fill = float(fill)
        self.prior = max(1, int(prior_tokens))
        self.idle_s = idle_s
        self.clock = clock
        self.sessions: dict[str, _Session] = {}
        self.learnt: deque[float] = deque(maxlen=window)  # time-averaged footprints of finished dialogues
        self.peaks: deque[int] = deque(maxlen=window)
        self.waiters: deque[tuple[str, asyncio.Future[None]]] = deque()
        self.admitted = 0
        self.waited = 0
        self.wait_s = 0.0

    # ---- what the gate knows ------------------------------------------------------------
    def demand(self) -> int:
        return sum(s.footprint for s in self.sessions.values())

    def expected(self) -> float:
        return sum(self.learnt) / len(self.learnt) if self.learnt else float(self.prior)

    def room(self) -> bool:
        """Whether a new dialogue may enter now."""
        if self.mode == "fixed" or not self.sessions:
            return True
        budget = self.fill * self.capacity
        exp = self.expected()
        return (len(self.sessions) + 1) * exp <= budget and self.demand() + exp <= budget

    def target(self) -> int:
        """Dialogues the cache holds at the learnt footprint (what ``kv`` admission steers to)."""
        return max(1, int(self.fill * self.capacity / self.expected()))

    # ---- the call path ----------------------------------------------------------------------
    async def enter(self, session: str) -> None:
        """Before a call of ``session``: a new session waits for room; a live one goes on."""
        now = self.clock()
        if not session:
            return
        s = self.sessions.get(session)
        if s is None:
            self._expire(now)
            if self.waiters or not self.room():
                self.waited += 1
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.waiters.append((session, fut))
                try:
                    await fut  # _wake admits the session before it resolves this
                except BaseException:
                    if not fut.done():
                        fut.cancel()
                    self._wake()
                    raise
                self.wait_s += self.clock() - now
            else:
                self._admit(session, now)
            s = self.sessions[session]
        s.busy += 1
        s.last = self.clock()

    def _admit(self, session: str, now: float) -> None:
        self.sessions[session] = _Session(started=now, since=now, last=now)
        self.admitted += 1

    def leave(self, session: str, chain: int, tokens: int) -> None:
        """After a call of ``session`` on prompt chain ``chain`` that held ``tokens`` (prompt + answer);
        ``tokens`` 0 for a call that failed."""
        s = self.sessions.get(session) if session else None
        if s is None:
            return
        now = self.clock()
        s.busy = max(0, s.busy - 1)
        s.last = now
        if tokens > s.chains.get(chain, 0):
            s.area += s.footprint * (now - s.since)
            s.since = now
            s.chains[chain] = tokens
        self._wake()

    def end(self, session: str, learn: bool = True) -> None:
        """The dialogue is over: its room is freed and, if it finished (``learn``), its footprint
        is learnt (a dialogue that failed midway would teach too small a one)."""
        s = self.sessions.pop(session, None)
        if s is None:
            return
        now = self.clock()
        life = now - s.started
        if learn and s.footprint:
            area = s.area + s.footprint * (now - s.since)
            self.learnt.append(area / life if life > 0 else float(s.footprint))
            self.peaks.append(s.footprint)
        self._wake()

    def _expire(self, now: float) -> None:
        """Drop sessions idle for ``idle_s`` with nothing in flight (a worker that died never ends them)."""
        stale = [k for k, s in self.sessions.items() if not s.busy and now - s.last > self.idle_s]
        for k in stale:
            del self.sessions[k]

    def _wake(self) -> None:
        """Admit waiting sessions, first come first served, while there is room."""
        while self.waiters and self.room():
            session, fut = self.waiters.popleft()
            if fut.done():  # its caller gave up
                continue
            self._admit(session, self.clock())
            fut.set_result(None)

    def stats(self) -> dict[str, Any]:
        return {
            "admission": self.mode,
            "kv_capacity_tokens": self.capacity,
            "kv_demand_tokens": self.demand(),
            "live_sessions": len(self.sessions),
            "waiting_sessions": len(self.waiters),
            "expected_footprint_tokens": round(self.expected(), 1),
            "footprint_learnt_from": len(self.learnt),
            "mean_peak_footprint_tokens": round(sum(self.peaks) / len(self.peaks), 1) if self.peaks else None,
            "admission_target": self.target(),
            "sessions_admitted": self.admitted,
            "sessions_waited": self.waited,
            "admission_wait_s": round(self.wait_s, 3),
        }
