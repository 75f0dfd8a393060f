"""The dataset card: ``OUT/README.md`` in the Hugging Face format, so ``datasets.load_dataset(OUT)`` works.

The YAML header names one config per table (``dialogues``, the default, is ``synth/*.parquet``;
``turns``, ``rules`` and ``dialogue_scores`` are the evaluation's tables; ``sft`` / ``sharegpt``
appear once ``mdd export`` has written them) with its features, read from the Parquet files as they
are (so columns added by later stages are described too). The body has the schema, how the data
was made, the report's headline figures, the known limitations and a loading snippet.
"""
from __future__ import annotations

import os
import posixpath
from typing import Any

import pyarrow as pa
import yaml

from mdd.publish.run_data import USAGE_FIELDS, RunData, usage_by_model
from mdd.publish.stats import case_sources, headline, reference
from mdd.storage import Store

CARD_FILE = "README.md"

# (config name, folder under OUT holding its *.parquet, what a row is); the first is the default config
TABLES = (
    ("dialogues", "synth", "one synthesized dialogue"),
    ("turns", "eval/turns", "one doctor question / patient answer exchange with its quality scores"),
    ("rules", "eval/rules", "one dialogue × rule of the multi-turn rule judge"),
    ("dialogue_scores", "eval/dialogues", "one dialogue's mean scores and rule counts"),
    ("sft", "export/sft", "one dialogue as OpenAI-style chat messages (doctor = assistant)"),
    ("sharegpt", "export/sharegpt", "one dialogue in the ShareGPT layout (doctor = gpt)"),
)

COLUMN_DOCS = {
    "dialogue_id": "`{case_id}-v{variant}`, stable across runs",
    "case_id": "the patient case",
    "variant": "which of the case's dialogues (0-based)",
    "seed": "seed derived from (run seed, case id, variant)",
    "doctor_persona": "doctor persona id (mdd/knowledge/personas.yaml)",
    "experience": "the patient's fictitious past experience, as told",
    "experience_triple": "the experience's (time, people, event)",
    "topics": "the topics the doctor asked, in order",
    "turns": "the dialogue: list of {speaker, text, topic, exemplars}; the last doctor turn gives the diagnosis",
    "icd_code": "label: ICD-10 code(s) of the case, comma-separated",
    "diagnosis": "label: the case's diagnosis",
    "treatment": "label: the case's treatment plan",
    "gender": "the patient's gender", "age": "the patient's age",
    "n_turns": "doctor turns, the closing one included", "n_exchanges": "doctor question + patient answer pairs",
    "engine": "engine that wrote it (`scripted` = offline dry run)", "model": "model that wrote it",
    "llm_calls": "LLM calls spent", "prompt_tokens": "prompt tokens spent", "output_tokens": "output tokens spent",
    "prompt_tokens_by_role": "prompt tokens by role", "output_tokens_by_role": "output tokens by role",
    "models": "which model played each role (doctor, patient, tool, companion, judge; null: no call)",
    "calls_by_role": "LLM calls by role",
    "cached_tokens_by_role": "prompt tokens served from the prefix cache, by role",
    "usage_by_model": "per model that served the dialogue: its calls and prompt, output and cached tokens",
    "fallbacks": "tool verdicts that fell back to a rule", "source": "`mdd` (synthesized) or `mdd5k` (imported)",
    "turn": "the exchange's index in its dialogue", "question": "the doctor's question",
    "answer": "the patient's answer",
    "high_quality": "the evaluator's high-quality decision", "rule": "rule id", "triggered": "the rule applied",
    "score": "1 passed, 0 failed, null when not triggered", "reason": "why", "kwargs": "JSON evidence",
    "exemplar_index": "the run whose index/qa.parquet the turns' exemplar ids point into (null: none shown)",
    "messages": "chat messages: system, then the doctor as `assistant` and the patient as `user`",
    "conversations": "ShareGPT turns: `system`, `human` (patient), `gpt` (doctor)",
}

