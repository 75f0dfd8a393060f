"""Build the index of the high-quality pairs from the shards' pairs tables, in bounded memory.

    pass 1  keys and dialogue ids of every pair   → distinct pairs, their counts and dialogue ids
    pass 2  vectors of a key-hash sample           → held-back queries, the quantizer's training sample
    pass 3  every first occurrence, in file order  → added to the index in batches, its sidecar row
                                                     written (row groups), exact top-10 of the queries

Exact duplicates (the same question and answer text: the same 64-bit key) are stored once, with
``count`` and ``dialogue_ids``; ids are the order of first occurrence over the pairs tables in name
order (the same shards give the same index). The index type follows the size: up to
``evaluate.index.flat_max_pairs`` an exact flat scan over 8-bit scalar-quantized vectors; above it
an IVF index (``nlist`` ≈ 4·√n lists) trained on a sample, whose ``nprobe`` is the smallest power of
two that reaches ``min_recall`` recall@10 against exact search over the same vectors on held-back
queries. ``index/meta.json`` records the recall (and for every nprobe tried), the compaction's
recall@10 against the embedder's full vectors on a bounded subset, the near-duplicate rate, and the
bytes per pair.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from mdd.schema import QA_SIDECAR

TOPK = 10
BATCH = 4096
SIDECAR_COLUMNS = [f.name for f in QA_SIDECAR if f.name not in ("id", "count", "dialogue_ids", "case_ids")]

Parts = Callable[[list[str]], Iterator[pa.Table]]  # columns -> the pairs tables, always in the same order


def _vectors(t: pa.Table) -> np.ndarray:
    col = t.column("vector").combine_chunks()
    dim = col.type.list_size
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


class _TopK:
    """Running exact top-k (inner product) of a few queries over vectors seen in batches."""

    def __init__(self, queries: np.ndarray, k: int = TOPK):
        self.q = queries
        self.k = k
        self.scores = np.full((len(queries), 0), -np.inf, np.float32)
        self.ids = np.zeros((len(queries), 0), np.int64)

    def add(self, vecs: np.ndarray, first_id: int) -> None:
        if not len(self.q) or not len(vecs):
            return
        s = self.q @ vecs.T
        ids = np.broadcast_to(np.arange(first_id, first_id + len(vecs)), s.shape)
        s, ids = np.concatenate([self.scores, s], 1), np.concatenate([self.ids, ids], 1)
        top = np.argsort(-s, axis=1, kind="stable")[:, : self.k]
        self.scores, self.ids = np.take_along_axis(s, top, 1), np.take_along_axis(ids, top, 1)


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = TOPK) -> float:
    """Mean share of each query's true top-k found among its returned top-k (ids; -1 = none)."""
    if not len(truth):
        return 1.0
    return float(np.mean([len(set(f[:k].tolist()) & set(t[:k].tolist()) - {-1}) / min(k, len(t))
                          for f, t in zip(found, truth)]))


def _make_index(dim: int, n: int, cfg: Any) -> tuple[Any, str, int]:
    import faiss

    sq = faiss.ScalarQuantizer.QT_8bit
    if n <= cfg.flat_max_pairs:
        return faiss.IndexScalarQuantizer(dim, sq, faiss.METRIC_INNER_PRODUCT), "flat-sq8", 0
    nlist = cfg.nlist or max(16, int(4 * math.sqrt(n)))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, sq, faiss.METRIC_INNER_PRODUCT)
    index.own_fields = True
    quantizer.this.disown()  # type: ignore[attr-defined]  # SWIG's ownership handle: not in faiss's type hints
    return index, "ivf-sq8", nlist


