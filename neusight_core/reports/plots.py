"""Figures in the paper's style, from the long cell frames of :mod:`neusight_core.studies.evaluation`.

Every function takes frames, not files, so the same code draws the authors' predictions and ours:
pass cells whose ``predictor_display`` says e.g. ``NeuSight (ours)`` next to the authors' rows, or a
``{series label: cells}`` mapping for the latency figures. All functions return a matplotlib Figure.

Habitat's errors reach thousands of percent on the unseen GPUs, which would flatten every other bar;
the APE figures therefore clip the axis (default 100 %, like the paper) and print the value above
each clipped bar, or use a log axis (``log=True``).
"""
from __future__ import annotations

import textwrap

import matplotlib

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from neusight_core.studies import bf16_checks, evaluation as ev, live_kernels, live_modern, recipe_eval
from neusight_core.predictors import registry

# Colours fixed per predictor so the authors' and our figures read the same way in every notebook:
# NeuSight blue as the authors predicted it, red for our re-implementation (never a baseline's colour).
# Every registered predictor's colour (predictors/registry.yaml: ours red, the authors' recipe purple), plus the
# authors' shipped predictions ("NeuSight" in the paper's figures) blue and the measurements dark grey.
PALETTE = {**registry.colours(), "NeuSight": "#4c72b0", "authors": "#4c72b0", "ours": registry.entry("neusight").colour,
           "Measured": "#333333"}
# For series without a fixed colour: none of them close to a fixed one.
_EXTRA = ["#937860", "#da8bc3", "#ccb974", "#64b5cd", "#2f4b7c", "#a05195"]


def _palette(names) -> dict:
    extra = iter(_EXTRA * 4)
    return {n: PALETTE.get(n) or next(extra) for n in names}


def _crowded_ticks(ax, n_ticks: int, width_in: float) -> None:
    """Rotate x labels (on one line each) when they would overlap: about 1 inch per label at 7 pt."""
    if n_ticks * 1.0 > width_in:
        labels = [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()]
        ax.set_xticks(ax.get_xticks(), labels, rotation=45, ha="right", rotation_mode="anchor")


def _style():
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)


def plot_ape_bars(cells: pd.DataFrame, title: str = "", clip: float | None = 100.0, log: bool = False,
                  facet: str = "gpu_short", ncols: int = 2, panel_width: float = 9.0,
                  note: str = "") -> matplotlib.figure.Figure:
    """Grouped bars of APE (%): one panel per ``facet`` value (GPU), x = model and batch, one bar
    per predictor (``predictor_display``). Clipped bars carry their value as text; ``note`` (why the numbers are
    what they are) goes under the legend, wrapped to the figure's width."""
    _style()
    need = {facet, "model_display", "batch", "predictor_display", "ape"}
    if not need <= set(cells.columns):
        raise ev.EvaluationError(f"plot_ape_bars needs columns {sorted(need)}")
    df = cells.dropna(subset=["ape"]).copy()
    df["config"] = df["model_display"] + "\nb" + df["batch"].astype(str)
    panels = list(dict.fromkeys(df[facet]))
    preds = list(dict.fromkeys(df["predictor_display"]))
    pal = _palette(preds)
    ncols = max(1, min(ncols, len(panels)))
    nrows = max(1, int(np.ceil(len(panels) / ncols)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_width * ncols, 2.9 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        sub = df[df[facet] == panel]
        order = list(dict.fromkeys(sub["config"]))
        shown = sub.assign(ape_shown=sub["ape"].clip(upper=clip) if (clip and not log) else sub["ape"])
        sns.barplot(data=shown, x="config", y="ape_shown", hue="predictor_display", order=order,
                    hue_order=preds, palette=pal, ax=ax, errorbar=None, width=0.8)
        if log:
            ax.set_yscale("log")
        elif clip:
            ax.set_ylim(0, clip * 1.12)
            # Label every clipped bar with its true value (as the paper does for Habitat).
            width = 0.8 / len(preds)
            for _, r in sub[sub["ape"] > clip].iterrows():
                x = order.index(r["config"]) - 0.4 + width * (preds.index(r["predictor_display"]) + 0.5)
                ax.text(x, clip * 1.01, f"{r['ape']:.0f}", ha="center", va="bottom", fontsize=6, rotation=90)
        _panel_axes(ax, panel, "APE (%)")
        _crowded_ticks(ax, len(order), panel_width)
    if log and len(df):  # one y-range for every panel, so panels compare at a glance
        pos = df["ape"][df["ape"] > 0]
        lo, hi = (pos.min() / 1.5, pos.max() * 1.5) if len(pos) else (0.1, 100.0)
        for ax in list(axes.flat)[:len(panels)]:
            ax.set_ylim(lo, hi)
    return _finish(fig, axes, len(panels), pal, preds, title, 0.1 / nrows, note)


def _panel_axes(ax, panel, ylabel: str) -> None:
    """Title, labels and ticks of one panel; the per-panel legend goes (one legend for the figure)."""
    ax.set_title(str(panel))
    ax.set_xlabel("")
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelsize=7)
    if ax.get_legend():
        ax.get_legend().remove()


def _finish(fig, axes, n_panels: int, pal: dict, names: list, title: str, bottom: float, note: str = ""):
    """Hide unused panels, add the title, one legend under the figure and the note under that."""
    for ax in list(axes.flat)[n_panels:]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=pal[n]) for n in names]
    if title:
        fig.suptitle(title)
    lines = textwrap.wrap(note, width=int(fig.get_figwidth() * 14)) if note else []
    below = 0.12 * len(lines) / fig.get_figheight()     # a line of 8-point text is about 0.12 inch
    fig.tight_layout(rect=(0, bottom + below, 1, 1))
    fig.legend(handles, names, loc="lower center", ncol=len(names), frameon=False, bbox_to_anchor=(0.5, below))
    if lines:
        fig.text(0.5, 0.005, "\n".join(lines), ha="center", va="bottom", fontsize=8)
    return fig


