"""How long a memory-bound BF16 / FP16 kernel takes: a stated law, its three numbers fitted on measured kernels.

The FP32 networks learned element-wise, normalisation and copy kernels from the release, which measures FP32
kernels on older GPUs; a BF16 model's such kernels went through them as the FP32 kernel that moves the same bytes
(``common.half_as_fp32``). NVIDIA's database (``measured_kernels.load_quantize``) measures a BF16 element-wise
kernel on three of the tensor-core networks' training GPUs (H100 SXM, H200 SXM, L40S): x[m, k] read as BF16 and
written as FP8, 3,256 shapes each. It says two things the networks cannot know:

- **Below the L2's size the GPU's memory does not matter.** The H200 (4.8 TB/s) takes 0.95-1.0 of the H100's
  (3.35 TB/s) time on every kernel that moves up to 64 MB, and 0.70 (the bandwidth ratio) only beyond 256 MB.
  Both have the same 132 SMs, clock and 50 MB L2: the operands stay in the L2, and how fast the SMs draw from it
  is the limit. The L40S, with a 96 MB L2 and 0.86 TB/s, runs such kernels at 4-6 TB/s.
- **Every kernel costs a fixed time** (1.1-2.6 us at the smallest sizes), whatever it moves.

The law, for a kernel moving b bytes (read and written) on a GPU with bandwidth W, S SMs at f cycles per second
and an L2 of L bytes:

    t = t0 + b / rate,   rate = beta * S * f                  when b <= L   (from the L2, at the SMs' pace)
                         rate = min(eta * W, beta * S * f)     otherwise     (from DRAM)

t0 (s), eta (the share of the bandwidth reached) and beta (bytes per SM per cycle) are fitted by least squares on
log time over the training GPUs' kernels (``fit``); the L2 threshold at exactly the L2's size was chosen among
0.25-2 x by leaving one training GPU out (docs/search_bf16.jsonl, tag ``i33-memory-law``). Held-out GPUs are
never read here. It answers the BF16 / FP16 rows of the vector and memory classes of the ``neusight`` recipe
(``neusight.NeuSightPredictor.predict``); an element-wise kernel other than a quantiser, a normalisation or a
copy is an extrapolation of it: the database measures no other.

**ATen's slower paths.** The quantiser is a vectorised kernel. Eager PyTorch runs an element-wise op, a copy or a
``cat`` on a slower kernel when an operand is broadcast or strided, converted to a wider type, or (``cat``) a
strided view (``aten_ops.access``, the table's ``access`` column in half-precision tables). Timed alone on an H100
and an H200 (our kernel measurements, docs/tier2/2026-11-28-h100-paths and -h200-modern-paths), such kernels took
the same time on both GPUs at every size from 16 M elements up, although the H200 has 1.43x the bandwidth: a
per-element cost on the SMs. Such a row (any precision) takes

    t = t0 + max(b / rate, n / (gamma * S * f))       n = the output's elements

with gamma (elements per SM per cycle) per path fitted on those kernels (``fit_paths``, ``PATH_RATE``); on any
other GPU, an extrapolation through its SMs and clock.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.question import schema
import neusight_core.predictors.common as common

#: t0 (us), eta, beta (bytes / SM / cycle) as ``fit`` gives them on aiconfigurator-core 0.12.0's training GPUs:
#: used when the database is not installed
DEFAULT_LAW = {"t0_us": 1.9587, "eta": 0.8765, "beta": 18.5726}
#: where the L2 stops holding a kernel's bytes, in L2 sizes (chosen by leave-one-GPU-out, module docstring)
L2_SHARE = 1.0

#: the classes it answers in half precision: element-wise, row-wise and copies (every memory-bound class)
LAW_CLASSES = schema.op_classes(lambda c: c.is_vector or c.is_memory)
#: gamma of each of ATen's slower paths (``aten_ops.ACCESS_PATHS``): output elements per SM per cycle, as
#: ``fit_paths`` gives them on the recorded kernels (tests/test_access_paths.py checks that it does)
PATH_RATE = {"strided": 1.376, "upcast": 1.341, "strided_cat": 0.918}
#: the kernels ``fit_paths`` reads: at least this many output elements (the per-launch cost is under a tenth)
PATH_FIT_MIN_ELEMENTS = 4 * 1024 * 1024

def answers(kernels: pd.DataFrame) -> np.ndarray:
    """The rows the law answers: BF16 / FP16 rows of ``LAW_CLASSES`` (a table without a ``precision`` column is FP32),
    and the rows of a half-precision table on one of ATen's slower paths (``access``), whatever their precision."""
    if "precision" not in kernels.columns:
        return np.zeros(len(kernels), bool)
    half = (kernels["precision"].isin(schema.HALF_PRECISIONS) & kernels["op_class"].isin(LAW_CLASSES)).to_numpy()
    return half | (paths(kernels) != "")