def build(dst: Any, parts: Parts, cfg: Any, embedder_name: str, embedder_model: str | None,
          full_embedder: Callable[[list[str]], np.ndarray] | None = None) -> dict:
    """Write ``index/qa.faiss``, ``index/qa.parquet`` and ``index/meta.json`` to ``dst`` (a Store)."""
    import faiss

    from mdd.index import INDEX_DIR, INDEX_FILE, META_FILE, SIDECAR_FILE, qa_text

    t0 = time.perf_counter()
    # pass 1: distinct pairs
    seen: dict[int, list] = {}
    n_rows, dim = 0, 0
    for t in parts(["key", "dialogue_id", "case_id", "vector"]):
        dim = dim or t.schema.field("vector").type.list_size
        for k, d, c in zip(t.column("key").to_pylist(), t.column("dialogue_id").to_pylist(),
                           t.column("case_id").to_pylist()):
            e = seen.get(k)
            if e is None:
                seen[k] = [1, [d], {c}]
            else:
                e[0] += 1
                e[1].append(d)
                e[2].add(c)
        n_rows += t.num_rows
    n = len(seen)
    dim = dim or cfg.dim
    index, kind, nlist = _make_index(dim, n, cfg)

    # pass 2: held-back queries (the smallest keys) and the training sample (the next ones)
    by_key = sorted(seen)
    q_keys = by_key[: cfg.queries]
    n_train = min(n, max(cfg.train_pairs, 40 * nlist)) if kind != "flat-sq8" else min(n, cfg.train_pairs)
    t_keys = set(by_key[len(q_keys): len(q_keys) + n_train] if n > len(q_keys) else by_key)
    want = set(q_keys) | t_keys
    got: dict[int, np.ndarray] = {}
    if want:
        for t in parts(["key", "vector"]):
            keys = t.column("key").to_pylist()
            idx = [i for i, k in enumerate(keys) if k in want and k not in got]
            if idx:
                v = _vectors(t.take(pa.array(idx)))
                for j, i in enumerate(idx):
                    got[keys[i]] = v[j]
    queries = np.vstack([got[k] for k in q_keys]) if q_keys else np.zeros((0, dim), np.float32)
    if n:
        index.train(np.vstack([got[k] for k in sorted(t_keys)]))
    del got

    # pass 3: add first occurrences in order, write their sidecar rows, exact top-k of the queries
    exact = _TopK(queries)
    check_texts: list[str] = []
    check_vecs: list[np.ndarray] = []
    emitted: set[int] = set()
    next_id = 0
    schema = QA_SIDECAR
    with dst.parquet_writer(f"{INDEX_DIR}/{SIDECAR_FILE}", schema) as writer:
        for t in parts(SIDECAR_COLUMNS + ["key", "vector"]):
            keys = t.column("key").to_pylist()
            take = []
            for i, k in enumerate(keys):
                if k not in emitted:
                    emitted.add(k)
                    take.append(i)
            if not take:
                continue
            t = t.take(pa.array(take))
            for s in range(0, t.num_rows, BATCH):
                b = t.slice(s, BATCH)
                v = _vectors(b)
                index.add(v)
                exact.add(v, next_id)
                if len(check_texts) < cfg.check_pairs:
                    m = cfg.check_pairs - len(check_texts)
                    check_texts += [qa_text(q, a) for q, a in zip(b.column("question").to_pylist()[:m],
                                                                 b.column("answer").to_pylist()[:m])]
                    check_vecs.append(v[:m])
                bkeys = b.column("key").to_pylist()
                cols = {c: b.column(c) for c in SIDECAR_COLUMNS}
                cols["id"] = pa.array(range(next_id, next_id + b.num_rows), pa.int64())
                cols["count"] = pa.array([seen[k][0] for k in bkeys], pa.int32())
                cols["dialogue_ids"] = pa.array([sorted(seen[k][1]) for k in bkeys], pa.list_(pa.string()))
                cols["case_ids"] = pa.array([sorted(c for c in seen[k][2] if c is not None) for k in bkeys],
                                            pa.list_(pa.string()))
                writer.write(pa.Table.from_pydict({f.name: cols[f.name] for f in schema}).cast(schema),
                             cfg.row_group_size)
                next_id += b.num_rows

    recall, by_nprobe, nprobe = _tune(index, kind, nlist, queries, exact, cfg.min_recall)
    dup = _near_duplicates(exact, q_keys, seen, by_key, cfg.near_duplicate_cos)
    compaction = _compaction_check(full_embedder, check_texts, check_vecs, cfg.queries)
    blob = faiss.serialize_index(index)
    dst.write_bytes(f"{INDEX_DIR}/{INDEX_FILE}", blob.tobytes())
    sizes = dst.file_sizes(INDEX_DIR)
    meta = {"embedder": embedder_name, "embedder_model": embedder_model, "dim": dim,
            "projection": {"seed": cfg.seed, "dim": cfg.dim}, "type": kind, "nlist": nlist, "nprobe": nprobe,
            "size": n, "pairs": n_rows, "duplicates_removed": n_rows - n, "metric": "inner_product",
            "text": "【问】question\\n【答】answer", "row_group_size": cfg.row_group_size,
            "recall_at_10": {"value": recall, "queries": len(q_keys), "by_nprobe": by_nprobe,
                             "reference": "exact search over the same compact vectors, held-back queries "
                                          "(not in the training sample)"},
            "compaction_recall_at_10": compaction, "near_duplicates": dup,
            "bytes": {"index": sizes.get(INDEX_FILE, 0), "sidecar": sizes.get(SIDECAR_FILE, 0),
                      "per_pair": round((sizes.get(INDEX_FILE, 0) + sizes.get(SIDECAR_FILE, 0)) / n, 1) if n else None},
            "build_s": round(time.perf_counter() - t0, 3),
            # what a search verifies before it trusts the files (mdd.index.Searcher)
            "checksum": {"algorithm": "sha256", INDEX_FILE: hashlib.sha256(blob.tobytes()).hexdigest(),
                         SIDECAR_FILE: dst.sha256(f"{INDEX_DIR}/{SIDECAR_FILE}")}}
    dst.write_json(f"{INDEX_DIR}/{META_FILE}", meta)
    return meta


