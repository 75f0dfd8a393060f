"""The dialogue worker: a stateless async Ray actor that runs dialogues (many in flight) on the engine
client it was given, and the accounting columns of the rows it returns."""
from __future__ import annotations

import traceback
from typing import Any

from mdd.cases import Case
from mdd.config import DialogueConfig
from mdd.engines.base import EngineBase, EngineError


class DialogueWorker:
    """Runs dialogues; holds no state between them but the cases and the engine client."""

    def __init__(self, cases: dict[str, Case], engine: EngineBase, cfg: DialogueConfig, run_seed: int):
        from mdd.dialogue import ops
        from mdd.dialogue.exemplars import ExemplarRetriever

        self.cases, self.engine, self.cfg, self.run_seed = cases, engine, cfg, run_seed
        self.personas = ops.all_personas()
        self.exemplars = ExemplarRetriever.maybe(cfg.exemplars)  # the index loads once per worker

    async def run(self, case_id: str, variant: int) -> dict[str, Any]:
        from mdd.dialogue import ops
        from mdd.dialogue.loop import GuardFailure, run_dialogue
        from mdd.dialogue.setting import setting

        case = self.cases[case_id]
        finished = False
        try:
            persona, triple = setting(self.personas, case, self.run_seed, variant)
            row, acct = await run_dialogue(case, variant, self.run_seed, self.engine, self.cfg, persona, triple,
                                           self.exemplars)
            finished = True
        except EngineError as exc:  # the engine down or unreachable: retried after a backoff (``backoff``)
            return {"ok": False, "retriable": self.engine.should_retry(exc), "backoff": True, "error": f"engine: {exc}"}
        except GuardFailure as exc:  # a turn that failed its guards after every regeneration: counted, not retried
            return {"ok": False, "retriable": False, "error": f"guard: {exc}",
                    "guard_failure": {"speaker": exc.speaker, "guards": exc.guards, "events": exc.events,
                                      "generated": exc.generated}}
        except Exception as exc:  # a per-dialogue failure: recorded, never fatal for the run
            # retried from the start unless the engine says retrying cannot help (a 4xx request error)
            return {"ok": False, "retriable": self.engine.should_retry(exc), "backoff": False,
                    "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"}
        finally:  # the engine frees what it kept for the dialogue (its admission room)
            await self.engine.close_session(ops.dialogue_id(case_id, variant), finished)
        row.update(accounting_columns(acct, self.engine.models_for(row["dialogue_id"],
                                                                   [r for r, n in acct.calls.items() if n])))
        return {
            "ok": True,
            "row": row,
            "calls_by_role": acct.calls,
            "calls_by_op": acct.by_op,
            "fallbacks": acct.fallbacks,
            "cached_tokens": acct.cached_tokens,
            "generated": acct.generated,
        }

    def ready(self) -> str:
        """The node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def engine_metrics(self) -> dict[str, float]:
        """This worker's engine counters (collected before the worker is killed)."""
        return self.engine.worker_metrics()


def accounting_columns(acct: Any, models: dict[str, str]) -> dict[str, Any]:
    """The dialogue row's accounting by role and by model (``models``: role -> model)."""
    from mdd.engines.roles import per_model

    counts = {"calls": acct.calls, "prompt_tokens": acct.prompt_tokens, "output_tokens": acct.output_tokens,
              "cached_tokens": acct.cached_by_role}
    by = {k: per_model(models, v) for k, v in counts.items()}
    return {
        "models": models,
        "calls_by_role": dict(acct.calls),
        "cached_tokens_by_role": dict(acct.cached_by_role),
        "usage_by_model": [{"model": m, **{k: by[k].get(m, 0) for k in counts}} for m in sorted(set(models.values()))],
    }
