"""Dialogues in, scored exchanges out: the one per-batch pipeline of the evaluation stage.

The stage's scoring actors and the validity self-check (``mdd/evaluate/validity.py``) both call
``ExchangeScorer.score``, so controls are scored exactly like the run's own exchanges. A batch
holds whole dialogues: the relevance signal compares each answer with the other questions of
its dialogue and with the other dialogues of the batch.

    dialogues ─ mdd.record.exchanges ─▶ (question, answer) pairs
              ─ relevance.signals (IDF n-grams learnt from the run; optionally the embedder's
                 vectors too) ─▶ relevance (α) and the seed's relevance_rank
              (the embedder itself embeds the high-quality pairs for the index, in the stage)
              ─ faithfulness (record-based, the LLM judge, or the seed's constant) ─▶ β
              ─ quality.QualityScorer (the seed's formula) ─▶ every metric and overall
              ─ gates.decide ─▶ high_quality, hq_reason
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, cast

import numpy as np
import pyarrow as pa

from mdd.record import exchanges
from mdd.schema import METRICS

DIALOGUE_COLUMNS = ["dialogue_id", "case_id", "turns", "diagnosis", "icd_code", "treatment", "age", "age_range",
                    "gender", "doctor_persona", "companion", "experience"]

EXCHANGE_SCHEMA = pa.schema(
    [
        pa.field("dialogue_id", pa.string()),
        pa.field("case_id", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("topic", pa.string()),
        pa.field("question", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("diagnosis", pa.string()),
        pa.field("icd_code", pa.string()),
        pa.field("persona", pa.string()),
    ]
)


def explode(batch: pa.Table, record_facts: Any = None) -> tuple[pa.Table, dict[str, list]]:
    """Dialogues → one row per exchange (EXCHANGE_SCHEMA), plus per-row side lists
    (``grounding``, ``experience``, ``treatment``, and ``guards``: the turn guards the exchange's
    question or answer fails, as ``speaker:guard``) that the scorer needs but does not output.
    ``record_facts(case_id)``: the case's ``RecordFacts`` (None: unknown) for the faithfulness guard."""
    from mdd.dialogue import guards as G

    cols: dict[str, list] = {f.name: [] for f in EXCHANGE_SCHEMA}
    side: dict[str, list] = {"grounding": [], "experience": [], "treatment": [], "guards": []}
    get = {name: (batch.column(name).to_pylist() if name in batch.column_names else [None] * batch.num_rows)
           for name in DIALOGUE_COLUMNS}
    for i in range(batch.num_rows):
        turns = get["turns"][i] or []
        facts = record_facts(get["case_id"][i]) if record_facts is not None else None
        failed = G.check_dialogue(turns, facts, G.is_thought_topic).failures
        for ex in exchanges(turns):
            side["guards"].append([f"{sp}:{f.guard}"
                                   for sp, k in (("doctor", ex.position), ("answer", ex.answer_position))
                                   for f in failed.get(k, ())])
            cols["dialogue_id"].append(get["dialogue_id"][i])
            cols["case_id"].append(get["case_id"][i])
            cols["turn"].append(ex.index)
            cols["topic"].append(ex.topic)
            cols["question"].append(ex.question_text)
            cols["answer"].append(ex.answer_text)
            cols["diagnosis"].append(get["diagnosis"][i])
            cols["icd_code"].append(get["icd_code"][i])
            cols["persona"].append(get["doctor_persona"][i])
            side["grounding"].append(cast(Mapping[str, Any], ex.answer).get("grounding"))  # a row's turns: mappings
            side["experience"].append(get["experience"][i])
            side["treatment"].append(get["treatment"][i])
    return pa.Table.from_pydict(cols, schema=EXCHANGE_SCHEMA), side