def plot_perop(table: pd.DataFrame, title: str = "Table 6: per-operator APE", log: bool = True) -> matplotlib.figure.Figure:
    """Grouped bars of a Table 6 frame (rows predictor, columns (distribution, op))."""
    _style()
    long = (table.stack(level=[0, 1], future_stack=True).rename("mape").reset_index()
            .rename(columns={"level_0": "predictor"}))
    long.columns = ["predictor", "distribution", "op", "mape"]
    preds = list(dict.fromkeys(long["predictor"]))
    pal = _palette(preds)
    dists = list(dict.fromkeys(long["distribution"]))
    fig, axes = plt.subplots(1, len(dists), figsize=(6 * len(dists), 3), squeeze=False, sharey=True)
    for ax, d in zip(axes.flat, dists):
        sns.barplot(data=long[long["distribution"] == d].dropna(), x="op", y="mape", hue="predictor",
                    hue_order=preds, palette=pal, ax=ax, errorbar=None)
        if log:
            ax.set_yscale("log")
        ax.set_title(d)
        ax.set_xlabel("")
        ax.set_ylabel("MAPE (%)")
        if ax.get_legend():
            ax.get_legend().remove()
    handles = [plt.Rectangle((0, 0), 1, 1, color=pal[p]) for p in preds]
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.legend(handles, preds, loc="lower center", ncol=len(preds), frameon=False)
    return fig


def _latency_long(series: dict, keys: list) -> pd.DataFrame:
    """{label: cells with label_ms/pred_ms} -> long frame (keys..., series, ms, ape)."""
    frames, first = [], True
    for label, cells in series.items():
        if first:  # measured latency once, from the first frame
            frames.append(cells[keys].assign(series="Measured", ms=cells["label_ms"], ape=np.nan))
            first = False
        frames.append(cells[keys].assign(series=label, ms=cells["pred_ms"], ape=cells["ape"]))
    return pd.concat(frames, ignore_index=True)


