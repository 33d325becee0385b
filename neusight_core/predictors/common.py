"""Arithmetic every predictor shares: per-row device numbers, roofline, tiles and waves (SPEC 3.1).

Units: FLOPs and bytes as counts, device peaks in GFLOPS and GB/s (decimal, as in the release's
device JSONs), latencies in ms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.question import schema
from neusight_core.question.schema import OpClass, Precision

# classes that run on the GEMM units and so take the GEMM (tensor-core) peak at tf32 / fp16 / bf16: the GEMMs,
# CONV (cuDNN's implicit GEMM) and fused attention (its two GEMMs, QK^T and PV, dominate)
PEAK_GEMM_CLASSES = schema.op_classes(lambda c: c.on_matrix_units)
VECTOR_CLASSES = schema.op_classes(lambda c: c.is_vector)
MODEL_CLASSES = schema.GEMM_CLASSES + VECTOR_CLASSES
# convolutions: tiles and waves of their implicit GEMM, whose M already includes the batch
CONV_CLASSES = (OpClass.CONV,)
PREDICTED_CLASSES = MODEL_CLASSES + CONV_CLASSES   # every class a predictor models (the others: memory-bound)
MEMORY_CLASSES = schema.op_classes(lambda c: c.is_memory)
ROW_TILE_CLASSES = schema.op_classes(lambda c: c.is_row_tiled)   # one row (H elements) per tile
MIN_BYTES = 4.0                                # a kernel moves at least one FP32 element


class PredictorInputError(ValueError):
    """A kernel table a predictor cannot use (one line naming the problem)."""


def check_kernels(kernels: pd.DataFrame) -> None:
    need = {"op_class", "B", "M", "N", "K", "H", "flops", "bytes_read", "bytes_written"}
    missing = need - set(kernels.columns)
    if missing:
        raise PredictorInputError(f"kernel table lacks column(s) {', '.join(sorted(missing))} "
                                  "(see docs/interfaces.md, kernel table)")


#: the catalogue's figures ``device_arrays`` gives per row
DEVICE_FIELDS = ("num_sm", "fp32_gflops", "fp32_vec_gflops", "mem_bw_gbs", "mem_gb", "l2_mb", "freq_mhz")


def device_arrays(kernels: pd.DataFrame, device=None) -> dict:
    """Device numbers per row: from ``device`` (one GPU) or from the table's ``device`` column."""
    n = len(kernels)
    if device is not None:
        d = devices.get_device(device)
        out = {c: np.full(n, float(getattr(d, c))) for c in DEVICE_FIELDS}
        out.update({f"{p}_gemm_gflops": np.full(n, d.gemm_peak_gflops(p)) for p in schema.TENSOR_PRECISIONS})
        return out
    if "device" not in kernels:
        raise PredictorInputError("no device given and the kernel table has no 'device' column")
    devs = {name: devices.get_device(name) for name in kernels["device"].unique()}
    out = {c: kernels["device"].map({k: float(getattr(d, c)) for k, d in devs.items()}).to_numpy(float)
           for c in DEVICE_FIELDS}
    out.update({f"{p}_gemm_gflops": kernels["device"].map({k: d.gemm_peak_gflops(p) for k, d in devs.items()})
                .to_numpy(float) for p in schema.TENSOR_PRECISIONS})
    return out


def total_bytes(kernels: pd.DataFrame) -> np.ndarray:
    b = (kernels["bytes_read"].fillna(0) + kernels["bytes_written"].fillna(0)).to_numpy(float)
    return np.maximum(b, MIN_BYTES)


def peak_gflops(kernels: pd.DataFrame, dev: dict) -> np.ndarray:
    """GEMM peak for GEMMs, vector peak otherwise (they differ on AMD only).

    Precision: a GEMM row whose ``precision`` column is tf32/fp16/bf16 gets the device's
    dense tensor-core peak of that precision (``<p>_gemm_gflops`` of ``device_arrays``; the FP32
    peak on GPUs without such tensor cores). Without the column, or for fp32 rows, nothing changes."""
    gemm = kernels["op_class"].isin(PEAK_GEMM_CLASSES).to_numpy()
    peak = np.where(gemm, dev["fp32_gflops"], dev["fp32_vec_gflops"])
    if "precision" in kernels.columns:
        prec = kernels["precision"].to_numpy()
        for p in schema.TENSOR_PRECISIONS:
            sel = gemm & (prec == p)
            if sel.any():
                peak = np.where(sel, dev.get(f"{p}_gemm_gflops", dev["fp32_gflops"]), peak)
    return peak


def row_element_bytes(kernels: pd.DataFrame) -> np.ndarray:
    """Bytes per element of each row: 2 for fp16/bf16 rows (``precision`` column), 1 for fp8, else 4 (FP32)."""
    if "precision" not in kernels.columns:
        return np.full(len(kernels), 4.0)
    return kernels["precision"].map(schema.ELEMENT_BYTES).fillna(4).to_numpy(float)


#: Memory-bound classes whose FP16 / BF16 rows are predicted as their byte-equivalent FP32 kernel.
HALF_AS_FP32 = schema.op_classes(lambda c: c.is_vector)


