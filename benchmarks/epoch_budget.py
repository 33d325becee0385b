"""What would a full run that trains within the time target cost in accuracy?  (issue 24)

Reads the validation history (validation MAPE after every epoch, training GPUs' kernels) that every full training
run records in its meta.json, for both NeuSight recipes and every seed already trained in artifacts/trained, and
prints per op class the best validation MAPE within the first fraction f of the recipe's epochs, mean over seeds.
Both recipes train at a constant learning rate, so the first E epochs of a run are exactly an E-epoch run (an
ensemble's members are read one by one and averaged, which is close to but not the same as the averaged network).
Training time scales with the epochs, so f is also the fraction of the training CPU time.

    .venv/bin/python benchmarks/epoch_budget.py [--fractions 1 0.5 0.333]

Nothing is trained: a recipe and seed without full weights is skipped, and said so.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd

from neusight_core import predictors as P


def best_within(history, fraction: float) -> float:
    """Best validation MAPE within the first ceil(fraction x epochs) epochs; members of an ensemble averaged."""
    h = np.atleast_2d(np.asarray(history, float))
    e = max(1, math.ceil(h.shape[1] * fraction - 1e-9))
    return float(np.mean([np.nanmin(np.where(np.isfinite(m[:e]), m[:e], np.nan)) for m in h]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5, 1 / 3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args()
    rows = []
    for name in ("neusight-paper", "neusight"):
        for seed in a.seeds:
            meta_file = P.folder(name, False, seed) / "meta.json"
            if not meta_file.is_file():
                print(f"skipped: {name} seed {seed} has no full weights in {meta_file.parent}")
                continue
            info = json.loads(meta_file.read_text())["info"]
            for cls, c in info["classes"].items():
                for f in a.fractions:
                    rows.append({"recipe": name, "seed": seed, "op_class": cls, "epochs": c["epochs"],
                                 "fraction": round(f, 3), "best_val_mape": best_within(c["val_history"], f),
                                 "train_s_seed": info.get("train_seconds")})
    if not rows:
        raise SystemExit("no full weights in artifacts/trained: run ./run_all.sh (notebook 03) first")
    df = pd.DataFrame(rows)
    t = (df.groupby(["recipe", "op_class", "fraction"], sort=False)["best_val_mape"].mean()
         .unstack("fraction").round(1))
    print("best validation MAPE (%) within the first fraction of each class's epochs, mean over seeds "
          f"{sorted(int(s) for s in df.seed.unique())}")
    print(t.to_markdown())
    secs = df.drop_duplicates(["recipe", "seed"]).groupby("recipe")["train_s_seed"].mean()
    print("training seconds per seed at the full epochs (mean): " + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()))


if __name__ == "__main__":
    main()
