"""The run report: ``OUT/report.html`` (one self-contained file, images embedded) and the same
figures as PNGs in ``OUT/report/``.

The report is a list of panels. A panel is a function of the run's outputs that returns figures
and HTML blocks, or raises ``NotAvailable`` with the reason (its stage has not run, or an older
run lacks the columns): the report then says "not available" for that panel and goes on. Adding a
panel is one decorated function::

    @panel("my_key", "My title")
    def _mine(ctx: Context) -> Panel:
        table = ctx.run.synth
        if table is None or "my_column" not in table.column_names:
            raise NotAvailable("no my_column in synth/")
        return Panel(figures=[("my_plot", plots.barh(...))], blocks=[html_table(...)])

A panel that fails unexpectedly is shown with its error (and logged); the rest of the report is
still written. ``run.json`` sections that no panel reads are listed at the end as they are.
"""
from __future__ import annotations

import base64
import html
import json
import logging
import os
import posixpath
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from mdd.publish import plots
from mdd.publish.run_data import RunData, usage_by_model
from mdd.publish.stats import case_sources, headline, icd_prefix, reference, rule_counts, shape
from mdd.schema import METRICS
from mdd.storage import StorageError, Store

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
FIGURE_DIR = "report"


class NotAvailable(Exception):
    """The panel's data is not in this run (the message says what is missing)."""


@dataclass
class Panel:
    figures: list[tuple[str, Any]] = field(default_factory=list)  # (file stem, matplotlib Figure)
    blocks: list[str] = field(default_factory=list)  # HTML shown under the figures


@dataclass
class Context:
    run: RunData
    ref: dict[str, Any]
    consumed: set[str] = field(default_factory=set)  # run.json sections shown by a panel


PANELS: list[tuple[str, str, Callable[[Context], Panel]]] = []


def panel(key: str, title: str) -> Callable[[Callable[[Context], Panel]], Callable[[Context], Panel]]:
    def deco(fn: Callable[[Context], Panel]) -> Callable[[Context], Panel]:
        PANELS.append((key, title, fn))
        return fn

    return deco


# --- HTML helpers -------------------------------------------------------------------------

def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, default=str)
    return "" if v is None else str(v)


def html_table(rows: Iterable[Mapping[str, Any]], columns: list[str] | None = None, limit: int | None = None) -> str:
    rows = list(rows)
    if not rows:
        return "<p class='na'>(no rows)</p>"
    cols = columns or list(dict.fromkeys(k for r in rows for k in r))
    shown = rows[:limit] if limit else rows
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in shown)
    more = f"<p class='note'>{len(rows) - len(shown):,} more rows not shown.</p>" if len(shown) < len(rows) else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def kv_table(d: Mapping[str, Any]) -> str:
    return html_table([{"figure": k, "value": v} for k, v in d.items()])


def note(text: str) -> str:
    return f"<p class='note'>{esc(text)}</p>"


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v and all(not isinstance(x, Mapping) for x in v.values()) and prefix:
            out[f"{prefix}{k}"] = v
        elif isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def mapping_block(d: Any) -> str:
    """Any run.json section as HTML: a table of rows when it is a mapping of mappings, else key/value."""
    if isinstance(d, Mapping) and d and all(isinstance(v, Mapping) for v in d.values()):
        return html_table([{"": k, **_flat(v)} for k, v in d.items()])
    if isinstance(d, Mapping):
        return kv_table(_flat(d))
    if isinstance(d, list) and d and all(isinstance(v, Mapping) for v in d):
        return html_table(d, limit=50)
    return f"<pre>{esc(json.dumps(d, ensure_ascii=False, indent=2, default=str))}</pre>"


# --- panels -------------------------------------------------------------------------------

