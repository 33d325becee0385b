"""Hyper-parameter selection on the training GPUs' kernels only.

Two validation schemes, both inside the five training GPUs' records (``train/collect``):

* ``random``: a random 10 % of the records held out (in-distribution error);
* ``logo`` (leave one GPU out): train on four training GPUs, validate on the fifth one's records,
  for each of the five; this imitates predicting an unseen GPU without touching one.

The unseen GPUs (H100, L4, A100-80GB) and the kernel test sets are never used here. The chosen
configuration and the table it was chosen from are kept in ``predictors/hparams.yaml``.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from neusight_core import dataset, report
from neusight_core.dataset import TrainingData


def _subset(train: TrainingData, mask: np.ndarray) -> TrainingData:
    k = train.kernels[mask].reset_index(drop=True)
    return TrainingData(k, train.checksum, tuple(sorted(k["device"].unique())))


def logo_scores(make_predictor, train: TrainingData, classes, folds=None) -> pd.DataFrame:
    """Validation MAPE per held-out training GPU and class for one predictor configuration."""
    k = train.kernels[train.kernels["op_class"].isin(classes)].reset_index(drop=True)
    train = TrainingData(k, train.checksum, train.devices)
    rows = []
    for held in folds or train.devices:
        p = make_predictor()
        p.fit(_subset(train, (k["device"] != held).to_numpy()))
        val = k[k["device"] == held].reset_index(drop=True)
        # the held-out GPU is predicted as an unseen GPU: its tiles come from the lookup
        pred = p.predict(val.drop(columns=["tile_m", "tile_k", "tile"]), held)
        ape = report.ape(val["latency_ms"], pred)
        for cls, a in pd.Series(ape).groupby(val["op_class"].to_numpy()):
            rows.append({"held_out": held, "op_class": cls, "mape": float(a.mean())})
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
            out.append({**cfg, "op_class": cls, "logo_mape": g["mape"].mean(),
                        **{f"held_{h}": m for h, m in zip(g["held_out"], g["mape"])}})
    return pd.DataFrame(out)
