"""Notebook 05's recorded modern runs (``live_modern.RECORDED``) predicted with seeds 0-2 of the full weights:
MAPE % by variant (graph = kernel sums, eager = wall times, before = the paper's setting) and phase, mean (min-max)
over seeds, and the signed error of the kernel sums by phase. The measurements are validation: nothing here is
fitted. ``--grads accumulate`` predicts the training steps as before the eighth session (accumulation kernels that
the measured steps, whose gradients start from none, do not run).

    .venv/bin/python benchmarks/modern_steps.py [--seeds 0,1,2] [--grads fresh|accumulate]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from neusight_core.studies import live_modern  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--grads", default="fresh", choices=("fresh", "accumulate"))
    a = ap.parse_args(argv)
    seeds = tuple(int(x) for x in a.seeds.split(","))
    pd.set_option("display.width", 250)
    for name, (gpu, folder) in live_modern.RECORDED.items():
        steps = pd.read_csv(ROOT / folder / "modern_steps.csv")
        p = live_modern.predict_steps(steps, gpu, ("neusight", "roofline"), seeds, False, grads=a.grads)
        m = live_modern.step_mape(p)
        cols = [c for c in m.columns if c.startswith("mean")] + ["min pooled", "max pooled"]
        print(f"\n{name} ({gpu}), grads {a.grads}, seeds {list(seeds)}")
        print(m[cols].to_string())
        g = p[(p["variant"] == "graph") & (p["predictor"] == "neusight")]
        print("signed, neusight kernel sums:", g.groupby("phase")["error_pct"].mean().round(1).to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
