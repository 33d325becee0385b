"""Network model: how long the communication kernels of a parallel plan take on one server.

The kernel table marks communication as ``op_class == "COMM"`` rows with ``comm_kind``
(``allreduce`` | ``sendrecv``) and ``comm_bytes`` (bytes each GPU contributes). The predictors give
those rows 0 ms; this module times them.

Model (SPEC 3.3): the authors time collectives from the NVLink peak of the GPU, derated to
0.72 x peak / 2 (their ``efficiency`` and the fact that the quoted NVLink figure counts both
directions). We keep the same form with every constant a parameter:

    effective_gbs   = link_gbs x efficiency / 2
    ring all-reduce = latency + 2 (N - 1) / N x bytes / effective_gbs      (reduce-scatter + all-gather)
    send/recv       = bytes / effective_gbs                                (one hop between stages)

``latency`` (``comm``, a field of the request, ``schema.COMMS``): ``bandwidth`` = 0, the authors' model, which the
paper's reproduction keeps (``scenario.PAPER``); ``nccl`` (what a question gets unless it says) = the fixed cost
of one NCCL all-reduce on N GPUs, ``NCCL_LATENCY_US``. NVIDIA's database (``measured_kernels.load_allreduce``)
times NCCL all-reduces of 512 B to 512 MB on 2, 4 and 8 GPUs: the bandwidth term matches its large messages
(within 20 % on the training GPUs) and misses its small ones by 99 %: an all-reduce of a few KB, the size of a
tensor-parallel decode step's, takes 6-23 us, not the 0.01-0.1 us its bytes need (docs/recipes.md,
"Collectives"). Data parallelism's gradient all-reduces (``overlap`` rows, one per module) pay it per bucket, as
PyTorch's DDP sends them: a row its share ``bytes / DDP_BUCKET_BYTES`` of it, at most all of it. Send / recv keeps the
authors' form: the database measures no point-to-point transfer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from neusight_core.question.schema import COMMS, Comm, OpClass

#: The authors' derating of the NVLink peak (SPEC 3.3).
DEFAULT_EFFICIENCY = 0.72
#: NCCL's fixed cost of one all-reduce on N GPUs, ``base + per_gpu x (N - 1)`` us, as ``fit_latency`` gives it on the
#: training GPUs with NVLink (A100 SXM, H100 SXM, H200 SXM; aiconfigurator-core 0.12.0, NCCL 2.27-2.29; a test re-fits
#: it): 6.9-11.8 us on 2 GPUs, 10.0-14.6 on 4, 16.9-22.5 on 8 measured.
NCCL_LATENCY_US = {"base": 6.68, "per_gpu": 1.746}
#: messages whose bandwidth term is below this share of their measured time set the fixed cost (``fit_latency``)
LATENCY_FIT_SHARE = 0.1
#: the gradient bucket of PyTorch's DistributedDataParallel (its ``bucket_cap_mb`` default, 25 MiB): one all-reduce
#: per bucket, however many modules' gradients it holds
DDP_BUCKET_BYTES = 25 * 2**20


class NetworkError(ValueError):
    """Bad network parameters (non-positive bandwidth, GPU count below 1, ...)."""


def ring_ms(nbytes, gpus, link_gbs, efficiency: float = DEFAULT_EFFICIENCY):
    """The bandwidth term of a ring all-reduce of ``nbytes`` per GPU (scalars or arrays), ms."""
    n = np.asarray(gpus, dtype=float)
    effective = np.asarray(link_gbs, dtype=float) * efficiency / 2 * 1e9            # B/s, the authors' derating
    return 2.0 * (n - 1) / n * np.asarray(nbytes, dtype=float) / effective * 1e3


def fixed_us(gpus, params: dict = NCCL_LATENCY_US):
    """``params``' fixed cost of one all-reduce on ``gpus`` GPUs (scalars or arrays), us."""
    return params["base"] + params["per_gpu"] * (np.asarray(gpus, dtype=float) - 1)


def latency_us(comm: str, gpus: int) -> float:
    """The fixed cost of one all-reduce on ``gpus`` GPUs under ``comm`` (``schema.COMMS``), us."""
    if comm not in COMMS:
        raise NetworkError(f"comm must be one of {', '.join(COMMS)}, got {comm!r}")
    if comm == Comm.BANDWIDTH or int(gpus) < 2:
        return 0.0
    return float(fixed_us(int(gpus)))


