"""Notebook 07, section 5c: BF16 memory-bound kernels, measured by NVIDIA, against the memory law.

The rows: ``measured_kernels.load_quantize`` (BF16 -> FP8 element-wise kernels; training GPUs H100 SXM, H200 SXM,
L40S, and the held-out B200 and GB200, reported only). The predictions, each with the engine's BF16 kernel floor
(``kernel_floor``) as every BF16 answer has it:

- ``law, GPU left out``: ``memory_law`` fitted on the other training GPUs (training GPUs only; how the law's L2
  threshold was chosen, docs/search_bf16.jsonl tag ``i33-memory-law``);
- ``law``: the law as ``neusight`` uses it (fitted on all three training GPUs);
- ``FP32 networks``: ``neusight``'s answer before the law (``predict_extrapolated``: the FP32 networks on the
  byte-equivalent FP32 kernel), per seed;
- ``roofline``: bytes over the bandwidth (its FLOPs are negligible).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

import neusight_core.predictors.common as common
import neusight_core.predictors.memory_law as memory_law
from neusight_core import predictors as P
from neusight_core.cost import kernel_floor
from neusight_core.data import measured_kernels

LAW_COMPARISON = ("law, GPU left out", "law", "FP32 networks", "roofline")


def rows() -> pd.DataFrame:
    """The measured kernels of the training and held-out GPUs (column ``role``)."""
    return pd.concat([measured_kernels.load_quantize("training"), measured_kernels.load_quantize("held_out")],
                     ignore_index=True)


def floored(ms) -> np.ndarray:
    """Per-launch ms with the engine's BF16 floor of element-wise kernels, as every BF16 answer has it."""
    return np.maximum(np.asarray(ms, float), kernel_floor.floor_ms(memory_bound=True))


def left_out_ms(train: pd.DataFrame, kernels: pd.DataFrame, device: str, l2_share: float = memory_law.L2_SHARE,
                law=memory_law.law_s) -> np.ndarray:
    """ms of ``kernels`` on ``device`` by ``law`` fitted on ``train``'s other GPUs (leave that GPU out)."""
    p = memory_law.fit(train[train["device"] != device], l2_share, law)
    bw, sm, l2 = memory_law.device_rates(kernels, device)
    return law(common.total_bytes(kernels), bw, sm, l2, p["t0_us"] * 1e-6, p["eta"], p["beta"], l2_share) * 1e3


def predict_all(kernels: pd.DataFrame, seeds=(0,), quick: bool = False) -> pd.DataFrame:
    """One row per kernel x compared predictor (x seed for the FP32 networks): ``device``, ``role``, ``bytes``,
    ``measured_ms``, ``predictor``, ``seed``, ``predicted_ms``, ``ape`` (%)."""
    from neusight_core import predictors
    train = kernels[kernels["role"] == "training"]
    out = []
    for dev, k in kernels.groupby("device", sort=True):
        k = k.reset_index(drop=True)
        moved = common.total_bytes(k)
        preds = [("law", 0, memory_law.time_ms(k, dev, P.memory_law_params())),
                 ("roofline", 0, common.roofline_ms(k, common.device_arrays(k, dev)))]
        if k["role"].iloc[0] == "training":
            preds.append(("law, GPU left out", 0, left_out_ms(train, k, dev)))
        for s in seeds:
            preds.append(("FP32 networks", s, predictors.get("neusight", quick=quick, seed=s).predict_extrapolated(k, dev)))
        meas = k["latency_ms"].to_numpy(float)
        for name, seed, ms in preds:
            ms = floored(ms)
            out.append(pd.DataFrame({"device": dev, "role": k["role"].iloc[0], "bytes": moved, "measured_ms": meas,
                                     "predictor": name, "seed": seed, "predicted_ms": ms,
                                     "ape": np.abs(ms / meas - 1) * 100}))
    return pd.concat(out, ignore_index=True)


def table(long: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (rows, with its role) x predictor: MAPE %, mean over seeds, and its spread (max - min)."""
    per = long.groupby(["role", "device", "predictor", "seed"])["ape"].mean()
    g = per.groupby(["role", "device", "predictor"])
    t = pd.DataFrame({"mape": g.mean(), "spread": g.max() - g.min()}).reset_index()
    wide = t.pivot_table(index=["role", "device"], columns="predictor", values="mape")
    wide = wide[[c for c in LAW_COMPARISON if c in wide.columns]]
    wide["FP32 networks spread"] = t[t.predictor == "FP32 networks"].set_index(["role", "device"])["spread"]
    return wide.sort_index(ascending=[False, True]).reset_index()
