"""Figure 10 and claim C9 re-predicted by our re-implementation (notebook 06): FP16 tensor-core BMMs on the H100,
the release's ``fp16mm.csv``, predicted with the dense or the sparse tensor-core peak, or as the authors ran it (the
release's ``NVIDIA_H100_80GB_HBM3_TP`` device in FP32 accounting). Notebook 04 can pass ``fp16mm_ours()`` as the
``fp16`` frame of ``claims.compute_claims`` to give C9 a verdict for our re-implementation; :func:`c9_verdict` does
it for C9 alone.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.cost import latency
from neusight_core.question.schema import OpClass, Precision
from neusight_core.studies.whatif import H100

SPARSE_FP16_H100 = 1979000.0    # the release's _TP device and the datasheet's "with sparsity" figure
PEAKS = ("dense", "sparse", "authors")


def fp16mm_kernels(fp16: pd.DataFrame, elem_bytes: float = 2.0, precision: str = Precision.FP16) -> pd.DataFrame:
    """The Figure 10 BMM shapes as a kernel table (release convention: [M x N] @ [N x K])."""
    B, M, N, K = (fp16[c].astype(float).to_numpy() for c in ("B", "M", "N", "K"))
    n = len(fp16)
    return pd.DataFrame({
        "phase": "fw", "aten_op": "aten.bmm.default", "op_class": OpClass.BMM, "sub_op": "",
        "B": B, "M": M, "N": N, "K": K, "H": np.nan, "flops": 2.0 * B * M * N * K,
        "bytes_read": elem_bytes * B * (M * N + N * K), "bytes_written": elem_bytes * B * M * K,
        "dtype": "float16" if elem_bytes == 2 else "float32", "module": "", "layer": -1, "count": 1,
        "comm_kind": "", "comm_bytes": 0.0, "overlap": False, "stage": 0, "precision": [precision] * n})


def fp16mm_ours(predictor="neusight", quick: bool = False, peak: str = "dense", fp16: pd.DataFrame | None = None,
                tensor_core: bool = True) -> pd.DataFrame:
    """Figure 10 re-predicted: columns B, M, N, K, label_ms (the release's measurement), pred_ms (ours).

    ``peak``: ``dense`` = the H100's dense FP16 tensor-core peak from the catalogue (989.4 TFLOPS),
    2-byte elements; ``sparse`` = the same with the datasheet's "with sparsity" 1,979 TFLOPS, the
    figure the release's ``NVIDIA_H100_80GB_HBM3_TP.json`` uses; ``authors`` = that release device
    itself in FP32 accounting (4-byte elements against doubled bandwidth, L2 and memory, as the
    authors' code ran it). ``tensor_core=False``: a predictor with BF16 / FP16 tensor-core networks (``neusight``)
    predicts without them (``predict_extrapolated``: its FP32 networks, as before those networks existed)."""
    from neusight_core.studies import paper_tables
    if peak not in PEAKS:
        raise ValueError(f"peak must be one of {', '.join(PEAKS)}, got {peak!r}")
    fp16 = paper_tables.load_fp16mm() if fp16 is None else fp16
    pred = latency.loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    if peak == "authors":
        k, dev = fp16mm_kernels(fp16, 4.0, Precision.FP32), devices.get_device("NVIDIA_H100_80GB_HBM3_TP")
    else:
        k, dev = fp16mm_kernels(fp16), devices.get_device(H100)
        if peak == "sparse":
            dev = dataclasses.replace(dev, name=dev.name + "_sparse_fp16", fp16_tensor_gflops=SPARSE_FP16_H100)
    out = fp16[["B", "M", "N", "K", "label_ms"]].copy()
    fn = pred.predict if tensor_core or not hasattr(pred, "predict_extrapolated") else pred.predict_extrapolated
    out["pred_ms"] = fn(k, dev)
    return out



def c9_verdict(fp16_ours: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, detail) of claim C9 computed from ``fp16_ours`` (``claims.compute_claims``)."""
    from neusight_core.studies import claims as cl
    reg = cl.load_claims()
    reg = {**reg, "claims": [c for c in reg["claims"] if c["id"] == "C9"]}
    return cl.compute_claims(pd.DataFrame(), fp16_ours, claims=reg)
