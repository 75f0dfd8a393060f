"""Provenance fingerprints: in run.json and on every shard; a rerun never mixes outputs silently."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from mdd import provenance
from mdd.config import load_config
from mdd.synthesize.run import run_synthesis

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"


def config(out: Path, cases: Path, **over):
    return load_config(ROOT / "configs" / "local.yaml", {"synth.cases": str(cases), "synth.out": str(out),
                                                         "synth.variants": 1, **over})


@pytest.fixture()
def cases(tmp_path) -> Path:
    f = tmp_path / "cases.json"
    f.write_text(json.dumps(json.loads(SAMPLES.read_text(encoding="utf-8"))[:2], ensure_ascii=False), encoding="utf-8")
    return f


def test_components_and_fingerprint(tmp_path, cases):
    cfg = config(tmp_path, cases)
    comp = provenance.components(cfg, "scripted", "scripted", "k1")
    fp = provenance.fingerprint(comp)
    assert fp == provenance.fingerprint(provenance.components(cfg, "scripted", "scripted", "k1"))
    assert len(comp["prompts"]) == len(comp["knowledge"]) == 16
    # what changes the dialogues changes the fingerprint; what only changes the speed does not
    for other in (config(tmp_path, cases, **{"synth.seed": 7}),
                  config(tmp_path, cases, **{"synth.dialogue.max_exchanges": 30}),
                  config(tmp_path, cases, **{"privacy.case_ids": "always"})):
        assert provenance.fingerprint(provenance.components(other, "scripted", "scripted", "k1")) != fp
    assert provenance.fingerprint(provenance.components(cfg, "vllm", "scripted", "k1")) != fp
    assert provenance.fingerprint(provenance.components(cfg, "scripted", "qwen", "k1")) != fp
    assert provenance.fingerprint(provenance.components(cfg, "scripted", "scripted", "k2")) != fp
    fast = config(tmp_path, cases, **{"synth.in_flight": 3, "synth.shard_size": 2, "synth.variants": 4})
    assert provenance.fingerprint(provenance.components(fast, "scripted", "scripted", "k1")) == fp


def test_rerun_with_another_seed_refuses_unless_told(ray_session, tmp_path, cases):
    out = tmp_path / "out"
    first = run_synthesis(config(out, cases), progress=False)
    assert first["counts"]["dialogues_run"] == 2
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    fp = run["provenance"]["fingerprint"]
    shards = sorted((out / "synth").glob("*.parquet"))
    assert [pq.read_schema(f).metadata[b"mdd.fingerprint"].decode() for f in shards] == [fp]
    assert json.loads(pq.read_schema(shards[0]).metadata[b"mdd.provenance"])["seed"] == 20250225

    again = run_synthesis(config(out, cases, **{"synth.variants": 2}), progress=False)  # same settings: resumes
    assert again["counts"]["dialogues_run"] == 2

    with pytest.raises(provenance.ProvenanceMismatch, match=r"seed \(20250225 -> 7\)"):
        run_synthesis(config(out, cases, **{"synth.seed": 7, "synth.variants": 3}), progress=False)
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["synthesize"]["config"]["synth"]["seed"] == 20250225  # the record still tells the truth
    assert pl.read_parquet(out / "synth" / "*.parquet").height == 4

    proc = subprocess.run([sys.executable, "-m", "jobs.synthesize", "--cases", str(cases), "--out", str(out),
                           "--seed", "7", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "seed (20250225 -> 7)" in proc.stderr and "--resume always" in proc.stderr

    with pytest.raises(provenance.ProvenanceMismatch, match="never"):
        run_synthesis(config(out, cases, **{"synth.variants": 3}), progress=False, resume="never")

    mixed = run_synthesis(config(out, cases, **{"synth.seed": 7, "synth.variants": 3}), progress=False,
                          resume="always")
    assert mixed["counts"]["dialogues_run"] == 2
    prov = json.loads((out / "run.json").read_text(encoding="utf-8"))["provenance"]
    assert prov["mixed"] is True and len(prov["history"]) == 2 and fp in prov["history"]
    by_shard = {pq.read_schema(f).metadata[b"mdd.fingerprint"].decode() for f in (out / "synth").glob("*.parquet")}
    assert by_shard == set(prov["history"])


def test_another_privacy_key_or_unknown_dialogues_refuse(ray_session, tmp_path, cases, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.delenv("MDD_PRIVACY_KEY", raising=False)
    run_synthesis(config(out, cases), progress=False)
    monkeypatch.setenv("MDD_PRIVACY_KEY", "another key")  # other case ids: resuming would duplicate cases
    with pytest.raises(provenance.ProvenanceMismatch, match="privacy.key_id"):
        run_synthesis(config(out, cases, **{"synth.variants": 2}), progress=False)

    foreign = tmp_path / "foreign"
    (foreign / "synth").mkdir(parents=True)
    pq.write_table(pq.read_table(next((out / "synth").glob("*.parquet"))).replace_schema_metadata({}),
                   foreign / "synth" / "mdd5k-00000.parquet")
    with pytest.raises(provenance.ProvenanceMismatch, match="unknown provenance"):
        run_synthesis(config(foreign, cases, **{"synth.variants": 2}), progress=False)


def test_a_moved_module_is_hashed_under_its_former_name():
    """Moving code writes no new prompt: a prompt module or a YAML file that names a moved module by its new
    name hashes as it did before the move (the fingerprint stays, a resume goes on)."""
    from mdd import provenance

    before = b"from mdd.evaluate.speech import leak_pattern  # see mdd/evaluate/speech.py\n"
    after = b"from mdd.record.speech import leak_pattern  # see mdd/record/speech.py\n"
    assert provenance._as_before(after) == before
    assert provenance._as_before(b"from mdd.record import Turn") == b"from mdd.record import Turn"


def test_the_dry_run_writer_moved_into_the_dialogue_room_keeps_the_knowledge_hash():
    """styles.yaml and doctor_wording.yaml name the dry-run writer by its new place; they hash as they did
    when it was mdd/engines/scripted{,_speech}.py (the main job's shards stay byte-identical)."""
    from mdd import provenance

    assert provenance._as_before(b"(mdd/dialogue/dryrun/speech.py; mdd/dialogue/dryrun/engine.py)") == \
        b"(mdd/engines/scripted_speech.py; mdd/engines/scripted.py)"
    for f in ("styles.yaml", "doctor_wording.yaml"):
        text = (Path(provenance.__file__).parent / "knowledge" / f).read_bytes()
        assert b"mdd/dialogue/dryrun/" in text and b"mdd/engines/scripted" not in text


def test_the_dry_run_script_is_not_in_the_knowledge_hash():
    """styles.yaml's scripted.behaviour (the dry-run engine's answer shapes, code of the engine until it became
    data) is left out of the knowledge hash like the engine's code; every other line still counts."""
    from mdd import provenance

    text = (b"styles:\n  terse: {budget: 8}\nscripted:\n  lead: {terse: []}\n  # shapes\n"
            b"  behaviour:\n    terse: {deny_bare: true}\n")
    stripped = provenance._without_key(text, "scripted", "behaviour")
    assert stripped == b"styles:\n  terse: {budget: 8}\nscripted:\n  lead: {terse: []}\n"
    other = text.replace(b"deny_bare: true", b"deny_bare: false")
    assert provenance._without_key(other, "scripted", "behaviour") == stripped
    assert provenance._without_key(text.replace(b"budget: 8", b"budget: 9"), "scripted", "behaviour") != stripped
