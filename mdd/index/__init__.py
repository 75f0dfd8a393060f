"""FAISS index of the high-quality question/answer pairs.

``OUT/index/qa.faiss``: one vector per *distinct* pair (exact duplicates merged), the embedder's
vector of ``"【问】question\\n【答】answer"`` projected to ``evaluate.index.dim`` dimensions
(``compact.py``) and 8-bit scalar-quantized; an exact flat scan for small runs, an IVF index above
``evaluate.index.flat_max_pairs`` (``build.py``). Inner product on L2-normalised vectors; ids are
row positions of ``OUT/index/qa.parquet``, the sidecar (QA_SIDECAR, with ``count`` and
``dialogue_ids`` of the merged duplicates). ``OUT/index/meta.json``: embedder, projection, type,
recall figures, bytes per pair, so that a search embeds its query the same way.

A search (:class:`Searcher`) opens the index memory-mapped (``faiss.IO_FLAG_MMAP``: an IVF search
touches only the lists it probes) and reads only the sidecar row groups of its hits. OUT may be a
path or an object-store URI (the index file is then fetched to a local temporary file first).
"""
from __future__ import annotations

import atexit
import bisect
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, cast

import numpy as np
import pyarrow as pa

from mdd.storage import StorageError, Store, open_store

INDEX_DIR = "index"
INDEX_FILE = "qa.faiss"
SIDECAR_FILE = "qa.parquet"
META_FILE = "meta.json"
PAIRS_DIR = "eval/pairs"


def qa_text(question: str | None, answer: str | None) -> str:
    return f"【问】{question or ''}\n【答】{answer or ''}"


def _index_cfg(cfg: Any | None) -> Any:
    if cfg is None:
        from mdd.config import IndexConfig

        return IndexConfig()
    return cfg


def pair_vectors(embedder: Any, questions: list, answers: list, cfg: Any) -> tuple[list[int], pa.Array]:
    """(keys, vector column) of the pairs: what a shard worker adds to its pairs table."""
    from mdd.index.compact import pair_key, project, projected_dim

    texts = [qa_text(q, a) for q, a in zip(questions, answers)]
    dim = projected_dim(embedder.dim, cfg.dim)
    vecs = project(embedder.encode(texts), cfg.dim, cfg.seed) if texts else np.zeros((0, dim), np.float32)
    col = pa.FixedSizeListArray.from_arrays(pa.array(vecs.astype(np.float16).reshape(-1), pa.float16()), dim)
    return [pair_key(t) for t in texts], col


def with_vectors(rows: pa.Table, embedder: Any, cfg: Any) -> pa.Table:
    keys, col = pair_vectors(embedder, rows.column("question").to_pylist(), rows.column("answer").to_pylist(), cfg)
    return rows.append_column("key", pa.array(keys, pa.int64())).append_column("vector", col)


def _full_embedder(embedder: Any, cfg: Any) -> Any:
    """The full vectors' encoder for the compaction check (None when nothing is projected)."""
    return embedder.encode if embedder.dim > cfg.dim and cfg.check_pairs else None


def build_from_pairs(dst: Store, embedder_name: str, embedder_model: str | None, cfg: Any | None = None) -> dict:
    """The index of ``dst``'s ``eval/pairs/*.parquet`` (the stage's; runs in a Ray worker)."""
    import pyarrow.parquet as pq

    from mdd.index.build import build
    from mdd.index.embedders import make_embedder

    cfg = _index_cfg(cfg)
    files = dst.parquet_files(PAIRS_DIR)

    def parts(columns: list[str]) -> Iterator[pa.Table]:
        for f in files:
            yield pq.read_table(dst.path(f), filesystem=dst.fs, columns=columns)

    embedder = make_embedder(embedder_name, embedder_model)
    return build(dst, parts, cfg, embedder_name, embedder_model, _full_embedder(embedder, cfg))


