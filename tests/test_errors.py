"""One error base (mdd.errors.MddError) for what a user can meet, mapped to the exit code in one place."""
from __future__ import annotations

import importlib

import pytest

from mdd.errors import MddError, entry_point

USER_FACING = [
    ("mdd.config", "ConfigError"), ("mdd.cases", "CaseFileError"), ("mdd.cases.plan", "ProfileError"),
    ("mdd.cases.write", "CaseWriteError"), ("mdd.synthesize.run", "RunRefused"), ("mdd.provenance", "ProvenanceMismatch"),
    ("mdd.storage", "StorageError"), ("mdd.storage", "ShardError"), ("mdd.storage", "LockHeld"),
    ("mdd.index", "IndexDamaged"), ("mdd.dialogue.exemplars", "ExemplarError"), ("mdd.publish.export", "ExportError"),
    ("mdd.models", "ModelError"), ("mdd.knowledge", "KnowledgeError"), ("mdd.evaluate.rule_set", "RuleError"),
    ("mdd.engines.base", "EngineError"),
]


@pytest.mark.parametrize("module,name", USER_FACING)
def test_every_user_facing_error_is_an_mdd_error(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, MddError) and cls.exit_code == 2


def test_older_bases_still_catch():
    from mdd.config import ConfigError
    from mdd.storage import StorageError

    assert issubclass(ConfigError, ValueError) and issubclass(StorageError, RuntimeError)


def test_entry_point_prints_one_line_and_returns_the_code(capsys):
    class Held(MddError):
        exit_code = 2

    @entry_point("demo")
    def main(argv):
        if argv == ["bad"]:
            raise Held("OUT/.mdd.lock: held by `mdd run` (pid 7); wait with --wait")
        if argv == ["bug"]:
            raise KeyError("a bug is no user error")
        return 0

    assert main([]) == 0
    assert main(["bad"]) == 2
    assert capsys.readouterr().err == "error: OUT/.mdd.lock: held by `mdd run` (pid 7); wait with --wait\n"
    with pytest.raises(KeyError):  # a bug keeps its traceback
        main(["bug"])


def test_a_job_maps_a_config_error_to_exit_2(capsys, tmp_path):
    from jobs import report, synthesize

    bad = tmp_path / "c.yaml"
    bad.write_text("synth: {variants: 0}\n", encoding="utf-8")
    for job in (report, synthesize):
        assert job.main(["--config", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "variants" in err[0], err


def test_one_logger_hierarchy():
    """Every module logs under its own name (mdd.<room>.<module>), so `mdd` (or `mdd.evaluate`, …) sets the
    level of a whole room; no module names a logger of its own invention."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "mdd"
    named = [f"{p.relative_to(root)}: {m.group(0)}" for p in root.rglob("*.py")
             for m in re.finditer(r"getLogger\(\s*[\"'][^\"']*[\"']\s*\)", p.read_text(encoding="utf-8"))]
    assert named == [], named


def test_no_import_circle():
    """No module of mdd/ imports one that (directly or round a circle) imports it back, lazy imports included."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "mdd"

    def name(p: Path) -> str:
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    mods = {name(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mdd"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m and not m.startswith(t + ".")}
    # a package's __init__ importing its own submodules is no circle; anything else that reaches back is
    seen: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in sorted(graph[m]):
            if seen.get(t) == 1 and not t.startswith(m + ".") and not m.startswith(t + "."):
                circles.append(path[path.index(t):] + [t])
            elif t not in seen:
                visit(t, path + [t])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [m])
    assert circles == [], circles[:5]
