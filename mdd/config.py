"""Run configuration: frozen pydantic models validated at load time.

YAML is parsed only here (at the edge); errors name the offending key. The resolved
configuration is saved beside the outputs in ``run.json``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mdd.errors import MddError


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AdmissionOptions(_Frozen):
    """How an engine admits new dialogues (mdd/engines/vllm/admission.py)."""

    mode: Literal["fixed", "kv"] = Field("fixed", description="fixed: every dialogue the driver sends (synth."
                                         "in_flight) runs at once; kv: a new dialogue waits until the engine's KV "
                                         "cache holds it beside the live ones, by a footprint learnt from the run")
    fill: float = Field(0.9, gt=0.0, le=1.0, description="share of the KV cache kv admission plans to fill")
    prior_tokens: int | None = Field(None, ge=1, description="a dialogue's expected KV footprint before the run has "
                                     "taught one (tokens, time-averaged); None: max_model_len / 2")


class VLLMOptions(_Frozen):
    """vLLM engine arguments (set explicitly: the async defaults are small)."""

    num_engines: int = Field(1, ge=1, description="engine actors; one per GPU (or per TP group)")
    tensor_parallel_size: int = Field(1, ge=1)
    num_gpus_per_engine: float = Field(1.0, ge=0.0, description="0 on a CPU-only machine")
    num_cpus_per_engine: float = Field(1.0, ge=0.0)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=16)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    max_model_len: int = Field(8192, ge=128)
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    block_size: int | None = Field(None, ge=1, description="KV-cache block (tokens); the prefix cache reuses whole "
                                   "blocks only. None: vLLM's default (16 on GPUs, 128 on the CPU build)")
    kv_cache_dtype: str = Field("auto", description="KV-cache storage: 'auto' (the model's dtype) or 'fp8_e4m3' / "
                                "'fp8_e5m2' / 'fp8': half the bytes of bf16, so twice the dialogues in flight per "
                                "GB and half the memory read per decoded token")
    kv_cache_space_gib: float | None = Field(None, description="VLLM_CPU_KVCACHE_SPACE on the CPU build")
    kv_cache_tokens: int | None = Field(None, ge=16, description="cap the KV cache at this many tokens (vLLM's "
                                        "num_gpu_blocks_override; needs block_size): the benchmark's KV-pressure runs")
    admission: AdmissionOptions = AdmissionOptions()
    enforce_eager: bool = False
    max_restarts: int = Field(2, ge=0, description="times an engine actor that died is restarted")
    per_request_seed: bool | None = Field(None, description="send each call's seed to vLLM; None: yes on GPUs, "
                                          "no on the CPU build (its sampler crashes on seeded requests in a batch)")
    batch_invariant: bool = Field(False, description="vLLM's batch invariance (VLLM_BATCH_INVARIANT=1; GPUs of "
                                  "compute capability 8.0+, beta, slower): with per-request seeds, a rerun gives the "
                                  "same text byte for byte whatever else shares the batch")
    v1_multiprocessing: bool | None = Field(None, description="VLLM_ENABLE_V1_MULTIPROCESSING; None: off on the CPU "
                                            "build (a separate worker process and its polling cost a core's share "
                                            "there), vLLM's default elsewhere")
    cpu_threads: int | None = Field(None, ge=1, description="CPU build: intra-op threads once the engine holds "
                                    "cpu_threads_min_batch requests; one thread below that (at batch 1 the threads "
                                    "only synchronise). None: as started (Ray sets OMP_NUM_THREADS to "
                                    "num_cpus_per_engine)")
    cpu_threads_min_batch: int = Field(16, ge=1, description="requests in flight that switch to cpu_threads; "
                                       "back to one thread at half of it")
    extra: dict[str, Any] = Field(default_factory=dict, description="passed to AsyncEngineArgs as is")
    hosted: str | None = Field(None, description="host this in-process engine (one that reads no options, e.g. "
                               "scripted) in each engine actor instead of vLLM: the same placement (one actor per "
                               "GPU), routing and failure handling, no model (a cluster dry run)")
    startup_timeout_s: float = Field(900.0, gt=0, description="wait this long for the engines to be ready")
    stats_refresh_s: float = Field(5.0, gt=0, description="how often a pool client refreshes engine load")

    @field_validator("hosted")
    @classmethod
    def _hostable(cls, v: str | None) -> str | None:
        if v is not None:
            hostable = sorted(n for n, e in _engines().items() if e.options is None)
            if v not in hostable:
                raise ValueError(f"unknown engine {v!r} to host; engines that read no options: {', '.join(hostable)}")
        return v

    @model_validator(mode="after")
    def _kv_tokens_need_blocks(self) -> "VLLMOptions":
        if self.kv_cache_tokens is not None and self.block_size is None:
            raise ValueError("kv_cache_tokens needs block_size (the cap is set in whole blocks)")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.max_model_len:
            raise ValueError(f"kv_cache_tokens ({self.kv_cache_tokens}) must hold one prompt of max_model_len "
                             f"({self.max_model_len}): vLLM refuses to start otherwise")
        return self


class OpenAIOptions(_Frozen):
    base_url_env: str = "MDD_OPENAI_BASE_URL"
    api_key_env: str = "MDD_OPENAI_API_KEY"
    base_url: str | None = None
    concurrency: int = Field(64, ge=1)
    max_retries: int = Field(5, ge=0)
    timeout_s: float = Field(120.0, gt=0)
    backoff_s: float = Field(1.0, ge=0)
    max_backoff_s: float = Field(30.0, ge=0, description="cap on one backoff sleep")


def _engines() -> dict[str, Any]:
    """The registered engines (imports the built-in ones: ``mdd/providers.py``)."""
    from mdd.providers import load_engines

    return load_engines()


class EngineConfig(_Frozen):
    """``name``: a registered engine (``mdd/providers.py``); each reads its options under its name."""

    name: str = Field("scripted", validate_default=True)
    model: str = "scripted"
    vllm: VLLMOptions = VLLMOptions()
    openai: OpenAIOptions = OpenAIOptions()

    @field_validator("name")
    @classmethod
    def _registered(cls, v: str) -> str:
        known = _engines()
        if v not in known:
            raise ValueError(f"unknown engine {v!r}; known: {', '.join(sorted(known))}")
        return v


class SamplingConfig(_Frozen):
    """How the speaking agents sample. A field the config leaves out takes the model family's
    recommendation (``family``; ``mdd/knowledge/sampling.yaml``: Qwen2.5's published temperature 0.7,
    top_p 0.8, top_k 20, repetition_penalty 1.05), else the default below; a field the config sets is
    used as set."""

    family: str = Field("auto", description="whose recommended sampling fills the fields not set: auto (by the "
                        "doctor's model name), a family of mdd/knowledge/sampling.yaml, or none (the defaults "
                        "below)")
    temperature: float = Field(0.8, ge=0.0)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens (0: off)")
    frequency_penalty: float = 0.3
    repetition_penalty: float = Field(1.0, gt=0.0, description="vLLM's repetition penalty (1.0: off; Qwen "
                                      "recommends 1.05)")
    doctor_max_tokens: int = Field(160, ge=8)
    patient_max_tokens: int = Field(200, ge=8)
    story_max_tokens: int = Field(400, ge=8)
    story_frequency_penalty: float = Field(0.5, description="the fictitious experience's own frequency penalty: a "
                                           "long first-person text is where a small model loops (我开始…我开始…)")
    verdict_max_tokens: int = Field(8, ge=1)
    json_max_tokens: int = Field(96, ge=8)
    doctor_min_tokens: int = Field(0, ge=0, description="doctor answers run to at least this many tokens (the end "
                                   "token is held back until then; 0: off). With doctor_max_tokens equal, every "
                                   "question has that length: the benchmark's production profile gives the "
                                   "random-weight tiny model MDD-5k's turn lengths this way")
    patient_min_tokens: int = Field(0, ge=0, description="as doctor_min_tokens, for the patient's answers")

    @model_validator(mode="after")
    def _min_below_max(self) -> "SamplingConfig":
        for who in ("doctor", "patient"):
            lo, hi = getattr(self, f"{who}_min_tokens"), getattr(self, f"{who}_max_tokens")
            if lo > hi:
                raise ValueError(f"{who}_min_tokens ({lo}) must not exceed {who}_max_tokens ({hi})")
        return self


class InterviewConfig(_Frozen):
    """When an interview is sufficient: every required item of the case's diagnoses asked
    (mdd/knowledge/checklists.yaml) and a seeded length target reached."""

    checklist: bool = Field(True, description="ask the required items of the case's diagnoses "
                            "(mdd/knowledge/checklists.yaml); off: the tree's topics only")
    target_exchanges: float = Field(20.0, ge=1.0, description="mean of the per-dialogue length target "
                                    "(a seeded normal draw); the released MDD-5k corpus averages 23.4 exchanges, "
                                    "17-35. A dialogue runs longer when its required items need it")
    target_spread: float = Field(4.0, ge=0.0, description="standard deviation of the length target")
    fast_shift: float = Field(-3.0, description="added to the target for fast doctor personas")
    slow_shift: float = Field(3.0, description="added to the target for slow doctor personas")
    required_slack: int = Field(3, ge=0, description="the target is at least the opening plus the required "
                                "topics plus a seeded 0..required_slack exchanges")
    min_exchanges: int = Field(10, ge=1, description="the length target is at least this")


class ExemplarConfig(_Frozen):
    """Exemplar retrieval: before the doctor asks about a topic, the best question-answer pairs on that
    topic from an earlier run's index are shown to it as examples of good questions."""

    index: str | None = Field(None, description="a run folder (or URI) whose index/ holds the high-quality pairs, "
                              "e.g. an earlier run's OUT; None: no exemplars")
    k: int = Field(2, ge=1, le=8, description="exemplars per topic")
    candidates: int = Field(64, ge=1, description="nearest pairs fetched before the filters")
    per_case: int = Field(1, ge=1, description="diversity: at most this many exemplars from any one source case")
    min_score: float = Field(0.0, ge=-1.0, le=1.0, description="leave out pairs less similar than this (cosine)")
    answer_chars: int = Field(60, ge=0, description="each exemplar's answer is cut to this many characters (the "
                              "question is what the doctor learns from; the answer shows it was answered)")
    followups: bool = Field(False, description="also before follow-up questions (default: a topic's first question)")
    keep_in_history: bool = Field(True, description="the exemplars stay in the doctor's history with the turn's "
                                  "instruction (every later prompt extends the one that carried them: computed "
                                  "once); False drops them after the turn, which breaks the cached prefix there")


