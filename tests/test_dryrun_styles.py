"""A speech style's dry-run behaviour is data (``styles.yaml`` ``scripted.behaviour``), not code
branches: the table is checked, and changing a style's entry changes how the dry run answers."""
from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path

import pytest

from mdd.dialogue import patient
from mdd.dialogue.dryrun import speech
from mdd.knowledge import KnowledgeError

DRYRUN = Path(speech.__file__).parent


@pytest.fixture
def book(monkeypatch):
    """Swap in a copy of the style book whose ``scripted.behaviour`` a test rewrites."""
    real = patient.style_book()

    def use(table):
        b = dataclasses.replace(real, scripted={**real.scripted, "behaviour": table})
        monkeypatch.setattr(speech, "style_book", lambda: b)
        speech.behaviour.cache_clear()

    yield use
    speech.behaviour.cache_clear()


def test_no_code_branch_names_a_style():
    for f in DRYRUN.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "style":
                raise AssertionError(f"{f.name}:{node.lineno}: a branch on the style's name")


def test_the_shipped_table_reads_as_before():
    assert speech.behaviour("terse") == speech.Behaviour(deny_bare=True, yes_short=True, shape="first_only")
    assert speech.behaviour("tearful").trails_off and speech.behaviour("irritable").tail_chance == 0.5
    assert speech.behaviour("poor_insight") == speech.Behaviour()  # not listed: plain


@pytest.mark.parametrize("table, says", [
    ({"nope": {}}, "scripted.behaviour.nope: no such style"),
    ({"terse": {"deny_bar": True}}, "scripted.behaviour.terse.deny_bar: unknown key"),
    ({"terse": {"shape": "long"}}, "scripted.behaviour.terse.shape: 'long' is none of"),
    ({"terse": {"deny_bare": "yes"}}, "scripted.behaviour.terse.deny_bare: expected bool"),
    ({"terse": {"deny_adds": "nothing_here"}}, "scripted.behaviour.terse.deny_adds: 'nothing_here' names no phrase"),
    ({"terse": {"tail_chance": 2}}, "scripted.behaviour.terse.tail_chance: expected a chance in [0, 1]"),
])
def test_a_bad_entry_names_the_style_the_key_and_why(book, table, says):
    book(table)
    with pytest.raises(KnowledgeError) as e:
        speech.behaviour("terse")
    assert says in str(e.value)


def _denial(style: str) -> str:
    ctx = {"style": style, "budget": 60, "what": "有没有听到别人听不到的声音", "question": "有没有听到别人听不到的声音？"}
    return speech.patient_answer(ctx, random.Random(3))


def test_the_data_decides_how_a_style_denies(book):
    book({})
    plain = _denial("cooperative")
    assert "听到" in plain  # a plain denial names what it denies
    book({"cooperative": {"deny_bare": True}})
    bare = _denial("cooperative")
    assert "听到" not in bare and len(bare) < len(plain)
    book({"cooperative": {"deny_adds": "irritable_no"}})
    added = _denial("cooperative")
    assert any(p in added for p in patient.style_book().scripted["irritable_no"])
