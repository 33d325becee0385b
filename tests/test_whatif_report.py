"""Notebook 06's summary, written by reports/whatif_report.py from the what-if tables (issue 35: prose out of the
notebook). A run that cannot happen shows no time in the H100 table; the counts come from the tables."""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.reports import whatif_report


def _inputs():
    res = pd.DataFrame({
        "model": ["llama2_7b", "llama2_70b", "llama2_7b"], "workload": ["prefill", "prefill", "decode"],
        "dtype": ["bf16", "bf16", "bf16"], "plan": ["1 GPU", "1 GPU", "1 GPU"], "batch": [1, 1, 1],
        "gpu": ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3", "Tesla_T4"],
        "latency_ms": [52.4, np.nan, 30.0], "mem_total_gib": [13.5, 130.2, 13.0],
        "fit": ["fits", "does not fit on 1: needs 130.2 GiB on one GPU, has 80 GiB", "fits"],
        "validation": ["paper setting", "extrapolation", "extrapolation"]})
    c9 = {"dense": {"mape": 31.4, "verdict": "DEVIATES", "expected": 5.0},
          "sparse": {"mape": 38.5, "verdict": "DEVIATES"}}
    fitcheck = pd.DataFrame({"authors_label": [True, True, False], "predicted_fits": [True, False, False]})
    return dict(res=res, c9=c9, fig10_authors=pd.DataFrame({"ape": [10.0, 20.0]}),
                memval=pd.DataFrame({"error_pct": [0.5, -1.25]}), fitcheck=fitcheck,
                slower=pd.DataFrame({"model": ["llama2_7b"], "workload": ["prefill"]}),
                cmp=pd.DataFrame({"fp32 / bf16": [1.2, np.nan, 0.9]}))


def test_summary_says_what_the_tables_say():
    x = _inputs()
    md = whatif_report.summary_markdown(**x, floor_line="2.0x the floor.", bf16_status=pd.DataFrame(
        {"kernels": ["GEMM", "norms"], "held-out MAPE": ["15.7 / 17.1 %", "—"], "status": ["validated", "extrapolation"]}),
        max_gpus=1, quick=True, total_s=12.0)
    assert "MAPE **31.4 %** with the dense" in md and "shipped predictions: 15.0 %" in md
    assert "max |error| 1.25 % over 2 runs" in md and "1 of 2 single-GPU training" in md and "1 of the 1 they" in md
    assert "slower than fp32 in 1 of 2 batch-1 cases (llama2_7b prefill)" in md
    assert "GEMM: 15.7 / 17.1 % held-out" in md and "norms" not in md
    assert "3 predictions (2 extrapolations" in md and "1 do not fit on 1 GPUs" in md
    rows = [line for line in md.splitlines() if line.startswith("| llama2")]
    assert rows == ["| llama2_7b | prefill | bf16 | 1 GPU | 52.4 | 13.5 | fits |",
                    "| llama2_70b | prefill | bf16 | 1 GPU | — | 130.2 | does not fit on 1: needs 130.2 GiB on one GPU, "
                    "has 80 GiB |"]                                   # the T4 row is not in the H100 table
    m = whatif_report.metrics(**{k: v for k, v in x.items() if k != "cmp"}, floor_t=pd.DataFrame({"a": [1]}),
                              quick=True, predictor="roofline", total_s=12.0, run_s=3.0)
    assert m["does_not_fit"] == 1 and m["labels_predicted_to_fit"] == [1, 2] and m["extrapolations"] == 2


def test_a_tensor_split_needs_a_link_that_joins_that_many_gpus():
    """An NVLink bridge joins two PCIe cards: a split over 8 of them has no link to run at NVLink speed."""
    from neusight_core.data import devices
    from neusight_core.studies import whatif
    pcie, sxm = devices.get_device("A100-PCIE-40GB"), devices.get_device("A100-SXM4-40GB")
    assert pcie.link_gpus == 2 and sxm.link_gpus is None
    assert whatif.linked(pcie, 1) and whatif.linked(pcie, 2) and not whatif.linked(pcie, 8)
    assert whatif.linked(sxm, 8) and not whatif.linked(devices.get_device("T4"), 2)


def test_the_execution_figure_draws_a_run_that_does_not_fit_hollow_and_says_so():
    import numpy as np
    import pandas as pd
    from matplotlib.colors import to_rgba
    from neusight_core.reports import plots
    from neusight_core.studies import bf16_checks
    rows = [{"model": "llama2_7b", "seed": 0, "workload": "decode", "device": g, "variant": v[0], "e2e_ms": ms,
             "floor_ms": 1.0, "fit": fit}
            for g, ms, fit in (("Tesla_P4", 280.0, "does not fit"), ("NVIDIA_H100_80GB_HBM3", 7.5, "fits"))
            for v in bf16_checks.EXECUTION_VARIANTS]
    fig = plots.plot_execution(pd.DataFrame(rows))
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0]
    hollow = [p for p in bars if p.get_facecolor()[3] == 0]
    assert len(hollow) == len(bf16_checks.EXECUTION_VARIANTS)           # P4's bars, and only those
    assert all(np.isclose(p.get_height(), 280.0) and p.get_hatch() for p in hollow)
    assert all(p.get_facecolor() != to_rgba("none") for p in bars if p not in hollow)
    assert sum(t.get_text() == "does not fit" for t in ax.texts) == len(hollow)
    legend = fig.legends[0]                                               # under the panels, not over a bar
    assert not ax.get_legend() and any("does not fit" in t.get_text() for t in legend.get_texts())