class CompanionConfig(_Frozen):
    """The family member in the room (mdd/dialogue/companion.py)."""

    enabled: bool = True
    minor_age: int = Field(17, ge=0, description="patients this old or younger always come with a parent")
    elderly_age: int = Field(60, ge=0)
    p_elderly: float = Field(0.3, ge=0.0, le=1.0, description="chance an elderly patient comes with someone")
    p_psychotic: float = Field(0.5, ge=0.0, le=1.0, description="chance a psychotic patient comes with someone")
    p_severe: float = Field(0.3, ge=0.0, le=1.0, description="chance a severely ill patient comes with someone")
    severe_words: tuple[str, ...] = Field(("重度",), description="diagnosis words that mark severe illness")
    p_mother: float = Field(0.7, ge=0.0, le=1.0, description="a minor's parent is the mother by this chance")
    p_either: float = Field(0.5, ge=0.0, le=1.0, description="an `audience: either` topic goes to the companion")
    p_interject: float = Field(0.15, ge=0.0, le=1.0, description="the companion adds to a patient answer on a "
                               "topic it knows about")
    p_correct: float = Field(0.7, ge=0.0, le=1.0, description="the companion corrects an answer that played down "
                             "what the record affirms")
    max_interjections: int = Field(3, ge=0)


GUARDS = ("role", "echo", "loop", "leak", "truncation", "repeat", "language", "faithfulness")  # mdd/dialogue/guards.py