def _latency_bars(long: pd.DataFrame, facet: str, x: str, title: str, ncols: int) -> matplotlib.figure.Figure:
    _style()
    panels = list(dict.fromkeys(long[facet]))
    series = list(dict.fromkeys(long["series"]))
    pal = _palette(series)
    ncols = max(1, min(ncols, len(panels)))
    nrows = int(np.ceil(len(panels) / ncols))
    widest = max(long[long[facet] == p][x].nunique() for p in panels)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.2, 0.9 * widest) * ncols, 3.2 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        sub = long[long[facet] == panel]
        order = list(dict.fromkeys(sub[x]))
        sns.barplot(data=sub, x=x, y="ms", hue="series", order=order, hue_order=series, palette=pal,
                    ax=ax, errorbar=None)
        width = 0.8 / len(series)
        for _, r in sub.dropna(subset=["ape"]).iterrows():  # APE above each predicted bar
            xpos = order.index(r[x]) - 0.4 + width * (series.index(r["series"]) + 0.5)
            ax.text(xpos, r["ms"], f"{r['ape']:.1f}%", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.margins(y=0.2)
        _panel_axes(ax, panel, "latency (ms)")
        _crowded_ticks(ax, len(order), max(4.2, 0.9 * widest))
    return _finish(fig, axes, len(panels), pal, series, title, 0.07)


def _as_series(cells, default: str) -> dict:
    return dict(cells) if isinstance(cells, dict) else {default: cells}


def _with_config(cells, label) -> dict:
    """{series: cells with an x-axis ``config`` label} from one frame or a {series: frame} mapping."""
    return {k: c.assign(config=label(c)) for k, c in _as_series(cells, "NeuSight").items()}


def plot_fusion(cells, title: str = "Table 7: operator fusion (inference)") -> matplotlib.figure.Figure:
    """Measured vs predicted latency, non-fused and fused, per GPU; ``cells`` from
    ``paper_tables.fusion_cells`` or a {series label: cells} mapping."""
    prepared = _with_config(cells, lambda c: (c["model_display"] + " b" + c["batch"].astype(str) + "\n"
                                              + np.where(c["fused"], "fused", "non-fused")))
    # one panel per row: three GPUs side by side made a figure too wide to read at page width
    return _latency_bars(_latency_long(prepared, ["gpu_short", "config"]), "gpu_short", "config", title, 1)


def plot_distributed(cells, title: str = "Table 8: 4-GPU training") -> matplotlib.figure.Figure:
    """Measured vs predicted latency of DP/TP/PP per system; ``cells`` from
    ``paper_tables.distributed_cells`` or a {series label: cells} mapping."""
    prepared = _with_config(cells, lambda c: c["model_display"] + " b" + c["batch"].astype(str) + "\n" + c["parallel"])
    return _latency_bars(_latency_long(prepared, ["system", "config"]), "system", "config", title, 2)


def plot_fp16mm(table, title: str = "Figure 10: FP16 tensor-core BMM on H100") -> matplotlib.figure.Figure:
    """Measured vs predicted latency per BMM shape; ``table`` from ``paper_tables.table_fp16mm`` or a
    {series label: table} mapping."""
    series = _as_series(table, "NeuSight")
    prepared = {}
    for k, t in series.items():
        t = t.reset_index()
        t["shape"] = t["shape (BxMxNxK)"].str.replace("x", "x\n", n=1)
        t["panel"] = "M=N=K=" + t["M"].astype(str)
        prepared[k] = t
    return _latency_bars(_latency_long(prepared, ["panel", "shape"]), "panel", "shape", title, 3)


def compact_number(v: float) -> str:
    """A cell label that stays short at 6 pt: 0.42, 3.1, 57, 840, 2.6k, 26k, 1.3M ('' for NaN)."""
    if v is None or not np.isfinite(v):
        return ""
    a = abs(v)
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if a >= div * 0.9995:                    # 999.6 reads 1k, not 1000
            x = v / div
            return f"{x:.2g}{suffix}" if abs(x) < 10 else f"{x:.0f}{suffix}"
    return f"{v:.0f}" if a >= 10 else f"{v:.2g}"


def _blank_cell(fit, gpus) -> str:
    """The text of a heat-map cell without a time: why there is none."""
    fit = fit if isinstance(fit, str) else ""
    if fit.startswith("does not fit"):
        return "does not\nfit"
    if "no NVLink" in fit:
        return f"tp{int(gpus)}:\nno link" if gpus and gpus > 1 else "no link"
    return "n/a"


def plot_latency_heatmap(rows: pd.DataFrame, title: str, note: str, ncols: int = 3) -> matplotlib.figure.Figure:
    """Predicted latency (ms) per GPU (``gpu_short``) x batch, one panel per (model, workload) of ``rows``
    (columns latency_ms, gpus): colour on a log scale, a compact number in each cell (``compact_number``;
    ``(tpN)`` when split over N GPUs), blank cells grey and labelled with why (column ``fit``: "does not fit",
    "tpN: no link"; else n/a, ``note`` says why), no grid lines."""
    panels = list(rows.groupby(["model", "workload"], sort=False).groups)
    nrow = int(np.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrow, ncols, figsize=(5.2 * ncols, 4.8 * nrow + 0.4), squeeze=False)
    for ax, (m, w) in zip(axes.flat, panels):
        sel = rows[(rows.model == m) & (rows.workload == w)]
        t = sel.pivot_table(index="gpu_short", columns="batch", values="latency_ms", dropna=False)
        plans = sel.pivot_table(index="gpu_short", columns="batch", values="gpus", dropna=False).reindex(
            index=t.index, columns=t.columns)
        # why a cell has no time, in the cell: does not fit, or a split with no link model
        fit = (sel.pivot_table(index="gpu_short", columns="batch", values="fit", aggfunc="first", dropna=False)
               .reindex(index=t.index, columns=t.columns) if "fit" in sel else None)
        z = np.log10(t.to_numpy(float))
        cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="0.92")
        im = ax.imshow(np.ma.masked_invalid(z), aspect="auto", cmap=cmap)
        ax.grid(False)                           # the global whitegrid style would draw lines through the cells
        ax.set_xticks(range(len(t.columns)), [f"b{b}" for b in t.columns])
        ax.set_yticks(range(len(t.index)), t.index, fontsize=7)
        lo, hi = (np.nanmin(z), np.nanmax(z)) if np.isfinite(z).any() else (0, 1)
        for i in range(t.shape[0]):
            for j in range(t.shape[1]):
                v, n = t.iat[i, j], plans.iat[i, j]
                dark = np.isfinite(v) and (np.log10(v) - lo) / max(hi - lo, 1e-9) > 0.5   # viridis_r: high = dark
                text = (_blank_cell(None if fit is None else fit.iat[i, j], n) if not np.isfinite(v)
                        else compact_number(v) + (f"\n(tp{int(n)})" if n > 1 else ""))
                ax.text(j, i, text, ha="center", va="center", fontsize=6, color="w" if dark else "k")
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        cb.set_label("log10 ms", fontsize=7)
        cb.ax.tick_params(labelsize=6)
        ax.set_title(f"{m} {w} (ms)", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.text(0.5, 0.005, note, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    return fig


# ---------------------------------------------------------------- the studies' own figures
def plot_live_kernels(k: pd.DataFrame):
    """Predicted against measured ms of the measured kernel rows, one colour per ``kernel_kind``, log axes, the
    exact line dashed. Returns the matplotlib figure."""
    m = k.dropna(subset=["measured_ms", "pred_ms"])
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for kind, g in m.groupby(live_kernels.kernel_kind(m), sort=False):
        ax.scatter(g["measured_ms"].astype(float), g["pred_ms"].astype(float), s=14, label=kind)
    if len(m):
        lo = float(m[["measured_ms", "pred_ms"]].astype(float).min().min()) / 2
        hi = float(m[["measured_ms", "pred_ms"]].astype(float).max().max()) * 2
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log"); ax.set_yscale("log")
    ax.set_xlabel("measured (ms)"); ax.set_ylabel("predicted (ms)")
    ax.set_title("Kernels on this GPU (dashed: exact)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def plot_live_modern(pred):
    """Predicted against measured per variant (graph: kernel sums; eager and the paper's setting: wall times), one
    colour per phase and, when several runs are shown (the local one, the recorded H100 and H200 runs), one marker per
    run: one legend under the panels (never over a point) with a key for the colours and one for the markers."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    variants = [v for v in live_modern.VARIANTS if v in set(pred["variant"])]
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 4.0), squeeze=False)
    d = pred[pred["predictor"] == pred["predictor"].iloc[0]] if len(pred) else pred
    runs = list(dict.fromkeys(d["run"])) if "run" in d else [None]
    # a marker for every run (nine recorded runs and the local one), so that none is left out of the figure
    markers = dict(zip(runs, "o^sDvP*Xhp<>d"))
    colours = dict(zip(live_modern.STEP_PHASES, ("tab:blue", "tab:orange", "tab:green")))
    for ax, v in zip(axes[0], variants):
        x = d[d["variant"] == v]
        for run, marker in markers.items():
            r = x if run is None else x[x["run"] == run]
            for ph, c in colours.items():
                y = r[r["phase"] == ph]
                ax.scatter(y["measured_ms"], y["predicted_ms"], s=18, c=c, marker=marker, alpha=0.8, linewidths=0)
        lo = max(1e-2, float(min(x["measured_ms"].min(), x["predicted_ms"].min())) / 1.5) if len(x) else 0.1
        hi = float(max(x["measured_ms"].max(), x["predicted_ms"].max())) * 1.5 if len(x) else 10
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel=f"measured ms ({live_modern.VARIANTS[v][0]})", ylabel="predicted ms",
               title=f"{d['predictor'].iloc[0] if len(d) else ''}: {v}")
    # the phases' key as colour patches, so that no phase reads as a run's marker
    handles = [Patch(color=c, label=ph) for ph, c in colours.items()]
    if len(runs) > 1:
        handles += [Line2D([], [], ls="none", marker=m, color="0.3", label=str(run)) for run, m in markers.items()]
    _legend_below(fig, handles, [h.get_label() for h in handles], ncol=4, markerscale=1)
    return fig


def plot_per_gpu(summary: pd.DataFrame, authors: dict, recipes=recipe_eval.RECIPES, title: str = ""):
    """Bars: MAPE per GPU x mode for the authors' shipped predictions and each recipe (mean over seeds,
    error bars min-max)."""
    groups = [g for g in summary["group"].unique() if g.endswith(" inf") or g.endswith(" train")]
    fig, ax = plt.subplots(figsize=(max(8, 0.75 * len(groups) + 2), 3.8))
    width = 0.8 / (1 + len(recipes))
    x = np.arange(len(groups))
    ax.bar(x - 0.4 + width / 2, [authors.get(g, np.nan) for g in groups], width, label="authors' shipped predictions",
           color=PALETTE["authors"])
    for i, r in enumerate(recipes, 1):
        s = summary[summary["predictor"] == r].set_index("group").reindex(groups)
        ax.bar(x - 0.4 + width * (i + 0.5), s["mean"], width, label=f"{r} (mean over seeds, bars min-max)",
               yerr=[s["mean"] - s["min"], s["max"] - s["mean"]], capsize=2,
               color=PALETTE.get(r))
    ax.set_xticks(x, groups, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("MAPE (%)")
    ax.set_title(title or "End-to-end MAPE per GPU and mode (Figure 7 / 8 cells)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: width (characters) at which plot_ablation wraps a row's label, and the width (inches) of each of its panels
ABLATION_LABEL_CHARS = 38
ABLATION_PANEL_IN = 3.4


def _tick_labels_overlap(labels) -> bool:
    boxes = [t.get_window_extent() for t in labels if t.get_visible() and t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def plot_ablation(table: pd.DataFrame, groups=recipe_eval.HEADLINE_GROUPS[:3], title: str = "", base_line: bool = True):
    """Horizontal bars: each ablation row's mean MAPE per group, whiskers min-max over seeds; a dashed line
    at the first row's mean (``base_line``).

    Readable at page width whatever the rows are called: long row labels are wrapped (``ABLATION_LABEL_CHARS``) and
    each row is as tall as its longest label, so the labels cannot take the panels' width (which squeezed the MAPE
    ticks of a full run into each other); each panel is ``ABLATION_PANEL_IN`` wide with at most five MAPE ticks, and
    a panel whose tick labels would still touch (MAPEs in the tens of thousands) gets them turned and right-aligned."""
    from matplotlib.ticker import MaxNLocator
    labels = ["\n".join(textwrap.wrap(str(r), ABLATION_LABEL_CHARS, break_on_hyphens=False)) or str(r)
              for r in table["row"]]
    lines = max((lab.count("\n") + 1 for lab in labels), default=1)
    row_in = 0.25 + 0.12 * lines
    label_in = 0.075 * min(ABLATION_LABEL_CHARS, max((len(r) for r in table["row"].astype(str)), default=0))
    fig, axes = plt.subplots(1, len(groups), figsize=(label_in + ABLATION_PANEL_IN * len(groups), row_in * len(table) + 1.6),
                             sharey=True)
    axes = np.atleast_1d(axes)
    y = np.arange(len(table))[::-1]
    for ax, g in zip(axes, groups):
        mean = table[f"{g} mean"].to_numpy(float)
        lo_hi = table[f"{g} min-max"].str.split("-", n=1, expand=True).astype(float).to_numpy()
        # the min-max strings are rounded to 0.1: clip the whiskers at 0 where rounding crosses the mean
        err = np.clip(np.nan_to_num([mean - lo_hi[:, 0], lo_hi[:, 1] - mean]), 0, None)
        ax.barh(y, mean, xerr=err, capsize=2, color="#8172b3")
        if base_line:
            ax.axvline(mean[0], color="k", lw=0.7, ls="--")
        ax.set_title(g, fontsize=9)
        ax.set_xlabel("MAPE (%)")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, min_n_ticks=3))
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(y, labels, fontsize=8)
    fig.suptitle(title or "Ablation: the authors' recipe with one difference switched to ours")
    fig.tight_layout()
    fig.canvas.draw()
    turned = False
    for ax in axes:
        if _tick_labels_overlap(ax.get_xticklabels()):
            ax.tick_params(axis="x", labelrotation=35)
            for t in ax.get_xticklabels():
                t.set_horizontalalignment("right")
            turned = True
    if turned:
        fig.tight_layout()
    return fig


def plot_execution(t: pd.DataFrame, model: str = "llama2_7b"):
    """Predicted ms per GPU for ``model``'s prefill and decode step, one bar per ``bf16_checks.EXECUTION_VARIANTS``, the
    floor as a black tick. A configuration that does not fit in the GPU's memory cannot run: its bar is drawn hollow
    and hatched, labelled "does not fit", and the legend (under the panels, never over a bar) says so."""
    from matplotlib.patches import Patch
    d = t[(t["model"] == model) & (t["seed"] == t["seed"].min())]
    works = list(dict.fromkeys(d["workload"]))
    fig, axes = plt.subplots(1, len(works), figsize=(6.5 * len(works), 4.6), squeeze=False)
    labels = [v[0] for v in bf16_checks.EXECUTION_VARIANTS]
    colours = dict(zip(labels, sns.color_palette(n_colors=len(labels))))
    for ax, work in zip(axes[0], works):
        x = d[d["workload"] == work]
        gpus = list(dict.fromkeys(x["device"]))
        for j, lab in enumerate(labels):
            y = x[x["variant"] == lab].set_index("device").reindex(gpus)
            bars = ax.bar(np.arange(len(gpus)) + (j - 1) * 0.27, y["e2e_ms"], 0.27, color=colours[lab])
            if {"lo_ms", "hi_ms"} <= set(y.columns) and y["lo_ms"].notna().any():
                # each answer's 80 % interval (cost/error_model.py); none on a run that cannot happen
                ok = (y["fit"] == "fits").to_numpy() & y["lo_ms"].notna().to_numpy()
                mid = y["e2e_ms"].to_numpy(float)
                err = np.vstack([mid - y["lo_ms"].to_numpy(float), y["hi_ms"].to_numpy(float) - mid])
                ax.errorbar((np.arange(len(gpus)) + (j - 1) * 0.27)[ok], mid[ok], yerr=err[:, ok], fmt="none",
                            ecolor="k", elinewidth=0.8, capsize=2)
            for bar, fit in zip(bars, y["fit"]):
                if fit != "fits":       # a time the GPU cannot run: an outline only, never a filled bar
                    bar.set(facecolor="none", edgecolor=colours[lab], hatch="//")
                    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), "does not fit" if fit != "unknown"
                            else "fit unknown", rotation=90, ha="center", va="bottom", fontsize=6)
        fl = x.drop_duplicates("device").set_index("device").reindex(gpus)["floor_ms"]
        ax.scatter(np.arange(len(gpus)), fl, marker="_", s=300, c="k", zorder=3)
        ax.set_xticks(np.arange(len(gpus)), [g.replace("NVIDIA_", "") for g in gpus], rotation=60, ha="right",
                      fontsize=8)
        ax.set(yscale="log", ylabel="predicted ms (extrapolation)", title=f"{model} bf16, {work}, batch 1")
        top = np.nanmax(x["e2e_ms"].to_numpy(float)) if x["e2e_ms"].notna().any() else 1.0
        ax.set_ylim(top=top * 8)        # room above the tallest bar for its label (a log axis: a factor)
    handles = [Patch(color=colours[lab], label=lab) for lab in labels] + [
        plt.Line2D([], [], color="k", marker="_", markersize=14, linestyle="none", label="physical floor"),
        plt.Line2D([], [], color="k", lw=0.8, label="80 % interval of the answer (docs/error_bars.md)"),
        Patch(facecolor="none", edgecolor="grey", hatch="//",
              label="hollow, hatched: does not fit in the GPU's memory (a time it cannot run)")]
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def plot_published(pub: pd.DataFrame, predictor: str, measured_label: str) -> matplotlib.figure.Figure:
    """Published ResNet-50 times against our predictions, one panel per ``published.panels`` group (batch on x, ms per
    batch on y, both log): the measurement and each predictor's line. Titles are wrapped to their panel so that
    neighbours never overlap; one legend for the figure, under the panels."""
    from neusight_core.studies import published
    groups = published.panels(pub)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.0), squeeze=False)
    handles = {}
    for ax, (title, g) in zip(axes.flat, groups):
        m = g[g.predictor == predictor]
        handles["measured"] = ax.plot(m.batch, m.latency_ms, "o-", color=PALETTE["Measured"],
                                      label=f"measured ({measured_label})")[0]
        for p, gp in g.groupby("predictor"):
            handles[p] = ax.plot(gp.batch, gp.predicted_ms, "s--", color=PALETTE.get(p), label=f"predicted: {p}")[0]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="batch", ylabel="ms per batch")
        ax.set_title("\n".join(textwrap.wrap(title, 40)), fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles=list(handles.values()), loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    return fig


# ---------------------------------------------------------------- notebook 07's figures
#: The held-out GPUs of notebook 07 in their own colours and markers, so that one never hides under the other;
#: the training GPUs are greys under them.
_HELD_STYLE = (("tab:orange", "o"), ("tab:blue", "^"), ("tab:purple", "s"), ("tab:green", "D"))


def _short(dev: str) -> str:
    return str(dev).replace("NVIDIA_", "")


def _device_styles(d: pd.DataFrame) -> dict:
    """device -> (label, scatter keywords), in drawing order: the training GPUs first, in greys, small, faint and at the
    bottom; then the held-out GPUs, largest set first, so that the smaller set is drawn over it, each in its own colour
    and marker, the larger set fainter (an alpha by share) and all of them above the training GPUs (zorder)."""
    roles = d.groupby("device")["role"].first()
    sizes = d.groupby("device").size()
    train = sorted(roles.index[roles != "held_out"])
    # the largest set first (at the bottom); on a tie the first by name (B200 before GB200) is drawn last, on top
    held = sorted(sorted(roles.index[roles == "held_out"], reverse=True), key=lambda dev: -sizes[dev])
    out = {}
    for i, dev in enumerate(train):
        out[dev] = (f"{_short(dev)} (training)",
                    dict(s=1, alpha=0.15, color=str(0.3 + 0.12 * (i % 4)), marker="o", zorder=1, linewidths=0))
    for i, dev in enumerate(held):
        colour, marker = _HELD_STYLE[i % len(_HELD_STYLE)]
        # the bottom (largest) held-out set fainter, so that the points over it stay visible
        alpha = 0.4 if i == 0 and len(held) > 1 else 0.8
        out[dev] = (f"{_short(dev)} (held out)",
                    dict(s=9, alpha=alpha, color=colour, marker=marker, zorder=3 + i, linewidths=0))
    return out


def _legend_below(fig, handles, labels, ncol: int, note_lines: int = 0, markerscale: float = 3) -> None:
    """One legend for the figure under its panels (never over a point), opaque markers; tight_layout leaves it room."""
    height = fig.get_figheight()
    rows = int(np.ceil(len(labels) / ncol))
    below = (0.25 * rows + 0.15 + 0.14 * note_lines) / height
    fig.tight_layout(rect=(0, below, 1, 1 - 0.5 / height if fig.get_suptitle() else 1))
    leg = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False, markerscale=markerscale,
                     bbox_to_anchor=(0.5, 0.14 * note_lines / height))
    for h in leg.legend_handles:
        h.set_alpha(1)


def plot_predicted_vs_measured(long: pd.DataFrame, kinds: dict, predictors, title: str = "") -> matplotlib.figure.Figure:
    """Predicted against measured ms (log axes), one panel per kind (rows; ``kinds``: key -> label) and predictor
    (columns) of ``long`` (columns kind, predictor, device, role, latency_ms, pred_ms): the training GPUs grey at the
    bottom, the held-out GPUs (role ``held_out``) in colour on top (``_device_styles``), the exact line dashed; one legend
    under the panels that names each GPU as training or held out."""
    ks = [k for k in kinds if (long["kind"] == k).any()]
    predictors = list(predictors)
    fig, axes = plt.subplots(len(ks), len(predictors), figsize=(3.4 * len(predictors), 3.2 * len(ks) + 1.0),
                             squeeze=False)
    styles = _device_styles(long)
    handles = {}
    for i, k in enumerate(ks):
        for j, pr in enumerate(predictors):
            ax = axes[i, j]
            t = long[(long["kind"] == k) & (long["predictor"] == pr)]
            for dev, (label, kw) in styles.items():
                g = t[t["device"] == dev]
                if len(g):
                    handles[label] = ax.scatter(g["latency_ms"], g["pred_ms"], label=label, **kw)
            if len(t):
                lo, hi = t["latency_ms"].min(), t["latency_ms"].max()
                ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, zorder=10)
            ax.set_xscale("log"); ax.set_yscale("log")
            ax.set_title(f"{kinds[k]}: {pr}", fontsize=8)
            ax.set_xlabel("measured (ms)", fontsize=7); ax.set_ylabel("predicted (ms)", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9, wrap=True)
    labels = [lab for lab, _ in styles.values() if lab in handles]
    _legend_below(fig, [handles[lab] for lab in labels], labels, ncol=min(len(labels), 6))
    return fig


def plot_moe_layers(long: pd.DataFrame, scored, names: dict | None = None) -> matplotlib.figure.Figure:
    """Notebook 07's MoE layers: predicted grouped GEMMs against the measured layer (log axes), one panel per predictor
    of ``scored`` (its first seed), the training GPUs grey at the bottom and the held-out GPUs in colour on top, named
    "(held out)" in one legend under the panels; each panel's title has its MAPE and bias over every GPU's layers.
    ``names``: predictor -> the title's name for it (default: the predictor)."""
    names = names or {}
    fig, axes = plt.subplots(1, len(scored), figsize=(4.2 * len(scored), 4.4), squeeze=False)
    styles = _device_styles(long)
    handles = {}
    for ax, name in zip(axes[0], scored):
        sel = long[long["predictor"] == name]
        d = sel[sel["seed"] == sel["seed"].min()]
        for dev, (label, kw) in styles.items():
            g = d[d["device"] == dev]
            if len(g):
                handles[label] = ax.scatter(g["latency_ms"], g["pred_ms"], label=label, **dict(kw, s=kw["s"] + 2))
        if len(d):
            lim = [1e-3, 2 * max(d["latency_ms"].max(), d["pred_ms"].max())]
            ax.plot(lim, lim, "k--", lw=0.8, zorder=10)
            ax.set_title(f"{names.get(name, name)}: MAPE {d['ape'].mean():.1f} %, bias {d['err'].mean():+.1f} %",
                         fontsize=9)
        ax.set_xscale("log"); ax.set_yscale("log")
        ax.set_xlabel("measured MoE layer (ms)", fontsize=8); ax.set_ylabel("predicted grouped GEMMs (ms)", fontsize=8)
    labels = [lab for lab, _ in styles.values() if lab in handles]
    _legend_below(fig, [handles[lab] for lab in labels], labels, ncol=min(len(labels), 6))
    return fig


def plot_moe_parallel(table: pd.DataFrame, max_gpus: int | None = None, splits=None) -> matplotlib.figure.Figure:
    """Bias (%) of the two grouped GEMMs of one GPU of a split MoE layer against the GPUs in the group, one panel per
    GPU role, a line per predictor (``<predictor> bias`` columns) and split (``splits``; default: every split but the
    single GPU, which starts each line at 1). ``max_gpus``: only the groups up to that many GPUs (the counts a table
    beside it shows); the x axis has a tick at each count drawn and at no other."""
    t = table if max_gpus is None else table[table["gpus"] <= max_gpus]
    single = t["gpus"] == 1
    splits = list(dict.fromkeys(t.loc[~single, "split"])) if splits is None else list(splits)
    preds = [c[:-len(" bias")] for c in t.columns if c.endswith(" bias")]
    roles = list(dict.fromkeys(t["role"]))
    fig, axes = plt.subplots(1, len(roles), figsize=(4.5 * len(roles), 3.6), sharey=True, squeeze=False)
    # one colour per split, one line style and marker per predictor (the first solid with dots, the others dashed)
    colours = dict(zip(splits, ("tab:blue", "tab:green", "tab:purple", "tab:brown")))
    line = {(p, s): ("o-" if i == 0 else "x--", colours[s]) for i, p in enumerate(preds) for s in splits}
    for ax, role in zip(axes[0], roles):
        g = t[t["role"] == role]
        counts = set()
        for (p, s), (fmt, colour) in line.items():
            d = pd.concat([g[g["gpus"] == 1], g[(g["split"] == s) & (g["gpus"] > 1)]])
            if len(d) > 1:
                ax.plot(d["gpus"], d[f"{p} bias"], fmt, color=colour, label=f"{p}, {s}")
                counts |= set(d["gpus"].astype(int))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(counts), [str(c) for c in sorted(counts)])
        ax.minorticks_off()
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"{str(role).replace('_', '-')} GPUs", fontsize=9)
        ax.set_xlabel("GPUs in the group", fontsize=8)
    axes[0][0].set_ylabel("bias of the two GEMMs, % (< 0: faster)", fontsize=8)
    h, lab = axes[0][0].get_legend_handles_labels()
    _legend_below(fig, h, lab, ncol=min(len(lab), 4), markerscale=1)
    return fig
