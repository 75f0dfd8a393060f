"""One base for every error a user can meet, and the one place the entry points turn it into an exit code.

An ``MddError`` says in one line what is wrong and how to fix it (the case, field or path it concerns);
the command that meets it prints ``error: <message>`` to stderr and exits with its ``exit_code`` (2: the
input, the config or the output folder needs the user's hand), never with a traceback. Each subclass
keeps its older base too (``ConfigError`` is still a ``ValueError``, ``StorageError`` a ``RuntimeError``),
so code that catches those goes on working. Errors that stay inside the pipeline (a dialogue's guard
failure, one engine request that failed and is retried) are not ``MddError``: the run records them.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable


class MddError(Exception):
    """A user-facing error: one line, and the exit code of the command that meets it."""

    exit_code = 2


def entry_point(command: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate the ``main(argv)`` of the job ``command``: an ``MddError`` it raises is printed as
    ``error: <message>`` and the command exits with the error's code (the one place this mapping lives)."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapped(*args: Any, **kwargs: Any) -> int:
            try:
                return main(*args, **kwargs)
            except MddError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return exc.exit_code

        return wrapped

    return decorate