class GuardConfig(_Frozen):
    """Turn guards at generation time (mdd/dialogue/guards.py, mdd/knowledge/guards.yaml): every generated
    turn is checked, a failing one regenerated with a new seed and a short corrective note; a turn that
    still fails ends the dialogue as a counted failure (failures.parquet), never as a clean row."""

    enabled: tuple[str, ...] = Field(GUARDS, description="the guards that run")
    max_regenerations: int = Field(3, ge=0, description="regenerations of one failing turn before the dialogue "
                                   "fails")
    story: bool = Field(True, description="guard the fictitious experience too (loop, leak, language, truncation, "
                        "role)")
    skip_asked_topic: bool = Field(True, description="a doctor turn that fails only as a repeat of its own earlier "
                                   "question, or an answer that fails only as an echo (its question is then taken "
                                   "back), ends its topic, not the dialogue (the row's topics_skipped counts them)")
    max_topics_skipped: int = Field(3, ge=0, description="at most this many topics a dialogue so ends; the next "
                                    "such turn ends the dialogue as a failure")
    trim: bool = Field(True, description="a turn stopped at the token limit is cut back to its last whole sentence "
                       "when at least 8 characters are left (the row's trimmed_turns counts them)")
    temperature_step: float = Field(0.15, ge=0, description="each regeneration samples this much hotter ...")
    max_temperature: float = Field(1.1, ge=0, description="... up to this temperature")

    @field_validator("enabled")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [g for g in v if g not in GUARDS]
        if unknown:
            raise ValueError(f"unknown guard(s) {unknown}; known: {list(GUARDS)}")
        return v


