"""How many epochs of the authors' recipe does the artifact need?  (CPU time, issue: Tier 1 fidelity)

Trains `neusight-paper` for the authors' 100 epochs on one seed (about 30 min on one core) -- or
reuses that run from artifacts/trained -- and prints, per op class, the best validation MAPE within
the first E epochs against the best of all 100, and the smallest E within 1 point per class. The learning rate is constant, so the first E epochs
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
    folder = R.uncut_paper_folder(a.seed, a.epochs)
    over = None if folder == P.folder("neusight-paper", False, a.seed) else {"epochs": a.epochs}
    p = P.get("neusight-paper", seed=a.seed, config=over)
    meta = json.loads((folder / "meta.json").read_text())
    t = R.epoch_cut_table(meta, cuts=(10, 20, 30, 40, 50, 60, 70, 80))
    print(f"neusight-paper, seed {a.seed}, {a.epochs} epochs, trained in {p.info.get('train_seconds', 0) / 60:.1f} min")
    print(t.round(2).to_markdown(index=False))
    print(f"smallest E within 1 point of the uncut run, per class: {R.smallest_cut_per_class(meta, 1.0)}")
    print(f"the recipe trains: {hparams('neusight-paper')['epochs']}")

if __name__ == "__main__":
    main()
