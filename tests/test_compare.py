"""mdd compare on the shared MDD-5k slice (read in place), with known answers: a corpus against
itself is at distance zero, a degraded copy is far, and our dry run is farther from the corpus
than two halves of the corpus are from each other."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdd.cli import main as cli
from mdd.publish import compare as C
from mdd.schema import DIALOGUE

ROOT = Path(__file__).resolve().parents[1]
MDD5K = ROOT.parent / "shared" / "mdd5k"


@pytest.fixture(scope="module")
def corpus():
    rows, layout = C.load_dialogues(str(MDD5K))
    assert len(rows) == 100 and layout.startswith("MDD-5k")
    return rows


def write_run(out: Path, rows: list[dict]) -> Path:
    full = [{"dialogue_id": r["dialogue_id"], "case_id": r.get("case_id") or r["dialogue_id"], "variant": 0, "seed": 0,
             "turns": [{"speaker": t["speaker"], "text": t["text"], "topic": t.get("topic")} for t in r["turns"]],
             "icd_code": r.get("icd_code")} for r in rows]
    (out / "synth").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(full, schema=DIALOGUE), out / "synth" / "part-0.parquet")
    return out


def test_compare_on_the_shared_slice_prints_and_writes(tmp_path, corpus, capsys):
    """The slice against itself (as a run) through the CLI: every distance is zero."""
    out = write_run(tmp_path / "run", corpus)
    assert cli(["compare", "--out", str(out), "--reference", str(MDD5K), "--max-turns", "3000"]) == 0
    printed = capsys.readouterr().out
    for figure in ("exchanges per dialogue", "patient: chars per turn", "patient: share under 20 chars",
                   "speaker share of turns", "topic coverage", "doctor: distinct-2", "Fréchet distance"):
        assert figure in printed, figure
    report = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    d = report["distances"]
    assert d["exchanges_wasserstein"] == 0 and set(d["turn_chars_wasserstein"].values()) == {0}
    assert d["speaker_share_js"] == {"turns": 0, "chars": 0} and d["topic_coverage_js"] == 0
    assert all(v == 0 for s in d["distinct_wasserstein"].values() for v in s.values())
    assert all(v == pytest.approx(0, abs=1e-6) for v in d["frechet"].values())
    run_json = json.loads((out / "run.json").read_text(encoding="utf-8"))["compare"]
    assert run_json["distances"] == d and run_json["dialogues"] == {"run": 100, "reference": 100}
    a = report["run"]
    assert a["exchanges"]["mean"] == pytest.approx(np.mean([C.exchanges(r) for r in corpus]))
    assert 120 < a["turn_chars"]["patient"]["mean"] < 145 and a["turn_chars"]["patient"]["share_under_20"] < 0.05


def test_distances_grow_with_the_difference(corpus):
    """A negative control: patient answers replaced by fillers are far from the corpus on length,
    distinct-n and the Fréchet distance, while the other half of the corpus is near."""
    half_a, half_b = corpus[::2], corpus[1::2]
    near = C.compare(half_a, half_b, max_turns=2000)["distances"]
    filler = [{**r, "turns": [t if t["speaker"] != "patient" else {**t, "text": "嗯，是的。"} for t in r["turns"]]}
              for r in half_a]
    far = C.compare(filler, half_b, max_turns=2000)["distances"]
    assert far["turn_chars_wasserstein"]["patient"] > 100 > 10 > near["turn_chars_wasserstein"]["patient"]
    assert far["turn_chars_wasserstein"]["doctor"] == near["turn_chars_wasserstein"]["doctor"]
    assert far["frechet"]["patient"] > 3 * near["frechet"]["patient"]
    assert far["distinct_wasserstein"]["patient"]["distinct-2"] > 5 * near["distinct_wasserstein"]["patient"]["distinct-2"]
    assert far["speaker_share_js"]["chars"] > 10 * (near["speaker_share_js"]["chars"] or 1e-9)


def test_our_dry_run_against_the_corpus(tmp_path, corpus):
    """The scripted dry run is compared like any run; its exchanges are near the corpus's, its
    turn embeddings farther from the corpus than the corpus's two halves are."""
    from _evaldata import synthesize_scripted

    synthesize_scripted(tmp_path / "dry", n_cases=6, variants=2)
    report = C.run_compare(str(tmp_path / "dry"), str(MDD5K), max_turns=2000)
    near = C.compare(corpus[::2], corpus[1::2], max_turns=2000)["distances"]
    d = report["distances"]
    assert report["settings"]["reference_layout"].startswith("MDD-5k") and report["run"]["dialogues"] == 12
    assert abs(report["run"]["exchanges"]["mean"] - report["reference"]["exchanges"]["mean"]) < 0.2 * 23.4
    assert d["frechet"]["all"] > near["frechet"]["all"]
    # another run's folder is a reference too
    again = C.run_compare(str(tmp_path / "dry"), str(tmp_path / "dry"), max_turns=2000)
    assert again["settings"]["reference_layout"].startswith("run") and again["distances"]["exchanges_wasserstein"] == 0


