"""Roofline baseline (SPEC 3.2): FLOPs / min(peak, intensity x bandwidth) for every modelled kernel,
which is bytes / bandwidth for the (memory-bound) vector ops. Nothing to train."""
from __future__ import annotations

import numpy as np
import pandas as pd

import neusight_core.predictors.common as common
from neusight_core.predictors.base import ANSWER_COMM, ANSWER_ROOFLINE, KernelPredictor
from neusight_core.question.schema import OpClass


class RooflinePredictor(KernelPredictor):
    name = "roofline"
    has_weights = False

    def fit(self, train=None, quick: bool = False) -> None:
        self.info = {"data_checksum": getattr(train, "checksum", None), "quick": quick, "train_seconds": 0.0}
        self.fitted = True

    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        return common.roofline_ms(kernels, dev)

    def answered_by(self, kernels: pd.DataFrame) -> np.ndarray:
        """Every row by the roofline, COMM rows by the network model."""
        return np.where(kernels["op_class"].to_numpy() == OpClass.COMM, ANSWER_COMM, ANSWER_ROOFLINE).astype(object)