class LayoutConfig(_Frozen):
    """How each speaking agent's history is rendered (mdd/dialogue/views.py): its own turns are the
    assistant's, everyone else's the user's; the per-turn instruction goes after the other side's last
    words, before them, or in a system message of its own right before the reply; the other side's
    turns carry a speaker label (医生：…) always or only when a companion makes three speakers. Every
    layout keeps the prompts append-only (the prefix cache)."""

    instruction: Literal["after", "before", "system"] = Field("after", description="where the per-turn "
                                                                "instruction goes")
    labels: Literal["companion", "always"] = Field("companion", description="label the other side's turns "
                                                   "always, or only with a companion in the room")


class DialogueConfig(_Frozen):
    max_exchanges_per_topic: int = Field(3, ge=1, description="hard cap, whatever IsTopicEnd says")
    max_exchanges: int = Field(60, ge=2, description="IsDialEnd's hard cap for a whole dialogue (a short cap makes "
                               "smoke-test dialogues: the interview ends there, required items or not)")
    history_window: int = Field(0, ge=0, description="0 keeps the whole history (prefix-cache friendly)")
    max_context_tokens: int = Field(0, ge=0, description="end the dialogue once a prompt plus its answer "
                                    "would pass this many tokens (keep below the model's context); 0: no limit")
    dup_detect: bool = True
    sampling: SamplingConfig = SamplingConfig()
    guards: GuardConfig = GuardConfig()
    layout: LayoutConfig = LayoutConfig()
    interview: InterviewConfig = InterviewConfig()
    exemplars: ExemplarConfig = ExemplarConfig()
    companion: CompanionConfig = CompanionConfig()


class SynthConfig(_Frozen):
    cases: str = "data/cases"
    out: str = "out/local"
    variants: int = Field(5, ge=1)
    seed: int = 20250225
    in_flight: int = Field(64, ge=1, description="dialogues in flight across all workers")
    num_workers: int = Field(1, ge=1)
    shard_size: int = Field(50, ge=1, description="dialogues per Parquet shard")
    tail_order: Literal["longest_first", "plan"] = Field(
        "longest_first", description="the order the run's last 2 x in_flight dialogues are submitted in: longest "
                                     "planned first (the slots stay full longer at the end), or plan order")
    max_attempts: int = Field(4, ge=1, description="attempts per dialogue before it is a failure")
    retry_backoff_s: float = Field(10.0, ge=0.0, description="first wait before retrying a dialogue whose engine "
                                   "failed; doubles per attempt (an engine restart takes about a minute)")
    limit: int | None = Field(None, ge=1, description="only the first N valid cases")
    allow_mixed_sources: bool = Field(False, description="run cases of both sources (synthetic and real or "
                                      "unstated) together; without it such a run is refused before any work")
    dialogue: DialogueConfig = DialogueConfig()