LICENSE_NOTE = ("The licence in the header is the run's `publish.license`. The method follows MDD-5k "
                "(Yin et al., AAAI 2025; its release is MIT-licensed); no MDD-5k data is included.")


def size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                        (10_000_000, "1M<n<10M")):
        if n < limit:
            return name
    return "10M<n<100M"


def hf_feature(t: pa.DataType) -> dict[str, Any]:
    """An Arrow type as the body of a Hugging Face ``features`` YAML entry (``dtype`` / ``list`` / ``struct``)."""
    if pa.types.is_struct(t):
        return {"struct": [dict(name=f.name, **hf_feature(f.type)) for f in t]}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        if pa.types.is_struct(inner):
            return {"list": [dict(name=f.name, **hf_feature(f.type)) for f in inner]}
        body = hf_feature(inner)
        return {"list": body["dtype"] if list(body) == ["dtype"] else body}
    if pa.types.is_map(t):
        raise TypeError(f"map type {t} has no Hugging Face feature (use a list of structs)")
    name = {"string": "string", "large_string": "large_string", "bool": "bool", "double": "float64",
            "float": "float32", "halffloat": "float16"}.get(str(t), str(t))
    return {"dtype": name}


def _schema(store: Store, folder: str) -> pa.Schema | None:
    files = store.files(folder, ".parquet")
    if not files:
        return None
    return pa.unify_schemas([store.read_metadata(f"{folder}/{f}").schema.to_arrow_schema() for f in files],
                            promote_options="permissive")


def _rows(store: Store, folder: str) -> int:
    return sum(store.read_metadata(f"{folder}/{f}").num_rows for f in store.files(folder, ".parquet"))


def header(run: RunData, license: str, pretty_name: str) -> tuple[dict[str, Any], dict[str, pa.Schema]]:
    configs, infos, schemas = [], [], {}
    for name, folder, _ in TABLES:
        sch = _schema(run.store, folder)
        if sch is None:
            continue
        schemas[name] = sch
        cfg: dict[str, Any] = {"config_name": name, "data_files": [{"split": "train", "path": f"{folder}/*.parquet"}]}
        if name == "dialogues":
            cfg["default"] = True
        configs.append(cfg)
        try:
            infos.append({"config_name": name,
                          "features": [dict(name=f.name, **hf_feature(f.type)) for f in sch]})
        except TypeError:  # a column HF cannot describe: let the loader infer this config's features
            pass
    n = run.synth.num_rows if run.synth is not None else 0
    meta = {
        "language": ["zh"],
        "license": license,
        "pretty_name": pretty_name,
        "size_categories": [size_category(n)],
        "task_categories": ["text-generation"],
        "tags": ["medical", "psychiatry", "dialogue", "synthetic", "mdd-5k"],
        "configs": configs,
        "dataset_info": infos,
    }
    return meta, schemas


