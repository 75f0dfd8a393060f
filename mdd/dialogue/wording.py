"""Doctor turns that do not repeat themselves: no overused openers, empathy that is varied and not
on every turn, safe wording for questions on suicide (``mdd/knowledge/doctor_wording.yaml``)."""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from mdd import knowledge
from mdd.record.speech import opener
from mdd.tree import Topic


@lru_cache(maxsize=None)
def wording() -> dict[str, Any]:
    return knowledge.load_yaml("doctor_wording.yaml")


def overused_text() -> str:
    return "、".join(f"“{w}”" for w in wording()["overused"])


def used_openers(turns: list[dict[str, Any]]) -> list[str]:
    """The openers of this dialogue's doctor turns so far, most recent last, each once."""
    n = int(wording().get("opener_chars", 3))
    seen = [opener(t["text"], n) for t in turns if t["speaker"] == "doctor"]
    return list(dict.fromkeys(o for o in reversed(seen) if o))[::-1]


def avoid_note(turns: list[dict[str, Any]]) -> str:
    """The per-turn reminder that names the openers already used (none at the start)."""
    recent = used_openers(turns)[-int(wording().get("recent_openers", 6)):]
    return f"（前面用过的开头：{'、'.join(f'「{o}」' for o in recent)}，这次换一种。）" if recent else ""


def empathy_cue(answer: str, rng: random.Random | None = None) -> str:
    """An empathy cue when the answer shows distress ("" otherwise), its wording picked by ``rng``."""
    w = wording()["empathy"]
    hits = [d for d in w["distress"] if d in (answer or "")]
    if not hits:
        return ""
    cues = w["cues"]
    return f"患者说到了「{hits[0]}」。{cues[rng.randrange(len(cues))] if rng else cues[0]}"


def is_suicide_topic(topic: Topic | None) -> bool:
    return topic is not None and any(w in f"{topic.topic}{topic.ask}" for w in wording()["suicide"]["topics"])


def safe_note(topic: Topic | None) -> str:
    return wording()["suicide"]["note"] if is_suicide_topic(topic) else ""


def unsafe_in(text: str) -> list[str]:
    return [w for w in wording()["suicide"]["unsafe"] if w in (text or "")]