class RayConfig(_Frozen):
    address: str | None = Field(None, description="None: RAY_ADDRESS from the environment, else a local Ray")
    num_cpus: int | None = None
    include_dashboard: bool = False


class ValidityConfig(_Frozen):
    """The self-check every evaluation run makes (mdd/evaluate/validity.py)."""

    sample_dialogues: int = Field(40, ge=2, description="dialogues of the run its negative controls are made from")
    min_auc: float = Field(0.8, ge=0.5, le=1.0, description="patient_ability AUC, real vs each control, to count "
                           "as separated")
    max_control_hq_share: float = Field(0.1, ge=0.0, le=1.0, description="controls' high-quality share above "
                                        "which a recipe counts as not separated")
    seed: int = 0


class IndexConfig(_Frozen):
    """The FAISS index of the high-quality pairs (mdd/index/)."""

    dim: int = Field(1024, ge=8, description="index vectors: the embedder's projected to this many dimensions "
                     "(seeded random projection; embedders not wider are kept), stored as 8-bit scalars")
    seed: int = Field(0, description="seed of the projection matrix")
    flat_max_pairs: int = Field(10_000, ge=1, description="up to this many distinct pairs an exact flat scan; "
                                "above it an IVF index trained on a sample")
    nlist: int | None = Field(None, ge=1, description="IVF lists; None: about 4 x sqrt(pairs)")
    min_recall: float = Field(0.95, gt=0.0, le=1.0, description="IVF: the smallest nprobe (a power of two) whose "
                              "recall@10 against exact search on held-back queries reaches this")
    queries: int = Field(200, ge=1, description="held-back queries for the recall measurements")
    train_pairs: int = Field(20_000, ge=1, description="pairs the quantizer (and IVF) is trained on, at most")
    check_pairs: int = Field(2_000, ge=0, description="pairs re-embedded with the full embedder to measure the "
                             "compaction's recall@10")
    near_duplicate_cos: float = Field(0.95, gt=0.0, le=1.0, description="cosine at which two distinct pairs "
                                      "count as near-duplicates (measured, not merged)")
    row_group_size: int = Field(1024, ge=1, description="sidecar rows per Parquet row group (a search reads "
                                "only the row groups of its hits)")


class EvaluateConfig(_Frozen):
    embedder: str = "hashing"
    embedder_model: str | None = None
    judge: str = "keyword"
    threshold: float = Field(0.7, ge=0.0, le=1.0)
    rule_sets: tuple[str, ...] = ("psychiatric",)
    batch_size: int = Field(256, ge=1, description="exchanges per scoring batch, in whole dialogues (~20 "
                            "exchanges each): the relevance signal compares a dialogue with the others of its batch")
    distractors: int = Field(15, ge=1)
    faithfulness_default: float = Field(0.75, ge=0.0, le=1.0)
    faithfulness: Literal["auto", "record", "default", "llm"] = Field(
        "auto", description="auto: the LLM judge (cfg.engine) when judge is 'llm', else record; record: checked "
        "against OUT/cases.parquet (null where a dialogue's case record is unknown); default: the seed's constant "
        "faithfulness_default"
    )
    relevance_spaces: Literal["lexical", "embedder", "lexical+embedder"] = Field(
        "lexical", description="vectors of the calibrated relevance: IDF character n-grams learnt from the run, "
        "the embedder's, or both (mean z)")
    idf_sample_dialogues: int = Field(300, ge=1, description="dialogues the n-gram document frequencies are "
                                      "learnt from")
    validity: ValidityConfig = ValidityConfig()
    concurrency: int | None = Field(None, ge=1, description="shard workers (scoring and rules, one synth shard "
                                    "each at a time); None: one per CPU, one per GPU for sentence-transformers, one "
                                    "with the LLM judge")
    index: IndexConfig = IndexConfig()
    incremental: bool = Field(True, description="evaluate only the synth shards not yet evaluated with this "
                              "evaluator's fingerprint (eval/state.json); false: everything, IDF refitted")
    lexicon: str | None = Field(None, description="evaluator lexicon YAML; None: mdd/knowledge/lexicons.yaml")


