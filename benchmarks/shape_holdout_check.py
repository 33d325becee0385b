"""The kernel-data evidence for our recipe `neusight` (docs/recipes.md "Our recipe"): how the authors'
recipe and ours predict kernel shapes that neither trained on, on the training GPUs only.

A fixed random 30 % of the distinct shapes of the release's kernel test sets is held out on every
training GPU; our recipe trains on the rest of those rows (plus the raw grid), the authors' recipe on the
raw grid only. With --drop-gpu the check is leave-one-GPU-out: both recipes train without that training
GPU and are scored on its held-out shapes, as if it were unseen. No end-to-end label and no unseen-GPU
datum is read.

    .venv/bin/python benchmarks/shape_holdout_check.py [--seeds 0,1] [--drop-gpu Tesla_V100-PCIE-32GB] [--quick]

Trains what is missing (8-10 min per recipe and seed on one core; two at a time), then prints the
time-weighted and plain MAPE per op class (mean over the five GPUs; mean and min-max over seeds) and
the per-GPU table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))



def candidates() -> dict:
    """Our recipe is written as its differences from the authors' (the same config, so the same weights
    folder whichever way it is asked for)."""
    from neusight_core.predictors.registry import hparams
    paper, ours = hparams("neusight-paper"), hparams("neusight")
    diff = {k: v for k, v in ours.items() if paper.get(k) != v}
    return {"paper": ("authors' recipe (neusight-paper)", "neusight-paper", None),
            "align": ("+ those kernels + alignment input (not adopted)", "neusight-paper",
                      {"extra_training": "seen_test", "inputs": paper["inputs"] + ["alignment"]}),
            "ours": ("ours (neusight)", "neusight-paper", diff)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    ap.add_argument("--candidates", default="paper,ours", help="any of paper, align, ours")
    ap.add_argument("--drop-gpu", default=None, help="leave this training GPU out (catalogue name)")
    ap.add_argument("--holdout", type=float, default=0.3, help="share of the distinct test shapes held out")
    ap.add_argument("--quick", action="store_true", help="the quick predictors (a smoke test)")
    ap.add_argument("--csv", default=None, help="also write the per-GPU rows here")
    a = ap.parse_args(argv)
    import pandas as pd

    from neusight_core import predictors as P
    from neusight_core.studies import recipe_studies as S
    pd.set_option("display.width", 200)
    seeds = [int(s) for s in a.seeds.split(",")]
    cands = [candidates()[c] for c in a.candidates.split(",")]
    jobs = [(recipe, a.quick, s, S.holdout_overrides(recipe, over, a.holdout, a.drop_gpu), None)
            for _, recipe, over in cands for s in seeds]
    P.train_parallel(jobs)
    per = S.shape_holdout_check(cands, seeds, a.holdout, a.quick, a.drop_gpu)
    if a.csv:
        per.to_csv(a.csv, index=False)
    print(f"held-out shapes ({a.holdout:.0%} of the distinct test shapes; training GPUs"
          f"{'' if not a.drop_gpu else ', ' + a.drop_gpu + ' left out of training'}), seeds {seeds}")
    print("\ntime-weighted MAPE (%), mean over GPUs; mean (min-max) over seeds")
    print(S.shape_holdout_summary(per, "wmape").to_string())
    print("\nMAPE (%)")
    print(S.shape_holdout_summary(per, "mape").to_string())
    print("\nper GPU, time-weighted MAPE (%), mean over seeds")
    print(per.pivot_table(index=["op_class", "device"], columns="candidate", values="wmape").round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
