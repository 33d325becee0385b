"""The shortest time a kernel occupies the GPU, in BF16 / FP16 steps.

A kernel, however little it does, holds the GPU for a few microseconds: its blocks are scheduled, run and
retired before the next kernel starts. NVIDIA's measured kernels (``aiconfigurator-core``, SPEC section 10) show
it: the smallest GEMMs of its database (down to 32 x 32 x 1) take 2.45 us on the A100 and H100, 2.37 us on the
H200 and 1.65 us on the L40S (package 0.12.0), whatever their size. A decode step launches about 1,300 kernels,
most of them element-wise ops on one token's vectors, which the roofline puts at nanoseconds and the networks,
extrapolating below the smallest kernel they were trained on, at 0.001-0.3 us. So in a BF16 / FP16 scenario every
kernel's time is at least the floor: the median over the database's training GPUs (the held-out ones stay sealed)
of the shortest kernel measured on each, 2.41 us with package 0.12.0; ``DEFAULT_FLOOR_US`` without the database.
Two floors, by kind of kernel: the GEMM floor above for every class that runs on tiles of the matrix units (and
any other), and for element-wise, row-wise and copy kernels (``MEMORY_BOUND``) the shortest BF16 element-wise
kernel of the same database, 1.27 us (median of 1.14-1.43 us). One floor of each kind for every GPU, not one per
GPU: a GPU that is not in the database has no measured floor, and a GPU feature that cannot change a kernel's
speed must not change its prediction (a per-name floor made an H100 with more memory faster). It applies to every
predictor's per-launch times (``engine``), as the host's launch cost does.

Only BF16 / FP16 scenarios: the paper's FP32 reproduction (Tier 0/1) stays as published; its
networks learned the release's timings, which start at 24 us per kernel (launch included).

Where it came from: the decode steps of notebook 05's recorded runs (docs/tier2.md) missed by 45 % against their
kernel sums, with a thousand kernels predicted under 1 us. The element-wise floor came from the runs of 2026-11-28,
where small models' decode steps came out up to 39 % too slow with about 500 element-wise kernels each at 2.41 us,
and a vectorised add of one token's vector took 1.27 us. Both values come from the database, not from those runs;
but those runs' numbers after each change are no independent check of it.
"""
from __future__ import annotations

import statistics

import numpy as np
import pandas as pd

from neusight_core.question import schema

#: The median of the training GPUs' shortest measured kernels (A100 SXM 2.454, H100 SXM 2.452, H200 2.367,
#: L40S 1.650 us; aiconfigurator-core 0.12.0): used when the database is not installed.
DEFAULT_FLOOR_US = 2.41
#: The same for the memory-bound classes: the median of the shortest BF16 element-wise kernels the database measures
#: (``measured_kernels.load_quantize``: H100 SXM 1.273, H200 1.143, L40S 1.434 us; package 0.12.0).
DEFAULT_MEMORY_FLOOR_US = 1.27
#: the classes whose floor is the element-wise one: element-wise, row-wise and copies (no GEMM or tensor-core tile)
MEMORY_BOUND = schema.op_classes(lambda c: c.is_vector or c.is_memory)

_FLOORS: dict = {}


def _measured(kind: str) -> dict[str, float]:
    """{GPU name: shortest measured kernel, ms} of the database's training GPUs ({} without the database), of its
    GEMMs (``kind`` "gemm") or its element-wise kernels ("memory"); read once per package version and cached with
    the traces (``trace_cache``)."""
    if kind not in _FLOORS:
        from neusight_core.data import measured_kernels
        from neusight_core.tracing import trace_cache
        if measured_kernels.unavailable():
            _FLOORS[kind] = {}
        else:
            def build() -> pd.DataFrame:
                g = (measured_kernels.load_gemm("training", features=False) if kind == "gemm"
                     else measured_kernels.load_quantize("training"))
                m = g.groupby("device")["latency_ms"].min()
                return pd.DataFrame({"device": m.index.astype(str), "floor_ms": m.to_numpy(float)})
            key = {"kind": "kernel-floor" if kind == "gemm" else "kernel-floor-memory",
                   "package": measured_kernels.package_version() or "", "root": str(measured_kernels.data_root())}
            f = trace_cache.cached(key, build)
            _FLOORS[kind] = dict(zip(f["device"], f["floor_ms"].astype(float)))
    return _FLOORS[kind]


def floors() -> dict[str, float]:
    """{GPU name: shortest measured GEMM, ms} of the database's training GPUs ({} without the database)."""
    return _measured("gemm")


def memory_floors() -> dict[str, float]:
    """{GPU name: shortest measured element-wise kernel, ms} of the database's training GPUs ({} without it)."""
    return _measured("memory")


def floor_ms(memory_bound: bool = False) -> float:
    """The floor, ms: the median of ``floors()`` (of ``memory_floors()`` for a memory-bound class), or the
    documented default without the database."""
    f = memory_floors() if memory_bound else floors()
    if f:
        return statistics.median(f.values())
    return (DEFAULT_MEMORY_FLOOR_US if memory_bound else DEFAULT_FLOOR_US) / 1e3


def row_floor_ms(op_class) -> np.ndarray:
    """Per kernel row of classes ``op_class`` (an array): its floor, ms (``MEMORY_BOUND`` rows the element-wise one)."""
    mem = np.isin(np.asarray(op_class, dtype=object), MEMORY_BOUND)
    return np.where(mem, floor_ms(memory_bound=True), floor_ms())
