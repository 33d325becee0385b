"""Row values of measured kernels: what ``measured_kernels`` checks in every BF16 row it reads.

Every BF16 row read must have a finite, positive latency
within ``LATENCY_MAX_MS``, positive dims (GEMM m, n, k; attention batch, tokens, heads, KV heads <= heads, head
size; cached tokens and window >= 0), and must not beat the roofline at the GPU's catalogue peak by more than
``COMPUTE_MARGIN`` / ``MEMORY_MARGIN``. A file with one failing row is refused whole, in one line naming the file,
the count and the first failing row: such a row is damage (random bytes in an installed parquet file loaded
latencies from -6e307 to 1e304 ms), and dropping it would let the rest of a damaged file train the BF16
networks and draw notebook 07's figures. Every row of aiconfigurator-core 0.12.0's split passes.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.question import schema
from neusight_core.question.schema import OpClass, Precision


class MeasuredDataError(ValueError):
    """The measured-kernel database cannot be used (one line: missing package, changed layout, refused GPU,
    damaged rows)."""


#: a measured kernel may not run faster than FLOPs / (the GPU's dense BF16 peak x this): 2 is the structured-sparse
#: peak, which no dense kernel reaches; over aiconfigurator-core 0.12.0's training and held-out files the fastest
#: row reaches 1.28 x the dense peak (an H100 TRT-LLM prefill: boost clocks above the spec sheet's)
COMPUTE_MARGIN = 2.0
#: ... nor faster than bytes / (DRAM bandwidth x this): the database times repeated launches on the same tensors,
#: so operands that stay in L2 beat the DRAM roofline, by up to 4.7 x in 0.12.0 (L40S, 96 MB L2, decode
#: attention; GEMMs up to 3.5 x); L2 bandwidth is a few times DRAM's, so 10 x is out of reach of any cache
MEMORY_MARGIN = 10.0
#: ... nor longer than this: one kernel launch of the database takes at most 1.2 s (an L40S GEMM) in 0.12.0
LATENCY_MAX_MS = 1.0e5


def validate(kernels: pd.DataFrame, source, fix: str = "") -> pd.DataFrame:
    """``kernels`` (rows of ``measured_kernels.gemm_kernels`` / ``attention_kernels``) if every row's values are
    plausible (module docstring), else :class:`MeasuredDataError`, one line naming ``source`` (the file), how many
    rows fail, the first of them with its reason, and ``fix`` (what to do)."""
    if kernels.empty:
        return kernels
    lat = kernels["latency_ms"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        checks = [("latency_ms", ~(np.isfinite(lat) & (lat > 0)), "not a positive finite latency"),
                  ("latency_ms", lat > LATENCY_MAX_MS, f"longer than {LATENCY_MAX_MS:g} ms")]
        dims = ("M", "N", "K") if (kernels["op_class"] == OpClass.LINEAR).all() else ("B",) + schema.ATTN_COLUMNS
        for c in dims:
            v = kernels[c].to_numpy(float)
            checks.append((c, ~(np.isfinite(v) & (v > 0)), "not a positive number"))
        if "window" in kernels:
            for c in ("window", "seq_kv"):
                v = kernels[c].to_numpy(float) - (kernels["seq_q"].to_numpy(float) if c == "seq_kv" else 0)
                checks.append((c, ~(np.isfinite(v) & (v >= 0)), "negative (window, or cached tokens)"))
            checks.append(("kv_heads", kernels["kv_heads"].to_numpy(float) > kernels["heads"].to_numpy(float),
                           "more KV heads than query heads"))
        peak, bw = _device_limits(kernels["device"])
        flops = kernels["flops"].to_numpy(float)
        byts = (kernels["bytes_read"] + kernels["bytes_written"]).to_numpy(float)
        checks.append(("latency_ms", lat * 1e-3 * peak * COMPUTE_MARGIN < flops,
                       f"faster than the roofline at {COMPUTE_MARGIN:g} x the GPU's BF16 peak"))
        checks.append(("latency_ms", lat * 1e-3 * bw * MEMORY_MARGIN < byts,
                       f"faster than {MEMORY_MARGIN:g} x the GPU's memory bandwidth allows"))
    bad = np.zeros(len(kernels), bool)
    for _, b, _ in checks:
        bad |= b
    if not bad.any():
        return kernels
    i = int(np.flatnonzero(bad)[0])
    col, _, why = next(c for c in checks if c[1][i])
    raise MeasuredDataError(f"{source}: {int(bad.sum())} of {len(kernels)} BF16 rows fail validation (first: "
                            f"{col}={float(kernels[col].iloc[i]):.6g}: {why})" + (f"; {fix}" if fix else ""))


def _device_limits(device: pd.Series):
    """Per row: the dense BF16 GEMM peak (FLOP/s) and the memory bandwidth (B/s) of the row's catalogue GPU."""
    peak, bw = {}, {}
    for name in device.unique():
        try:
            d = devices.get_device(name)
        except LookupError:         # a GPU outside the catalogue: no bound (NaN compares false)
            peak[name] = bw[name] = np.nan
            continue
        peak[name], bw[name] = d.gemm_peak_gflops(Precision.BF16) * 1e9, d.mem_bw_gbs * 1e9
    return device.map(peak).to_numpy(float), device.map(bw).to_numpy(float)
