"""Exemplar retrieval: the loop from the evaluation's index back into synthesis.

Before the doctor asks about a topic, ``ExemplarRetriever.pick`` returns the top-k high-quality
question–answer pairs of an earlier run's index (``mdd/index.py``) for that topic:

- the query is the topic, what to find out about it, and the patient's last answer (the dialogue
  so far), embedded the way the index was built;
- pairs from the case being synthesized are never used (its own variants would leak its facts);
- pairs recorded under the same topic come first, then the nearest others, by cosine;
- diversity: at most ``per_case`` pairs from any one source case, and no question twice;
- pairs under ``min_score`` are left out.

The choice is deterministic (an exact flat index, ties broken by id). The chosen pairs' ids (the
sidecar's ``id``) are recorded on the doctor turn that saw them (``turns[i].exemplars``), and the
dialogue row names the index (``exemplar_index``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdd.config import ExemplarConfig
from mdd.errors import MddError


@dataclass(frozen=True)
class Exemplar:
    id: int
    case_id: str | None
    topic: str | None
    question: str
    answer: str
    score: float


class ExemplarError(MddError, ValueError):
    pass


def resolve_index(cfg: ExemplarConfig) -> ExemplarConfig:
    """``cfg`` with ``index`` as an absolute path (or the URI), checked: ``ExemplarError`` naming the key
    when the index cannot be used. Run in the driver before any work (dialogue workers open it)."""
    import os

    from mdd.index import INDEX_DIR, INDEX_FILE, META_FILE, verify
    from mdd.storage import StorageError, is_uri, open_store

    assert cfg.index is not None  # run only for a configured index (mdd.synthesize.run)
    try:
        store = open_store(cfg.index)
        for name in (INDEX_FILE, META_FILE):
            if not store.is_file(f"{INDEX_DIR}/{name}"):
                raise ExemplarError("synth.dialogue.exemplars.index: "
                                    f"{store.display(INDEX_DIR + '/' + name)} not found "
                                    "(run the evaluation there first: it writes the index)")
        verify(store)  # IndexDamaged: a damaged index or sidecar, before any dialogue runs
    except ExemplarError:
        raise
    except (StorageError, OSError, ValueError) as exc:
        raise ExemplarError(f"synth.dialogue.exemplars.index: {cfg.index}: {exc}") from exc
    return cfg.model_copy(update={"index": cfg.index if is_uri(cfg.index) else os.path.abspath(cfg.index)})


class ExemplarRetriever:
    """Loads the index, its sidecar and its embedder once (one per dialogue worker)."""

    def __init__(self, cfg: ExemplarConfig):
        from mdd.index import Searcher

        if not cfg.index:
            raise ExemplarError("synth.dialogue.exemplars.index: not set")
        try:
            self.searcher = Searcher(cfg.index)
        except FileNotFoundError as exc:
            raise ExemplarError(f"synth.dialogue.exemplars.index: {exc}") from exc
        self.cfg = cfg
        self.source = cfg.index
        self.size = int(self.searcher.index.ntotal)
        self.by_topic: dict[str, list[int]] = {}
        self.rows = self.searcher.all_rows()
        for i, row in self.rows.items():
            self.by_topic.setdefault(row.get("topic") or "", []).append(int(i))

    @classmethod
    def maybe(cls, cfg: ExemplarConfig) -> "ExemplarRetriever | None":
        return cls(cfg) if cfg.index else None

    def query_text(self, topic: str, ask: str | None, last_answer: str | None) -> str:
        from mdd.index import qa_text

        return qa_text(f"{topic}：{ask or topic}", last_answer or "")

    def pick(self, case_id: str, topic: str, ask: str | None = None, last_answer: str | None = None) -> list[Exemplar]:
        if self.size == 0:
            return []
        import numpy as np

        cfg = self.cfg
        q = self.searcher.embed([self.query_text(topic, ask, last_answer)])
        scores, ids = self.searcher.index.search(q, min(cfg.candidates, self.size))
        hits = {int(i): float(s) for s, i in zip(scores[0], ids[0]) if i >= 0}
        same_topic = self.by_topic.get(topic, [])
        missing = [i for i in same_topic if i not in hits]
        if missing:  # same-topic pairs outside the nearest candidates: score them too
            vecs = np.vstack([self.searcher.vector(i) for i in missing])
            for i, s in zip(missing, (vecs @ q[0]).tolist()):
                hits[i] = float(s)
        topical = set(same_topic)
        order = sorted(hits, key=lambda i: (i not in topical, -hits[i], i))
        chosen: list[Exemplar] = []
        per_case: dict[Any, int] = {}
        questions: set[str] = set()
        for i in order:
            row = self.rows[i]
            src = row.get("case_id")
            question = (row.get("question") or "").strip()
            # a pair said in several cases (stored once) is from each of them; older indexes: case_id only
            if case_id in (row.get("case_ids") or [src]) or hits[i] < cfg.min_score or not question:
                continue
            if question in questions:
                continue
            if per_case.get(src, 0) >= cfg.per_case:
                continue
            per_case[src] = per_case.get(src, 0) + 1
            questions.add(question)
            chosen.append(Exemplar(id=i, case_id=src, topic=row.get("topic"), question=question,
                                   answer=(row.get("answer") or "").strip(), score=round(hits[i], 4)))
            if len(chosen) == cfg.k:
                break
        return chosen


def instruction_block(shown: list[Exemplar], answer_chars: int = 60) -> str:
    """The exemplars as the text appended to the doctor's instruction ('' for none)."""
    from mdd.dialogue import prompts as P

    if not shown:
        return ""
    items = "\n".join(P.DOC_EXEMPLAR_ITEM.format(n=n, question=e.question, answer=e.answer[:answer_chars])
                      for n, e in enumerate(shown, start=1))
    return P.DOC_EXEMPLARS.format(items=items)