def paths(kernels: pd.DataFrame) -> np.ndarray:
    """Each row's ``access`` path, "" where the table has none (FP32 tables) or the row is vectorised."""
    if "access" not in kernels.columns:
        return np.full(len(kernels), "", dtype=object)
    return kernels["access"].fillna("").to_numpy(dtype=object)


def device_rates(kernels: pd.DataFrame, device) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: DRAM bandwidth (B/s), SM cycles per second (SMs x clock) and L2 size (B) of ``device`` (or of
    the table's ``device`` column when None)."""
    d = common.device_arrays(kernels, device)
    return d["mem_bw_gbs"] * 1e9, d["num_sm"] * d["freq_mhz"] * 1e6, d["l2_mb"] * 1e6


def law_s(moved, bw, sm_cycles, l2, t0_s: float, eta: float, beta: float, l2_share: float = L2_SHARE):
    """The law (module docstring), seconds per launch."""
    sm = beta * sm_cycles
    rate = np.where(moved <= l2_share * l2, sm, np.minimum(eta * bw, sm))
    return t0_s + moved / rate


def fit(kernels: pd.DataFrame, l2_share: float = L2_SHARE, law=law_s) -> dict:
    """t0, eta and beta on measured kernels (``latency_ms`` and ``device`` columns): least squares on log time
    (``law``: another form with ``law_s``'s arguments, for the search)."""
    from scipy.optimize import least_squares
    moved = common.total_bytes(kernels)
    bw, sm, l2 = device_rates(kernels, None)
    y = np.log(kernels["latency_ms"].to_numpy(float) * 1e-3)
    res = least_squares(lambda p: np.log(law(moved, bw, sm, l2, p[0] * 1e-6, p[1], p[2], l2_share)) - y,
                        x0=[2.0, 0.85, 15.0], bounds=([0.0, 0.1, 1.0], [10.0, 1.0, 100.0]))
    return {"t0_us": float(res.x[0]), "eta": float(res.x[1]), "beta": float(res.x[2])}


def time_ms(kernels: pd.DataFrame, device, p: dict, rates: dict | None = None) -> np.ndarray:
    """ms per launch of each row by the law (``p``: its numbers, ``fit``'s, which the trainer hands over:
    ``training.memory_law_params``), a row on one of ATen's slower paths at least its output's elements at that
    path's rate (``rates``, default ``PATH_RATE``)."""
    bw, sm, l2 = device_rates(kernels, device)
    t = law_s(common.total_bytes(kernels), bw, sm, l2, p["t0_us"] * 1e-6, p["eta"], p["beta"])
    gamma = pd.Series(paths(kernels)).map(PATH_RATE if rates is None else rates).to_numpy(float)
    slow = np.isfinite(gamma)
    if slow.any():
        elem = kernels["precision"].map(schema.ELEMENT_BYTES).fillna(4).to_numpy(float)
        n = kernels["bytes_written"].to_numpy(float) / elem
        t[slow] = np.maximum(t[slow], p["t0_us"] * 1e-6 + n[slow] / (gamma[slow] * sm[slow]))
    return t * 1e3


def fit_paths(kernels: pd.DataFrame, p: dict) -> dict:
    """gamma of each path in ``kernels`` (columns ``access``, ``bytes_read``, ``bytes_written``, ``precision``,
    ``measured_ms``, ``device``; rows of at least ``PATH_FIT_MIN_ELEMENTS`` output elements): least squares on log
    time of ``time_ms``'s form, the law's own numbers fixed."""
    from scipy.optimize import least_squares
    out = {}
    elem = kernels["precision"].map(schema.ELEMENT_BYTES).fillna(4).to_numpy(float)
    big = kernels[kernels["bytes_written"].to_numpy(float) / elem >= PATH_FIT_MIN_ELEMENTS]
    for path, k in big.groupby("access"):
        if path not in PATH_RATE:
            continue
        y = np.log(k["measured_ms"].to_numpy(float))
        res = least_squares(lambda g: np.log(time_ms(k, None, p, {path: g[0]})) - y, x0=[1.0], bounds=([0.01], [100.0]))
        out[path] = float(res.x[0])
    return out
