"""Engines register themselves by name with the options class they read (``@register_engine``); the
config checks ``engine.name`` (and ``engine.vllm.hosted``) against the registry, and ``engines/``
imports nothing of the domain."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from mdd.config import ConfigError, EngineConfig, OpenAIOptions, VLLMOptions, load_config
from mdd.engines import base
from mdd.providers import ENGINE_MODULES, load_engines

ROOT = Path(__file__).resolve().parents[1]


def test_the_built_in_engines_register_with_their_options_class():
    got = load_engines()
    assert {n: e.options for n, e in got.items() if n in ("scripted", "vllm", "openai")} == {
        "scripted": None, "vllm": VLLMOptions, "openai": OpenAIOptions}
    for name in ("scripted", "vllm", "openai"):
        assert base.engine_class(name).__module__ in ENGINE_MODULES
        assert base.engine_class(name).name == name


def test_an_unknown_engine_name_is_a_one_line_config_error_naming_the_field_and_the_known_names(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  name: nope\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "\n" not in msg and "engine.name: unknown engine 'nope'; known: openai, scripted, vllm" in msg
    proc = subprocess.run([sys.executable, "-m", "jobs.synthesize", "--config", str(f), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "engine.name: unknown engine 'nope'" in proc.stderr


def test_only_an_engine_that_reads_no_options_can_be_hosted(tmp_path):
    assert EngineConfig(name="vllm", vllm={"hosted": "scripted"}).vllm.hosted == "scripted"
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  name: vllm\n  vllm: {hosted: openai}\n")
    with pytest.raises(ConfigError, match=r"engine.vllm.hosted: unknown engine 'openai' to host; engines that read "
                                          r"no options: scripted$"):
        load_config(f)


def test_a_new_provider_is_one_decorated_class(monkeypatch):
    """A class registered under a new name is a valid ``engine.name`` and is what launch_engine starts."""
    monkeypatch.setattr(base, "_ENGINES", dict(base._ENGINES))

    @base.register_engine("echo")
    class Echo(base.EngineBase):
        name = "echo"

        @classmethod
        def launch(cls, cfg):
            e = cls()
            e.model = cfg.model
            return e

    engine = base.launch_engine(load_config(None, {"engine.name": "echo", "engine.model": "m"}).engine)
    assert isinstance(engine, Echo) and engine.model == "m"
    with pytest.raises(ValueError, match="registered twice"):
        base.register_engine("echo")(type("Other", (base.EngineBase,), {}))


def _imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return {m for m in out if m.startswith("mdd")}


def test_engines_import_nothing_of_the_domain_and_no_engine_module_imports_back():
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (ROOT / "mdd" / "engines").rglob("*.py")}
    graph = {m: _imports(p) for m, p in mods.items()}
    for m, deps in graph.items():
        bad = [d for d in deps if d.startswith(("mdd.dialogue", "mdd.evaluate", "mdd.cases", "mdd.knowledge"))]
        assert not bad, f"{m} imports {bad}"
        assert not [d for d in deps if m in graph.get(d, ())], f"{m}: an import circle"
