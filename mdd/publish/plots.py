"""The run report's figures, drawn with matplotlib on the Agg backend (no display needed).

Every function returns a ``Figure``; ``png_bytes`` renders one. Chinese labels need a CJK font:
the first installed one of ``CJK_FONTS`` is used (``scripts/setup.sh`` installs
fonts-wqy-microhei); without one the labels render as boxes and ``cjk_font()`` says so.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

log = logging.getLogger(__name__)

CJK_FONTS = ("Noto Sans CJK SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Source Han Sans SC",
             "Droid Sans Fallback", "AR PL UMing CN", "SimHei")
OURS, REF = "#2f6db5", "#d9822b"
PALETTE = ("#2f6db5", "#d9822b", "#4a9c5d", "#b6443d", "#7d5ba6", "#8c6d4f", "#d36fb0", "#7f7f7f")


@lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """The CJK font family the figures use (None: none installed; a warning once)."""
    installed = {f.name for f in font_manager.fontManager.ttflist}
    if not installed & set(CJK_FONTS):  # installed after matplotlib cached its font list
        for path in font_manager.findSystemFonts():
            if any(k in Path(path).name.lower() for k in ("wqy", "notosanscjk", "droidsansfallback")):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue
        installed = {f.name for f in font_manager.fontManager.ttflist}
    for name in CJK_FONTS:
        if name in installed:
            plt.rcParams["font.sans-serif"] = [name, "DejaVu Sans"]
            plt.rcParams["axes.unicode_minus"] = False
            return name
    log.warning("no CJK font installed (e.g. apt-get install fonts-wqy-microhei): Chinese labels render as boxes")
    return None


def _fig(w: float = 7.0, h: float = 3.6, ncols: int = 1, nrows: int = 1):
    cjk_font()
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), dpi=100, squeeze=False)
    fig.set_layout_engine("constrained")
    return fig, axes


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # no timestamps in the PNG: the same run gives the same bytes
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def histogram(ax, values: Sequence[float] | np.ndarray, *, bins: int | Sequence[float] | np.ndarray = 20,
              label: str = "this run",
              ref_values: Sequence[float] | None = None, ref_mean: float | None = None, ref_label: str = "reference",
              xlabel: str = "", title: str = "") -> None:
    """One histogram (density when a reference distribution is overlaid), with mean lines."""
    import numpy as np

    vals = np.asarray(values, dtype=float)
    density = ref_values is not None and len(ref_values) > 0
    if len(vals):
        ax.hist(vals, bins=bins, color=OURS, alpha=0.75, label=f"{label} (mean {vals.mean():.1f})", density=density)
        ax.axvline(vals.mean(), color=OURS, linestyle="-", linewidth=1.5)
    if density and ref_values is not None:  # (density: there are reference values)
        ax.hist(np.asarray(ref_values, float), bins=bins, color=REF, alpha=0.45, density=True,
                label=f"{ref_label} (n={len(ref_values)})")
    if ref_mean is not None:
        ax.axvline(ref_mean, color=REF, linestyle="--", linewidth=1.8, label=f"{ref_label} mean {ref_mean:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share" if density else "count")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def hist_figure(values: Sequence[float], **kw) -> Figure:
    """A figure of one ``histogram``."""
    fig, axes = _fig(6.0, 3.0)
    histogram(axes[0][0], values, **kw)
    return fig


def shape_figure(exchanges: Sequence[float], chars: Mapping[str, Sequence[float]], ref: Mapping,
                 ref_dists: Mapping[str, Sequence[float]] | None = None) -> Figure:
    """Exchanges per dialogue and characters per turn (one panel per speaker) beside the reference."""
    import numpy as np

    speakers = list(chars)
    fig, axes = _fig(4.0 * (1 + len(speakers)), 3.6, ncols=1 + len(speakers))
    ref_dists = ref_dists or {}
    label = ref.get("label", "MDD-5k")
    top = max([*exchanges, 1])
    histogram(axes[0][0], exchanges, bins=np.arange(0, top + 3, max(1, int(top) // 25 + 1)),
              ref_values=ref_dists.get("exchanges"), ref_mean=ref.get("exchanges_mean"), ref_label=label,
              xlabel="exchanges per dialogue", title="Exchanges per dialogue")
    for i, sp in enumerate(speakers, start=1):
        vals = chars[sp]
        hi = float(np.percentile(vals, 99)) if len(vals) else 1.0
        histogram(axes[0][i], np.clip(vals, 0, hi), bins=np.linspace(0, max(hi, 1.0), 31),
                  ref_values=ref_dists.get(sp), ref_mean=(ref.get("chars_per_turn_mean") or {}).get(sp),
                  ref_label=label, xlabel="characters per turn (clipped at the 99th percentile)",
                  title=f"{sp} turn length")
    return fig


def barh(counts: Mapping[str, float], *, title: str, xlabel: str = "dialogues", max_bars: int = 30,
         fmt: str = "{:g}", sum_rest: bool = True) -> Figure:
    """Horizontal bars, largest first; past ``max_bars`` the rest is summed into one bar (``sum_rest``,
    for counts) or left out (for shares, which do not add up)."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    if len(items) > max_bars and not sum_rest:
        items = items[:max_bars]
    elif len(items) > max_bars:
        rest = sum(v for _, v in items[max_bars - 1:])
        items = items[: max_bars - 1] + [(f"({len(items) - max_bars + 1} more)", rest)]
    fig, axes = _fig(7.5, 0.6 + 0.26 * max(len(items), 3))
    ax = axes[0][0]
    labels = [str(k) for k, _ in items][::-1]
    values = [v for _, v in items][::-1]
    bars = ax.barh(labels, values, color=OURS)
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7, padding=2)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(x=0.12)
    return fig


