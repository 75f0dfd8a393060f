"""jobs.import_mdd5k on the shared MDD-5k sample (read in place, never copied)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.import_mdd5k import main
from mdd.schema import DIALOGUE, REJECT

MDD5K = Path(__file__).parents[1].parent / "shared" / "mdd5k"


def _flat(out: Path) -> int:
    return main(["--dialogues", str(MDD5K / "dialogues"), "--labels", str(MDD5K / "labels"), "--out", str(out)])


def test_flat_layout_imports_every_dialogue_once(tmp_path, capsys):
    assert _flat(tmp_path) == 0
    assert "imported 100 dialogues" in capsys.readouterr().out
    files = sorted(p.name for p in (tmp_path / "synth").glob("*.parquet"))
    assert files == ["mdd5k-00000.parquet"]
    t = pq.read_table(tmp_path / "synth")
    assert t.schema.equals(DIALOGUE, check_metadata=False)
    rows = t.to_pylist()
    ids = [r["dialogue_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 100
    r = next(r for r in rows if r["dialogue_id"] == "mdd5k-1-0")
    assert r["case_id"] == "patient_1" and r["variant"] == 0 and r["seed"] == 0
    assert (r["engine"], r["model"], r["source"]) == ("mdd5k", "released", "mdd5k")
    assert r["icd_code"] == "F32.901" and r["diagnosis"] == "抑郁状态"
    assert r["topics"] == []
    conv = json.loads((MDD5K / "dialogues" / "patient_1.json").read_text(encoding="utf-8"))[0]["conversation"]
    # imported text is de-identified: the released doctor introduces herself as 张医生 (a name with a title)
    assert "张医生" in conv[0]["doctor"]
    assert r["turns"][0] == {"speaker": "doctor", "text": conv[0]["doctor"].strip().replace("张医生", "某医生"), "topic": None,
                             "grounding": None,  # no record behind an imported turn
                             "exemplars": None}  # nor exemplars
    assert r["n_exchanges"] == sum(1 for ex in conv if ex.get("doctor") and ex.get("patient"))
    assert all(x["speaker"] in ("doctor", "patient") for x in r["turns"])
    # sorted by case number, then variant
    nums = [(int(i.split("-")[1]), int(i.split("-")[2])) for i in ids]
    assert nums == sorted(nums)
    assert not (tmp_path / "rejects.parquet").exists()


def test_rerun_replaces(tmp_path):
    assert _flat(tmp_path) == 0
    assert _flat(tmp_path) == 0
    assert pq.read_table(tmp_path / "synth").num_rows == 100


def test_released_layout_malformed_and_unlabelled(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "MDD_5k").mkdir(parents=True)
    (src / "Label").mkdir()
    for n in (1, 51):
        shutil.copy(MDD5K / "dialogues" / f"patient_{n}.json", src / "MDD_5k" / f"patient_{n}.json")
    shutil.copy(MDD5K / "labels" / "patient_1_label.json", src / "Label" / "patient_1_label.json")  # 51: no label
    (src / "MDD_5k" / "patient_7.json").write_text("{not json", encoding="utf-8")
    (src / "MDD_5k" / "patient_9.json").write_text(
        json.dumps([{"conversation": [{"doctor": "你好", "patient": "你好"}]}, {"conversation": 3}, "x"]),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert main(["--src", str(src), "--out", str(out), "--shard-size", "4"]) == 0
    assert "5 reject rows" in capsys.readouterr().out
    t = pq.read_table(out / "synth")
    assert t.num_rows == 11  # 5 + 5 + the one good record of patient_9
    assert sorted(p.name for p in (out / "synth").glob("*.parquet")) == [
        "mdd5k-00000.parquet", "mdd5k-00001.parquet", "mdd5k-00002.parquet"]
    by_id = {r["dialogue_id"]: r for r in t.to_pylist()}
    assert by_id["mdd5k-51-0"]["icd_code"] is None and by_id["mdd5k-51-0"]["diagnosis"] is None
    assert by_id["mdd5k-9-0"]["n_exchanges"] == 1
    rej = pq.read_table(out / "rejects.parquet")
    assert rej.schema.equals(REJECT, check_metadata=False)
    got = {(Path(r["source"]).name, r["position"], r["field"]) for r in rej.to_pylist()}
    assert got == {("patient_7.json", 0, "file"), ("patient_9.json", 1, "conversation"), ("patient_9.json", 2, "record"),
                   ("patient_9_label.json", 0, "label"), ("patient_51_label.json", 0, "label")}  # missing labels


def test_ids_are_normalised_and_a_second_file_of_a_case_is_a_reject(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "MDD_5k").mkdir(parents=True)
    (src / "Label").mkdir()
    shutil.copy(MDD5K / "dialogues" / "patient_1.json", src / "MDD_5k" / "patient_01.json")
    shutil.copy(MDD5K / "dialogues" / "patient_1.json", src / "MDD_5k" / "patient_1.json")
    shutil.copy(MDD5K / "dialogues" / "patient_51.json", src / "MDD_5k" / "patient_0051.json")
    for name in ("patient_1_label.json", "patient_001_label.json", "patient_51_label.json"):
        shutil.copy(MDD5K / "labels" / ("patient_51_label.json" if "51" in name else "patient_1_label.json"),
                    src / "Label" / name)
    out = tmp_path / "out"
    assert main(["--src", str(src), "--out", str(out)]) == 0
    assert "2 duplicate files" in capsys.readouterr().out
    ids = pq.read_table(out / "synth").column("dialogue_id").to_pylist()
    assert len(ids) == len(set(ids)) == 10
    assert {i.rsplit("-", 1)[0] for i in ids} == {"mdd5k-1", "mdd5k-51"}
    rej = pq.read_table(out / "rejects.parquet").to_pylist()
    assert {(Path(r["source"]).name, r["field"], r["case_id"]) for r in rej} == {
        ("patient_01.json", "file", "patient_1"), ("patient_001_label.json", "file", "patient_1")}
    assert all("duplicate" in r["reason"] and "patient_1" in r["reason"] for r in rej)


def test_missing_source(tmp_path, capsys):
    assert main(["--dialogues", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
