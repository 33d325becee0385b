"""Timing on the local GPU (notebook 05): which GPU this is, and the paper's measurement protocol (warm-up, 25
timed runs, mean of the 5 fastest, CUDA events), with a time budget and OOM recorded per configuration.

Everything here runs on CPU with fakes (injectable timer, faked device properties); a real GPU is only touched
through :class:`CudaEventTimer` and :func:`local_properties`.
"""
from __future__ import annotations

import platform
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from neusight_core.question.schema import Precision

RUNS = 25
FASTEST = 5
WARMUP = 3


# ---------------------------------------------------------------- device detection
@dataclass(frozen=True)
class GpuProperties:
    """The three facts torch.cuda.get_device_properties gives us that identify a GPU."""
    name: str
    total_memory_bytes: int
    sm_count: int


@dataclass
class DetectedDevice:
    name: str                      # catalogue id (release file stem) or "UNKNOWN:<display name>"
    display_name: str
    num_sm: int
    mem_gb: float
    known: bool
    estimated_fields: tuple = ()   # fields derived by rule of thumb for an unknown GPU
    device: object | None = None   # devices.Device when the catalogue is available
    note: str = ""


def identify(props: GpuProperties) -> DetectedDevice:
    """Map faked or real device properties to the catalogue (``devices.device_from_properties``);
    unknown -> an entry derived from the properties (``devices.derive_from_properties``) + a warning."""
    from neusight_core.data import devices
    gb = props.total_memory_bytes / 2**30
    dev = devices.device_from_properties(props.name, props.total_memory_bytes, props.sm_count)
    if dev is not None:
        return DetectedDevice(dev.name, props.name, props.sm_count, gb, True, (), dev)
    derived, est = devices.derive_from_properties(props.name, props.total_memory_bytes, props.sm_count)
    est = tuple(est) + ("link_gbs",)
    msg = (f"unknown GPU {props.name!r} ({props.sm_count} SMs, {gb:.1f} GiB): catalogue entry derived "
           f"from its properties; estimated fields: {', '.join(est)} — predictions are indicative only")
    warnings.warn(msg, stacklevel=2)
    return DetectedDevice(f"UNKNOWN:{props.name}", props.name, props.sm_count, gb, False, est, derived, msg)


def local_properties() -> GpuProperties | None:
    """The local GPU 0's properties, or None when there is no CUDA GPU."""
    import torch
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return GpuProperties(p.name, int(p.total_memory), int(p.multi_processor_count))


def no_gpu_reason() -> str | None:
    """None if a CUDA GPU is usable, else a one-line reason."""
    import torch
    if torch.cuda.is_available():
        return None
    cuda = torch.version.cuda
    return f"no CUDA GPU: torch {torch.__version__} (CUDA build: {cuda or 'none'}), torch.cuda.is_available() is False"


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def software_versions() -> dict:
    import torch
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": (torch.backends.cudnn.version() if torch.cuda.is_available() else None),
            "transformers": transformers.__version__, "platform": platform.platform()}


# ---------------------------------------------------------------- measurement harness
@dataclass
class HarnessConfig:
    runs: int = RUNS
    fastest: int = FASTEST
    warmup: int = WARMUP
    precision: str = Precision.FP32        # "fp32" (paper), extensions: "tf32", "bf16" (labelled as such)


class TimeBudget:
    """Wall-clock budget; ``allows(cost_s)`` says whether a step of that cost still fits."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock, self.start = float(seconds), clock, clock()

    def remaining(self) -> float:
        return self.seconds - (self.clock() - self.start)

    def allows(self, cost_s: float) -> bool:
        return cost_s <= self.remaining()

    def share(self, weight: float, weights_left: float) -> "TimeBudget":
        """A section's budget: ``weight / weights_left`` of what is left now (``weights_left``: the weights of
        this section and of every section still to come), so that time a section does not use goes to the ones
        after it. Never more than what is left."""
        frac = weight / weights_left if weights_left > 0 else 1.0
        return TimeBudget(max(0.0, self.remaining()) * min(1.0, frac), self.clock)


# Notebook 05's measured sections share the time budget by these weights, in this order: the first GPU runs
# spent the whole budget on the paper's models and measured one torch.compile pair of six. The kernel section
# weighs 2 since it also times ResNet-50's 68 convolutions (90 kernels, 28 calls each).
SECTION_WEIGHTS = {"kernels": 2.0, "paper": 4.0, "llama": 2.0, "vision": 2.0, "fusion": 3.0}


def section_budget(total: "TimeBudget", section: str) -> "TimeBudget":
    """``total.share`` for ``section`` of ``SECTION_WEIGHTS`` (this one and the sections after it)."""
    names = list(SECTION_WEIGHTS)
    left = sum(SECTION_WEIGHTS[n] for n in names[names.index(section):])
    return total.share(SECTION_WEIGHTS[section], left)


class CudaEventTimer:
    """Times one call of ``fn`` in ms with CUDA events (the paper's tool)."""

    def __call__(self, fn: Callable[[], object]) -> float:
        import torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end))


def set_precision(precision: str) -> None:
    """FP32 with TF32 off by default; TF32 is an extension and is labelled in every output."""
    import torch
    if precision not in (Precision.FP32, Precision.TF32, Precision.BF16):
        raise ValueError(f"precision must be fp32, tf32 or bf16, not {precision!r}")
    allow = precision == Precision.TF32
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def harness_dtype(cfg: "HarnessConfig | None"):
    import torch
    return torch.bfloat16 if (cfg is not None and cfg.precision == Precision.BF16) else torch.float32


def is_oom(e: BaseException) -> bool:
    import torch
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


@dataclass
class Measurement:
    status: str                    # OK | OOM | BUDGET | ERROR
    mean_ms: float | None = None   # mean of the `fastest` fastest timed runs
    times_ms: list = field(default_factory=list)
    reason: str | None = None


def measure(fn: Callable[[], object], timer: Callable | None = None, cfg: HarnessConfig | None = None,
            budget: TimeBudget | None = None) -> Measurement:
    """Warm up, time ``cfg.runs`` runs, return the mean of the ``cfg.fastest`` fastest.

    The budget is checked before every call using the slowest call seen so far as the cost of the
    next one, so a run stops *before* it would overrun; a stopped measurement is status BUDGET.
    """
    cfg = cfg or HarnessConfig()
    timer = timer or CudaEventTimer()
    worst_s = 0.0
    times: list[float] = []
    try:
        for i in range(cfg.warmup + cfg.runs):
            if budget is not None and not budget.allows(worst_s):
                return Measurement("BUDGET", None, times, f"time budget exhausted after {i} of "
                                   f"{cfg.warmup + cfg.runs} calls")
            ms = float(timer(fn))
            worst_s = max(worst_s, ms / 1e3)
            if i >= cfg.warmup:
                times.append(ms)
    except Exception as e:  # noqa: BLE001 - OOM is recorded per configuration, others re-raised
        if is_oom(e):
            free_cuda()
            return Measurement("OOM", None, times, f"out of memory: {str(e).splitlines()[0][:200]}")
        raise
    fastest = sorted(times)[: cfg.fastest]
    return Measurement("OK", float(np.mean(fastest)), times)


def error_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def free_cuda() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass
