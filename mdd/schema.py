"""Arrow schemas of every table the project writes, in one place.

Readers (polars, pandas, HF datasets) see exactly these columns and types.
"""
from __future__ import annotations

import pyarrow as pa

TURN = pa.struct(
    [
        pa.field("speaker", pa.string(), nullable=False),  # "doctor" | "patient" | "companion"
        pa.field("text", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        # patient turns: the case-record fields the answer was grounded on ("现病史", "精神检查.情感");
        # null for other turns and for dialogues made elsewhere
        pa.field("grounding", pa.list_(pa.string())),
        pa.field("exemplars", pa.list_(pa.int64())),  # doctor turns: ids (index sidecar) of the exemplars it saw
    ]
)

TOKENS_BY_ROLE = pa.struct(
    [
        pa.field("doctor", pa.int64()),
        pa.field("patient", pa.int64()),
        pa.field("tool", pa.int64()),
        pa.field("companion", pa.int64()),  # the family member in the room (null in older files)
    ]
)

# Which model played each role in a dialogue (null: the role made no call)
MODELS_BY_ROLE = pa.struct(
    [
        pa.field("doctor", pa.string()),
        pa.field("patient", pa.string()),
        pa.field("tool", pa.string()),
        pa.field("companion", pa.string()),
        pa.field("judge", pa.string()),
    ]
)

# Calls and tokens per model, one entry per model that served the dialogue (a list of structs,
# not a map: Hugging Face datasets has no map type)
USAGE_BY_MODEL = pa.list_(pa.struct(
    [
        pa.field("model", pa.string()),
        pa.field("calls", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
    ]
))

# A generated turn's attempt that a turn guard failed (mdd/dialogue/guards.py): the turn was asked again
GUARD_EVENT = pa.struct(
    [
        pa.field("turn", pa.int32()),  # the index the turn has (or would have had) in `turns`; the story: 0
        pa.field("speaker", pa.string()),  # doctor | patient | companion | story (the fictitious experience)
        pa.field("guard", pa.string()),  # role | echo | loop | leak | truncation | repeat | language | faithfulness
        pa.field("attempt", pa.int32()),  # 0: the first generation
        pa.field("reason", pa.string()),
        pa.field("text", pa.string()),  # what the failed attempt said (its first 200 characters)
    ]
)

# One row per synthesized (or imported) dialogue: OUT/synth/*.parquet
DIALOGUE = pa.schema(
    [
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("case_id", pa.string(), nullable=False),
        pa.field("variant", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("doctor_persona", pa.string()),
        pa.field("experience", pa.string()),  # the fictitious past experience, as told
        pa.field("experience_triple", pa.struct(
            [pa.field("time", pa.string()), pa.field("people", pa.string()), pa.field("event", pa.string())]
        )),
        pa.field("topics", pa.list_(pa.string())),
        pa.field("turns", pa.list_(TURN)),
        pa.field("icd_code", pa.string()),
        pa.field("diagnosis", pa.string()),
        pa.field("treatment", pa.string()),
        pa.field("gender", pa.string()),
        pa.field("age", pa.int32()),
        pa.field("age_range", pa.list_(pa.int32())),  # [lo, hi] around the exact age: rule_set.age_range
        pa.field("n_turns", pa.int32()),  # doctor turns, the last (diagnosis) turn included
        pa.field("n_exchanges", pa.int32()),  # doctor question + patient answer pairs
        pa.field("engine", pa.string()),
        pa.field("model", pa.string()),
        pa.field("llm_calls", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("prompt_tokens_by_role", TOKENS_BY_ROLE),
        pa.field("output_tokens_by_role", TOKENS_BY_ROLE),
        pa.field("fallbacks", pa.int64()),  # tool verdicts that fell back to a rule
        pa.field("source", pa.string()),  # "mdd" for synthesized, "mdd5k" for imported
        pa.field("patient_style", pa.string()),  # the patient's speech style (mdd/knowledge/styles.yaml)
        pa.field("jargon_turns", pa.int32()),  # patient turns using clinical jargon (mdd/record/speech.py)
        pa.field("topic_ids", pa.list_(pa.string())),  # the ids of `topics` (tree / module / experience ids)
        pa.field("required_items", pa.list_(pa.string())),  # the checklist items the case's diagnoses require
        pa.field("items_asked", pa.list_(pa.string())),  # those of them the doctor asked
        pa.field("exemplar_index", pa.string()),  # the run whose index/ the turns' exemplar ids point into
        pa.field("companion", pa.string()),  # who came with the patient (母亲, 丈夫 …); null: nobody
        # accounting by role and by model (null in files written before they existed)
        pa.field("models", MODELS_BY_ROLE),
        pa.field("calls_by_role", TOKENS_BY_ROLE),
        pa.field("cached_tokens_by_role", TOKENS_BY_ROLE),
        pa.field("usage_by_model", USAGE_BY_MODEL),
        # turn guards: every failed attempt that was asked again, and how many attempts were (null in files
        # written before the guards)
        pa.field("guard_events", pa.list_(GUARD_EVENT)),
        pa.field("regenerations", pa.int32()),
        pa.field("trimmed_turns", pa.int32()),
        pa.field("topics_skipped", pa.int32()),
        # the case's provenance (cases.parquet's source, profile, plan_seed): synthetic | real | null
        pa.field("case_source", pa.string()),
        pa.field("case_profile", pa.string()),
        pa.field("case_plan_seed", pa.int64()),
    ]
)

# One row per validated (already masked) case of a synthesis: OUT/cases.parquet. ``fields`` maps a
# record field path ("主诉", "现病史", "个人史.婚恋情况", "精神检查.情感", ...) to its text; a section
# given as one string is one entry under its own name. The evaluator checks answers against it.
CASE = pa.schema(
    [
        pa.field("case_id", pa.string(), nullable=False),
        pa.field("age", pa.int32()),
        pa.field("gender", pa.string()),
        pa.field("icd_code", pa.string()),
        pa.field("diagnosis", pa.string()),
        pa.field("treatment", pa.string()),
        pa.field("fields", pa.map_(pa.string(), pa.string())),
        pa.field("masked", pa.list_(pa.string())),  # "field:kind" of personal data that was masked
        pa.field("source", pa.string()),  # synthetic | real | null (the record does not say)
        pa.field("profile", pa.string()),  # a synthetic case's profile (mdd/knowledge/profiles/)
        pa.field("plan_seed", pa.int64()),  # a synthetic case's plan seed
    ]
)

# One row per rejected case: OUT/rejects.parquet
REJECT = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),  # the file
        pa.field("position", pa.int64(), nullable=False),  # 0-based index of the record in the file; -1: the whole file
        pa.field("case_id", pa.string()),  # null when the record has no usable id
        pa.field("field", pa.string(), nullable=False),  # "(file)" / "(line)": the file or JSONL line is unreadable
        pa.field("reason", pa.string(), nullable=False),
        pa.field("line", pa.int64()),  # 1-based line of a JSONL file; null for other files
    ]
)

# One row per dialogue that failed after its retries: OUT/failures.parquet
FAILURE = pa.schema(
    [
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("case_id", pa.string(), nullable=False),
        pa.field("variant", pa.int32(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        # a dialogue a turn guard ended: the guards that failed its last turn, that turn's speaker, and every
        # failed attempt of the dialogue (null for other failures)
        pa.field("guards", pa.list_(pa.string())),
        pa.field("speaker", pa.string()),
        pa.field("guard_events", pa.list_(GUARD_EVENT)),
    ]
)

# --- evaluation stage -------------------------------------------------------------

METRICS = (
    "relevance",
    "relevance_rank",
    "faithfulness",
    "robustness",
    "specificity",
    "targetedness",
    "professionalism",
    "patient_ability",
    "doctor_quality",
    "overall",
)

# null where unknown: faithfulness without a case record (imported dialogues) and without an LLM judge
NULLABLE_METRICS = ("faithfulness",)

# One row per doctor question / patient answer exchange: OUT/eval/turns/
TURN_EVAL = pa.schema(
    [
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("case_id", pa.string()),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("question", pa.string()),
        pa.field("answer", pa.string()),
        *[pa.field(m, pa.float64(), nullable=m in NULLABLE_METRICS) for m in METRICS],
        pa.field("high_quality", pa.bool_(), nullable=False),
        # the first gate of mdd/evaluate/gates.py the exchange failed, or "ok" (high quality)
        pa.field("hq_reason", pa.string()),
        # the turn guards (mdd/dialogue/guards.py) the exchange fails: "doctor:repeat", "answer:echo" …
        pa.field("turn_guards", pa.list_(pa.string())),
    ]
)

# One row per dialogue x rule: OUT/eval/rules/
RULE_RESULT = pa.schema(
    [
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("rule", pa.string(), nullable=False),
        pa.field("n", pa.int32()),  # the resolved turn; null when skipped before resolution
        pa.field("triggered", pa.bool_(), nullable=False),  # the rule applied (precondition met, N in range)
        pa.field("score", pa.float64()),  # 1 passed, 0 failed, null when not triggered
        pa.field("kwargs", pa.string()),  # JSON evidence
        pa.field("reason", pa.string(), nullable=False),
    ]
)

# One row per ICD prefix (of the leading diagnosis) x required item: OUT/eval/coverage/
COVERAGE = pa.schema(
    [
        pa.field("icd_prefix", pa.string(), nullable=False),
        pa.field("item", pa.string(), nullable=False),
        pa.field("dialogues", pa.int32(), nullable=False),  # dialogues whose diagnosis requires the item
        pa.field("asked", pa.int32(), nullable=False),  # of them, those where a doctor question asked it
        pa.field("share", pa.float64(), nullable=False),
    ]
)

# One row per dialogue: OUT/eval/dialogues/
DIALOGUE_EVAL = pa.schema(
    [
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("case_id", pa.string()),
        pa.field("n_exchanges", pa.int32(), nullable=False),
        *[pa.field(m, pa.float64(), nullable=m in NULLABLE_METRICS) for m in METRICS],
        pa.field("n_high_quality", pa.int32(), nullable=False),
        pa.field("rules_triggered", pa.int32()),
        pa.field("rules_passed", pa.int32()),
        # exchanges whose question or answer fails a turn guard, as a share; the dialogue's `overall` is the
        # mean of its exchanges' times (1 - this share): a dialogue falls with its collapsed turns
        pa.field("guard_failed_share", pa.float64()),
    ]
)

# Sidecar of the FAISS index, keyed by the same int64 ids: OUT/index/qa.parquet
QA_SIDECAR = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("dialogue_id", pa.string(), nullable=False),
        pa.field("case_id", pa.string()),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("question", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("overall", pa.float64()),
        pa.field("doctor_quality", pa.float64()),
        pa.field("patient_ability", pa.float64()),
        pa.field("diagnosis", pa.string()),
        pa.field("icd_code", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("persona", pa.string()),
        pa.field("count", pa.int32()),  # occurrences of this exact (question, answer) among the run's HQ pairs
        pa.field("dialogue_ids", pa.list_(pa.string())),  # the dialogues they came from (sorted)
        pa.field("case_ids", pa.list_(pa.string())),  # their cases (sorted): exemplars never come from any of them
    ]
)

# --- exports (mdd export) -----------------------------------------------------------

CHAT_MESSAGE = pa.struct(
    [
        pa.field("role", pa.string(), nullable=False),  # "system" | "user" | "assistant"
        pa.field("content", pa.string(), nullable=False),
        pa.field("weight", pa.int8()),  # assistant turns: 1 trained on, 0 context only; null otherwise
    ]
)

_EXPORT_LABELS = [
    pa.field("dialogue_id", pa.string(), nullable=False),
    pa.field("case_id", pa.string()),
    pa.field("icd_code", pa.string()),
    pa.field("diagnosis", pa.string()),
    pa.field("quality", pa.float64()),  # the dialogue's mean of the filter metric (null without evaluation)
]

# One row per exported dialogue: OUT/export/sft/ (OpenAI chat messages; the doctor is the assistant)
SFT_ROW = pa.schema([*_EXPORT_LABELS, pa.field("messages", pa.list_(CHAT_MESSAGE))])

# One row per exported dialogue: OUT/export/sharegpt/ (from: human = patient, gpt = doctor)
SHAREGPT_ROW = pa.schema([
    *_EXPORT_LABELS,
    pa.field("system", pa.string()),
    pa.field("conversations", pa.list_(pa.struct([
        pa.field("from", pa.string(), nullable=False),
        pa.field("value", pa.string(), nullable=False),
        pa.field("weight", pa.int8()),
    ]))),
])

# The evaluation run's validity self-check, one row per control recipe x metric: OUT/eval/validity.parquet.
# auc: P(real scores above control) + half the ties; for "high_quality" the means are HQ shares.
VALIDITY = pa.schema(
    [
        pa.field("control", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("n_real", pa.int64(), nullable=False),
        pa.field("n_control", pa.int64(), nullable=False),
        pa.field("auc", pa.float64()),
        pa.field("real_mean", pa.float64()),
        pa.field("control_mean", pa.float64()),
    ]
)
