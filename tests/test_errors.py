"""One error base (mdd.errors.MddError) for what a user can meet, mapped to the exit code in one place."""
from __future__ import annotations

import importlib

import pytest

from mdd.errors import MddError, entry_point

USER_FACING = [
    ("mdd.config", "ConfigError"), ("mdd.cases", "CaseFileError"), ("mdd.cases.plan", "ProfileError"),
    ("mdd.cases.write", "CaseWriteError"), ("mdd.driver", "RunRefused"), ("mdd.provenance", "ProvenanceMismatch"),
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