def test_a_third_speaker_is_a_speaker():
    d = {"dialogue_id": "x", "turns": [
        {"speaker": "doctor", "text": "孩子最近睡得怎么样？"}, {"speaker": "companion", "text": "他每天很晚才睡。"},
        {"speaker": "doctor", "text": "你自己觉得呢？"}, {"speaker": "patient", "text": "还行吧。"},
        {"speaker": "companion", "text": "其实不太好。"}, {"speaker": "doctor", "text": "诊断结束。"}]}
    assert C.exchanges(d) == 2
    assert [s for s, _ in C.speaker_turns(d)] == ["doctor", "companion", "doctor", "patient", "companion"]
    m = C.measure([d], C.topic_keywords())
    assert m["speaker_share"]["turns"] == {"doctor": 0.4, "patient": 0.2, "companion": 0.4}
    report = C.compare([d], [d], max_turns=100)
    assert set(report["distances"]["turn_chars_wasserstein"]) == {"doctor", "patient", "companion"}


def test_distance_known_answers():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4000, 8)), rng.normal(size=(4000, 8))
    assert C.frechet(a, a) == pytest.approx(0, abs=1e-9)
    assert C.frechet(a, a + 2.0) == pytest.approx(8 * 4.0, rel=1e-6)  # |mu1 - mu2|^2, same covariance
    assert C.frechet(a, 3 * b) == pytest.approx(8 * (1 - 3) ** 2, rel=0.1)  # Tr(S1 + S2 - 2 (S1 S2)^1/2)
    assert C.jensen_shannon({"x": 1}, {"x": 1}) == 0 and C.jensen_shannon({"x": 1}, {"y": 1}) == pytest.approx(1)
    assert C.wasserstein([0, 0], [3, 3]) == 3
    assert C.distinct_n("好好好好", 1) == 0.25 and C.distinct_n("，。", 1) is None


def test_release_layout_is_read_in_place(tmp_path):
    """The release's own layout (MDD_5k/ + Label/), as the held-out corpus comes: links to the
    shared slice's folders, nothing copied."""
    (tmp_path / "MDD_5k").symlink_to(MDD5K / "dialogues", target_is_directory=True)
    (tmp_path / "Label").symlink_to(MDD5K / "labels", target_is_directory=True)
    rows, layout = C.load_dialogues(str(tmp_path))
    assert layout == "MDD-5k release" and len(rows) == 100 and all(r["icd_code"] for r in rows)


def test_bad_reference_is_one_line(tmp_path, corpus, capsys):
    out = write_run(tmp_path / "run", corpus[:3])
    assert cli(["compare", "--out", str(out), "--reference", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("compare: ") and "MDD-5k layout" in err and "\n" not in err
    assert cli(["compare", "--out", str(MDD5K), "--reference", str(MDD5K)]) == 2
    assert "must be a run's folder" in capsys.readouterr().err