def _md_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def cell(v: Any) -> str:
        return ("" if v is None else str(v)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    return "" if v is None else str(v)


def limitations(run: RunData, engine: str | None, model: str | None) -> list[str]:
    items = []
    if engine == "scripted":
        items.append("Written by the offline `scripted` engine (a dry run): the doctor's questions and the "
                     "patient's answers are templates filled from the case, not model text. Use it to see the "
                     "pipeline and the schema, not to train a model.")
    synthetic = case_sources(run).get("synthetic")
    if synthetic:
        items.append(f"{synthetic['case_share']:.0%} of the patient cases are synthetic records drawn from a profile's "
                     "priors (`mdd cases synthesize`), not patients: their mix of diagnoses, ages and symptoms follows "
                     "the profile, their wording the case writer (see Case sources).")
    if model and str(model).startswith("tiny:"):
        items.append("Written by a tiny random-weight model: its text is noise by design (it proves the engine path).")
    items += [
        "Synthetic dialogues from de-identified or invented cases; not reviewed by clinicians. Not for "
        "diagnosing or treating anyone.",
        "The quality scores come from an automatic evaluator (lexicons, embeddings and, with `--judge llm`, an "
        "LLM judge); see the run report's validity self-check for how far they separate real from control "
        "answers on this data.",
        "Each dialogue's labels (`icd_code`, `diagnosis`, `treatment`) are the case's, not the dialogue's: the "
        "closing turn states them whatever the conversation found.",
        "Variants of one case share the case's facts: split train/test by `case_id`, not by dialogue.",
    ]
    if run.synth is not None and "turns" in run.synth.column_names:
        speakers = {t.get("speaker") for ts in run.column("synth", "turns") or [] for t in ts or [] if t}
        if "companion" not in speakers:
            items.append("No companion (family member) speaks in these dialogues: doctor and patient only.")
    return items


def write_card(out: str | os.PathLike | Store, cfg: Any = None, reference_path: str | os.PathLike | None = None,
               dest: Store | None = None, sections: dict[str, Any] | None = None) -> str:
    """Write ``OUT/README.md``; ``cfg`` (a ``Config``) gives the licence and title (else from run.json).
    ``dest``: write it there instead (a staging area); ``sections``: run.json sections being written
    with it (the new report or export), read as if committed. Returns where it goes."""
    run = RunData(out, sections)
    store = run.store
    syn = run.synthesis
    pub = (cfg.publish.model_dump() if cfg is not None else syn.setting("publish")) or {}
    run_name = syn.setting("run_name") or posixpath.basename(store.uri.rstrip("/"))
    pretty = pub.get("pretty_name") or f"mdd psychiatric diagnostic dialogues ({run_name})"
    meta, schemas = header(run, pub.get("license") or "apache-2.0", pretty)
    h = (run.section("report") or {}).get("headline") or headline(run, reference(reference_path))
    engine, model = h.get("engine"), h.get("model")

    parts = ["---", yaml.safe_dump(meta, allow_unicode=True, sort_keys=False).rstrip(), "---", "", f"# {pretty}", ""]
    parts += [
        f"Chinese psychiatric diagnostic dialogues (doctor and patient) synthesized by "
        f"`mdd` with the MDD-5k method: {h.get('dialogues', 0):,} dialogues from "
        f"{h.get('cases', 0):,} patient cases, each ending with the case's diagnosis and treatment as labels, "
        "scored per exchange by an automatic evaluator and checked against clinical interview rules. "
        "The run report (`report.html`, figures in `report/`) shows the figures below as plots.",
        "",
        "## Contents",
        "",
        _md_table([{"config": f"`{n}`" + (" (default)" if n == "dialogues" else ""), "files": f"`{g}/*.parquet`",
                    "a row is": what, "rows": _rows(store, g)} for n, g, what in TABLES if n in schemas],
                  ["config", "files", "a row is", "rows"]),
        "",
        "Also here: `run.json` (resolved config, versions, counts, cost, evaluation summary), "
        "`rejects.parquet` (cases that were rejected, by field and reason), `failures.parquet` (dialogues that "
        "failed, if any), `index/` (FAISS index of the high-quality question–answer pairs with its sidecar).",
        "",
        "## Schema",
        "",
    ]
    for name, sch in schemas.items():
        parts += [f"### `{name}`", "",
                  _md_table([{"column": f"`{f.name}`", "type": f"`{f.type}`", "meaning": COLUMN_DOCS.get(f.name, "")}
                             for f in sch], ["column", "type", "meaning"]), ""]
    ev = run.section("evaluate") or {}
    exemplars = syn.setting("synth", "dialogue", "exemplars", "index")
    made = {
        "engine": engine, "model": model,
        "cases": syn.setting("synth", "cases"),
        "variants per case": syn.setting("synth", "variants"),
        "run seed": syn.setting("synth", "seed"),
        "exemplars": exemplars and ("the doctor saw high-quality question–answer pairs of "
                                    f"`{exemplars}` before each topic (ids in `turns[].exemplars`)"),
        "evaluation": (f"embedder `{ev.get('embedder')}`, judge `{ev.get('judge')}`, faithfulness "
                       f"`{ev.get('faithfulness')}`, high-quality threshold {ev.get('threshold')}") if ev else None,
        "versions": ", ".join(f"{k} {v}" for k, v in syn.versions.items()) or None,
        "command": " ".join(syn.argv) or None,
    }
    parts += ["## How it was made", "",
              "Each dialogue follows the paper's Algorithm 1: a doctor agent with a persona, steered by a dynamic "
              "diagnostic tree, interviews a patient agent that answers from the case record and from a fictitious "
              "past experience drawn from a knowledge graph; a tool agent decides topic ends, duplicates and the "
              "experience branch. The full resolved configuration is in `run.json` (`synthesize.config`).", "",
              _md_table([{"": k, "value": v} for k, v in made.items() if v not in (None, "")], ["", "value"]), ""]
    parts += _sources_section(run)
    usage = usage_by_model(run)
    if usage:
        parts += ["## Cost by model", "",
                  "Every dialogue of the run: the model that played each role (the `models` column) and what it "
                  "spent (`usage_by_model`)" + (" (the scripted engine counts characters, not tokens)"
                                                if engine == "scripted" else "") + ".", "",
                  _md_table([{k: _fmt(v) for k, v in r.items()} for r in usage],
                            ["model", "roles", "dialogues", *USAGE_FIELDS]), ""]
    ref = h.get("reference") or {}
    fig_rows = [
        {"figure": "dialogues", "value": h.get("dialogues")},
        {"figure": "exchanges per dialogue (mean)", "value": h.get("exchanges_mean"),
         "reference": ref.get("exchanges_mean")},
    ]
    for sp, v in (h.get("chars_per_turn_mean") or {}).items():
        fig_rows.append({"figure": f"characters per {sp} turn (mean)", "value": v,
                         "reference": (ref.get("chars_per_turn_mean") or {}).get(sp)})
    fig_rows += [{"figure": "high-quality exchanges (share)", "value": h.get("high_quality_share")},
                 {"figure": "rule pass rate (triggered rules)", "value": h.get("rule_pass_rate")},
                 {"figure": "LLM calls per exchange", "value": h.get("llm_calls_per_exchange")},
                 {"figure": "cases rejected", "value": h.get("cases_rejected")},
                 {"figure": "dialogues failed", "value": h.get("dialogues_failed")}]
    fig_rows += _utility_rows(run)
    parts += ["## Figures", "", f"Reference: {ref.get('label') or 'MDD-5k'}.", "",
              _md_table([{k: _fmt(v) for k, v in r.items()} for r in fig_rows if r.get("value") is not None],
                        ["figure", "value", "reference"]), ""]
    parts += _export_section(run)
    parts += ["## Known limitations", ""] + [f"- {x}" for x in limitations(run, engine, model)] + [""]
    where = store.display()
    parts += [
        "## Loading", "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'dialogues = load_dataset("{where}")["train"]                 # the default config: synth/',
        f'turns = load_dataset("{where}", "turns")["train"]          # per-exchange scores',
        "print(dialogues[0][\"turns\"][:2], dialogues[0][\"diagnosis\"])",
        "",
        "import polars as pl                                       # or straight from the Parquet files",
        f'df = pl.read_parquet("{where}/synth/*.parquet")',
        "```", "",
        "## Licence and citation", "", LICENSE_NOTE, "",
        "```bibtex",
        "@inproceedings{yin2025mdd5k,",
        "  title     = {MDD-5k: A New Diagnostic Conversation Dataset for Mental Disorders Synthesized via "
        "Neuro-Symbolic LLM Agents},",
        "  author    = {Yin, Congchi and others},",
        "  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},",
        "  year      = {2025}",
        "}",
        "```", "",
    ]
    (dest or store).write_text(CARD_FILE, "\n".join(parts))
    return store.display(CARD_FILE)


def _utility_rows(run: RunData) -> list[dict[str, Any]]:
    """One line per task of ``mdd utility``: macro-F1 of a classifier trained on these dialogues, tested on
    real ones, with its 95% interval; the reference column holds train-on-real and the majority class."""
    u = run.section("utility") or {}
    rows = []
    for task in ("four", "binary"):
        t = u.get(task) or {}
        tstr, trtr, maj = t.get("tstr"), t.get("trtr"), t.get("majority")
        if not tstr:
            continue
        ci = tstr.get("macro_f1_ci")
        ref = [f"train on real {trtr['macro_f1']:.2f}" if trtr else None,
               f"majority {maj['macro_f1']:.2f}" if maj else None]
        rows.append({"figure": f"diagnosis macro-F1 ({task}), trained here, tested on {tstr['n_test']} real dialogues",
                     "value": f"{tstr['macro_f1']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
                     "reference": ", ".join(x for x in ref if x)})
    return rows


def _export_section(run: RunData) -> list[str]:
    from mdd.publish.export import CARD_TEXT

    exp = run.section("export")
    lines = ["## Fine-tuning export", "", CARD_TEXT, ""]
    if exp:
        lines += [_md_table([{"format": f, "rows": d.get("rows"),
                              "files": ", ".join(f"`{x}`" for x in d.get("files", [])),
                              "filters": _fmt(d.get("filters"))} for f, d in exp.items()],
                            ["format", "rows", "files", "filters"]), ""]
    else:
        lines += ["Not exported in this run yet: `mdd export --out OUT --format sft` writes it.", ""]
    return lines


SOURCE_TEXT = {"synthetic": "synthetic records (`source: synthetic`, with the profile and plan seed they were "
                            "drawn from)",
               "real": "real records (`source: real`)",
               "unstated": "records that do not state their source (e.g. the sample cases, hospital files)"}


def _sources_section(run: RunData) -> list[str]:
    """The share of each case source (the dialogue table's ``case_source``), and the synthetic cases'
    fidelity to their profile (run.json ``synthesize.synthetic_cases``)."""
    sources = case_sources(run)
    if not sources:
        return []
    lines = ["## Case sources", "",
             "Where the patient cases come from (each dialogue's `case_source`, `case_profile`, `case_plan_seed`)"
             + (". This run mixes sources (allowed by `synth.allow_mixed_sources`): split or filter by "
                "`case_source`." if len(sources) > 1 else "."), "",
             _md_table([{"source": k, "what": SOURCE_TEXT[k], "cases": f"{v['cases']:,}",
                         "share of cases": f"{v['case_share']:.1%}", "dialogues": f"{v['dialogues']:,}",
                         "share of dialogues": f"{v['dialogue_share']:.1%}"} for k, v in sources.items()],
                       ["source", "what", "cases", "share of cases", "dialogues", "share of dialogues"]), ""]
    for profile, d in (run.synthesis.synthetic_cases or {}).items():
        if "js_distance" not in d:
            continue
        nd = d.get("near_duplicates") or {}
        lines += [f"Synthetic cases of profile `{profile}` ({d.get('cases', 0):,}): Jensen-Shannon distance to the "
                  "profile " + ", ".join(f"{k} {v:.4f}" for k, v in d["js_distance"].items())
                  + f"; near-duplicates (character {nd.get('shingle_chars', 5)}-gram Jaccard >= "
                  f"{nd.get('threshold', 0.8)}) {nd.get('share', 0):.1%}; distinct symptom sets "
                  + ", ".join(f"{k} {v['distinct']} of {v['cases']}" for k, v in list(d["symptom_sets"].items())[:4])
                  + ".", ""]
    return lines
