"""Our NeuSight recipe as a seed ensemble: members of another recipe trained on several seeds, each
kernel predicted as the mean of the members' latencies (``recipes/neusight.yaml``).

The members are ordinary trained predictors (``predictors.get(of, seed=k)``); the ensemble has no
weights of its own, so ``predictors.get`` builds it from them and never saves it. One model: its
``seed`` is not used (notebooks report it once, like the seedless baselines).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.predictors.base import KernelPredictor, hparams, without_attrs


class SeedEnsemblePredictor(KernelPredictor):
    name = "neusight"

    @classmethod
    def default_config(cls) -> dict:
        return hparams(cls.name)

    def __init__(self, config=None, seed=0):
        super().__init__(config, seed)
        self.members: list[KernelPredictor] = []

    @classmethod
    def from_members(cls, members: list[KernelPredictor], config: dict | None = None) -> "SeedEnsemblePredictor":
        p = cls(config)
        p.members = list(members)
        p.fitted = True
        p.info = {"members": [f"{m.name} seed {m.seed}" for m in members],
                  "data_checksum": members[0].info.get("data_checksum") if members else None,
                  # training time of the ensemble = the members' (trained once, shared with their recipe)
                  # (no validation error of its own: each member has its own random split;
                  # recipe_eval.held_out_ensemble_check scores it on the records every member held out)
                  "train_seconds": float(sum(m.info.get("train_seconds") or 0.0 for m in members))}
        return p

    def fit(self, train, quick: bool = False) -> None:
        raise RuntimeError("the seed ensemble is built from its trained members: use predictors.get('neusight')")

    def predict(self, kernels: pd.DataFrame, device) -> np.ndarray:
        if not self.members:
            raise RuntimeError("predictor 'neusight' has no members: use predictors.get('neusight')")
        kernels = without_attrs(kernels)      # once, not once per member
        return np.mean([m.predict(kernels, device) for m in self.members], axis=0)

    def utilisation(self, kernels: pd.DataFrame, device) -> np.ndarray:
        """Mean of the members' u (for tests and plots; the prediction averages latencies)."""
        return np.mean([m.utilisation(kernels, device) for m in self.members], axis=0)

    @property
    def tiles(self):
        """The members' tile lookup (all fitted on the same filtered records, so identical)."""
        return self.members[0].tiles

    def save(self, folder):
        raise RuntimeError("the seed ensemble is not saved: its members are")