def bar_grid(panels: Mapping[str, Mapping[str, float]], *, title: str = "") -> Figure:
    """One small bar chart per entry (e.g. calls, prompt tokens, output tokens, each by role)."""
    n = max(len(panels), 1)
    fig, axes = _fig(3.6 * n, 3.2, ncols=n)
    for ax, (name, counts) in zip(axes[0], panels.items()):
        keys = list(counts)
        bars = ax.bar(keys, [counts[k] for k in keys], color=[PALETTE[i % len(PALETTE)] for i in range(len(keys))])
        ax.bar_label(bars, labels=[_short(counts[k]) for k in keys], fontsize=7)
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.margins(y=0.15)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def stacked_shares(rows: Mapping[str, Mapping[str, float]], parts: Sequence[str], *, title: str,
                   colors: Sequence[str] = ("#4a9c5d", "#b6443d", "#bbbbbb")) -> Figure:
    """One horizontal bar per row split into ``parts`` (shares of the row's total)."""
    names = list(rows)[::-1]
    fig, axes = _fig(8.0, 0.8 + 0.3 * max(len(names), 3))
    ax = axes[0][0]
    left = [0.0] * len(names)
    for part, color in zip(parts, colors):
        shares = [(rows[n].get(part, 0) / (sum(rows[n].get(p, 0) for p in parts) or 1)) for n in names]
        ax.barh(names, shares, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, shares)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of dialogues")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=8, loc="lower right", ncols=len(parts))
    return fig


def small_multiples(series: Mapping[str, Sequence[float]], *, title: str = "", ncols: int = 5,
                    marks: Mapping[str, float] | None = None, range_: tuple[float, float] = (0.0, 1.0)) -> Figure:
    """One histogram per series on a shared range (metric distributions), optional marker lines."""
    import numpy as np

    names = list(series)
    nrows = max(1, -(-len(names) // ncols))
    fig, axes = _fig(2.6 * ncols, 2.1 * nrows, ncols=ncols, nrows=nrows)
    bins = np.linspace(range_[0], range_[1], 21)
    for k, ax in enumerate(ax for row in axes for ax in row):
        if k >= len(names):
            ax.axis("off")
            continue
        vals = np.asarray([np.nan if v is None else v for v in series[names[k]]], float)
        vals = vals[np.isfinite(vals)]  # null: unknown (e.g. faithfulness without a case record)
        ax.hist(vals, bins=bins, color=OURS, alpha=0.8)
        if len(vals):
            ax.axvline(vals.mean(), color="black", linewidth=1)
        if marks and names[k] in marks:
            ax.axvline(marks[names[k]], color=REF, linestyle="--", linewidth=1.5)
        ax.set_title(f"{names[k]} (mean {vals.mean():.2f})" if len(vals) else f"{names[k]} (unknown)", fontsize=8)
        ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def learning_curves(tasks: Mapping[str, Mapping], *, title: str = "") -> Figure:
    """Per task: TSTR macro-F1 against training dialogues (mean, ±1 sd band) with the train-on-real
    ceiling, the majority class and the shuffled-label control as lines (``mdd utility``'s report)."""
    n = max(len(tasks), 1)
    fig, axes = _fig(4.2 * n, 3.4, ncols=n)
    for ax, (name, t) in zip(axes[0], tasks.items()):
        pts = t["learning_curve"]
        x = [p["n_train"] for p in pts]
        y = np.array([p["macro_f1"] for p in pts])
        sd = np.array([p["macro_f1_sd"] for p in pts])
        ax.plot(x, y, "o-", color=OURS, label="train on synthetic")
        ax.fill_between(x, y - sd, y + sd, color=OURS, alpha=0.15, linewidth=0)
        for key, color, style, label in (("trtr", REF, "-", "train on real (CV)"), ("majority", "#7f7f7f", "--",
                                         "majority class"), ("shuffled", "#b6443d", ":", "shuffled labels")):
            if t.get(key):
                ax.axhline(t[key]["macro_f1"], color=color, linestyle=style, linewidth=1.2, label=label)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("training dialogues (run)")
        ax.set_ylabel("macro-F1 on the reference")
        ax.set_title(name, fontsize=10)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def confusions(mats: Mapping[str, tuple[Sequence[str], Sequence[Sequence[int]]]], *, title: str = "") -> Figure:
    """Confusion matrices side by side (rows: true class, columns: predicted), counts in the cells."""
    n = max(len(mats), 1)
    fig, axes = _fig(3.4 * n, 3.4, ncols=n)
    for ax, (name, (labels, m)) in zip(axes[0], mats.items()):
        a = np.asarray(m, dtype=float)
        ax.imshow(a / np.maximum(a.sum(1, keepdims=True), 1), cmap="Blues", vmin=0, vmax=1)
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                ax.text(j, i, f"{int(a[i, j])}", ha="center", va="center", fontsize=8,
                        color="white" if a[i, j] > 0.6 * max(a[i].sum(), 1) else "black")
        ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("predicted", fontsize=8)
        ax.set_ylabel("true", fontsize=8)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _short(v: float) -> str:
    v = float(v)
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:g}"