def build_index(
    out_dir: str | Path | Store,
    rows: pa.Table,
    embedder: Any | None = None,
    embedder_name: str = "hashing",
    embedder_model: str | None = None,
    cfg: Any | None = None,
) -> dict:
    """Write the index of ``rows`` (high-quality pairs: QA_SIDECAR columns without ``id``, ``count``,
    ``dialogue_ids``), embedded here; rows are taken in (dialogue_id, turn) order. Replaces any
    previous index."""
    import pyarrow.compute as pc

    from mdd.index.build import SIDECAR_COLUMNS, build
    from mdd.index.embedders import make_embedder

    cfg = _index_cfg(cfg)
    out = open_store(out_dir)
    embedder = embedder or make_embedder(embedder_name, embedder_model)
    cols = {c: rows.column(c) if c in rows.column_names else pa.nulls(rows.num_rows) for c in SIDECAR_COLUMNS}
    table = pa.table(cols)
    if table.num_rows:
        table = table.take(pc.sort_indices(table, sort_keys=[("dialogue_id", "ascending"), ("turn", "ascending")]))
    table = with_vectors(table, embedder, cfg)
    return build(out, lambda columns: iter([table.select(columns)]), cfg, embedder_name, embedder_model,
                 _full_embedder(embedder, cfg))


def _local_copy(store: Store, rel: str) -> str:
    """A local path of ``rel`` to memory-map: the file itself, or a temporary copy of a remote one."""
    local = store.local_path(rel)
    if local:
        return local
    fd, path = tempfile.mkstemp(prefix="mdd-index-", suffix=".faiss")
    with os.fdopen(fd, "wb") as f, store.fs.open_input_stream(store.path(rel)) as src:
        while chunk := src.read(1 << 24):
            f.write(chunk)
    def remove() -> None:
        if os.path.exists(path):
            os.unlink(path)

    atexit.register(remove)
    return path


class IndexDamaged(StorageError):
    """The index, its sidecar or meta.json cannot be trusted (one line: which file and the fix)."""


def _rebuild(store: Store) -> str:
    return f"rebuild it with `mdd evaluate --out {store.display()} --full`"


def verify(store: Store) -> dict:
    """``index/meta.json``, once the index file and the sidecar match the checksums it holds:
    :class:`IndexDamaged` naming the file otherwise (an index written before checksums is taken as it is)."""
    meta_rel = f"{INDEX_DIR}/{META_FILE}"
    try:
        meta = store.read_json(meta_rel)
        if not isinstance(meta, dict) or "embedder" not in meta:
            raise ValueError("not an index description")
    except FileNotFoundError:
        raise IndexDamaged(f"{store.display(meta_rel)}: missing; {_rebuild(store)}") from None
    except (OSError, ValueError) as exc:
        raise IndexDamaged(f"{store.display(meta_rel)}: unreadable ({type(exc).__name__}); {_rebuild(store)}") from None
    sums = meta.get("checksum") or {}
    for name in (INDEX_FILE, SIDECAR_FILE):
        rel = f"{INDEX_DIR}/{name}"
        if not store.is_file(rel):
            raise IndexDamaged(f"{store.display(rel)}: missing; {_rebuild(store)}")
        if name in sums and store.sha256(rel) != sums[name]:
            raise IndexDamaged(f"{store.display(rel)}: damaged (its SHA-256 differs from the one in "
                               f"{META_FILE}); {_rebuild(store)}")
    return meta