def half_as_fp32(kernels: pd.DataFrame) -> pd.DataFrame:
    """FP16 / BF16 element-wise, softmax and normalisation rows as the FP32 kernel that moves the same bytes
    (half the elements: half the rows, or half the row length for a single row; half the FLOPs), for FP32-trained
    networks. Such a kernel is memory-bound: its time follows the bytes it moves, not the type of its elements,
    and the networks never saw 2-byte elements (the release measures FP32 only). An extrapolation: no BF16 kernel
    of these classes was measured on a training GPU."""
    if "precision" not in kernels.columns or "op_class" not in kernels.columns:
        return kernels
    rows = (kernels["precision"].isin(schema.HALF_PRECISIONS).to_numpy()
            & kernels["op_class"].isin(HALF_AS_FP32).to_numpy())
    if not rows.any():
        return kernels
    out = kernels.copy()
    B = out.loc[rows, "B"].fillna(1).to_numpy(float)
    H = out.loc[rows, "H"].fillna(1).to_numpy(float)
    out.loc[rows, "B"] = np.where(B >= 2, np.ceil(B / 2), B)
    out.loc[rows, "H"] = np.where(B >= 2, H, np.ceil(H / 2))
    out.loc[rows, "flops"] = out.loc[rows, "flops"].to_numpy(float) / 2
    out.loc[rows, "precision"] = Precision.FP32
    return out


def memory_ms(kernels: pd.DataFrame, dev: dict) -> np.ndarray:
    """Bytes / bandwidth: the memory-bound model of MEM and UNCLASSIFIED kernels."""
    return total_bytes(kernels) / (dev["mem_bw_gbs"] * 1e9) * 1e3


def roofline_ms(kernels: pd.DataFrame, dev: dict) -> np.ndarray:
    """max(FLOPs / peak, bytes / bandwidth) = FLOPs / min(peak, intensity x bandwidth)."""
    flops = kernels["flops"].fillna(0).to_numpy(float)
    return np.maximum(flops / (peak_gflops(kernels, dev) * 1e9), total_bytes(kernels) / (dev["mem_bw_gbs"] * 1e9)) * 1e3


def elements(kernels: pd.DataFrame) -> np.ndarray:
    """Output elements of vector kernels (B rows x H), else bytes written / 4."""
    e = (kernels["B"] * kernels["H"]).to_numpy(float)
    alt = kernels["bytes_written"].fillna(0).to_numpy(float) / 4.0
    return np.maximum(np.where(np.isfinite(e) & (e > 0), e, alt), 1.0)


def geometry(kernels: pd.DataFrame, dev: dict, tile_m, tile_k, tile) -> dict:
    """Tiles, waves and per-tile work of every row (SPEC 3.1), for the given tile sizes.

    GEMM (B, M, N, K), output M x K cut into tile_m x tile_k tiles, each over the whole reduction N:
      tiles = B * ceil(M / tile_m) * ceil(K / tile_k); tile FLOPs = 2 tile_m N tile_k;
      tile bytes = 4 (tile_m N + N tile_k + tile_m tile_k) (2 instead of 4 for fp16/bf16 rows).
      Convolutions (CONV) the same over their implicit GEMM, with B = 1 (M counts the batch).
    Vector ops: element-wise kernels cut the flat B*H outputs into tiles of ``tile`` elements;
      softmax / layernorm one row per tile (tile = H). Tile FLOPs and bytes are the kernel's per-output
      FLOPs and bytes times the tile.
    waves = ceil(tiles / num_SM). ``padded_flops`` = tiles x tile FLOPs >= the kernel's FLOPs.
    """
    cls = kernels["op_class"].to_numpy()
    gemm = np.isin(cls, schema.IGEMM_CLASSES)
    rows = np.isin(cls, ROW_TILE_CLASSES)
    # a convolution's implicit-GEMM M is batch x output pixels already: its B does not multiply the tiles
    B = np.where(np.isin(cls, CONV_CLASSES), 1.0, np.maximum(kernels["B"].fillna(1).to_numpy(float), 1.0))
    M, N, K, H = (np.maximum(kernels[c].fillna(1).to_numpy(float), 1.0) for c in ("M", "N", "K", "H"))
    tile_m, tile_k, tile = (np.asarray(x, float) for x in (tile_m, tile_k, tile))
    num_sm = dev["num_sm"]
    E = elements(kernels)
    flops = kernels["flops"].fillna(0).to_numpy(float)
    byts = total_bytes(kernels)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_vec = np.where(rows, H, np.maximum(tile, 1.0))
        g_tiles = B * np.ceil(M / tile_m) * np.ceil(K / tile_k)
        v_tiles = np.where(rows, np.maximum(np.round(E / H), 1.0), np.ceil(E / t_vec))
        tiles = np.where(gemm, g_tiles, v_tiles)
        g_tile_flops = 2.0 * tile_m * N * tile_k
        g_tile_bytes = row_element_bytes(kernels) * (tile_m * N + N * tile_k + tile_m * tile_k)
        v_tile_flops = flops / E * t_vec
        v_tile_bytes = byts / E * t_vec
    tile_flops = np.where(gemm, g_tile_flops, v_tile_flops)
    tile_bytes = np.where(gemm, g_tile_bytes, v_tile_bytes)
    waves = np.ceil(tiles / num_sm)
    return {"tiles": tiles, "waves": waves, "tile_flops": tile_flops, "tile_bytes": tile_bytes,
            "padded_flops": tiles * tile_flops, "bytes": byts, "flops": flops}


def wave_roofline_ms(kernels: pd.DataFrame, dev: dict, geo: dict) -> np.ndarray:
    """Latency at utilisation 1: waves x (tile FLOPs / per-SM roofline throughput).

    = waves x num_SM / tiles x max(padded FLOPs / peak, bytes / bandwidth), never below the plain
    roofline because waves x num_SM >= tiles and padded FLOPs >= FLOPs.
    """
    peak = peak_gflops(kernels, dev) * 1e9
    bw = dev["mem_bw_gbs"] * 1e9
    occupancy = geo["waves"] * dev["num_sm"] / geo["tiles"]
    return occupancy * np.maximum(geo["padded_flops"] / peak, geo["bytes"] / bw) * 1e3