class ExchangeScorer:
    """Holds the embedder, the run's lexical space and the case records; one per worker."""

    def __init__(
        self,
        embedder: Any,
        threshold: float = 0.7,
        distractors: int = 15,
        faithfulness: str = "record",
        faithfulness_default: float = 0.75,
        judge_engine: Any | None = None,
        lexicon: str | None = None,
        idf: tuple[np.ndarray, int] | None = None,
        records: Mapping[str, Mapping[str, str]] | None = None,
        relevance_spaces: str = "lexical",
    ):
        from mdd.evaluate.quality import QualityScorer
        from mdd.evaluate.relevance import LexicalSpace

        if faithfulness not in ("record", "default", "llm"):
            raise ValueError(f"evaluate.faithfulness: unknown mode {faithfulness!r}")
        if faithfulness == "llm" and judge_engine is None:
            raise ValueError("evaluate.faithfulness: 'llm' needs a judge engine")
        self.embedder = embedder
        self.threshold = float(threshold)
        self.faithfulness = faithfulness
        self.faithfulness_default = float(faithfulness_default)
        self.judge_engine = judge_engine
        self.lexicon = lexicon
        self.records = dict(records or {})
        self._record_texts: dict[str | None, str | None] = {}
        self._facts: dict[str | None, Any] = {}
        self.distractors = int(distractors)
        self.lexical = LexicalSpace(*idf) if idf is not None else LexicalSpace()
        if relevance_spaces not in ("lexical", "embedder", "lexical+embedder"):
            raise ValueError(f"evaluate.relevance_spaces: unknown value {relevance_spaces!r}")
        self.spaces = relevance_spaces
        self.quality = QualityScorer(embedder, threshold=threshold, distractors=distractors,
                                     faithfulness_default=faithfulness_default, lexicon=lexicon)
        from mdd.evaluate.gates import gate_spec

        gate_spec(lexicon)  # fail early on a broken lexicon

    # --- parts ---------------------------------------------------------------------------

    def record_facts(self, case_id: str | None) -> Any:
        """What the case's record documents for the faithfulness guard (None when unknown)."""
        from mdd.dialogue.guards import RecordFacts

        if case_id not in self._facts:
            fields = self.records.get(case_id) if case_id is not None else None
            self._facts[case_id] = RecordFacts.of(dict(fields)) if fields else None
        return self._facts[case_id]

    def record_text(self, case_id: str | None) -> str | None:
        """The whole record of a case as one text (None when unknown), joined once per case."""
        from mdd.evaluate.faithfulness import record_text

        if case_id not in self._record_texts:
            fields = self.records.get(case_id) if case_id is not None else None
            self._record_texts[case_id] = record_text(fields) if fields else None
        return self._record_texts[case_id]

    def _faithfulness(self, q: Sequence[str], a: Sequence[str], case_ids: Sequence[str | None],
                      side: dict[str, list], diagnoses: Sequence[str | None]) -> np.ndarray:
        n = len(a)
        if self.faithfulness == "default":
            return np.full(n, self.faithfulness_default)
        if self.faithfulness == "llm":
            from mdd.evaluate.quality import case_record, faithfulness

            recs = []
            for i in range(n):
                known = self.record_text(case_ids[i])
                recs.append(known if known else case_record(diagnoses[i], side["treatment"][i], [a[i]]))
            return faithfulness(q, a, recs, self.judge_engine, self.faithfulness_default)
        from mdd.evaluate.faithfulness import score_record_faithfulness

        scores = score_record_faithfulness(a, case_ids, side["grounding"], side["experience"], self.records,
                                           self.lexicon)
        return np.array([np.nan if s is None else s for s in scores], dtype=np.float64)

    def _relevance(self, q: Sequence[str], a: Sequence[str], dialogue_ids: Sequence[str]):
        from mdd.evaluate.relevance import combine, signals

        parts = []
        if "lexical" in self.spaces:
            vec = self.lexical.encode(list(q) + list(a))
            parts.append(signals(vec[: len(q)], vec[len(q):], dialogue_ids, self.distractors))
        if "embedder" in self.spaces:
            emb = self.embedder.encode(list(q) + list(a))
            parts.append(signals(emb[: len(q)], emb[len(q):], dialogue_ids, self.distractors))
        return combine(parts)

    # --- the batch -----------------------------------------------------------------------

    def score(self, dialogues: pa.Table) -> pa.Table:
        """Score a batch of whole dialogues: its exchanges with every metric, ``high_quality`` and
        ``hq_reason``."""
        from mdd.evaluate.gates import answered_in_kind, decide, gate_spec
        from mdd.evaluate.quality import relevance_score

        table, side = explode(dialogues, self.record_facts)
        n = table.num_rows
        q = table.column("question").to_pylist()
        a = table.column("answer").to_pylist()
        if n == 0:
            return _with_metrics(table, {m: np.zeros(0) for m in METRICS}, np.zeros(0, bool), [], [])
        ids = table.column("dialogue_id").to_pylist()
        case_ids = table.column("case_id").to_pylist()
        diagnoses = table.column("diagnosis").to_pylist()
        icd_codes = table.column("icd_code").to_pylist()
        sig = self._relevance(q, a, ids)
        spec = gate_spec(self.lexicon)
        in_kind = np.array([answered_in_kind(qq, aa, spec) for qq, aa in zip(q, a)], dtype=bool)
        alpha = relevance_score(sig.z, sig.fit, in_kind, a, self.lexicon)
        faith = self._faithfulness(q, a, case_ids, side, diagnoses)
        # a turn guard's failure (mdd/dialogue/guards.py) is what it is whatever the similarity says: an answer
        # that echoes, loops, leaks, speaks in the wrong role or contradicts the record is neither relevant nor
        # (where a record can tell) faithful; a question that does is worth nothing as a question
        answer_failed = np.array([any(g.startswith("answer:") for g in gs) for gs in side["guards"]], dtype=bool)
        question_failed = np.array([any(g.startswith("doctor:") for g in gs) for gs in side["guards"]], dtype=bool)
        alpha = np.where(answer_failed, 0.0, alpha)
        faith = np.where(answer_failed & np.isfinite(faith), 0.0, faith)  # unknown (no record) stays unknown
        m = self.quality.score(q, a, diagnoses, icd_codes, relevance=alpha, faithfulness=faith, rank=sig.rank)
        if question_failed.any():
            for k in ("specificity", "targetedness", "professionalism", "doctor_quality"):
                m[k] = np.where(question_failed, 0.0, m[k])
            m["overall"] = np.clip((m["doctor_quality"] + m["patient_ability"]) / 2.0, 0.0, 1.0)
        records = [self.record_text(c) for c in case_ids]
        hq, reasons = decide(q, a, m["overall"], self.threshold, sig.z, sig.fit, faith, diagnoses, icd_codes,
                             records=records, lexicon=self.lexicon, guards=side["guards"])
        return _with_metrics(table, m, hq, reasons, side["guards"])


