"""How many epochs of the authors' recipe does the artifact need?  (CPU time, issue: Tier 1 fidelity)

Trains `neusight-paper` for the authors' 100 epochs on one seed (about 25-50 min on 2 cores) -- or
reuses that run from artifacts/trained -- and prints, per op class, the best validation MAPE within
the first E epochs against the best of all 100. The learning rate is constant, so the first E epochs
of this run are exactly an E-epoch run (same initialisation, batches and weights).

    .venv/bin/python benchmarks/paper_epoch_cut.py [--seed 0]
"""
from __future__ import annotations

import argparse
import json

from neusight_core import predictors as P
from neusight_core import recipe_eval as R
from neusight_core.predictors.base import hparams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=100, help="the uncut run (the authors' 100)")
    a = ap.parse_args()
    over = {"epochs": a.epochs}
    if hparams("neusight-paper")["epochs"] == over["epochs"] or hparams("neusight-paper")["epochs"] == {
            c: a.epochs for c in ("BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM")}:
        over = None            # the recipe itself is uncut
    p = P.get("neusight-paper", seed=a.seed, config=over)
    meta = json.loads((P.folder("neusight-paper", False, a.seed, over) / "meta.json").read_text())
    t = R.epoch_cut_table(meta)
    print(f"neusight-paper, seed {a.seed}, {a.epochs} epochs, trained in {p.info.get('train_seconds', 0) / 60:.1f} min")
    print(t.round(2).to_markdown(index=False))
    print(f"smallest E within 1 point of the uncut run for every class: {R.smallest_cut(t)}")


if __name__ == "__main__":
    main()
