"""How many epochs of the authors' recipe does the artifact need?  (CPU time, issue: Tier 1 fidelity)

Trains `neusight-paper` for the authors' 100 epochs on one seed (about 30 min on one core) -- or
reuses that run from artifacts/trained -- and prints, per op class, the best validation MAPE within
the first E epochs against the best of all 100, and the smallest E within 1 point per class. The learning rate is constant, so the first E epochs
of this run are exactly an E-epoch run (same initialisation, batches and weights).

    .venv/bin/python benchmarks/paper_epoch_cut.py [--seed 0] [--e2e]

With --e2e it also predicts every labelled configuration with the uncut run and with the recipe's cut of
the same seed (training it if needed) and prints the pooled MAPE of both. Report only: the recipe's epochs
are chosen on the kernel validation split, never on these end-to-end labels.
"""
from __future__ import annotations

import argparse
import json

from neusight_core import predictors as P
from neusight_core.studies import recipe_eval as R, recipe_studies as S
from neusight_core.predictors.registry import hparams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=100, help="the uncut run (the authors' 100)")
    ap.add_argument("--e2e", action="store_true", help="also the end-to-end MAPE of the uncut run and the cut")
    a = ap.parse_args()
    folder = S.uncut_paper_folder(a.seed, a.epochs)
    over = None if folder == P.folder("neusight-paper", False, a.seed) else {"epochs": a.epochs}
    p = P.get("neusight-paper", seed=a.seed, config=over)
    meta = json.loads((folder / "meta.json").read_text())
    t = S.epoch_cut_table(meta, cuts=(10, 20, 30, 40, 50, 60, 70, 80))
    print(f"neusight-paper, seed {a.seed}, {a.epochs} epochs, trained in {p.info.get('train_seconds', 0) / 60:.1f} min")
    print(t.round(2).to_markdown(index=False))
    print(f"smallest E within 1 point of the uncut run, per class: {S.smallest_cut_per_class(meta, 1.0)}")
    print(f"the recipe trains: {hparams('neusight-paper')['epochs']}")
    if a.e2e:
        end_to_end(a.seed, a.epochs, p)


def end_to_end(seed: int, epochs: int, uncut) -> None:
    """Pooled MAPE of the uncut run against the recipe's cut on the same seed (report only)."""
    from neusight_core.studies import evaluation as ev
    from neusight_core.studies import reproduce
    configs = reproduce.select_configs(ev.build_index(), False)
    trained = {(f"{epochs} epochs", seed): uncut, ("the recipe's cut", seed): P.get("neusight-paper", seed=seed)}
    per_seed = R.seed_mape(R.predict_seeded(configs, trained), configs)
    keep = list(R.HEADLINE_GROUPS) + ["H100 inf", "H100 train"]
    t = per_seed[per_seed["group"].isin(keep)].pivot(index="predictor", columns="group", values="mape")[keep]
    print(f"end to end, neusight-paper seed {seed} (report only, no choice is made from it):")
    print(t.round(1).to_markdown())

if __name__ == "__main__":
    main()