class Searcher:
    """The index memory-mapped, its sidecar's footer and the embedder; ``search`` many times. Sidecar
    rows are read by row group, only for the hits (``all_rows`` reads them all, for exemplars)."""

    def __init__(self, out_dir: str | Path | Store, mmap: bool = True):
        import faiss
        import pyarrow.parquet as pq

        from mdd.index.embedders import make_embedder

        self.store = open_store(out_dir)
        path = f"{INDEX_DIR}/{INDEX_FILE}"
        if not self.store.is_file(path):
            raise FileNotFoundError(f"{self.store.display(path)}: no index; run the evaluate stage first")
        self.meta = verify(self.store)
        local = _local_copy(self.store, path)
        try:
            self.index = faiss.read_index(local, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) if mmap else \
                faiss.read_index(local)
        except RuntimeError as exc:  # faiss reports a truncated or foreign file so
            raise IndexDamaged(f"{self.store.display(path)}: not a readable FAISS index "
                               f"({str(exc).strip().splitlines()[-1][:120]}); {_rebuild(self.store)}") from None
        if self.meta.get("nprobe"):
            faiss.extract_index_ivf(self.index).nprobe = int(self.meta["nprobe"])
        side = f"{INDEX_DIR}/{SIDECAR_FILE}"
        try:
            self._file = self.store.fs.open_input_file(self.store.path(side))
            self.sidecar = pq.ParquetFile(self._file)
        except (OSError, pa.ArrowException) as exc:
            raise IndexDamaged(f"{self.store.display(side)}: not readable Parquet ({type(exc).__name__}); "
                               f"{_rebuild(self.store)}") from None
        md = self.sidecar.metadata
        if md.num_rows != self.index.ntotal:
            raise IndexDamaged(f"{self.store.display(side)}: {md.num_rows} rows for {self.index.ntotal} vectors in "
                               f"{INDEX_FILE}; {_rebuild(self.store)}")
        self._starts = list(np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)]))
        self.embedder = make_embedder(self.meta["embedder"], self.meta.get("embedder_model"))
        self._direct_map = False

    def embed(self, texts: list[str]) -> np.ndarray:
        from mdd.index.compact import project

        proj = self.meta.get("projection") or {}
        return project(self.embedder.encode(texts), int(proj.get("dim", self.index.d)), int(proj.get("seed", 0)))

    def rows(self, ids: list[int]) -> dict[int, dict]:
        """Sidecar rows by id, reading only the row groups that hold them."""
        groups: dict[int, list[int]] = {}
        for i in ids:
            groups.setdefault(bisect.bisect_right(self._starts, i) - 1, []).append(i)
        out = {}
        for g, members in groups.items():
            table = self.sidecar.read_row_group(g)
            for i in members:
                out[i] = table.slice(i - int(self._starts[g]), 1).to_pylist()[0]
        return out

    def all_rows(self) -> dict[int, dict]:
        return {r["id"]: r for r in self.sidecar.read().to_pylist()}

    def vector(self, i: int) -> np.ndarray:
        import faiss

        if self.meta.get("nprobe") and not self._direct_map:
            faiss.extract_index_ivf(self.index).make_direct_map()
            self._direct_map = True
        return cast(np.ndarray, self.index.reconstruct(int(i)))  # a CPU index gives numpy (faiss hints torch too)

    def search(self, text: str, k: int = 5) -> list[dict]:
        if self.index.ntotal == 0 or k <= 0:
            return []
        scores, ids = self.index.search(self.embed([text]), min(k, self.index.ntotal))
        hits = [(float(s), int(i)) for s, i in zip(scores[0], ids[0]) if i >= 0]
        rows = self.rows([i for _, i in hits])
        return [{**rows[i], "score": s} for s, i in hits]


def search(out_dir: str | Path | Store, text: str, k: int = 5) -> list[dict]:
    """The ``k`` high-quality pairs nearest to ``text`` (dicts: sidecar columns + score)."""
    return Searcher(out_dir).search(text, k)


def index_vectors(out_dir: str | Path | Store) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) stored in the index (decoded), for checks."""
    s = Searcher(out_dir, mmap=False)
    n = int(s.index.ntotal)
    vecs = np.vstack([s.vector(i) for i in range(n)]) if n else np.zeros((0, s.index.d), np.float32)
    return np.arange(n, dtype=np.int64), vecs
