"""NeuSight's inputs and output form (SPEC 3.1), shared by the FP32 networks (``neusight.py``) and the
tensor-core networks (``tensor_core.py``): the log2 per-SM features of a kernel's tiles and waves, and the
utilisation an MLP's outputs stand for. (Its own module so that both import it and neither imports the other.)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.question import schema
import neusight_core.predictors.common as common

U_MIN = 1e-6
# implicit-GEMM tile (M x K) of every convolution when the recipe names none: of the two most frequent AxB
# in the names of the release's conv kernels (128x128 in 11,179 of 24,662 records, 128x64 in 5,725), the one
# under whose wave roofline (with ``conv_winograd`` 4) no training record runs faster (search c0)
CONV_TILE = (128, 64)


FEATURE_NAMES = ("tile_flops_per_sm_peak", "tile_bytes_per_sm_bw", "wave_bytes_per_sm_l2",
                 "wave_bytes_per_sm_mem", "tile_intensity_per_ridge", "waves", "wave_bytes_per_sm_bw",
                 "alignment")
# Our recipe's extra input: the largest power of two (capped at ALIGN_CAP) dividing every dim of the
# kernel (GEMM: M, N, K; vector ops: H). cuBLAS and the element-wise kernels switch to vectorised
# (float4) variants when the dims allow: the release's raw GEMM measurements have random dims (P4: 0.5-1.3
# TFLOPS, maxwell_sgemm_64x64) while transformer shapes are multiples of 64 (P4: ~2.3 TFLOPS,
# sgemm_128x128x8_NT_vec), and the other inputs cannot tell the two apart (docs/recipes.md).
ALIGN_CAP = 16


def alignment(kernels: pd.DataFrame) -> np.ndarray:
    """min over the dims of (largest power of two dividing the dim), capped at ALIGN_CAP; >= 1."""
    gemm = kernels["op_class"].isin(schema.GEMM_CLASSES).to_numpy()
    out = np.full(len(kernels), float(ALIGN_CAP))
    for c in ("M", "N", "K", "H"):
        x = kernels[c].to_numpy(float)
        use = (gemm if c != "H" else ~gemm) & np.isfinite(x) & (x >= 1)
        xi = np.where(use, x, 1).astype(np.int64)
        low = (xi & -xi).astype(float)
        out = np.where(use, np.minimum(out, low), out)
    return np.minimum(out, ALIGN_CAP)
# Shape inputs (CONV): the kernel's own dims, where the per-SM ratios above cannot tell cuDNN's
# algorithms apart (which of implicit GEMM, Winograd or FFT runs, and how well, follows the image size and the
# channels: search c2 in docs/search_conv.jsonl). gemm_m / gemm_n / gemm_k: the (implicit) GEMM's M, N, K;
# conv_size: the input height; batch: B.
SHAPE_FEATURES = {"gemm_m": "M", "gemm_n": "N", "gemm_k": "K", "conv_size": "conv_in", "batch": "B"}


def shape_feature(kernels: pd.DataFrame, name: str) -> np.ndarray:
    """One of ``SHAPE_FEATURES`` (before the log2 of ``features``), at least 1."""
    col = SHAPE_FEATURES[name]
    x = kernels[col].to_numpy(float) if col in kernels else np.ones(len(kernels))
    return np.maximum(np.nan_to_num(x, nan=1.0), 1.0)


# The authors' inputs (neusight/Model/mlp_wave.py 212, 249) are the same ratios in other units: tile
# GFLOP / (TFLOPS per SM) = ours x 1e3, tile MB / (GB/s per SM) = ours x 1e9 / 2^20, waves x MB /
# (device MB per SM) = ours, waves x MB / (L2 KB per SM) = ours / 2^10. Without z-scoring these
# constant factors shift the MLP's inputs, so the paper recipe reproduces them.
AUTHORS_UNITS = {"tile_flops_per_sm_peak": 1e3, "tile_bytes_per_sm_bw": 1e9 / 2**20,
                 "wave_bytes_per_sm_mem": 1.0, "wave_bytes_per_sm_l2": 2.0**-10}


def features(kernels: pd.DataFrame, dev: dict, geo: dict, inputs=FEATURE_NAMES, units: str = "ours") -> np.ndarray:
    """The log2 MLP inputs of every row (see module docstring), the columns named in ``inputs``."""
    num_sm = dev["num_sm"]
    peak_sm = common.peak_gflops(kernels, dev) * 1e9 / num_sm
    bw_sm = dev["mem_bw_gbs"] * 1e9 / num_sm
    l2_sm = dev["l2_mb"] * 2**20 / num_sm
    mem_sm = dev["mem_gb"] * 2**30 / num_sm
    tf = np.maximum(geo["tile_flops"], 1.0)
    tb = np.maximum(geo["tile_bytes"], 1.0)
    w = geo["waves"]
    align = alignment(kernels) if "alignment" in inputs else np.ones(len(kernels))
    f = np.stack([tf / peak_sm, tb / bw_sm, w * tb / l2_sm, w * tb / mem_sm,
                  (tf / tb) / (peak_sm / bw_sm), w, w * tb / bw_sm, align], axis=1)
    cols = {name: f[:, i] for i, name in enumerate(FEATURE_NAMES)}
    cols.update({name: shape_feature(kernels, name) for name in inputs if name in SHAPE_FEATURES})
    f = np.stack([cols[i] for i in inputs], axis=1)
    if units == "authors":
        f = f * np.array([AUTHORS_UNITS.get(i, 1.0) for i in inputs])
    return np.log2(f)


def utilisation(out, waves, form: str = "ours", clamp_u: bool = True):
    """ours: u = sigmoid(g) * (1 - sigmoid(a) / waves), in (0, 1).
    authors: u = sigmoid(o2) - sigmoid(o0) / waves (neusight/Model/mlp_wave.py 253-259), which can reach
    zero or below; it is held at U_MIN so that a prediction stays finite and positive. ``clamp_u=False``
    (training the authors' form): unbounded, as their training runs it (mlp_wave.py 259, 317): a row
    whose u is below zero still has a gradient, where a clamp would freeze it; only |u| < U_MIN is moved
    to +-U_MIN (an exact 0 is an infinite time).
    ``out`` and ``waves`` are torch tensors (training) or numpy arrays (prediction)."""
    if isinstance(out, np.ndarray):
        def sig(x):
            with np.errstate(over="ignore"):        # exp overflow -> inf -> sigmoid 0, as in torch
                return 1.0 / (1.0 + np.exp(-x))

        def clamp(u):
            return np.clip(u, U_MIN, 1.0)
    else:
        import torch
        sig = torch.sigmoid

        def clamp(u):
            return u.clamp(min=U_MIN, max=1.0)
    if form == "authors":
        u = sig(out[:, 2]) - sig(out[:, 0]) / waves
        if clamp_u:
            return clamp(u)
        # unclamped, but never within U_MIN of zero: both sigmoids saturate to exactly 1.0 in float32 and
        # u = 1 - 1/1 = 0 gives an infinite time and a NaN loss (LINEAR, learning rate 5e-3, epoch 1)
        if isinstance(u, np.ndarray):
            return np.where(u >= 0, np.maximum(u, U_MIN), np.minimum(u, -U_MIN))
        import torch
        return torch.where(u >= 0, u.clamp(min=U_MIN), u.clamp(max=-U_MIN))
    return clamp(sig(out[:, 0]) * (1 - sig(out[:, 1]) / waves))
