"""Hyper-parameter selection on the training GPUs' kernels only.

Two validation schemes, both inside the five training GPUs' records (``train/collect``):

* ``random``: a random 10 % of the records held out (in-distribution error);
* ``logo`` (leave one GPU out): train on four training GPUs, validate on the fifth one's records,
  for each of the five; this imitates predicting an unseen GPU without touching one.

The unseen GPUs (H100, L4, A100-80GB) and the kernel test sets are never used here. The chosen
configuration and the table it was chosen from are kept in ``docs/search_log_logo.yaml``.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from neusight_core.data import dataset
from neusight_core.studies import error_metric
from neusight_core.data.dataset import TrainingData


def _subset(train: TrainingData, mask: np.ndarray) -> TrainingData:
    k = train.kernels[mask].reset_index(drop=True)
    return TrainingData(k, train.checksum, tuple(sorted(k["device"].unique())))


def logo_scores(make_predictor, train: TrainingData, classes, folds=None) -> pd.DataFrame:
    """Validation MAPE per held-out training GPU and class for one predictor configuration."""
    from neusight_core import predictors as P
    k = train.kernels[train.kernels["op_class"].isin(classes)].reset_index(drop=True)
    train = TrainingData(k, train.checksum, train.devices)
    rows = []
    for held in folds or train.devices:
        p = make_predictor()
        p.fit(P.data_for(p, _subset(train, (k["device"] != held).to_numpy())))
        val = k[k["device"] == held].reset_index(drop=True)
        # the held-out GPU is predicted as an unseen GPU: its tiles come from the lookup
        pred = p.predict(val.drop(columns=["tile_m", "tile_k", "tile"]), held)
        ape = error_metric.ape(val["latency_ms"], pred)
        y = val["latency_ms"].to_numpy(float)
        for cls, idx in pd.Series(np.arange(len(val))).groupby(val["op_class"].to_numpy()):
            i = idx.to_numpy()
            # wmape: APE weighted by the measured time, i.e. the relative error of the summed time of
            # these kernels -- what matters when a model's time is dominated by its large kernels
            rows.append({"held_out": held, "op_class": cls, "mape": float(ape[i].mean()),
                         "wmape": float((ape[i] * y[i]).sum() / y[i].sum())})
    return pd.DataFrame(rows)


def grid_search(make, grid: dict, classes, folds=None, quick: bool = False) -> pd.DataFrame:
    """LOGO MAPE (mean over folds) for every combination in ``grid`` (dict of lists)."""
    train = dataset.training_data(quick=quick)
    keys = list(grid)
    out = []
    combos = list(itertools.product(*grid.values()))
    for combo in tqdm(combos, desc="grid search", unit="config"):
        cfg = dict(zip(keys, combo))
        s = logo_scores(lambda: make(cfg), train, classes, folds)
        for cls, g in s.groupby("op_class"):
            out.append({**cfg, "op_class": cls, "logo_mape": g["mape"].mean(), "logo_wmape": g["wmape"].mean(),
                        **{f"held_{h}": m for h, m in zip(g["held_out"], g["mape"])}})
    return pd.DataFrame(out)


def main(argv=None) -> int:
    """``python -m neusight_core.studies.hyperparameter_search --base neusight --classes BMM LINEAR --seeds 0 1
    --try '{"hidden": 64}' '{"layers": 4}'``: LOGO scores of each override of a recipe (training GPUs
    only), one line per (override, seed, class), for the search log (docs/search_log_logo.yaml)."""
    import argparse
    import json

    from neusight_core import predictors as P
    ap = argparse.ArgumentParser(prog="python -m neusight_core.studies.hyperparameter_search")
    ap.add_argument("--base", default="neusight-logo", help="recipe the overrides start from")
    ap.add_argument("--classes", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--try", dest="tries", nargs="+", default=["{}"], help="JSON config overrides")
    ap.add_argument("--random", action="store_true",
                    help="also train on all five GPUs and report the random-split validation MAPE")
    a = ap.parse_args(argv)
    train = dataset.training_data()
    sub = TrainingData(train.kernels[train.kernels["op_class"].isin(a.classes)].reset_index(drop=True),
                       train.checksum, train.devices)
    for t in a.tries:
        over = json.loads(t)
        for seed in a.seeds:
            if a.random:
                p = P.create(a.base, seed, over)
                p.fit(P.data_for(p, sub))
                for cls, i in p.info["classes"].items():
                    print(f"{a.base} {t} seed={seed} {cls}: random_val_mape={i['val_mape']:.1f} "
                          f"random_val_wmape={i['val_wmape']:.1f} train_s={p.info['train_seconds']:.0f}", flush=True)
            s = logo_scores(lambda: P.create(a.base, seed, over), train, a.classes)
            for cls, g in s.groupby("op_class"):
                held = " ".join(f"{h.split('_')[-1][:9]}={m:.1f}" for h, m in zip(g["held_out"], g["mape"]))
                print(f"{a.base} {t} seed={seed} {cls}: logo_mape={g['mape'].mean():.1f} "
                      f"logo_wmape={g['wmape'].mean():.1f} | {held}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
