"""What each speaking agent sees of the dialogue: its own turns as assistant messages, everyone
else's as user messages, append-only (each call's prompt extends the agent's previous prompt and
its own answer, so the engine's prefix cache covers it).

With two speakers the other side's turns are bare. With a companion in the room every other
speaker's turn is labelled (医生：…, 母亲：…) and the turns between two of the agent's own turns
share one user message; the labelling is decided once per dialogue, so the views stay append-only.
"""
from __future__ import annotations

from typing import Any

from mdd.dialogue.ops import View, with_instruction
from mdd.engines.base import Message

SPEAKERS = ("doctor", "patient", "companion")


def agent_view(system: str, opening: str | None, turns: list[dict[str, Any]], instructions: dict[int, str],
               speaker: str, labels: dict[str, str] | None = None, window: int = 0,
               placement: str = "after") -> View:
    """``speaker``'s messages: ``system``, an ``opening`` stage direction, then the history (the last
    ``window`` turns; 0: all), each of its own turns preceded by the instruction it answered (placed as
    ``placement`` says: ``ops.View``)."""
    msgs: list[Message] = View([Message("system", system)] + ([Message("user", opening)] if opening else []),
                               placement)
    history = [(i, t) for i, t in enumerate(turns) if t["speaker"] in SPEAKERS]
    for i, t in history[-window:] if window else history:
        if t["speaker"] == speaker:
            if i in instructions:
                msgs = with_instruction(msgs, instructions[i])
            msgs.append(Message("assistant", t["text"]))
        elif labels is None:
            msgs.append(Message("user", t["text"]))
        else:
            line = f"{labels[t['speaker']]}：{t['text']}"
            if msgs[-1].role == "user" and len(msgs) > 1 + bool(opening):
                msgs[-1] = Message("user", f"{msgs[-1].content}\n{line}")
            else:
                msgs.append(Message("user", line))
    return View(msgs, placement)