class ExportConfig(_Frozen):
    """``mdd export``: SFT (OpenAI messages) / ShareGPT rows filtered by the evaluation."""

    min_quality: float | None = Field(None, ge=0.0, le=1.0, description="keep dialogues whose mean of `metric` "
                                      "(eval/dialogues) is at least this; None keeps all")
    metric: str = Field("overall", description="the eval/dialogues column min_quality applies to")
    min_rule_pass: float | None = Field(None, ge=0.0, le=1.0, description="keep dialogues that passed at least "
                                        "this share of their triggered rules; None keeps all")
    mask_below: float | None = Field(None, ge=0.0, le=1.0, description="trim instead of drop: doctor turns whose "
                                     "exchange scores below this doctor_quality get weight 0 (kept as context, "
                                     "not trained on); None: every doctor turn has weight 1")


class PublishConfig(_Frozen):
    """The run report, the dataset card and the exports (``mdd/publish/``)."""

    report: bool = Field(True, description="the main job writes OUT/report.html, OUT/report/*.png, OUT/README.md")
    reference: str | None = Field(None, description="a dialogue table (run folder or Parquet) whose figures the "
                                  "report shows as reference; None: the published MDD-5k figures")
    license: str = Field("apache-2.0", description="the dataset card's licence (a Hugging Face licence id)")
    pretty_name: str | None = Field(None, description="the dataset card's title; None: from run_name")
    export: ExportConfig = ExportConfig()


class PrivacyConfig(_Frozen):
    """De-identification (mdd/privacy.py). The id-hash key is never part of the config: it comes from
    the environment variable named here, else from the output's own key file (OUT/.privacy-key)."""

    case_ids: Literal["auto", "always"] = Field(
        "auto", description="auto: hash the case ids that look personal (names, long numbers, anything the "
        "pattern set finds); always: hash every case id")
    key_env: str = Field("MDD_PRIVACY_KEY", min_length=1, description="environment variable holding the id-hash key")


class Config(_Frozen):
    run_name: str = "local"
    engine: EngineConfig = Field(default_factory=EngineConfig)
    engines: dict[str, EngineConfig] | None = Field(
        None, description="named engines, each launched once (instead of engine:); roles: says which plays what")
    roles: dict[str, Any] | None = Field(
        None, description="role -> engine name, list of names or {name: weight}; default: the roles not listed. "
                          "Roles: doctor, patient, companion, tool, judge. A dialogue draws one engine per role")
    synth: SynthConfig = SynthConfig()
    ray: RayConfig = RayConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    publish: PublishConfig = PublishConfig()
    privacy: PrivacyConfig = PrivacyConfig()

    @field_validator("run_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("run_name must not be empty")
        return v

    @model_validator(mode="after")
    def _roles_name_engines(self) -> "Config":
        if self.engines is None:
            if self.roles is not None:
                raise ValueError("roles: needs named engines (engines:); with engine: every role runs on it")
            return self
        if not self.engines:
            raise ValueError("engines: names no engine")
        if "engine" in self.model_fields_set:
            raise ValueError("engine: and engines: are both given; keep one (engines: names each engine)")
        for name in self.engines:
            if not name or "+" in name or name == "default":
                raise ValueError(f"engines.{name}: not a usable engine name")
        self.role_map()  # raises naming the key
        return self

    def required_roles(self) -> tuple[str, ...]:
        """The roles this run calls: the dialogue's, and the judge's when the evaluation asks an LLM."""
        from mdd.engines.roles import SYNTH_ROLES

        ev = self.evaluate
        llm = ev.judge == "llm" or ev.faithfulness == "llm"
        return SYNTH_ROLES + (("judge",) if llm else ())

    def role_map(self) -> Any:
        """The validated ``roles:`` (an ``mdd.engines.roles.RoleMap``); None with a single ``engine:``."""
        from mdd.engines.roles import RoleMap

        if self.engines is None:
            return None
        roles = self.roles
        if roles is None:
            if len(self.engines) > 1:
                raise ValueError("roles: required when engines: names more than one engine")
            roles = {"default": next(iter(self.engines))}
        return RoleMap.build(roles, self.engines, self.required_roles())

    def engine_for(self, role: str) -> EngineConfig | None:
        """The engine config of ``role`` (the judge's for the evaluation; a mix gives its first).
        None: named engines and none for ``role``, which this run then never calls (a role the run
        calls without an engine is a config error)."""
        if self.engines is None:
            return self.engine
        try:
            return self.engines[self.role_map().options(role)[0][0]]
        except KeyError:
            return None


class ConfigError(MddError, ValueError):
    pass


SAMPLING_FAMILY_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "frequency_penalty")


