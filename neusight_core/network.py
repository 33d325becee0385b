"""Network model: how long the communication kernels of a parallel plan take on one server.

The kernel table marks communication as ``op_class == "COMM"`` rows with ``comm_kind``
(``allreduce`` | ``sendrecv``) and ``comm_bytes`` (bytes each GPU contributes). The predictors give
those rows 0 ms; this module times them.

Model (SPEC 3.3): the authors time collectives from the NVLink peak of the GPU, derated to
0.72 x peak / 2 (their ``efficiency`` and the fact that the quoted NVLink figure counts both
directions). We keep the same form with every constant a parameter:

    effective_gbs   = link_gbs x efficiency / 2
    ring all-reduce = 2 (N - 1) / N x bytes / effective_gbs      (reduce-scatter + all-gather)
    send/recv       = bytes / effective_gbs                      (one hop between stages)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from neusight_core.schema import OpClass

#: The authors' derating of the NVLink peak (SPEC 3.3).
DEFAULT_EFFICIENCY = 0.72


class NetworkError(ValueError):
    """Bad network parameters (non-positive bandwidth, GPU count below 1, ...)."""


@dataclass(frozen=True)
class NetworkModel:
    link_gbs: float                 # per-GPU link peak as quoted on spec sheets (both directions), GB/s
    gpus: int = 4
    efficiency: float = DEFAULT_EFFICIENCY

    def __post_init__(self):
        if not (self.link_gbs and self.link_gbs > 0):
            raise NetworkError(f"link bandwidth must be > 0 GB/s, got {self.link_gbs!r}")
        if int(self.gpus) < 1:
            raise NetworkError(f"number of GPUs must be >= 1, got {self.gpus!r}")
        if not (0 < self.efficiency <= 1):
            raise NetworkError(f"link efficiency must be in (0, 1], got {self.efficiency!r}")

    @property
    def effective_gbs(self) -> float:
        return self.link_gbs * self.efficiency / 2.0

    def allreduce_ms(self, nbytes: float) -> float:
        n = int(self.gpus)
        if n == 1:
            return 0.0  # nothing to exchange
        return 2.0 * (n - 1) / n * float(nbytes) / (self.effective_gbs * 1e9) * 1e3

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
        for i in np.flatnonzero(comm):
            kind = str(kinds[i])
            if kind == "allreduce":
                out[i] = self.allreduce_ms(nbytes[i])
            elif kind == "sendrecv":
                out[i] = self.sendrecv_ms(nbytes[i])
            else:
                raise NetworkError(f"unknown communication kind {kind!r} (expected allreduce or sendrecv)")
        return out
