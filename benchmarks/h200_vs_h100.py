"""Issue 34 item 2: is the H200 predicted at most as slow as the H100 on the paper's models?

The measured answer (docs/tier2/2026-11-26-h100, -h200: notebook 05 on lent GPUs) is 0.94-0.97 of the H100's
latency. This predicts the recorded FP32 configurations of both runs on both GPUs with every seed of a recipe (full
weights, trained here; nothing is trained by this script) and prints per configuration the predicted H200 / H100
ratio next to the measured one, and how many configurations are predicted slower on the H200.

    .venv/bin/python benchmarks/h200_vs_h100.py [--predictor neusight] [--seeds 0,1,2] [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
H100, H200 = "NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"


def ratios(predictor: str = "neusight", seeds=(0, 1, 2), quick: bool = False):
    import pandas as pd

    from neusight_core.cost import engine
    from neusight_core.cost import request
    from neusight_core import predictors as P
    runs = {g: pd.read_csv(ROOT / "docs" / "tier2" / f"2026-11-26-{g.split('_')[-1].lower() if g == H200 else 'h100'}"
                           / "live_paper.csv") for g in (H100, H200)}
    both = runs[H100].merge(runs[H200], on="name", suffixes=("_h100", "_h200"))
    both = both[both["measured_ms_h100"].notna() & both["measured_ms_h200"].notna() & (both["parallel_h100"].isna())]
    reqs = [{"model": r.model_h100, "device": g, "batch": int(r.batch_h100), "seq": int(r.seq_h100),
             "mode": r.mode_h100, "attention": "eager", "execution": "graph"} for r in both.itertuples() for g in (H100, H200)]
    use = [s for s in seeds if not P.trains_long(predictor) or P.is_trained(predictor, quick, s)]
    out = engine.predict(request.parse(reqs), [predictor], seeds=use, quick=quick)
    out = out.assign(name=[n for n in both["name"] for _ in (H100, H200)] * len(use))
    piv = out.pivot_table(index=["name", "seed"], columns="device", values="e2e_ms").reset_index()
    piv["predicted_h200_over_h100"] = piv[H200] / piv[H100]
    meas = both.set_index("name")
    piv["measured_h200_over_h100"] = (meas["measured_ms_h200"] / meas["measured_ms_h100"]).reindex(piv["name"]).to_numpy()
    return piv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", default="neusight")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    t = ratios(a.predictor, tuple(int(s) for s in a.seeds.split(",")), a.quick)
    print(t.round(3).to_string(index=False))
    slower = t[t["predicted_h200_over_h100"] > 1 + 1e-9]
    print(f"{a.predictor}: predicted H200/H100 {t.predicted_h200_over_h100.min():.3f}-{t.predicted_h200_over_h100.max():.3f}"
          f" (measured {t.measured_h200_over_h100.min():.3f}-{t.measured_h200_over_h100.max():.3f}); "
          f"{len(slower)} of {len(t)} (configuration, seed) pairs predicted slower on the H200")
    return 0


if __name__ == "__main__":
    sys.exit(main())