def sampling_family(name: str, model: str) -> dict[str, Any] | None:
    """The recommended sampling of family ``name`` (``auto``: the family whose match word ``model``
    holds; ``none``: no family). Raises ConfigError on an unknown family name."""
    from mdd import knowledge

    families = knowledge.load_yaml("sampling.yaml")["families"]
    if name == "none":
        return None
    if name == "auto":
        key = os.path.basename(str(model).rstrip("/")).lower() or str(model).lower()
        key = f"{str(model).lower()} {key}"
        return next((f for f in families.values() if any(m in key for m in f["match"])), None)
    if name not in families:
        raise ConfigError(f"synth.dialogue.sampling.family: unknown family {name!r}; known: auto, none, "
                          f"{', '.join(sorted(families))}")
    return families[name]


def resolve_sampling(cfg: "Config") -> "Config":
    """``cfg`` with the doctor's model family's recommended sampling in every sampling field the config
    left out (``SamplingConfig.family``)."""
    s = cfg.synth.dialogue.sampling
    doctor = cfg.engine_for("doctor")
    fam = sampling_family(s.family, doctor.model if doctor is not None else "")
    if fam is None:
        return cfg
    update = {k: fam[k] for k in SAMPLING_FAMILY_FIELDS if k in fam and k not in s.model_fields_set}
    if not update:
        return cfg
    d = cfg.synth.dialogue
    return cfg.model_copy(update={"synth": cfg.synth.model_copy(update={"dialogue": d.model_copy(
        update={"sampling": SamplingConfig.model_validate({**s.model_dump(exclude_unset=True), **update,
                                                           "family": s.family})})})})


# a dotted key given on the command line -> its flag, where the flag is not --<leaf with dashes>
FLAGS = {"synth.dialogue.exemplars.index": "--exemplars"}


def flag_of(dotted: str) -> str:
    return FLAGS.get(dotted) or "--" + dotted.rsplit(".", 1)[-1].replace("_", "-")


def _describe(err: ValidationError, path: str, given: dict[str, Any] | None = None) -> str:
    """One line naming each bad key and what is wrong (pydantic's messages do not quote the value); a
    key that came from the command line (``given``: dotted key -> value) is blamed on its flag."""
    problems, from_flags = [], []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")  # our own checks already name their key
        flag = next((k for k in (given or {}) if key == k or key.startswith(k + ".")), None)
        if flag is not None:
            assert given is not None  # a flag is found only in ``given``
            from_flags.append(f"{flag_of(flag)} {given[flag]}: {msg} (it overrides {flag})")
        else:
            problems.append(f"{key}: {msg}" if key else msg)
    parts = []
    if from_flags:
        parts.append("invalid command line: " + "; ".join(from_flags))
    if problems:
        parts.append(f"{path}: invalid configuration: " + "; ".join(problems))
    return "; ".join(parts)


def load_config(path: str | os.PathLike | None, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML config (None: the embedded defaults), apply dotted-key overrides."""
    data: dict[str, Any] = {}
    src = "<defaults>"
    if path is not None:
        src = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{src}: config file not found")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{src}: cannot be read as UTF-8 text ({type(exc).__name__})") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:  # the position and the problem, not the text around it
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ConfigError(f"{src}: not valid YAML{where}: "
                              f"{getattr(exc, 'problem', None) or type(exc).__name__}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{src}: the top level must be a mapping")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{src}: {dotted}: {k} must be a mapping")
        node[leaf] = value
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, src, {k: v for k, v in (overrides or {}).items() if v is not None})) from exc
    return resolve_sampling(cfg)
