"""FAISS index of high-quality QA pairs (built without Ray from the shared MDD-5k dialogues)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.search import main as search_main
from mdd.evaluate.embedders import make_embedder
from mdd.evaluate.quality import QualityScorer
from mdd.index import build_index, index_vectors, qa_text, search
from mdd.schema import QA_SIDECAR

MDD5K = Path(__file__).parents[1].parent / "shared" / "mdd5k"


@pytest.fixture(scope="module")
def hq_rows() -> pa.Table:
    rows = []
    for f in sorted((MDD5K / "dialogues").glob("patient_*.json"), reverse=True):  # unsorted on purpose
        n = f.stem.split("_")[1]
        label = json.loads((MDD5K / "labels" / f"{f.stem}_label.json").read_text(encoding="utf-8"))
        for k, rec in enumerate(json.loads(f.read_text(encoding="utf-8"))):
            turn = 0
            for ex in rec["conversation"]:
                if ex.get("doctor") and ex.get("patient"):
                    rows.append({"dialogue_id": f"mdd5k-{n}-{k}", "case_id": f.stem, "turn": turn,
                                 "question": ex["doctor"], "answer": ex["patient"],
                                 "diagnosis": label["Diagnosis_Result"], "icd_code": label["ICD_Code"],
                                 "topic": None, "persona": None})
                    turn += 1
    s = QualityScorer(make_embedder("hashing"))
    m = s.score([r["question"] for r in rows], [r["answer"] for r in rows],
                [r["diagnosis"] for r in rows], [r["icd_code"] for r in rows])
    for i, r in enumerate(rows):
        r.update(overall=float(m["overall"][i]), doctor_quality=float(m["doctor_quality"][i]),
                 patient_ability=float(m["patient_ability"][i]))
    keep = [r for i, r in enumerate(rows) if m["high_quality"][i]]
    assert 0 < len(keep) < len(rows)
    return pa.Table.from_pylist(keep)


@pytest.fixture(scope="module")
def built(tmp_path_factory, hq_rows):
    out = tmp_path_factory.mktemp("idx")
    meta = build_index(out, hq_rows, embedder_name="hashing")
    return out, meta


def test_layout_and_sidecar(built, hq_rows):
    out, meta = built
    assert meta["embedder"] == "hashing" and meta["size"] == hq_rows.num_rows
    assert json.loads((out / "index" / "meta.json").read_text())["embedder"] == "hashing"
    side = pq.read_table(out / "index" / "qa.parquet")
    assert side.schema.equals(QA_SIDECAR, check_metadata=False)
    ids, vecs = index_vectors(out)
    assert len(ids) == side.num_rows == hq_rows.num_rows
    assert side.column("id").to_pylist() == list(range(side.num_rows))
    keys = list(zip(side.column("dialogue_id").to_pylist(), side.column("turn").to_pylist()))
    assert keys == sorted(keys)
    assert vecs.dtype == np.float32 and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # id i holds the embedding of sidecar row i
    r = side.slice(3, 1).to_pylist()[0]
    want = make_embedder("hashing").encode([qa_text(r["question"], r["answer"])])[0]
    assert np.allclose(vecs[list(ids).index(3)], want, atol=1e-6)


def test_rebuild_is_identical(built, hq_rows, tmp_path):
    out, _ = built
    # shuffled input, given vectors instead of embedding here: same bytes
    shuffled = hq_rows.take(np.random.default_rng(0).permutation(hq_rows.num_rows))
    vecs = make_embedder("hashing").encode([qa_text(q, a) for q, a in zip(
        shuffled.column("question").to_pylist(), shuffled.column("answer").to_pylist())])
    build_index(tmp_path, shuffled, vectors=vecs, embedder_name="hashing")
    assert (tmp_path / "index" / "qa.faiss").read_bytes() == (out / "index" / "qa.faiss").read_bytes()
    assert pq.read_table(tmp_path / "index" / "qa.parquet").equals(pq.read_table(out / "index" / "qa.parquet"))
    build_index(tmp_path, shuffled, vectors=vecs, embedder_name="hashing")  # replaces, never appends
    assert index_vectors(tmp_path)[0].shape == (hq_rows.num_rows,)


def test_sleep_question_finds_sleep_pairs(built):
    out, _ = built
    hits = search(out, "最近睡眠怎么样，晚上睡得着吗", k=5)
    assert len(hits) == 5
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    for h in hits:
        text = h["question"] + h["answer"]
        assert "睡" in text or "失眠" in text, text
    assert {"dialogue_id", "diagnosis", "question", "answer", "score"} <= set(hits[0])


def test_search_cli(built, capsys):
    out, _ = built
    assert search_main(["--out", str(out), "-k", "3", "最近睡眠怎么样"]) == 0
    text = capsys.readouterr().out
    assert text.count("score=") == 3 and "问:" in text and "mdd5k-" in text


def test_search_without_index(tmp_path, capsys):
    assert search_main(["--out", str(tmp_path), "睡眠"]) == 2
