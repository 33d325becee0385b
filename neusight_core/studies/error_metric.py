"""The error every study reports: the absolute percentage error of a prediction against its measurement
(SPEC section 2), and its mean."""
from __future__ import annotations

import numpy as np


def ape(measured, predicted, nonpositive: str = "raise"):
    """Absolute percentage error, |measured - predicted| / measured x 100 (SPEC section 2).

    A measured value <= 0 has no relative error: ``nonpositive="raise"`` (default) raises,
    ``"nan"`` gives NaN there (tables where a class can be absent, e.g. per-op sums of 0)."""
    m = np.asarray(measured, dtype=float)
    p = np.asarray(predicted, dtype=float)
    if nonpositive == "raise":
        if np.any(m <= 0):
            raise ValueError("measured latency must be positive to compute an APE")
        return np.abs(m - p) / m * 100.0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.abs(m - p) / m * 100.0
    return np.where(m > 0, out, np.nan)


def mape(measured, predicted) -> float:
    """Plain mean of the APEs; NaN pairs (missing prediction or label) are dropped."""
    m = np.asarray(measured, dtype=float)
    p = np.asarray(predicted, dtype=float)
    ok = ~(np.isnan(m) | np.isnan(p))
    if not ok.any():
        return float("nan")
    return float(np.mean(ape(m[ok], p[ok])))
