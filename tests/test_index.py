"""FAISS index of high-quality QA pairs (built without Ray from the shared MDD-5k dialogues): compact
vectors, exact duplicates merged, IVF above the flat size with its recall, memory-mapped search."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.search import main as search_main
from mdd.index.embedders import make_embedder
from mdd.evaluate.quality import QualityScorer
from mdd.config import IndexConfig
from mdd.index import Searcher, build_index, index_vectors, qa_text, search
from mdd.index.build import recall_at_k
from mdd.index.compact import project
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
    meta = build_index(out, hq_rows, embedder_name="hashing", cfg=IndexConfig(row_group_size=16))
    return out, meta


def test_layout_and_sidecar(built, hq_rows):
    out, meta = built
    distinct = len(set(zip(hq_rows.column("question").to_pylist(), hq_rows.column("answer").to_pylist())))
    assert meta["embedder"] == "hashing" and meta["size"] == distinct and meta["pairs"] == hq_rows.num_rows
    assert meta["type"] == "flat-sq8" and meta["dim"] == 1024 and meta["bytes"]["per_pair"] <= 2048
    assert json.loads((out / "index" / "meta.json").read_text())["embedder"] == "hashing"
    side = pq.read_table(out / "index" / "qa.parquet")
    assert side.schema.equals(QA_SIDECAR, check_metadata=False)
    ids, vecs = index_vectors(out)
    assert len(ids) == side.num_rows == distinct and sum(side.column("count").to_pylist()) == hq_rows.num_rows
    assert side.column("id").to_pylist() == list(range(side.num_rows))
    keys = list(zip(side.column("dialogue_id").to_pylist(), side.column("turn").to_pylist()))
    assert keys == sorted(keys)
    # id i holds the compact vector of sidecar row i: the embedding projected to 1024-d, 8-bit quantized
    r = side.slice(3, 1).to_pylist()[0]
    want = project(make_embedder("hashing").encode([qa_text(r["question"], r["answer"])]), 1024, 0)[0]
    assert vecs.shape[1] == 1024 and float(vecs[3] @ want) / float(np.linalg.norm(vecs[3])) > 0.99
    assert meta["recall_at_10"]["value"] >= 0.9 and 0.5 <= meta["compaction_recall_at_10"]["value"] < 1.0


def test_rebuild_is_identical(built, hq_rows, tmp_path):
    out, _ = built
    shuffled = hq_rows.take(np.random.default_rng(0).permutation(hq_rows.num_rows))
    build_index(tmp_path, shuffled, embedder_name="hashing", cfg=IndexConfig(row_group_size=16))
    assert (tmp_path / "index" / "qa.faiss").read_bytes() == (out / "index" / "qa.faiss").read_bytes()
    assert pq.read_table(tmp_path / "index" / "qa.parquet").equals(pq.read_table(out / "index" / "qa.parquet"))
    build_index(tmp_path, shuffled, embedder_name="hashing")  # replaces, never appends
    assert index_vectors(tmp_path)[0].shape == (pq.read_metadata(out / "index" / "qa.parquet").num_rows,)


def test_a_duplicate_pair_is_indexed_once_with_its_count(tmp_path):
    rows = [{"dialogue_id": f"c{i}-v0", "case_id": f"c{i}", "turn": 0, "question": "最近睡眠怎么样？",
             "answer": "入睡困难，每晚只睡四个小时。"} for i in (2, 0, 1)]
    rows += [{"dialogue_id": "c0-v0", "case_id": "c0", "turn": 1, "question": "最近睡眠怎么样？",
              "answer": "还行，能睡七个小时。"}]  # same question, another answer: another pair
    meta = build_index(tmp_path, pa.Table.from_pylist(rows))
    side = pq.read_table(tmp_path / "index" / "qa.parquet").to_pylist()
    assert (meta["size"], meta["pairs"], meta["duplicates_removed"]) == (2, 4, 2)
    first = next(r for r in side if r["answer"].startswith("入睡"))
    assert first["count"] == 3 and first["dialogue_ids"] == ["c0-v0", "c1-v0", "c2-v0"]
    assert first["dialogue_id"] == "c0-v0" and first["turn"] == 0  # the first occurrence stands for them
    hits = search(tmp_path, "最近睡眠怎么样？入睡困难", k=5)
    assert len(hits) == 2 and len({(h["question"], h["answer"]) for h in hits}) == 2


def test_recall_at_10_with_known_neighbours():
    assert recall_at_k(np.array([[0, 1, 2, 3]]), np.array([[3, 2, 9, 8]]), k=4) == 0.5
    assert recall_at_k(np.array([[5, -1], [1, 2]]), np.array([[5, 6], [2, 1]]), k=2) == 0.75


def test_ivf_above_the_flat_size_with_its_recall_against_exact_search(tmp_path):
    """Random 64-d vectors: the exact neighbours are computed here by brute force; the index's
    recorded recall@10 on its held-back queries (the smallest keys: rows 0..49) is recomputed."""
    from mdd.index.build import build
    from mdd.storage import open_store

    n, d = 3000, 64
    x = np.random.default_rng(1).standard_normal((n, d)).astype(np.float32)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
    table = pa.table({"dialogue_id": [f"d{i:05d}" for i in range(n)], "turn": pa.array([0] * n, pa.int32()),
                      "question": [f"q{i}" for i in range(n)], "answer": ["a"] * n,
                      "key": pa.array(range(n), pa.int64()),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float16()), d)})
    for c in ("case_id", "diagnosis", "icd_code", "topic", "persona"):
        table = table.append_column(c, pa.nulls(n, pa.string()))
    for c in ("overall", "doctor_quality", "patient_ability"):
        table = table.append_column(c, pa.nulls(n, pa.float64()))
    cfg = IndexConfig(flat_max_pairs=1000, queries=50, min_recall=0.9)
    meta = build(open_store(tmp_path), lambda cols: iter([table.select(cols)]), cfg, "hashing", None)
    assert meta["type"] == "ivf-sq8" and meta["nlist"] == int(4 * np.sqrt(n))
    by = list(meta["recall_at_10"]["by_nprobe"].values())
    assert by == sorted(by) and by[-1] >= 0.9 and (len(by) == 1 or by[-2] < 0.9)  # the smallest nprobe that reaches it
    vf = x.astype(np.float32)
    truth = np.argsort(-(vf[:50] @ vf.T), axis=1)[:, :10]
    s = Searcher(tmp_path)
    _, found = s.index.search(vf[:50], 10)
    assert recall_at_k(found, truth) == pytest.approx(meta["recall_at_10"]["value"], abs=1e-4)
    assert s.index.nprobe == meta["nprobe"] < meta["nlist"]


def test_search_memory_maps_the_index_and_reads_only_the_hits_row_groups(built, monkeypatch):
    out, meta = built
    s = Searcher(out)
    read: list[int] = []
    real = s.sidecar.read_row_group
    monkeypatch.setattr(s.sidecar, "read_row_group", lambda g, **kw: read.append(g) or real(g, **kw))
    hits = s.search("最近睡眠怎么样，晚上睡得着吗", k=3)
    assert len(hits) == 3 and s.sidecar.metadata.num_row_groups > 3
    assert sorted(set(read)) == sorted({h["id"] // 16 for h in hits})
    import faiss

    # opened with IO_FLAG_MMAP: the codes stay in the file (a copy in memory would be as big as the file)
    plain = faiss.read_index(str(out / "index" / "qa.faiss"))
    assert s.index.ntotal == plain.ntotal and np.array_equal(s.index.search(s.embed(["失眠"]), 3)[1],
                                                             plain.search(s.embed(["失眠"]), 3)[1])


def test_sleep_question_finds_sleep_pairs(built):
    out, _ = built
    hits = search(out, "最近睡眠怎么样，晚上睡得着吗", k=5)
    assert len(hits) == 5
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    for h in hits:
        text = h["question"] + h["answer"]
        assert "睡" in text or "失眠" in text, text
    assert {"dialogue_id", "diagnosis", "question", "answer", "score", "count"} <= set(hits[0])


def test_search_cli(built, capsys):
    out, _ = built
    assert search_main(["--out", str(out), "-k", "3", "最近睡眠怎么样"]) == 0
    text = capsys.readouterr().out
    assert text.count("score=") == 3 and "问:" in text and "mdd5k-" in text


def test_search_without_index(tmp_path, capsys):
    assert search_main(["--out", str(tmp_path), "睡眠"]) == 2


def _copy_index(built, tmp_path) -> Path:
    import shutil

    out, _ = built
    dst = tmp_path / "run"
    shutil.copytree(out / "index", dst / "index")
    return dst


def test_meta_holds_the_checksums_of_index_and_sidecar(built):
    import hashlib

    out, meta = built
    assert meta["checksum"]["algorithm"] == "sha256"
    for name in ("qa.faiss", "qa.parquet"):
        assert meta["checksum"][name] == hashlib.sha256((out / "index" / name).read_bytes()).hexdigest()


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "bytes changed in place":
        mid = len(data) // 2
        data[mid:mid + 64] = bytes(255 - b for b in data[mid:mid + 64])
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


# an older index without checksums: a truncated file is still refused; a change in place cannot be told
# (what the checksum is for), so that pair is not a case
DAMAGES = [(name, how, True) for name in ("qa.faiss", "qa.parquet") for how in ("bytes changed in place", "truncated")]
DAMAGES += [(name, "truncated", False) for name in ("qa.faiss", "qa.parquet")]


@pytest.mark.parametrize("name,how,with_checksum", DAMAGES)
def test_a_damaged_index_is_one_line_exit_2(built, tmp_path, capsys, name, how, with_checksum):
    """Once `mdd search` printed scores like -3.7e32 for a changed index, and tracebacks for a truncated one."""
    out = _copy_index(built, tmp_path)
    if not with_checksum:
        meta = json.loads((out / "index" / "meta.json").read_text(encoding="utf-8"))
        del meta["checksum"]
        (out / "index" / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    _damage(out / "index" / name, how)
    capsys.readouterr()
    assert search_main(["--out", str(out), "-k", "3", "最近睡眠怎么样"]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err and "score=" not in cap.out, cap
    assert f"index/{name}" in lines[0] and "mdd evaluate" in lines[0], lines[0]


@pytest.mark.parametrize("text", ["{not json", '{"a": 1}'])
def test_a_damaged_meta_json_is_one_line_exit_2(built, tmp_path, capsys, text):
    out = _copy_index(built, tmp_path)
    (out / "index" / "meta.json").write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert search_main(["--out", str(out), "睡眠"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "index/meta.json" in err


@pytest.mark.parametrize("k", ["0", "-3", "x"])
def test_k_below_one_is_refused_by_the_parser(built, capsys, k):
    out, _ = built
    with pytest.raises(SystemExit) as e:
        search_main(["--out", str(out), "-k", k, "睡眠"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument -k" in err and "empty index" not in err