def _tune(index: Any, kind: str, nlist: int, queries: np.ndarray, exact: _TopK, min_recall: float
          ) -> tuple[float | None, dict[str, float], int]:
    if not len(queries) or index.ntotal == 0:
        return None, {}, 0
    if kind == "flat-sq8":
        _, found = index.search(queries, TOPK)
        return round(recall_at_k(found, exact.ids), 4), {}, 0
    by: dict[str, float] = {}
    nprobe = 1
    while True:
        index.nprobe = nprobe
        _, found = index.search(queries, TOPK)
        by[str(nprobe)] = round(recall_at_k(found, exact.ids), 4)
        if by[str(nprobe)] >= min_recall or nprobe >= nlist:
            return by[str(nprobe)], by, nprobe
        nprobe = min(nlist, nprobe * 2)


def _near_duplicates(exact: _TopK, q_keys: list[int], seen: dict, by_key: list[int], cos: float) -> dict:
    """Among the held-back queries: the share with another pair at cosine >= ``cos`` (not an exact
    duplicate: those are merged already), and the mean number of such pairs in the top 10."""
    if not len(exact.q):
        return {"cos": cos, "queries": 0}
    near = (exact.scores >= cos).sum(1) - 1  # the query's own pair is its own nearest
    return {"cos": cos, "queries": int(len(near)), "share_with_near_duplicate": round(float(np.mean(near > 0)), 4),
            "mean_in_top10": round(float(np.mean(np.clip(near, 0, None))), 3), "collapsed": False}


def _compaction_check(full_embedder: Callable | None, texts: list[str], vecs: list[np.ndarray], queries: int
                      ) -> dict:
    """recall@10 of the compact vectors against the embedder's full ones, on the first pairs."""
    if full_embedder is None or len(texts) < 2:
        return {"value": None, "note": "no projection (the embedder is not wider than the index)"}
    full = np.asarray(full_embedder(texts), np.float32)
    comp = np.vstack(vecs)[: len(texts)]
    step = max(1, len(texts) // queries)
    qi = np.arange(0, len(texts), step)[:queries]
    truth = np.argsort(-(full[qi] @ full.T), axis=1, kind="stable")[:, :TOPK]
    found = np.argsort(-(comp[qi] @ comp.T), axis=1, kind="stable")[:, :TOPK]
    return {"value": round(recall_at_k(found, truth), 4), "pairs": len(texts), "queries": int(len(qi)),
            "reference": "exact search over the embedder's full vectors (the same pairs)"}