@panel("overview", "Overview")
def _overview(ctx: Context) -> Panel:
    h = headline(ctx.run, ctx.ref)
    if not h["dialogues"]:
        raise NotAvailable("no dialogues in synth/")
    syn = ctx.run.synthesis
    rows = {
        "dialogues": h["dialogues"], "cases": h["cases"], "engine": h.get("engine"), "model": h.get("model"),
        "exchanges per dialogue (mean)": h.get("exchanges_mean"),
        "high-quality exchanges (share)": h.get("high_quality_share"),
        "rule pass rate (triggered rules)": h.get("rule_pass_rate"),
        "LLM calls per exchange": h.get("llm_calls_per_exchange"),
        "cases rejected": h.get("cases_rejected"), "dialogues failed": h.get("dialogues_failed"),
        "synthesis wall time (s)": syn.wall_time_s,
        "evaluation wall time (s)": (ctx.run.section("evaluate") or {}).get("wall_s"),
    }
    versions = syn.versions
    blocks = [kv_table({k: v for k, v in rows.items() if v is not None})]
    if versions:
        blocks.append(note("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())))
    return Panel(blocks=blocks)


@panel("shape", "Dialogues, exchanges and turn lengths")
def _shape(ctx: Context) -> Panel:
    st = shape(ctx.run.synth)
    if st is None:
        raise NotAvailable("no dialogues with turns in synth/")
    ref = ctx.ref
    ref_dists = ref.get("dist")
    fig = plots.shape_figure(st["dist"]["exchanges"], {s: st["dist"][s] for s in st["chars_per_turn_mean"]},
                             ref, ref_dists)
    rows = [{"figure": "dialogues", "this run": st["dialogues"], "reference": ref.get("dialogues")},
            {"figure": "exchanges per dialogue (mean)", "this run": st["exchanges_mean"],
             "reference": ref.get("exchanges_mean")},
            {"figure": "exchanges per dialogue (median, min–max)",
             "this run": f"{st['exchanges_median']:g} ({st['exchanges_min']}–{st['exchanges_max']})",
             "reference": (f"{ref['exchanges_median']:g} ({ref['exchanges_min']}–{ref['exchanges_max']})"
                           if "exchanges_median" in ref else None)}]
    for sp, v in st["chars_per_turn_mean"].items():
        rows.append({"figure": f"characters per {sp} turn (mean)", "this run": v,
                     "reference": (ref.get("chars_per_turn_mean") or {}).get(sp)})
    rows.append({"figure": "characters per dialogue (mean)", "this run": st["chars_per_dialogue_mean"],
                 "reference": ref.get("chars_per_dialogue_mean")})
    return Panel(figures=[("shape", fig)], blocks=[
        html_table(rows, ["figure", "this run", "reference"]),
        note(f"Reference: {ref.get('source', ref.get('label'))}. Every turn counts, the doctor's closing "
             "diagnosis turn included."),
    ])


@panel("topics", "Topic coverage")
def _topics(ctx: Context) -> Panel:
    topics = ctx.run.column("synth", "topics")
    if not topics or not any(topics):
        raise NotAvailable("no 'topics' column (or no topics) in synth/")
    n = len(topics)
    asked = Counter(t for ts in topics for t in set(ts or []))
    per_dialogue = [len(set(ts or [])) for ts in topics]
    share = {k: v / n for k, v in asked.items()}
    figs = [("topics", plots.barh(share, title=f"Share of dialogues that asked a topic (top of {len(asked)} topics)",
                                  xlabel="share of dialogues", max_bars=30, fmt="{:.0%}", sum_rest=False))]
    figs.append(("topics_per_dialogue", plots.hist_figure(per_dialogue, bins=20, xlabel="distinct topics per dialogue",
                                                          title="Topics per dialogue")))
    blocks = [note(f"{len(asked):,} distinct topics over {n:,} dialogues; {sum(per_dialogue) / n:.1f} per dialogue.")]
    coverage = ctx.run.section("coverage") or (ctx.run.section("evaluate") or {}).get("coverage")
    if coverage:
        ctx.consumed.add("coverage")
        blocks += ["<h3>Required-item coverage</h3>", mapping_block(coverage)]
    else:
        blocks.append(note("Required-item coverage (ICD × item): not available in this run."))
    return Panel(figures=figs, blocks=blocks)


CATEGORY_COLUMNS = {  # dialogue-table column -> title; shown when the column is present
    "doctor_persona": "Doctor personas",
    "patient_style": "Patient speech styles",
    "companion": "Companion in the room",
}


@panel("cases", "ICD prefixes, personas and styles")
def _cases(ctx: Context) -> Panel:
    syn = ctx.run.synth
    if syn is None:
        raise NotAvailable("no dialogues in synth/")
    figs, blocks = [], []
    codes = ctx.run.column("synth", "icd_code") or []
    if codes:
        figs.append(("icd_prefixes", plots.barh(Counter(icd_prefix(c) for c in codes),
                                                title="ICD prefix of the primary code")))
    for col, title in CATEGORY_COLUMNS.items():
        vals = ctx.run.column("synth", col)
        if vals is None:
            blocks.append(note(f"{title}: not available in this run (no '{col}' column)."))
        else:
            figs.append((col, plots.barh(Counter(_category(v) for v in vals), title=title)))
    turns = ctx.run.column("synth", "turns") or []
    with_companion = sum(1 for ts in turns if any(t and t.get("speaker") == "companion" for t in ts or []))
    models = ctx.run.column("synth", "models")
    if models is not None:
        mc = Counter(f"{role}: {model}" for m in models for role, model in _pairs(m))
        figs.append(("models", plots.barh(mc, title="Model per role")))
    blocks.append(note(f"Dialogues with companion turns: {with_companion:,} of {len(turns):,}."))
    return Panel(figures=figs, blocks=blocks)


def _category(v: Any) -> str:
    if isinstance(v, Mapping):  # a struct column: its first non-empty field names the category
        v = next((x for x in v.values() if x not in (None, "")), None)
    return "(none)" if v in (None, "", False) else str(v)


def _pairs(m: Any) -> list[tuple[str, str]]:
    """A role→model mapping as Arrow gives it back: a dict, a list of (key, value) or of {role, model}."""
    if m is None:
        return []
    if isinstance(m, Mapping):
        return [(str(k), str(v)) for k, v in m.items() if v is not None]
    out = []
    for item in m:
        if isinstance(item, Mapping):
            vals = list(item.values())
            out.append((str(vals[0]), str(vals[1]) if len(vals) > 1 else ""))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            out.append((str(item[0]), str(item[1])))
    return out


@panel("metrics", "Quality metrics and the evaluator's validity self-check")
def _metrics(ctx: Context) -> Panel:
    te = ctx.run.turn_eval
    ev = ctx.run.section("evaluate") or {}
    if te is None and not ev:
        raise NotAvailable("the evaluation stage has not run (no eval/turns/)")
    figs, blocks = [], []
    if te is not None and te.num_rows:
        metrics = [m for m in METRICS if m in te.column_names]
        thr = ev.get("threshold")
        figs.append(("metrics", plots.small_multiples({m: te.column(m).to_pylist() for m in metrics},
                                                       marks={"overall": thr} if thr is not None else None,
                                                       title="Per-exchange metrics (black: mean; dashed: "
                                                             "high-quality threshold)")))
        hq = te.column("high_quality").to_pylist() if "high_quality" in te.column_names else []
        blocks.append(note(f"{te.num_rows:,} exchanges; {sum(map(bool, hq)):,} high quality "
                           f"({sum(map(bool, hq)) / max(len(hq), 1):.1%})."))
        if "hq_reason" in te.column_names:
            reasons = Counter("(high quality)" if r in (None, "") else str(r)
                              for r in te.column("hq_reason").to_pylist())
            figs.append(("hq_reasons", plots.barh(reasons, title="Why exchanges are (not) high quality",
                                                  xlabel="exchanges")))
    validity = ev.get("validity")
    blocks.append("<h3>Validity self-check</h3>")
    if isinstance(validity, Mapping) and isinstance(validity.get("recipes"), Mapping):
        blocks.append(kv_table({k: v for k, v in validity.items() if k != "recipes"}))
        blocks.append(note("Per control recipe: the share of its exchanges judged high quality and, per metric, "
                           "the AUC of real against control exchanges (0.5: no separation)."))
        blocks.append(mapping_block(validity["recipes"]))
    elif validity:
        blocks.append(mapping_block(validity))
    if ctx.run.validity is not None:
        blocks.append(html_table(ctx.run.validity.to_pylist(), limit=60))
    if not validity and ctx.run.validity is None:
        blocks.append(note("The evaluator's validity self-check: not available in this run (no "
                           "run.json evaluate.validity, no eval/validity.parquet)."))
    return Panel(figures=figs, blocks=blocks)


@panel("rules", "Rule judge: pass, fail and skip rates")
def _rules(ctx: Context) -> Panel:
    rc = rule_counts(ctx.run.rules)
    if not rc:
        raise NotAvailable("no eval/rules/ (the evaluation stage has not run, or no rules)")
    fig = plots.stacked_shares(rc, ["passed", "failed", "skipped"], title="Rules per dialogue: passed / failed / "
                               "skipped (not triggered)")
    rows = [{"rule": k, **v, "pass rate (triggered)": (v["passed"] / (v["passed"] + v["failed"]))
             if v["passed"] + v["failed"] else None} for k, v in rc.items()]
    return Panel(figures=[("rules", fig)], blocks=[html_table(rows)])


@panel("cost", "Cost: LLM calls and tokens")
def _cost(ctx: Context) -> Panel:
    section = ctx.run.section("synthesize") or {}
    if not section.get("llm_calls") and not section.get("tokens"):
        raise NotAvailable("no llm_calls / tokens in run.json's synthesize section")
    syn = ctx.run.synthesis
    calls, tokens = syn.llm_calls, syn.tokens
    by_role = {"calls": calls.by_role, "prompt tokens": tokens.prompt_by_role, "output tokens": tokens.output_by_role}
    figs = [("cost_by_role", plots.bar_grid({k: v for k, v in by_role.items() if v},
                                            title="By role (this synthesis run)"))]
    if calls.by_op:
        figs.append(("calls_by_op", plots.barh(calls.by_op, title="LLM calls by operation", xlabel="calls")))
    roles = sorted({r for d in by_role.values() for r in d})
    blocks = [html_table([{"role": r, **{k: v.get(r) for k, v in by_role.items()}} for r in roles])]
    counts = syn.counts
    blocks.append(note(
        f"The last synthesis invocation: {counts.dialogues_run:,} dialogues run "
        f"({counts.dialogues_already_written:,} were already written by an earlier one); cached prompt "
        f"tokens {tokens.cached_prompt_tokens:,}; calls per exchange {calls.per_exchange}; "
        f"tool-verdict fallbacks {sum(syn.fallbacks.values()):,}."
        + (" The scripted engine counts characters, not tokens." if syn.engine.name == "scripted" else "")))
    usage = usage_by_model(ctx.run)
    if usage:
        blocks += ["<h3>By model, every dialogue of the run</h3>", html_table(usage)]
    by_pair = syn.usage_by_model_and_role
    if by_pair:
        blocks += ["<h3>By model and role, the last synthesis invocation</h3>", html_table(
            [{"model": m, "role": r, **u} for m, roles in by_pair.items() for r, u in roles.items()])]
    by_model = {k: v for k, v in (("by_model", calls.by_model), ("prompt_by_model", tokens.prompt_by_model),
                                  ("output_by_model", tokens.output_by_model),
                                  ("cached_by_model", tokens.cached_by_model)) if k in (section.get(
                    "llm_calls" if k == "by_model" else "tokens") or {})}
    if by_model:
        blocks += ["<h3>By model, the last synthesis invocation</h3>"] + [
            f"<h4>{esc(k)}</h4>{mapping_block(v)}" for k, v in by_model.items()]
        cost_fig = {k: {m: _total(x) for m, x in v.items() if isinstance(x, (int, float, Mapping))}
                    for k, v in by_model.items()}
        figs.append(("cost_by_model", plots.bar_grid({k: v for k, v in cost_fig.items() if v}, title="By model")))
    else:
        blocks.append(note("Cost by model: not available in this run (one engine for every role)."))
    return Panel(figures=figs, blocks=blocks)


def _total(x: Any) -> float:
    """A count, or the sum of a (nested) mapping of counts (usage_by_model_and_role: model -> role -> counts)."""
    if isinstance(x, Mapping):
        return sum(_total(v) for v in x.values())
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else 0


@panel("problems", "Failures and rejects")
def _problems(ctx: Context) -> Panel:
    section = ctx.run.section("synthesize") or {}
    counts = ctx.run.synthesis.counts
    rej, fail = ctx.run.rejects, ctx.run.failures
    figs, blocks = [], []
    known = section.get("counts") or {}
    blocks.append(kv_table({"cases rejected": counts.cases_rejected if "cases_rejected" in known
                            else rej.num_rows if rej is not None else 0,
                            "reject rows": rej.num_rows if rej is not None else 0,
                            "dialogues failed": fail.num_rows if fail is not None else 0,
                            "dialogue retries": counts.dialogue_retries if "dialogue_retries" in known else None}))
    if rej is not None and rej.num_rows:
        figs.append(("rejects", plots.barh(Counter(rej.column("field").to_pylist()), title="Rejected cases by field",
                                           xlabel="reject rows")))
        blocks += ["<h3>Rejects</h3>", html_table(rej.to_pylist(), limit=50)]
    if fail is not None and fail.num_rows:
        rows = [{**r, "error": (r.get("error") or "").splitlines()[0][:200]} for r in fail.to_pylist()]
        blocks += ["<h3>Failures</h3>", html_table(rows, limit=50)]
    return Panel(figures=figs, blocks=blocks)


@panel("synthetic_cases", "Case sources and synthetic cases' fidelity")
def _synthetic_cases(ctx: Context) -> Panel:
    sources = case_sources(ctx.run)
    figures = ctx.run.synthesis.synthetic_cases or {}
    if not sources and not figures:
        raise NotAvailable("no case_source column in synth/ (a run older than case provenance)")
    blocks = [html_table([{"source": k, **v} for k, v in sources.items()],
                         ["source", "cases", "case_share", "dialogues", "dialogue_share"])]
    if not figures:
        blocks.append(note("No synthetic case in this run: no fidelity figures (mdd cases synthesize writes "
                           "synthetic cases; 'unstated' is a record that does not say its source)."))
    rows, sets = [], []
    for profile, d in figures.items():
        if "js_distance" not in d:
            blocks.append(note(f"profile {profile}: {d.get('error')}"))
            continue
        nd = d.get("near_duplicates") or {}
        rows.append({"profile": profile, "cases": d.get("cases"),
                     **{f"JS {k}": v for k, v in d["js_distance"].items()},
                     "near-duplicate share": nd.get("share"), "nearest Jaccard max": nd.get("max_jaccard")})
        sets += [{"profile": profile, "first diagnosis": k, "cases": v["cases"], "distinct symptom sets": v["distinct"]}
                 for k, v in d.get("symptom_sets", {}).items()]
    if rows:
        blocks += [note("Jensen-Shannon distance (base 2; 0 = the profile's mix) per attribute, near-duplicates by "
                        "character 5-gram Jaccard >= 0.8 to the nearest other case, symptom sets the histories state."),
                   html_table(rows), html_table(sets, limit=12)]
    return Panel(blocks=blocks)


@panel("exemplars", "Exemplars shown to the doctor")
def _exemplars(ctx: Context) -> Panel:
    index = [x for x in (ctx.run.column("synth", "exemplar_index") or []) if x]
    if not index:
        raise NotAvailable("this run's doctor saw no exemplars (synth.dialogue.exemplars.index, --exemplars, "
                           "mdd run --rounds 2)")
    counts: Counter = Counter()
    doctor = 0
    for turns in ctx.run.column("synth", "turns") or []:
        for t in turns or []:
            if t and t.get("speaker") == "doctor":
                doctor += 1
                counts[len(t.get("exemplars") or [])] += 1
    shown = doctor - counts[0]
    fig = plots.barh({f"{k} exemplars": v for k, v in sorted(counts.items())}, title="Exemplars per doctor turn",
                     xlabel="doctor turns")
    return Panel(figures=[("exemplars", fig)], blocks=[note(
        f"{shown:,} of {doctor:,} doctor turns saw exemplars ({shown / max(doctor, 1):.0%}), from the index of "
        f"{', '.join(sorted(set(index)))}; each turn's ids (turns[].exemplars) point into that run's "
        "index/qa.parquet.")])


@panel("utility", "Does the data teach? Train on synthetic, test on real")
def _utility(ctx: Context) -> Panel:
    from mdd.publish.utility import UTILITY_FILE

    if not ctx.run.store.is_file(UTILITY_FILE):  # a separate command: said, as the coverage table is
        return Panel(blocks=[note(f"Not computed for this run (no {UTILITY_FILE}): mdd utility --out OUT --reference "
                                  "REF, or mdd run --utility REF, with REF a jobs.import_mdd5k folder.")])
    ctx.consumed.add("utility")
    u = ctx.run.store.read_json(UTILITY_FILE)
    tasks = {k: t for k, t in (u.get("tasks") or {}).items() if t.get("available")}
    view = u["settings"].get("view", "full")
    blocks = [note(f"A {u['settings']['model']} diagnosis classifier trained on this run's dialogues (the "
                   f"{'whole interview' if view == 'full' else view + ' turns of the interview'} before the doctor's "
                   f"closing), tested on {u['settings'].get('reference')}; train-on-real is "
                   "cross-validated by case (the ceiling); 95% intervals resample reference cases.")]
    rows = []
    for name, t in (u.get("tasks") or {}).items():
        if not t.get("available"):
            rows.append({"task": name, "comparison": f"not available: {t.get('reason')}"})
            continue
        for key in ("tstr", "trtr", "majority", "shuffled"):
            m = t.get(key)
            if m:
                ci = m.get("macro_f1_ci")
                rows.append({"task": name, "comparison": key, "macro-F1": m["macro_f1"],
                             "95% CI": f"{ci[0]:.2f}–{ci[1]:.2f}" if ci else None, "accuracy": m["accuracy"],
                             "n_train": m["n_train"], "n_test": m["n_test"]})
        rows.append({"task": name, "comparison": "chance (label-blind)", "macro-F1": t["chance"]["macro_f1"]})
        for view, v in (t.get("views") or {}).items():
            rows.append({"task": name, "comparison": f"{view} turns only: tstr / trtr",
                         "macro-F1": f"{v['tstr']['macro_f1']:.3f} / "
                                     + (f"{v['trtr']['macro_f1']:.3f}" if v.get("trtr") else "–")})
    blocks.append(html_table(rows, ["task", "comparison", "macro-F1", "95% CI", "accuracy", "n_train", "n_test"]))
    if not tasks:
        return Panel(blocks=blocks)
    g = u.get("guard") or {}
    blocks.append(note(f"Leakage guard: closing turns dropped {(g.get('run') or {}).get('closing_turns_dropped')} "
                       f"(run), {(g.get('reference') or {}).get('closing_turns_dropped')} (reference); diagnosis words "
                       f"masked {(g.get('run') or {}).get('label_mentions_masked')} / "
                       f"{(g.get('reference') or {}).get('label_mentions_masked')}; closings reaching the classifier: "
                       f"{g.get('closings_in_classifier_input')}."))
    mats = {f"{name}: {key}": (t["confusion"]["labels"], t["confusion"][key]) for name, t in tasks.items()
            for key in ("tstr", "trtr") if t["confusion"].get(key)}
    return Panel(figures=[("utility_learning", plots.learning_curves(tasks, title="Train on synthetic, test on real: "
                                                                            "macro-F1 by training size")),
                          ("utility_confusion", plots.confusions(mats, title="Confusion matrices on the reference"))],
                 blocks=blocks)


SHOWN_SECTIONS = {"synthesize", "evaluate", "report"}


def _other_sections(ctx: Context) -> str:
    rest = {k: v for k, v in ctx.run.run_json.items() if k not in SHOWN_SECTIONS | ctx.consumed}
    if not rest:
        return ""
    parts = [f"<details><summary>{esc(k)}</summary>{mapping_block(v)}</details>" for k, v in rest.items()]
    return "<section id='other'><h2>Other run.json sections</h2>" + "".join(parts) + "</section>"


# --- the page -----------------------------------------------------------------------------

CSS = """
body{font-family:"Noto Sans CJK SC","WenQuanYi Micro Hei",system-ui,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:2px solid #2f6db5;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#eef2f8}
img{max-width:100%;display:block;margin:.6em 0;border:1px solid #eee}
.na{color:#a33;font-style:italic}.note{color:#555;font-size:.9em}pre{background:#f6f6f6;padding:.6em;overflow:auto}
nav a{margin-right:1em}
"""

# Records how many images the browser decoded (headless checks read it back with --dump-dom).
SCRIPT = """window.addEventListener('load',function(){var im=document.images,ok=0;
for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0){ok++;}}
document.body.setAttribute('data-images',im.length);document.body.setAttribute('data-images-loaded',ok);});"""


def build_report(out: str | os.PathLike | Store, reference_path: str | os.PathLike | None = None,
                 dest: Store | None = None) -> dict[str, Any]:
    """Write ``OUT/report.html`` and ``OUT/report/*.png``; returns what was written (also in run.json['report']).

    ``dest``: where to write instead (a staging area, ``jobs.report.publish``): then run.json is left
    to the caller. A panel that meets an unreadable file or a failed write fails the whole report
    (raised), so that a report of failed panels never replaces a good one."""
    run = RunData(out)
    store = run.store
    sink = dest or store
    ctx = Context(run=run, ref=reference(reference_path))
    sections, figures, status = [], [], {}
    for i, (key, title, fn) in enumerate(PANELS):
        body = ""
        try:
            p = fn(ctx)
            for stem, fig in p.figures:
                name = f"{i:02d}-{stem}.png"
                data = plots.png_bytes(fig)
                sink.write_bytes(f"{FIGURE_DIR}/{name}", data)
                figures.append(name)
                b64 = base64.b64encode(data).decode("ascii")
                body += f"<img alt='{esc(stem)}' src='data:image/png;base64,{b64}'>"
            body += "".join(p.blocks)
            status[key] = "ok"
        except NotAvailable as exc:
            body = f"<p class='na'>Not available: {esc(exc)}</p>"
            status[key] = f"not available: {exc}"
        except (OSError, pa.ArrowException, StorageError):  # a damaged input or a failed write: the report fails whole
            raise
        except Exception as exc:  # noqa: BLE001 - one broken panel must not cost the whole report
            log.warning("report panel %s failed: %s: %s", key, type(exc).__name__, exc, exc_info=True)
            body = f"<p class='na'>This panel failed: {esc(type(exc).__name__)}: {esc(exc)}</p>"
            status[key] = f"error: {type(exc).__name__}: {exc}"
        sections.append(f"<section id='{esc(key)}'><h2>{esc(title)}</h2>{body}</section>")
    nav = "".join(f"<a href='#{esc(k)}'>{esc(t)}</a>" for k, t, _ in PANELS)
    name = run.section("synthesize", "config", "run_name") or posixpath.basename(store.uri.rstrip("/"))
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>mdd run report: {esc(name)}</title>"
            f"<style>{CSS}</style><script>{SCRIPT}</script></head><body><h1>mdd run report: {esc(name)}</h1>"
            f"<p class='note'>{esc(store.display())}</p><nav>{nav}</nav>{''.join(sections)}{_other_sections(ctx)}"
            "</body></html>")
    sink.write_text(REPORT_FILE, page)
    if dest is None:
        for old in store.files(FIGURE_DIR, ".png"):  # figures of an earlier report that this one lacks
            if old not in figures:
                store.delete(f"{FIGURE_DIR}/{old}")
    summary = {"file": REPORT_FILE, "figures": [f"{FIGURE_DIR}/{f}" for f in figures], "panels": status,
               "headline": headline(run, ctx.ref)}
    if dest is None:
        store.update_run_json("report", summary)
    return summary
