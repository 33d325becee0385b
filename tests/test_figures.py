"""What an evaluator reads off notebook 07's figures: legends that cover no data, held-out GPUs drawn over the
training ones and named as held out, one held-out GPU not hidden under the other, and x axes that stop where
their tables stop; and notebook 04's ablation figure, whose tick labels stay apart whatever its rows are called.
Small frames, no data or weights needed."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402  (after the backend is chosen)
import numpy as np
import pandas as pd
import pytest

from neusight_core.reports import plots


def _kernels(n_gb200: int = 40, n_b200: int = 20) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for dev, role, n in (("NVIDIA_H100_80GB_HBM3", "training", 60), ("NVIDIA_L40S", "training", 60),
                         ("NVIDIA_GB200", "held_out", n_gb200), ("NVIDIA_B200", "held_out", n_b200)):
        ms = 10 ** rng.uniform(-3, 1, n)
        for kind in ("GEMM", "ATTN_decode"):
            for pr in ("neusight", "roofline"):
                rows.append(pd.DataFrame({"kind": kind, "predictor": pr, "device": dev, "role": role, "seed": 0,
                                          "latency_ms": ms, "pred_ms": ms * rng.uniform(0.5, 2, n)}))
    d = pd.concat(rows, ignore_index=True)
    d["err"] = (d.pred_ms / d.latency_ms - 1) * 100
    d["ape"] = d["err"].abs()
    return d


def _outside_every_axes(fig) -> bool:
    fig.canvas.draw()
    leg = fig.legends[0]
    box = leg.get_window_extent().transformed(fig.transFigure.inverted())
    return not any(box.overlaps(ax.get_position()) for ax in fig.axes if ax.get_visible())


def _scatter_by_label(fig) -> dict:
    return {c.get_label(): c for ax in fig.axes for c in ax.collections if not c.get_label().startswith("_")}


@pytest.mark.parametrize("draw", ["predicted_vs_measured", "moe_layers"])
def test_held_out_gpus_are_named_drawn_on_top_and_the_legend_covers_no_panel(draw):
    d = _kernels()
    fig = (plots.plot_predicted_vs_measured(d, {"GEMM": "GEMM", "ATTN_decode": "attention decode"},
                                            ["neusight", "roofline"], title="t")
           if draw == "predicted_vs_measured" else plots.plot_moe_layers(d, ["neusight", "roofline"]))
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
    assert _outside_every_axes(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"B200 (held out)", "GB200 (held out)", "H100_80GB_HBM3 (training)", "L40S (training)"} == set(labels)
    ax = fig.axes[0]
    z = {c.get_label(): c.get_zorder() for c in ax.collections}
    assert min(z["B200 (held out)"], z["GB200 (held out)"]) > max(z["H100_80GB_HBM3 (training)"], z["L40S (training)"])
    # the larger held-out set (GB200) under the smaller, fainter, in another colour and marker
    assert z["B200 (held out)"] > z["GB200 (held out)"]
    sc = {c.get_label(): c for c in ax.collections}
    assert sc["GB200 (held out)"].get_alpha() < sc["B200 (held out)"].get_alpha()
    assert not np.allclose(sc["GB200 (held out)"].get_facecolor()[0][:3], sc["B200 (held out)"].get_facecolor()[0][:3])
    assert sc["GB200 (held out)"].get_paths()[0] != sc["B200 (held out)"].get_paths()[0]


def test_the_larger_held_out_set_goes_under_whichever_gpu_it_is():
    fig = plots.plot_predicted_vs_measured(_kernels(n_gb200=10, n_b200=50), {"GEMM": "GEMM"}, ["neusight"])
    z = {c.get_label(): c.get_zorder() for c in fig.axes[0].collections}
    assert z["GB200 (held out)"] > z["B200 (held out)"]


def _parallel_table() -> pd.DataFrame:
    rows = []
    for role in ("held_out", "training"):
        rows.append({"role": role, "split": "one GPU", "gpus": 1})
        for split in ("tp", "ep"):
            for g in (2, 4, 8, 16, 64, 256):
                rows.append({"role": role, "split": split, "gpus": g})
        rows.append({"role": role, "split": "tp x ep", "gpus": 4})
    t = pd.DataFrame(rows)
    t["neusight bias"] = -np.log2(t.gpus) * 5
    t["roofline bias"] = -30 - np.log2(t.gpus)
    return t


def test_the_parallel_figure_stops_where_its_table_stops():
    fig = plots.plot_moe_parallel(_parallel_table(), max_gpus=8, splits=["tp", "ep"])
    for ax in fig.axes:
        assert [float(x) for x in ax.get_xticks()] == [1, 2, 4, 8]
        assert max(float(np.max(line.get_xdata())) for line in ax.get_lines() if len(line.get_xdata()) > 2) == 8
    assert _outside_every_axes(fig)
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert labels == {"neusight, tp", "neusight, ep", "roofline, tp", "roofline, ep"}


def test_the_parallel_figure_without_a_cap_draws_every_count():
    fig = plots.plot_moe_parallel(_parallel_table(), splits=["ep"])
    assert [float(x) for x in fig.axes[0].get_xticks()] == [1, 2, 4, 8, 16, 64, 256]


def test_the_modern_steps_figure_draws_every_run_and_keeps_its_legend_off_the_points():
    from neusight_core.studies import live_modern
    runs = [f"recorded run {i}" for i in range(9)]
    rows = [{"run": run, "variant": v, "predictor": "neusight", "phase": ph, "measured_ms": 1.0 + i + j,
             "predicted_ms": 1.5 + i} for i, run in enumerate(runs) for v in live_modern.VARIANTS
            for j, ph in enumerate(live_modern.STEP_PHASES)]
    fig = plots.plot_live_modern(pd.DataFrame(rows))
    assert [ax.get_title().split(": ", 1)[1] for ax in fig.axes] == list(live_modern.VARIANTS)
    assert live_modern.PAPER_SETTING in live_modern.VARIANTS and "before" not in live_modern.VARIANTS
    assert not any(ax.get_legend() for ax in fig.axes) and _outside_every_axes(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == list(live_modern.STEP_PHASES) + runs
    # every run has its own marker and its points in every panel (none dropped for want of a marker)
    markers = [h.get_marker() for h in fig.legends[0].legend_handles[len(live_modern.STEP_PHASES):]]
    assert len(set(markers)) == len(runs)
    drawn = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    assert drawn == len(runs) * len(live_modern.STEP_PHASES)


def _ablation_table(rows, top: float) -> pd.DataFrame:
    """An ablation table as ``recipe_studies.ablation_table`` writes it: per group a mean, a "min-max" string and the
    change from the base row, MAPEs up to ``top``."""
    from neusight_core.studies import recipe_eval
    rng = np.random.default_rng(3)
    t = pd.DataFrame({"row": rows})
    for g in recipe_eval.HEADLINE_GROUPS[:3]:
        m = rng.uniform(0.02 * top, top, len(rows))
        t[f"{g} mean"], t[f"{g} min-max"] = m, [f"{0.9 * v:.1f}-{1.1 * v:.1f}" for v in m]
        t[f"{g} vs base"] = m - m[0]
    return t


_LONG_ROWS = ["neusight-paper (base), trained on 1,000 records per class",
              "+ the training GPUs' transformer-shaped kernels (a quarter of the records per class)",
              "learning rates (LINEAR 1e-3, softmax and layernorm 1e-4)",
              "LINEAR: five 8 x 256 networks, u averaged (a failed one dropped)", "epochs per class (ours)",
              "inputs: wave_bytes_per_sm_bw instead of the memory-capacity and L2 inputs (neusight-logo)",
              "tile lookup: the authors' unnormalised one instead of our scaled one, with the memory cap at the "
              "training GPUs' 40 GB (neusight-logo)", "all = neusight"]


@pytest.mark.parametrize("top", [12.0, 1.6e5, 3e7])
def test_the_ablation_figure_keeps_its_tick_labels_apart_whatever_the_rows_are_called(top):
    # a full run's long recipe names once took the panels' width and pressed their MAPE ticks into each other
    fig = plots.plot_ablation(_ablation_table(_LONG_ROWS, top), title="Ablation\n(every row trained on 1,000 records)")
    fig.canvas.draw()
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [(t.get_text(), t.get_window_extent()) for t in labels if t.get_visible() and t.get_text()]
            touching = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]
            assert not touching, f"{ax.get_title()}: tick labels overlap: {touching}"
    first = fig.axes[0]
    rows = [t for t in first.get_yticklabels() if t.get_text()]
    assert len(rows) == len(_LONG_ROWS)
    # every row label is left of the first panel, inside the figure, and wrapped (none wider than the panel)
    panel = first.get_window_extent()
    for t in rows:
        box = t.get_window_extent()
        assert box.x1 <= panel.x0 + 1 and box.x0 >= 0, t.get_text()
        assert box.width <= panel.width, t.get_text()
    matplotlib.pyplot.close(fig)
