"""CI's steps (.ci/run): install, lint, type-check, then the README's test command last; the lint and type
tools are pinned in the dev extra (which scripts/setup.sh installs) at the versions this machine runs."""
import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _steps() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_ci_installs_lints_type_checks_then_runs_the_readme_test_command():
    steps = _steps()
    assert "set -euo pipefail" in steps
    order = [s for s in steps if s in {"bash scripts/setup.sh", "ruff check mdd jobs", "mypy", "python -m pytest -q"}]
    assert order == ["bash scripts/setup.sh", "ruff check mdd jobs", "mypy", "python -m pytest -q"]
    assert steps[-1] == "python -m pytest -q"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first_block and first_block.group(1).strip().splitlines()[-1] == steps[-1]
    assert "`ruff check mdd jobs`" in readme and "`mypy`" in readme


def test_lint_and_type_tools_are_pinned_in_the_dev_extra_setup_installs():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dev = {r.name: r for r in map(Requirement, conf["project"]["optional-dependencies"]["dev"])}
    for tool in ("ruff", "mypy"):
        pins = [s for s in dev[tool].specifier if s.operator == "=="]
        assert pins, f"{tool} is not pinned in the dev extra"
        here = metadata.version(tool)
        assert pins[0].version == here, f"{tool}: pinned {pins[0].version} in the dev extra, installed here {here}"
    assert '".[cpu,dev]"' in (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    tools = conf["tool"]
    assert tools["ruff"]["line-length"] == 120 and tools["ruff"]["target-version"] == "py311"
    assert set(tools["ruff"]["lint"]["select"]) == {"E", "F", "W", "I"}
    assert tools["mypy"]["files"] == ["mdd"] and "pydantic.mypy" in tools["mypy"]["plugins"]
