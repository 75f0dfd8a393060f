"""The evaluation's work, one synth shard at a time, in Ray workers that write their own tables.

    driver ── shard names ──▶ ShardEvaluator actors (as many as configured; one shard each at a time)
                                 read OUT/synth/<shard>.parquet
                                 score (ExchangeScorer, in batches of whole dialogues), judge the rules,
                                 embed the high-quality pairs (compact index vectors, mdd/index/)
                                 write <eval>/turns/<shard>, rules/<shard>, dialogues/<shard>, pairs/<shard>
           ◀── a partial aggregate (mdd/evaluate/aggregate.py: a few KB) per shard

Every file is named after its input shard (``part-<hash>.parquet`` → ``eval/turns/part-<hash>.parquet``)
and sorted by (dialogue id, turn) (rules: dialogue id, rule), so a rerun rewrites exactly what
changed. The driver holds the shard names and the partials only: its memory does not grow with
the corpus, and at most one shard per actor is in flight.

**Distractor batches.** The calibrated relevance compares each exchange with the other
dialogues of its batch, so the batches are part of what a score means. They are a function of the
shard alone: its dialogues sorted by id, cut into ``ceil(n / per_batch)`` runs of near-equal size
(:func:`distractor_batches`). The number of workers, the order in which shards finish and whether a
shard is evaluated now or was kept from an earlier run change nothing.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mdd.schema import RULE_RESULT, TURN_EVAL

log = logging.getLogger(__name__)

TABLES = ("turns", "rules", "dialogues", "pairs")
RULE_COLUMNS = ["dialogue_id", "turns", "age", "age_range", "gender", "diagnosis", "icd_code", "companion"]
# the high-quality pairs of a shard, with what the index's sidecar shows of them
PAIR_COLUMNS = ["dialogue_id", "case_id", "turn", "question", "answer", "overall", "doctor_quality",
                "patient_ability", "diagnosis", "icd_code", "topic", "persona"]


def output_name(shard: str) -> str:
    """The file name of a shard's outputs in each table folder (the shard's own name)."""
    return shard


def sorted_by(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    return table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


def distractor_batches(dialogues: pa.Table, per_batch: int) -> list[pa.Table]:
    """``dialogues`` sorted by id, cut into ``ceil(n / per_batch)`` runs of near-equal size."""
    table = sorted_by(dialogues, ["dialogue_id"])
    n = table.num_rows
    if n == 0:
        return []
    k = max(1, math.ceil(n / max(1, per_batch)))
    bounds = np.linspace(0, n, k + 1).round().astype(int)
    return [table.slice(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def score_shard(scorer: Any, dialogues: pa.Table, per_batch: int) -> pa.Table:
    """Every exchange of ``dialogues`` scored (the scorer's output columns), sorted by (dialogue id, turn)."""
    parts = [scorer.score(b) for b in distractor_batches(dialogues, per_batch)]
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return scorer.score(dialogues.slice(0, 0))
    return sorted_by(pa.concat_tables(parts), ["dialogue_id", "turn"])


def judge_shard(rules: Any, judge: Any, dialogues: pa.Table) -> pa.Table:
    from mdd.evaluate.rules import evaluate_rules

    cols = [c for c in RULE_COLUMNS if c in dialogues.column_names]
    rows = evaluate_rules([{c: r.get(c) for c in RULE_COLUMNS} for r in dialogues.select(cols).to_pylist()],
                          rules, judge)
    return sorted_by(pa.Table.from_pylist(list(rows), schema=RULE_RESULT), ["dialogue_id", "rule"])


class ShardEvaluator:
    """A Ray actor: the embedder, scorer, rules and judge are built once; ``run(shard)`` evaluates
    one synth shard, writes its tables to ``dst`` and returns its partial aggregate."""

    def __init__(self, src: Any, dst: Any, columns: list[str], per_batch: int, scorer_kwargs: dict[str, Any],
                 embedder: str, embedder_model: str | None, rule_sets: tuple[str, ...], judge: str,
                 engine_cfg: Any, metadata: dict[str, str], index_cfg: Any, skip: dict[str, list[int]] | None = None):
        from mdd.evaluate.judges import make_judge
        from mdd.evaluate.rule_set import load_rules
        from mdd.evaluate.scoring import ExchangeScorer, load_records
        from mdd.index.embedders import make_embedder

        self.src, self.dst, self.columns, self.per_batch = src, dst, columns, per_batch
        self.embedder = make_embedder(embedder, embedder_model)
        self.scorer = ExchangeScorer(self.embedder, records=load_records(src), **scorer_kwargs)
        self.rules = load_rules(rule_sets)
        self.judge = make_judge(judge, engine_cfg=engine_cfg)
        self.metadata = metadata
        self.index_cfg = index_cfg
        self.skip = skip or {}  # per shard, rows that repeat an earlier dialogue id (storage.duplicate_rows)

    def run(self, shard: str) -> tuple[str, dict[str, Any]]:
        import pyarrow.parquet as pq

        from mdd.evaluate.aggregate import dialogue_eval, shard_partial
        from mdd.storage import SYNTH, without_rows

        present = set(self.src.read_metadata(f"{SYNTH}/{shard}").schema.to_arrow_schema().names)
        dialogues = pq.read_table(self.src.path(f"{SYNTH}/{shard}"), filesystem=self.src.fs,
                                  columns=[c for c in self.columns if c in present])
        dialogues = without_rows(dialogues, self.skip.get(shard, ()))
        scored = score_shard(self.scorer, dialogues, self.per_batch)
        turns = scored.select([f.name for f in TURN_EVAL]).cast(TURN_EVAL)
        rules = judge_shard(self.rules, self.judge, dialogues)
        dial = dialogue_eval(turns, rules)
        from mdd.index import with_vectors

        pairs = with_vectors(scored.filter(scored.column("high_quality")).select(PAIR_COLUMNS), self.embedder,
                             self.index_cfg)
        name = output_name(shard)
        for folder, table in zip(TABLES, (turns, rules, dial, pairs)):
            self.dst.write_table(table, f"eval/{folder}/{name}", metadata=self.metadata)
        icd_of = dict(zip(dialogues.column("dialogue_id").to_pylist(),
                          dialogues.column("icd_code").to_pylist() if "icd_code" in present else
                          [None] * dialogues.num_rows))
        return shard, shard_partial(dialogues.num_rows, turns, rules, dial, icd_of)


def evaluate_shards(shards: Sequence[str], workers: int, num_gpus: float | None, **kwargs: Any
                    ) -> dict[str, dict[str, Any]]:
    """Run ``shards`` through ``workers`` ShardEvaluator actors; {shard: partial}. Any shard's failure
    raises (the caller's staging area then changes nothing)."""
    import ray
    from ray.util import ActorPool

    if not shards:
        return {}
    actor = ray.remote(num_cpus=1, num_gpus=num_gpus or 0)(ShardEvaluator)
    actors = [actor.remote(**kwargs) for _ in range(max(1, min(workers, len(shards))))]
    try:
        pool = ActorPool(actors)
        return dict(pool.map_unordered(lambda a, s: a.run.remote(s), list(shards)))
    finally:
        for a in actors:
            ray.kill(a)  # type: ignore[arg-type]  # ray's stubs type .options(...).remote() as the class

