"""One op class of a NeuSight recipe, trained alone with config overrides, scored on kernel data only.

The search behind our recipe's per-class settings (docs/recipes.md, search log in docs/search_log_logo.yaml):
for each candidate, train the class on the recipe's training records with 30 % of the distinct
transformer-derived test shapes held out (as ``recipe_studies.shape_holdout_check`` does for whole recipes),
and print one JSON line: best validation MAPE on the random split (training GPUs), the epoch, the
held-out shapes' MAPE and time-weighted MAPE (mean over the five training GPUs), and the training time.
No end-to-end label and no unseen GPU is read.

    .venv/bin/python benchmarks/class_search.py --cls BMM --over '{"lr": {"BMM": 1e-4}}' --epochs 30
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from neusight_core.data import dataset
from neusight_core import predictors as P


def one_class(recipe: str, cls: str, config: dict, seed: int):
    """The recipe's predictor with ``config`` overrides, set to train the op class ``cls`` alone (one thread)."""
    import torch
    torch.set_num_threads(1)
    p = P.create(recipe, seed, config)
    records = p.training_records
    p.training_records = lambda train: (lambda k: k[k["op_class"] == cls])(records(train))
    return p


def run(recipe: str, cls: str, over: dict, epochs: int, seed: int, holdout: float = 0.3) -> dict:
    cfg = {**over, "epochs": {cls: epochs}}
    if P.create(recipe, seed).config.get("extra_training"):
        cfg["extra_holdout"] = holdout
    p = one_class(recipe, cls, cfg, seed)
    t0 = time.perf_counter()
    p.fit(P.data_for(p, dataset.training_data()))
    secs = time.perf_counter() - t0
    held = dataset.seen_test_kernels(holdout, part="held_out")
    held = held[held["op_class"] == cls].reset_index(drop=True)
    y = held["latency_ms"].to_numpy(float)
    ape = np.abs(p.predict(held, None) / y - 1) * 100
    d = held.assign(ape=ape, w=ape * y)
    per = d.groupby("device").apply(lambda g: (g["ape"].mean(), g["w"].sum() / g["latency_ms"].sum()),
                                    include_groups=False)
    info = p.info["classes"][cls]
    return {"recipe": recipe, "cls": cls, "over": over, "epochs": epochs, "seed": seed,
            "val_mape": round(info["val_mape"], 2), "val_wmape": round(info["val_wmape"], 2),
            "best_epoch": info["best_epochs"][0],
            "held_mape": round(float(np.mean([v[0] for v in per])), 2),
            "held_wmape": round(float(np.mean([v[1] for v in per])), 2),
            "held_wmape_per_gpu": {k: round(v[1], 1) for k, v in per.items()},
            "val_history": info["val_history"], "seconds": round(secs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="neusight")
    ap.add_argument("--cls", required=True)
    ap.add_argument("--over", default="{}", help="config overrides as JSON")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(run(a.recipe, a.cls, json.loads(a.over), a.epochs, a.seed)), flush=True)


if __name__ == "__main__":
    main()