def _with_metrics(table: pa.Table, m: dict[str, np.ndarray], hq: np.ndarray, reasons: list[str],
                  guards: list[list[str]] | None = None) -> pa.Table:
    for name in METRICS:
        v = np.asarray(m[name], dtype=np.float64)
        table = table.append_column(name, pa.array(v, pa.float64(), from_pandas=True))  # NaN → null
    table = table.append_column("high_quality", pa.array(np.asarray(hq, dtype=bool), pa.bool_()))
    table = table.append_column("hq_reason", pa.array(reasons, pa.string()))
    return table.append_column("turn_guards", pa.array(guards if guards is not None else [[]] * table.num_rows,
                                                       pa.list_(pa.string())))


# --- what the stage's driver prepares for the scorers --------------------------------------

def load_records(out: Any, case_ids: set[str] | None = None) -> dict[str, dict[str, str]]:
    """``OUT/cases.parquet`` as {case_id: {field path: text}}; {} when the run has none (imports).
    ``out``: a path, URI or ``mdd.storage.Store``; ``case_ids``: only these cases."""
    import logging

    from mdd.storage import open_store

    store = open_store(out)
    if not store.is_file("cases.parquet"):
        return {}
    try:
        table = store.read_table("cases.parquet", columns=["case_id", "fields"])
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        logging.getLogger(__name__).warning("%s: unreadable, faithfulness stays unknown: %s",
                                                  store.display("cases.parquet"), exc)
        return {}
    if case_ids is not None:
        import pyarrow.compute as pc

        table = table.filter(pc.is_in(table.column("case_id"), value_set=pa.array(sorted(case_ids), pa.string())))
    return {cid: dict(fields or []) for cid, fields in zip(table.column("case_id").to_pylist(),
                                                           table.column("fields").to_pylist()) if cid}


def corpus_df(out: Any, max_dialogues: int, shards: Sequence[str] | None = None) -> tuple[np.ndarray, int]:
    """Document frequencies of the lexical space over the texts of the first ``max_dialogues``
    dialogues of ``out``'s shards (``shards``: paths relative to ``out``; default: ``synth/*.parquet``)."""
    from mdd.evaluate.relevance import LexicalSpace
    from mdd.storage import SYNTH, open_store

    store = open_store(out)
    texts: list[str] = []
    left = max_dialogues
    for rel in shards if shards is not None else store.parquet_files(SYNTH):
        if left <= 0:
            break
        turns = store.read_table(rel, columns=["turns"]).column("turns").to_pylist()[:left]
        left -= len(turns)
        texts.extend(t.get("text") or "" for dialogue in turns for t in (dialogue or []) if t)
    return LexicalSpace.document_frequencies(texts)
