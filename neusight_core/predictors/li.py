"""Li et al. baseline (MICRO'23, ``micro`` in the release; SPEC 3.2).

Per training GPU and op class a straight line: latency = a x FLOPs + b (GEMMs and convolutions) or
a x bytes + b (vector ops), fitted by least squares on the relative error (each record weighted by 1 / latency,
so that small kernels count as much as large ones, as the APE metric does). For a GPU outside the
training set, 1/a (an effective throughput) is regressed linearly on memory bandwidth across the
training GPUs and b = 0.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.question import schema
import neusight_core.predictors.common as common
from neusight_core.predictors.base import KernelPredictor, Timer


def _x(kernels: pd.DataFrame) -> np.ndarray:
    gemm = kernels["op_class"].isin(schema.IGEMM_CLASSES).to_numpy()     # GEMMs and convolutions: FLOPs
    return np.where(gemm, kernels["flops"].fillna(0).to_numpy(float), common.total_bytes(kernels))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising sum(((a x + b - y) / y)^2) with a > 0 and b >= 0."""
    A = np.stack([x / y, 1.0 / y], 1)
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    if b < 0 or a <= 0:
        a = float(np.sum(x / y) / np.sum((x / y) ** 2))
        b = 0.0
    return float(max(a, 1e-30)), float(b)


class LiPredictor(KernelPredictor):
    name = "li"

    def __init__(self, config=None, seed=0, name=None):
        super().__init__(config, seed, name)
        self.lines: dict = {}        # cls -> {device: (a, b)}
        self.bw_fit: dict = {}       # cls -> (c0, c1): 1/a = c0 + c1 * bandwidth

    def fit(self, train, quick: bool = False) -> None:
        from tqdm.auto import tqdm
        k = train.kernels
        classes = [c for c in common.PREDICTED_CLASSES if (k["op_class"] == c).any()]
        with Timer() as t:
            for cls in tqdm(classes, desc=f"train {self.name}", unit="class"):
                df = k[k["op_class"] == cls]
                self.lines[cls] = {}
                for dev_name, g in df.groupby("device"):
                    self.lines[cls][dev_name] = fit_line(_x(g), g["latency_ms"].to_numpy(float))
                bw = np.array([devices.get_device(d).mem_bw_gbs for d in self.lines[cls]])
                inv_a = np.array([1.0 / ab[0] for ab in self.lines[cls].values()])
                c1, c0 = np.polyfit(bw, inv_a, 1)
                self.bw_fit[cls] = (float(c0), float(c1), float(inv_a.min()))
        self.info = {"data_checksum": train.checksum, "quick": quick, "train_seconds": t.seconds,
                     "lines": {c: {d: list(ab) for d, ab in v.items()} for c, v in self.lines.items()}}
        self.fitted = True

    def line(self, cls: str, device) -> tuple[float, float]:
        dev = devices.get_device(device)
        if dev.name in self.lines[cls]:
            return self.lines[cls][dev.name]
        c0, c1, floor = self.bw_fit[cls]
        # a straight line in bandwidth can cross zero far outside the training range: keep 1/a positive
        inv_a = max(c0 + c1 * dev.mem_bw_gbs, floor * 1e-3)
        return 1.0 / inv_a, 0.0

    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        out = common.roofline_ms(kernels, dev)
        x = _x(kernels)
        cls_col = kernels["op_class"].to_numpy()
        for cls in self.lines:
            rows = cls_col == cls
            if rows.any():
                a, b = self.line(cls, device)
                out[rows] = a * x[rows] + b
        return np.maximum(out, 1e-9)

    def get_state(self) -> dict:
        return {"lines": {c: {d: list(ab) for d, ab in v.items()} for c, v in self.lines.items()},
                "bw_fit": {c: list(v) for c, v in self.bw_fit.items()}}

    def set_state(self, state: dict) -> None:
        self.lines = {c: {d: tuple(ab) for d, ab in v.items()} for c, v in state["lines"].items()}
        self.bw_fit = {c: tuple(v) for c, v in state["bw_fit"].items()}
