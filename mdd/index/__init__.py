"""FAISS index of the high-quality question/answer pairs.

``OUT/index/qa.faiss``: ``IndexIDMap2(IndexFlatIP(d))`` over L2-normalised float32 embeddings of
``"【问】question\\n【答】answer"``; ids are the positions of the rows in (dialogue_id, turn)
order. ``OUT/index/qa.parquet``: the sidecar (QA_SIDECAR), same ids. ``OUT/index/meta.json``: the
embedder used, so that a search embeds its query the same way.
OUT may be a path or an
object-store URI: the index crosses ``mdd/storage.py`` as bytes (``faiss.serialize_index``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mdd.schema import QA_SIDECAR
from mdd.storage import Store, open_store

INDEX_DIR = "index"
INDEX_FILE = "qa.faiss"
SIDECAR_FILE = "qa.parquet"
META_FILE = "meta.json"


def qa_text(question: str | None, answer: str | None) -> str:
    return f"【问】{question or ''}\n【答】{answer or ''}"


def _gpu_available(faiss: Any) -> bool:
    try:
        return faiss.get_num_gpus() > 0 and hasattr(faiss, "index_cpu_to_all_gpus")
    except Exception:  # noqa: BLE001 - CPU builds may lack the GPU API altogether
        return False


def _to_gpu(index: Any) -> Any:
    import faiss

    if _gpu_available(faiss):
        try:
            return faiss.index_cpu_to_all_gpus(index)
        except Exception:  # noqa: BLE001 - keep the CPU index when the move fails
            return index
    return index


def _to_cpu(index: Any) -> Any:
    import faiss

    if hasattr(faiss, "index_gpu_to_cpu") and _gpu_available(faiss):
        try:
            return faiss.index_gpu_to_cpu(index)
        except Exception:  # noqa: BLE001 - already on the CPU
            return index
    return index


def sort_rows(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Sort by (dialogue_id, turn); returns the sorted table and the permutation."""
    order = pc.sort_indices(table, sort_keys=[("dialogue_id", "ascending"), ("turn", "ascending")])
    return table.take(order), np.asarray(order.to_numpy(), dtype=np.int64)


def build_index(
    out_dir: str | Path | Store,
    rows: pa.Table,
    vectors: np.ndarray | None = None,
    embedder: Any | None = None,
    embedder_name: str = "hashing",
    embedder_model: str | None = None,
) -> dict:
    """Write the index of ``rows`` (QA_SIDECAR columns except ``id``; high-quality rows only).

    ``vectors`` (one row per table row, same order) come from the stage; when absent the rows
    are embedded here with ``embedder`` (or ``make_embedder(embedder_name, embedder_model)``).
    Replaces any previous index.
    """
    import faiss

    out = open_store(out_dir)
    rows, perm = sort_rows(rows)
    if vectors is None:
        if embedder is None:
            from mdd.evaluate.embedders import make_embedder

            embedder = make_embedder(embedder_name, embedder_model)
        texts = [qa_text(q, a) for q, a in zip(rows.column("question").to_pylist(), rows.column("answer").to_pylist())]
        vectors = embedder.encode(texts) if texts else np.zeros((0, embedder.dim), dtype=np.float32)
        dim = int(embedder.dim)
    else:
        vectors = np.asarray(vectors, dtype=np.float32)[perm] if len(perm) else np.asarray(vectors, np.float32)
        dim = int(vectors.shape[1]) if vectors.ndim == 2 and vectors.shape[1] else int(embedder.dim if embedder else 0)
    if dim <= 0:
        raise ValueError("index: cannot tell the embedding dimension (no vectors and no embedder)")
    vectors = np.ascontiguousarray(vectors.reshape(-1, dim), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    if not np.allclose(norms, 1.0, atol=1e-5):  # the embedders normalise already
        vectors = np.ascontiguousarray(vectors / norms, dtype=np.float32)
    ids = np.arange(len(vectors), dtype=np.int64)

    index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    if len(ids):
        index.add_with_ids(vectors, ids)
    out.write_bytes(f"{INDEX_DIR}/{INDEX_FILE}", faiss.serialize_index(index).tobytes())

    cols = {f.name: rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
            for f in QA_SIDECAR if f.name != "id"}
    cols["id"] = pa.array(ids, pa.int64())
    sidecar = pa.Table.from_pydict({f.name: cols[f.name] for f in QA_SIDECAR}).cast(QA_SIDECAR)
    out.write_table(sidecar, f"{INDEX_DIR}/{SIDECAR_FILE}")
    meta = {"embedder": embedder_name, "embedder_model": embedder_model, "dim": dim, "size": int(len(ids)),
            "metric": "inner_product", "text": "【问】question\\n【答】answer"}
    out.write_json(f"{INDEX_DIR}/{META_FILE}", meta)
    return meta


def _read_index(out: Store) -> Any:
    import faiss

    path = f"{INDEX_DIR}/{INDEX_FILE}"
    if not out.is_file(path):
        raise FileNotFoundError(f"{out.display(path)}: no index; run the evaluate stage first")
    return faiss.deserialize_index(np.frombuffer(out.read_bytes(path), dtype=np.uint8))


def load_index(out_dir: str | Path | Store, gpu: bool = True) -> tuple[Any, pa.Table, dict]:
    out = open_store(out_dir)
    index = _read_index(out)
    if gpu:
        index = _to_gpu(index)
    meta = out.read_json(f"{INDEX_DIR}/{META_FILE}")
    sidecar = out.read_table(f"{INDEX_DIR}/{SIDECAR_FILE}")
    return index, sidecar, meta


def index_vectors(out_dir: str | Path | Store) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) stored in the index, for checks."""
    import faiss

    index = _read_index(open_store(out_dir))
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)
    vecs = np.vstack([index.reconstruct(int(i)) for i in ids]) if len(ids) else np.zeros((0, index.d), np.float32)
    return ids, vecs


class Searcher:
    """Loads the index, the sidecar and the embedder once; ``search`` many times."""

    def __init__(self, out_dir: str | Path | Store):
        from mdd.evaluate.embedders import make_embedder

        self.index, sidecar, self.meta = load_index(out_dir)
        self.rows = {r["id"]: r for r in sidecar.to_pylist()}
        self.embedder = make_embedder(self.meta["embedder"], self.meta.get("embedder_model"))

    def search(self, text: str, k: int = 5) -> list[dict]:
        if self.index.ntotal == 0 or k <= 0:
            return []
        q = self.embedder.encode([text])
        scores, ids = self.index.search(q, min(k, self.index.ntotal))
        hits = []
        for s, i in zip(scores[0], ids[0]):
            if i < 0:
                continue
            row = dict(self.rows[int(i)])
            row["score"] = float(s)
            hits.append(row)
        return hits


def search(out_dir: str | Path | Store, text: str, k: int = 5) -> list[dict]:
    """The ``k`` high-quality pairs nearest to ``text`` (dicts: sidecar columns + score)."""
    return Searcher(out_dir).search(text, k)