def fit_latency(rows: pd.DataFrame, efficiency: float = DEFAULT_EFFICIENCY) -> dict:
    """``NCCL_LATENCY_US`` of measured all-reduces (``measured_kernels.load_allreduce``'s columns): per GPU and GPU
    count, the median of (measured - the bandwidth term) over the messages whose bandwidth term is below
    ``LATENCY_FIT_SHARE`` of their time; then least squares of a line in N - 1 over those medians."""
    y = rows["latency_ms"].to_numpy(float) * 1e3
    bw = ring_ms(rows["bytes"], rows["gpus"], rows["link_gbs"], efficiency) * 1e3
    small = bw < LATENCY_FIT_SHARE * y
    med = (rows[small].assign(fixed=(y - bw)[small]).groupby(["device", "gpus"])["fixed"].median().reset_index())
    if med["gpus"].nunique() < 2:
        raise NetworkError("fit_latency needs small all-reduces on at least two GPU counts")
    a = np.stack([np.ones(len(med)), med["gpus"].to_numpy(float) - 1], axis=1)
    (base, per_gpu), *_ = np.linalg.lstsq(a, med["fixed"].to_numpy(float), rcond=None)
    return {"base": float(base), "per_gpu": float(per_gpu)}


@dataclass(frozen=True)
class NetworkModel:
    link_gbs: float                 # per-GPU link peak as quoted on spec sheets (both directions), GB/s
    gpus: int = 4
    efficiency: float = DEFAULT_EFFICIENCY
    latency_us: float = 0.0         # fixed cost of one all-reduce (``latency_us()``; 0: the authors' model)

    def __post_init__(self):
        if not (self.link_gbs and self.link_gbs > 0):
            raise NetworkError(f"link bandwidth must be > 0 GB/s, got {self.link_gbs!r}")
        if int(self.gpus) < 1:
            raise NetworkError(f"number of GPUs must be >= 1, got {self.gpus!r}")
        if not (0 < self.efficiency <= 1):
            raise NetworkError(f"link efficiency must be in (0, 1], got {self.efficiency!r}")
        if not (np.isfinite(self.latency_us) and self.latency_us >= 0):
            raise NetworkError(f"all-reduce latency must be a finite number of us >= 0, got {self.latency_us!r}")

    @property
    def effective_gbs(self) -> float:
        return self.link_gbs * self.efficiency / 2.0

    def allreduce_ms(self, nbytes: float, latency_share: float = 1.0) -> float:
        """One all-reduce of ``nbytes`` per GPU; ``latency_share``: the part of the fixed cost it pays (DDP buckets)."""
        n = int(self.gpus)
        if n == 1:
            return 0.0  # nothing to exchange
        return self.latency_us * latency_share * 1e-3 + float(ring_ms(nbytes, n, self.link_gbs, self.efficiency))

    def sendrecv_ms(self, nbytes: float) -> float:
        if int(self.gpus) == 1:
            return 0.0
        return float(nbytes) / (self.effective_gbs * 1e9) * 1e3

    def time_ms(self, kernels: pd.DataFrame) -> np.ndarray:
        """Per-row time (ms, one launch) of the COMM rows of ``kernels``; 0 for every other row."""
        out = np.zeros(len(kernels))
        if len(kernels) == 0 or "op_class" not in kernels:
            return out
        comm = (kernels["op_class"] == OpClass.COMM).to_numpy()
        if not comm.any():
            return out
        kinds = kernels["comm_kind"].to_numpy()
        nbytes = pd.to_numeric(kernels["comm_bytes"], errors="coerce").fillna(0).to_numpy()
        bucketed = (kernels["overlap"].fillna(False).astype(bool).to_numpy() if "overlap" in kernels
                    else np.zeros(len(kernels), bool))
        for i in np.flatnonzero(comm):
            kind = str(kinds[i])
            if kind == "allreduce":
                out[i] = self.allreduce_ms(nbytes[i], min(1.0, nbytes[i] / DDP_BUCKET_BYTES) if bucketed[i] else 1.0)
            elif kind == "sendrecv":
                out[i] = self.sendrecv_ms(nbytes[i])
            else:
                raise NetworkError(f"unknown communication kind {kind!r} (expected allreduce or sendrecv)")
        return out


def for_request(r: dict, efficiency: float = DEFAULT_EFFICIENCY) -> NetworkModel:
    """The network model of one request's fields (a Scenario's ``as_dict``): its link, GPUs and ``comm``."""
    return NetworkModel(link_gbs=r["link_gbs"] or 1.0, gpus=r["gpus"], efficiency=efficiency,
                        latency_us=latency_us(r["comm"], r["gpus"]))
