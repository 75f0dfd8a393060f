"""SIGTERM handled like Ctrl-C: the finished dialogues are written, then the job stops.

``ray job stop``, a KubeRay pod eviction and ``kill`` send SIGTERM. ``ray.init`` installs a handler
that calls ``sys.exit`` wherever the driver happens to be, so the dialogues finished since the last
shard would be lost; :func:`install` (called right after ``ray.init``) replaces it with one that raises
:class:`Terminated`, a ``KeyboardInterrupt``, which the driver already turns into "write what is
finished, then stop". :func:`exit_code` is 143 after SIGTERM (128 + 15, what shells report), else
130 (Ctrl-C).
"""
from __future__ import annotations

import signal
import threading

_received: list[int] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM received."""


def _handler(signum: int, frame: object) -> None:
    _received.append(signum)
    raise Terminated()


def install() -> None:
    """Route SIGTERM to :class:`Terminated` (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)


def exit_code() -> int:
    """143 when the interrupt was a SIGTERM, else 130."""
    return 128 + signal.SIGTERM if _received else 130
