"""Live on the local GPU: detect it, measure kernels/models with the paper's protocol, compare.

Everything here runs on CPU with fakes (injectable timer, faked device properties); a real GPU is
only touched through :class:`CudaEventTimer` and :func:`local_properties`. The local GPU is always
treated as *unseen*: nothing measured here is ever fed to a predictor's ``fit``.

Measurement protocol (paper): warm-up, 25 timed runs, mean of the 5 fastest, FP32 with TF32 off.
"""
from __future__ import annotations

import json
import platform
import time
import warnings
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

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
    from neusight_core import devices
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
    precision: str = "fp32"        # "fp32" (paper), extensions: "tf32", "bf16" (labelled as such)


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
    if precision not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"precision must be fp32, tf32 or bf16, not {precision!r}")
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def _dtype(cfg: "HarnessConfig | None"):
    import torch
    return torch.bfloat16 if (cfg is not None and cfg.precision == "bf16") else torch.float32


def _is_oom(e: BaseException) -> bool:
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
        if _is_oom(e):
            _free_cuda()
            return Measurement("OOM", None, times, f"out of memory: {str(e).splitlines()[0][:200]}")
        raise
    fastest = sorted(times)[: cfg.fastest]
    return Measurement("OK", float(np.mean(fastest)), times)


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def _free_cuda() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


# ---------------------------------------------------------------- kernel sweep
def kernel_sweep(quick: bool = False) -> pd.DataFrame:
    """Kernel shapes (transformer-derived) in the kernel-table convention of docs/interfaces.md.

    Columns: op_class, sub_op, B, M, N, K, H, flops, bytes_read, bytes_written, dtype.
    GEMM: [M x N] @ [N x K] (N reduction); vector ops: B rows of length H.
    """
    rows = []
    gemm = [(512, 1024, 1024), (2048, 1024, 4096), (2048, 4096, 1024), (4096, 4096, 4096)]
    bmm = [(64, 512, 64, 512), (64, 512, 512, 64), (128, 1024, 128, 1024)]
    vec = [(2048, 1024), (8192, 4096), (16384, 1600)]
    if quick:
        gemm, bmm, vec = gemm[:2], bmm[:1], vec[:1]
    for m, n, k in gemm:
        rows.append(dict(op_class="LINEAR", sub_op="", B=1, M=m, N=n, K=k, H=np.nan,
                         flops=2 * m * n * k, bytes_read=4 * (m * n + n * k + k), bytes_written=4 * m * k))
    for b, m, n, k in bmm:
        rows.append(dict(op_class="BMM", sub_op="", B=b, M=m, N=n, K=k, H=np.nan,
                         flops=2 * b * m * n * k, bytes_read=4 * b * (m * n + n * k), bytes_written=4 * b * m * k))
    for b, h in vec:
        n = b * h
        for sub, ins, ops in (("add", 2, 1), ("mul", 2, 1), ("gelu", 1, 1)):
            rows.append(dict(op_class="VEC", sub_op=sub, B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
                             flops=ops * n, bytes_read=4 * ins * n, bytes_written=4 * n))
        rows.append(dict(op_class="SOFTMAX", sub_op="", B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
                         flops=5 * n, bytes_read=4 * n, bytes_written=4 * n))
        rows.append(dict(op_class="LAYERNORM", sub_op="", B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
                         flops=6 * n, bytes_read=4 * n + 8 * h, bytes_written=4 * n))
    df = pd.DataFrame(rows)
    df["dtype"] = "float32"
    df["count"] = 1
    return df


def kernel_callable(row, device: str = "cuda", dtype=None, bias: bool = True) -> Callable[[], object]:
    """Allocate the row's tensors on ``device`` and return a zero-argument call of the kernel (``bias``: a
    LINEAR row adds one; the measured BF16 database times ``F.linear`` without)."""
    import torch
    import torch.nn.functional as F
    dt = dtype or torch.float32
    mk = lambda *s: torch.randn(*[int(x) for x in s], device=device, dtype=dt)  # noqa: E731
    c = row["op_class"]
    if c == "LINEAR":
        x, w, b = mk(row["M"], row["N"]), mk(row["K"], row["N"]), (mk(row["K"]) if bias else None)
        return lambda: F.linear(x, w, b)
    if c == "BMM":
        a, b = mk(row["B"], row["M"], row["N"]), mk(row["B"], row["N"], row["K"])
        return lambda: torch.bmm(a, b)
    if c == "CONV":
        return _conv_callable(row, mk)
    x = mk(row["B"], row["H"])
    if c == "SOFTMAX":
        return lambda: torch.softmax(x, dim=-1)
    if c == "LAYERNORM":
        w, b = mk(row["H"]), mk(row["H"])
        return lambda: F.layer_norm(x, (int(row["H"]),), w, b)
    y = mk(row["B"], row["H"])
    fn = {"add": lambda: x + y, "mul": lambda: x * y, "gelu": lambda: F.gelu(x)}
    if row["sub_op"] not in fn:
        raise ValueError(f"kernel sweep: unsupported VEC sub_op {row['sub_op']!r}")
    return fn[row["sub_op"]]


def _conv_callable(row, mk) -> Callable[[], object]:
    """A CONV row's kernel as cuDNN runs it in training: ``fwd`` the convolution, ``dgrad`` the gradient of its
    input, ``wgrad`` that of its weight (``torch.nn.grad``, which call the same backward kernels as autograd);
    no bias. cuDNN picks its algorithms by its heuristics (``cudnn.benchmark`` off, torch's default)."""
    import torch
    import torch.nn.functional as F
    from neusight_core import dataset
    n, cin, cout, k = (int(row[c]) for c in ("B", "conv_cin", "conv_cout", "conv_k"))
    size, stride, pad, groups = (int(row[c]) for c in ("conv_in", "conv_stride", "conv_pad", "conv_groups"))
    x, w = mk(n, cin, size, size), mk(cout, cin // groups, k, k)
    if row["sub_op"] == "fwd":
        return lambda: F.conv2d(x, w, None, stride, pad, 1, groups)
    out = int(dataset.conv_out(size, k, stride, pad))
    go = mk(n, cout, out, out)
    if row["sub_op"] == "dgrad":
        return lambda: torch.nn.grad.conv2d_input(x.shape, w, go, stride, pad, 1, groups)
    if row["sub_op"] == "wgrad":
        return lambda: torch.nn.grad.conv2d_weight(x, w.shape, go, stride, pad, 1, groups)
    raise ValueError(f"kernel sweep: unsupported CONV sub_op {row['sub_op']!r}")


#: the image model whose convolutions the kernel section measures, and at which batch and image side
CONV_SWEEP = ("resnet50", 32, 224)


def conv_kernel_sweep(quick: bool = False) -> pd.DataFrame:
    """The distinct convolutions of one ResNet-50 training step (``CONV_SWEEP``; forward, dgrad and wgrad rows
    of the tracer, ``count`` = how often each occurs in the step), in the kernel-table convention. The release
    measures forward 3 x 3 stride-1 convolutions only: the strided, 1 x 1 and 7 x 7 ones and every backward row
    are the extrapolations of issue 26 that a GPU can check. Quick: batch 2, one row of each kind."""
    from neusight_core import trace_cache
    model, batch, size = CONV_SWEEP
    t = trace_cache.trace(model, 2 if quick else batch, size, "train")
    conv = t[t["op_class"] == "CONV"]
    keys = ["sub_op", "B", "conv_cin", "conv_cout", "conv_k", "conv_in", "conv_stride", "conv_pad", "conv_groups"]
    rows = (conv.groupby(keys, sort=False, dropna=False)
            .agg(**{c: (c, "first") for c in ("M", "N", "K", "H", "flops", "bytes_read", "bytes_written")},
                 count=("count", "sum"))
            .reset_index())
    rows.insert(0, "op_class", "CONV")
    rows["dtype"] = "float32"
    if quick:
        rows = rows.groupby("sub_op", sort=False).head(1)
    return rows.reset_index(drop=True)


def measure_kernels(kernels: pd.DataFrame, timer=None, cfg: HarnessConfig | None = None,
                    budget: TimeBudget | None = None, device: str = "cuda") -> pd.DataFrame:
    """Add measured_ms / status / reason per row; OOM and budget stops are recorded, not raised."""
    out = kernels.copy()
    res = []
    from tqdm.auto import tqdm
    for _, row in tqdm(list(kernels.iterrows()), desc="kernels", leave=False):
        if budget is not None and budget.remaining() <= 0:
            res.append(Measurement("BUDGET", reason="time budget exhausted"))
            continue
        try:
            fn = kernel_callable(row, device, dtype=_dtype(cfg))
        except Exception as e:  # noqa: BLE001
            if not _is_oom(e):
                raise
            res.append(Measurement("OOM", reason="out of memory allocating inputs"))
            continue
        res.append(measure(fn, timer, cfg, budget))
    out["measured_ms"] = [m.mean_ms for m in res]
    out["status"] = [m.status for m in res]
    out["reason"] = [m.reason for m in res]
    return out


def skipped_measurements(df: pd.DataFrame, reason: str) -> pd.DataFrame:
    out = df.copy()
    out["measured_ms"] = None
    out["status"] = "SKIPPED"
    out["reason"] = reason
    return out


def kernel_kind(k: pd.DataFrame) -> pd.Series:
    """A kernel row's kind: its op class, a CONV row by its sub_op (``CONV fwd``, ``CONV dgrad``, ``CONV wgrad``)."""
    return k["op_class"].where(k["op_class"] != "CONV", "CONV " + k["sub_op"].astype(str))


def kernel_mape(k: pd.DataFrame) -> pd.DataFrame:
    """Per ``kernel_kind`` of the measured kernel rows: ``kernels`` measured, ``MAPE %`` and ``bias %`` (mean
    signed error) of ``pred_ms`` against ``measured_ms``."""
    m = k.dropna(subset=["measured_ms", "pred_ms"])
    err = (m["pred_ms"] / m["measured_ms"] - 1) * 100
    return (pd.DataFrame({"kind": kernel_kind(m), "ape": err.abs(), "err": err}).groupby("kind", sort=False)
            .agg(kernels=("ape", "size"), **{"MAPE %": ("ape", "mean"), "bias %": ("err", "mean")}).reset_index())


def plot_kernels(k: pd.DataFrame):
    """Predicted against measured ms of the measured kernel rows, one colour per ``kernel_kind``, log axes, the
    exact line dashed. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    m = k.dropna(subset=["measured_ms", "pred_ms"])
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for kind, g in m.groupby(kernel_kind(m), sort=False):
        ax.scatter(g["measured_ms"].astype(float), g["pred_ms"].astype(float), s=14, label=kind)
    if len(m):
        lo = float(m[["measured_ms", "pred_ms"]].astype(float).min().min()) / 2
        hi = float(m[["measured_ms", "pred_ms"]].astype(float).max().max()) * 2
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log"); ax.set_yscale("log")
    ax.set_xlabel("measured (ms)"); ax.set_ylabel("predicted (ms)")
    ax.set_title("Kernels on this GPU (dashed: exact)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


# ---------------------------------------------------------------- whole models on the GPU
def load_model_config(model):
    """trace.load_config when the tracer is there, else the release's HF JSON; a config passes through."""
    if not isinstance(model, str):
        return model
    try:
        from neusight_core import trace
        return trace.load_config(model)
    except ImportError:
        from transformers import AutoConfig
        from neusight_core import paths
        return AutoConfig.from_pretrained(str(Path(paths.model_configs_dir()) / f"{model}.json"))


def model_callable(model, batch: int, seq: int, mode: str, device: str = "cuda", compile: bool = False,
                   num_layers: int | None = None, dtype=None, past: int = 0) -> Callable[[], object]:
    """Random-weight HF model (eager attention; no KV cache unless ``past``) -> zero-arg inference, decode or
    fwd+bwd call.

    ``num_layers`` cuts the block count (Llama-2-70B: measure fewer layers, scale to the full model).
    ``compile`` wraps the model in torch.compile (the fused case of the paper's -fusion labels).
    ``past`` > 0 (inference): one decode step of ``seq`` new tokens on a KV cache of ``past`` tokens, filled
    once by a prefill here; each call appends to the cache and crops it back, so every call sees ``past``.
    """
    import copy
    import torch
    from transformers import AutoModelForCausalLM, AutoModel, AutoModelForImageClassification
    from neusight_core import configs
    cfg = copy.deepcopy(load_model_config(model))
    # an image model (ResNet, ViT; issue 26) takes a batch of square images of side ``seq``, as the tracer does
    image = configs.is_image_model(cfg)
    if image and past:
        raise ValueError(f"a decode step (past > 0) is for text decoders, not the image model {cfg.model_type!r}")
    if image and hasattr(cfg, "image_size"):
        cfg.image_size = int(seq)
    if num_layers is not None:
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if hasattr(cfg, key):
                setattr(cfg, key, int(num_layers))
    cfg.use_cache = bool(past)
    cfg._attn_implementation = "eager"
    # Built on the device in its dtype: a 13B model initialised on the host in FP32 took minutes and 52 GB
    # of host memory before it reached the GPU, and a BF16 model cast there after an FP32 build needs 1.5x
    # its memory on the GPU. The weights are random either way (the latency does not depend on them).
    dt = dtype or torch.float32
    with torch.device(device):
        if image:
            m = AutoModelForImageClassification.from_config(cfg, dtype=dt)
        else:
            try:
                m = AutoModelForCausalLM.from_config(cfg, dtype=dt)
            except ValueError:
                m = AutoModel.from_config(cfg, dtype=dt)
    m = m.to(device=device, dtype=dt)
    if image:
        inputs = {"pixel_values": torch.randn(batch, int(cfg.num_channels), seq, seq, device=device, dtype=dt)}
    else:
        ids = torch.randint(0, int(cfg.vocab_size), (batch, seq), device=device)
        inputs = {"input_ids": ids}
    run = torch.compile(m) if compile else m
    if past:
        if mode != "inf":
            raise ValueError("a decode step (past > 0) is inference only")
        m.eval()
        with torch.no_grad():
            cache = m(input_ids=torch.randint(0, int(cfg.vocab_size), (batch, int(past)), device=device),
                      use_cache=True).past_key_values

        def decode():
            with torch.no_grad():
                out = run(input_ids=ids, past_key_values=cache, use_cache=True)
            # back to the prompt, so that the next call decodes the same step (a negative crop drops that many
            # tokens: transformers 5.23 refuses a positive one, 4.x and 5.x take this form)
            cache.crop(-int(seq))
            return out
        return decode
    if mode == "inf":
        m.eval()

        def call():
            with torch.no_grad():
                return run(**inputs)
        return call
    m.train()

    def step():
        out = run(**inputs)
        logits = out.logits if hasattr(out, "logits") else out.last_hidden_state
        loss = logits.float().mean()
        loss.backward()          # optimizer step excluded, as in the paper
        m.zero_grad(set_to_none=True)
    return step


def measure_model(model, batch: int, seq: int, mode: str, timer=None, cfg: HarnessConfig | None = None,
                  budget: TimeBudget | None = None, device: str = "cuda", compile: bool = False,
                  num_layers: int | None = None, past: int = 0) -> Measurement:
    """Build + measure one model configuration; OOM while building is recorded like OOM while running.
    On CUDA the peak memory of the whole run (weights + step) is noted in ``last_peak_memory_gib``."""
    global last_peak_memory_gib
    last_peak_memory_gib = None
    # building a large model (and compiling it) takes seconds to minutes: none is started once the budget is spent
    if budget is not None and budget.remaining() <= 0:
        return Measurement("BUDGET", reason="time budget exhausted before this model was built")
    if device == "cuda":
        import torch
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    try:
        fn = model_callable(model, batch, seq, mode, device, compile, num_layers, dtype=_dtype(cfg), past=past)
    except Exception as e:  # noqa: BLE001
        if _is_oom(e):
            _free_cuda()
            return Measurement("OOM", reason="out of memory building the model")
        return Measurement("ERROR", reason=f"building the model failed: {_one_line(e)}")
    try:
        return measure(fn, timer, cfg, budget)
    except Exception as e:  # noqa: BLE001 - e.g. torch.compile without a working compiler on this machine:
        # recorded on this configuration (the tables show it), and the other configurations are still measured
        return Measurement("ERROR", reason=_one_line(e))
    finally:
        del fn
        if device == "cuda":
            import torch
            if torch.cuda.is_available():
                last_peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
        _free_cuda()


last_peak_memory_gib: float | None = None   # peak CUDA memory of the last measure_model (GiB)


# ---------------------------------------------------------------- predictions (degrade cleanly)
def predict_kernels(kernels: pd.DataFrame, device_name: str, predictor: str = "neusight",
                    quick: bool = False) -> tuple[np.ndarray | None, str | None]:
    """Per-row predicted ms, or (None, reason) when the predictors/catalogue are not available."""
    try:
        from neusight_core import devices, predictors
        dev = devices.get_device(device_name)
        return np.asarray(predictors.get(predictor, quick=quick).predict(kernels, dev), float), None
    except Exception as e:  # noqa: BLE001 - reported, never replaced by a number
        return None, f"prediction unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


NOT_POSSIBLE = "not possible: "


def predict_model(model: str, device_name: str, batch: int, seq: int, mode: str, **kw) -> tuple[dict | None, str | None]:
    """latency.predict_model's headline numbers, or (None, reason); in the paper's setting (eager attention, the
    kernel sum: ``scenario.PAPER``, what these sections measure) unless ``kw`` says otherwise."""
    from neusight_core import latency
    from neusight_core.scenario import PAPER
    try:
        r = latency.predict_model(model, device_name, batch, seq, mode, **{**PAPER, **kw})
        out = {k: float(r[k]) for k in ("e2e_ms", "fw_ms", "bw_ms", "acc_ms", "comm_ms") if k in r}
        mem = r.get("memory") or {}
        out.update({f"mem_{k}": float(mem[k]) for k in ("total_gib", "weights_gib", "activations_gib", "kv_cache_gib") if k in mem})
        if "fits" in mem:
            out["mem_fits"] = bool(mem["fits"])
        return out, None
    except latency.LatencyInputError as e:  # the configuration cannot run there: an answer, not a failure
        return None, f"{NOT_POSSIBLE}{str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001
        return None, f"prediction unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# ---------------------------------------------------------------- scenarios
#: run_live's sections of model scenarios (one row per scenario, ``predicted`` and ``measured_ms``), in order
MODEL_SECTIONS = ("paper", "llama", "vision", "parallel")


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    batch: int
    seq: int
    mode: str                      # inf | train
    parallel: str | None = None    # dp | tp | pp
    gpus: int = 1
    gpu: str = ""                  # catalogue GPU the scenario is stated for ("" = local/target)
    extension: bool = False
    note: str = ""
    past: int = 0                  # KV-cache length for a decode step (extension)


# sequence length of each paper model in the release's label names
SEQ = {"bert_large": 512, "switchxl4": 512, "gpt2_large": 1024, "gpt3_xl": 2048, "gpt3_27": 2048, "opt_13": 2048}


def paper_scenarios(models=None, batches=None, quick: bool = False) -> list[Scenario]:
    models = models or (["gpt2_large"] if quick else ["bert_large", "gpt2_large", "gpt3_xl", "opt_13", "gpt3_27"])
    batches = batches or ([4] if quick else [2, 4, 8])
    out = []
    for m in models:
        seq = SEQ.get(m, 2048)
        for b in batches:
            for mode in ("inf", "train"):
                out.append(Scenario(f"{m}-{mode}-{seq}-{b}", m, b, seq, mode))
    return out


def llama_scenarios(quick: bool = False) -> list[Scenario]:
    s = [Scenario("llama2_7b-prefill-2048", "llama2_7b", 1, 2048, "inf", extension=True),
         Scenario("llama2_13b-prefill-2048", "llama2_13b", 1, 2048, "inf", extension=True),
         Scenario("llama2_70b-prefill-2048", "llama2_70b", 1, 2048, "inf", extension=True,
                  note="measured with fewer layers; full model = measured x 80 / measured layers "
                       "(transformer blocks are identical; embedding/head counted once, a small error)")]
    # one decode step after a 2048-token prompt: 1 new token attending to 2048 cached ones
    s += [Scenario(f"{m}-decode-after-2048", m, 1, 1, "inf", extension=True, past=2048,
                   note="one decode step on a KV cache of 2048 tokens (measured with the cache filled by a prefill, "
                        "cropped back after each step)")
          for m in ("llama2_7b", "llama2_13b", "llama2_70b")]
    return [s[0], s[3]] if quick else s


def vision_scenarios(quick: bool = False) -> list[Scenario]:
    """ResNet-50 and ViT-B/16 (issue 26) at 224 x 224, inference and training, in the paper's protocol (FP32, TF32
    off): models the paper did not measure, so extensions. ``seq`` is the image side."""
    note = "image model (issue 26); seq is the image side in pixels"
    s = [Scenario(f"{m}-{mode}-224px-{b}", m, b, 224, mode, extension=True, note=note)
         for m, mode, b in (("resnet50", "inf", 32), ("resnet50", "inf", 128), ("resnet50", "train", 64),
                            ("vit_b16", "inf", 32), ("vit_b16", "train", 32))]
    return s[:1] if quick else s


def parallel_scenarios() -> list[Scenario]:
    return [Scenario("gpt2_large-train-dp8-a100", "gpt2_large", 8, 1024, "train", "dp", 8, "NVIDIA_A100-SXM4-40GB", True),
            Scenario("llama2_13b-inf-tp4-a100", "llama2_13b", 1, 2048, "inf", "tp", 4, "NVIDIA_A100-SXM4-40GB", True),
            Scenario("gpt2_large-train-1024-4-dp4", "gpt2_large", 4, 1024, "train", "dp", 4, "NVIDIA_A100-SXM4-40GB"),
            Scenario("gpt2_large-train-1024-4-tp4", "gpt2_large", 4, 1024, "train", "tp", 4, "NVIDIA_A100-SXM4-40GB"),
            Scenario("gpt2_large-train-1024-4-pp4_1", "gpt2_large", 4, 1024, "train", "pp", 4, "NVIDIA_A100-SXM4-40GB")]


def multi_gpu_skip_reason(needed: int) -> str | None:
    have = gpu_count()
    return None if have >= needed else f"needs {needed} GPUs, this machine has {have}"


def author_label(device_name: str, scenario_name: str) -> float | None:
    """The authors' measured e2e latency (ms) for the same GPU/config, if the release has it."""
    try:
        from neusight_core import paths
        p = Path(paths.labels_dir()) / device_name / f"{scenario_name}.json"
        return float(json.loads(p.read_text())["e2e_latency"]) if p.exists() else None
    except Exception:  # noqa: BLE001
        return None


def label_gap(measured_ms, label_ms, threshold_pct: float = 15.0) -> dict:
    """Our measurement vs the authors' label for the same GPU/config; > 15 % apart = software stack differs."""
    from neusight_core import report
    gap = float(report.ape(label_ms, measured_ms)) if (measured_ms is not None and label_ms) else None
    return {"author_label_ms": label_ms, "label_gap_pct": gap,
            "flag_stack_differs": None if gap is None else bool(gap > threshold_pct)}


def write_json(output_dir, name: str, body: dict) -> Path:
    from neusight_core import report
    p = report.out_dir(output_dir) / f"{name}.json"
    p.write_text(json.dumps(report.jsonable(body), indent=2, allow_nan=False))
    return p


def detected_to_dict(d: DetectedDevice) -> dict:
    x = asdict(d) if d.device is None else {**{k: v for k, v in asdict(d).items() if k != "device"},
                                           "device": asdict(d.device) if hasattr(d.device, "__dataclass_fields__") else str(d.device)}
    x["estimated_fields"] = list(d.estimated_fields)
    return x


# ---------------------------------------------------------------- the notebook's driver
def run_live(output_dir, quick: bool = False, models=None, batches=None, time_budget_s: float = 3600,
             target_gpu: str = "NVIDIA_H100_80GB_HBM3", precision: str = "fp32", timer=None,
             llama_precision: str = "bf16") -> dict:
    """Every section of notebooks/05_live_gpu: measure what the machine allows, predict the rest.

    ``precision`` is that of the paper's models (fp32 = the paper's protocol); ``llama_precision`` that
    of the Llama-2 scenarios (bf16 by default, as people run them; "fp32" = the paper's protocol),
    predicted with ``dtype=llama_precision`` and measured in it. Every model scenario carries the
    predicted memory (``predicted_mem_*``, without optimizer state: the measured step has no optimizer step)
    and, on a GPU, ``measured_peak_gib`` (``torch.cuda.max_memory_allocated`` of the run: weights + one step).

    Without a GPU every measured field is null with ``skipped_reason``; predictions are made for
    ``target_gpu`` and labelled prediction-only. Writes live_*.json, fusion_*.json, parallel_*.json.
    """
    from neusight_core import report
    budget = TimeBudget(time_budget_s)
    skip = no_gpu_reason()
    props = local_properties()
    det = identify(props) if props else None
    # An unknown local GPU is predicted with its derived catalogue entry (the warning names the
    # estimated fields); without a GPU, predictions are for target_gpu.
    dev_name = det.name if det and det.known else target_gpu
    dev_arg = det.device if det and not det.known and det.device is not None else dev_name
    if dev_arg is not dev_name:
        dev_name = dev_arg.name
    head = {"device": detected_to_dict(det) if det else None, "predicted_for": dev_name,
            "prediction_only": det is None, "precision": precision,
            "precision_label": "paper protocol (FP32, TF32 off)" if precision == "fp32" else f"extension: {precision}",
            "protocol": f"{WARMUP} warm-up, {RUNS} timed runs, mean of {FASTEST} fastest (CUDA events)",
            "software": software_versions(), "skipped_reason": skip}
    cfg = HarnessConfig(precision=precision)
    if not skip:
        set_precision(precision)

    # kernels
    k = pd.concat([kernel_sweep(quick), conv_kernel_sweep(quick)], ignore_index=True)
    k = skipped_measurements(k, skip) if skip else measure_kernels(k, timer, cfg, section_budget(budget, "kernels"))
    pred, why = predict_kernels(k, dev_arg, quick=quick)
    k["pred_ms"] = pred if pred is not None else None
    k["pred_reason"] = why
    if pred is not None:
        k["ape"] = [report.ape(m, p) if m is not None and not pd.isna(m) else None for m, p in zip(k["measured_ms"], pred)]
    write_json(output_dir, "live_kernels", {**head, "rows": k.to_dict(orient="records")})

    def _models(scen, name, prec=precision, section=None):
        rows = []
        sbudget = section_budget(budget, section) if section else budget
        mcfg = cfg if prec == precision else HarnessConfig(precision=prec)
        for s in scen:
            # optimizer "none": the measured training step has no optimizer step (the paper's protocol), so its
            # peak memory holds no optimizer state; the predicted memory is that of the same step
            p, why = predict_model(s.model, dev_arg if not s.gpu else s.gpu, s.batch, s.seq, s.mode, quick=quick,
                                   **({"parallel": s.parallel, "gpus": s.gpus} if s.parallel else {}),
                                   **({"past": s.past} if s.past else {}), dtype=prec, optimizer="none")
            mskip = skip or (multi_gpu_skip_reason(s.gpus) if s.gpus > 1 else None)
            if not mskip and s.gpus > 1:
                mskip = "multi-GPU measurement (torch.distributed, one process per GPU) not implemented in this version"
            meas, layers, peak = None, None, None
            if not mskip:
                layers = 8 if s.model == "llama2_70b" else None
                if prec != precision:
                    set_precision(prec)
                mm = measure_model(s.model, s.batch, s.seq, s.mode, timer, mcfg, sbudget, num_layers=layers,
                                   past=s.past)
                peak = None if layers else last_peak_memory_gib   # a cut 70B model's memory is not the model's
                if prec != precision:
                    set_precision(precision)
                meas = mm.mean_ms if mm.status == "OK" else None
                mskip = None if mm.status == "OK" else f"{mm.status}: {mm.reason}"
            full = meas * 80 / layers if (meas is not None and layers) else meas
            rows.append({**asdict(s), "precision": prec, "predicted": p, "predicted_reason": why, "measured_ms": full,
                         "measured_layers": layers, "measured_peak_gib": peak, "skipped_reason": mskip,
                         **label_gap(full, author_label(dev_name if not s.gpu else s.gpu, s.name))})
        write_json(output_dir, name, {**head, "rows": rows})
        return rows

    paper = _models(paper_scenarios(models, batches, quick), "live_models", section="paper")
    llama = _models(llama_scenarios(quick), "live_llama", llama_precision, section="llama")
    vision = _models(vision_scenarios(quick), "live_vision", section="vision")
    fus = []
    fbudget = section_budget(budget, "fusion")
    for s in paper_scenarios(models, batches, quick):
        if s.mode != "inf":
            continue
        pe, w1 = predict_model(s.model, dev_arg, s.batch, s.seq, s.mode, fusion=False, quick=quick)
        pf, w2 = predict_model(s.model, dev_arg, s.batch, s.seq, s.mode, fusion=True, quick=quick)
        me = mc = None
        if not skip:
            me = measure_model(s.model, s.batch, s.seq, s.mode, timer, cfg, fbudget)
            mc = measure_model(s.model, s.batch, s.seq, s.mode, timer, cfg, fbudget, compile=True)
        fus.append({**asdict(s), "pred_eager": pe, "pred_fused": pf, "predicted_reason": w1 or w2,
                    "measured_eager_ms": me.mean_ms if me else None, "measured_compile_ms": mc.mean_ms if mc else None,
                    "skipped_reason": skip or "; ".join(f"{x.status}: {x.reason}" for x in (me, mc) if x.status != "OK") or None,
                    "author_label_fusion_ms": author_label(dev_name, s.name + "-fusion")})
    write_json(output_dir, "fusion_live", {**head, "rows": fus})
    par = _models(parallel_scenarios(), "parallel_live")
    return {"head": head, "kernels": k, "paper": pd.DataFrame(paper), "llama": pd.DataFrame(llama),
            "vision": pd.DataFrame(vision),
            "fusion": pd.DataFrame(fus), "parallel": pd.DataFrame(par), "skip": skip}


def recorded_predictions(folder, gpu: str, seeds=(0, 1, 2), predictor: str = "neusight",
                         quick: bool = False) -> pd.DataFrame:
    """A recorded run of this notebook (``docs/tier2/<run>``: ``live_paper.csv`` in its precision, FP32,
    ``live_llama.csv`` in BF16, ``live_vision.csv`` in FP32) predicted again here for ``gpu`` with every seed of
    ``predictor``: one row per measured scenario and seed with ``measured_ms``, ``recorded_pred_ms`` (what the run
    predicted, seed 0), ``pred_ms``, ``ape`` and ``err`` (signed, %). The run's notebook predicted with seed 0 only."""
    from pathlib import Path

    from neusight_core import latency, predictors, report
    rows = []
    preds = {s: predictors.get(predictor, quick=quick, seed=s) for s in seeds}
    for table, default_dtype in (("live_paper", "fp32"), ("live_llama", "bf16"), ("live_vision", "fp32")):
        f = Path(folder) / f"{table}.csv"
        if not f.is_file():
            continue
        d = pd.read_csv(f).dropna(subset=["measured_ms"])
        for r in d.to_dict(orient="records"):
            dtype = str(r.get("precision") or default_dtype)
            past = int(r["past"]) if pd.notna(r.get("past")) and r.get("past") else 0
            for s, p in preds.items():
                out = latency.predict_model(str(r["model"]), gpu, int(r["batch"]), int(r["seq"]), str(r["mode"]),
                                            predictor=p, dtype=dtype, **({"past": past} if past else {}),
                                            attention="eager", execution="graph")
                rows.append({"table": table, "name": r["name"], "precision": dtype, "seed": s,
                             "measured_ms": float(r["measured_ms"]),
                             "recorded_pred_ms": float(r.get("predicted_e2e_ms", np.nan)), "pred_ms": out["e2e_ms"]})
    out = pd.DataFrame(rows)
    if len(out):
        out["ape"] = report.ape(out["measured_ms"], out["pred_ms"])
        out["err"] = (out["pred_ms"] / out["measured_ms"] - 1) * 100
    return out


def flat_table(df: pd.DataFrame) -> pd.DataFrame:
    """A scenario frame of run_live with its dict columns spread out: ``predicted`` -> ``predicted_e2e_ms``,
    ``predicted_fw_ms``, ...; ``pred_eager``/``pred_fused`` likewise (so the tables show the numbers)."""
    out = df.copy()
    for col in [c for c in df.columns if df[c].map(lambda v: isinstance(v, dict)).any()]:
        spread = pd.DataFrame([v if isinstance(v, dict) else {} for v in df[col]], index=df.index)
        spread.columns = [f"{col}_{k}" for k in spread.columns]
        out = pd.concat([out.drop(columns=[col]), spread], axis=1)
    return out


RECORDED_RUNS = "docs/tier2.md (H100 and H200, 2026-11-26)"


def summary_markdown(r: dict, quick: bool = False) -> str:
    """The notebook's summary.md: status line and one row per model/parallel scenario with the prediction,
    the measurement (or why there is none) and the authors' label for the same GPU where the release has one."""
    head = r["head"]
    status, reason = outcome(r)
    lines = [f"**05_live_gpu {status}** — " + (f"{reason}. " if status == "FAILED" else "")
             + (f"{r['skip']}. Predictions only, for {head['predicted_for']}." if r["skip"]
                else f"measured on {head['device']['display_name']} ({head['precision_label']}).")
             + (" QUICK mode: subset of scenarios, predictors trained on a data subset." if quick else "")
             # no number from another machine here: only where recorded runs are, so that nobody takes them for this one's
             + (f" Runs of this notebook recorded on other machines (not this run): {RECORDED_RUNS}." if r["skip"] else ""),
             "", "| scenario | GPU | predicted e2e (ms) | measured (ms) | authors' label (ms) |", "|---|---|---:|---:|---:|"]
    for sec in MODEL_SECTIONS:
        for s in r.get(sec, pd.DataFrame()).to_dict(orient="records"):
            p = (s.get("predicted") or {}).get("e2e_ms")
            gpu = s.get("gpu") or head["predicted_for"]
            meas = f"{s['measured_ms']:.1f}" if pd.notna(s.get("measured_ms")) else "SKIPPED"
            lab = f"{s['author_label_ms']:.1f}" if pd.notna(s.get("author_label_ms")) and s.get("author_label_ms") else "—"
            ext = " (extension)" if s.get("extension") else ""
            lines.append(f"| {s['name']}{ext} | {gpu} | {'—' if p is None else f'{p:.1f}'} | {meas} | {lab} |")
    return "\n".join(lines)


def outcome(r: dict) -> tuple[str, str]:
    """(status, reason) of notebook 05 for metrics.json: FAILED when any prediction failed (a broken
    device file, a missing predictor ...: never reported as SKIPPED), else SKIPPED when nothing could
    be measured, else OK. A configuration rejected as impossible on its GPU is an answer, not a failure."""
    failed, total = [], 0
    k = r.get("kernels", pd.DataFrame())
    if len(k):
        total += 1
        if k["pred_ms"].isna().all() if "pred_ms" in k else True:
            failed.append(("kernel sweep", str(k["pred_reason"].iloc[0]) if "pred_reason" in k else "no prediction"))
    for sec in MODEL_SECTIONS + ("fusion",):
        for row in r.get(sec, pd.DataFrame()).to_dict(orient="records"):
            preds = [row.get("predicted")] if sec != "fusion" else [row.get("pred_eager"), row.get("pred_fused")]
            total += 1
            why = str(row.get("predicted_reason") or "")
            if any(p is None or (isinstance(p, float) and np.isnan(p)) for p in preds) and not why.startswith(NOT_POSSIBLE):
                failed.append((row.get("name", sec), why or "no prediction"))
    if failed:
        name, why = failed[0]
        return "FAILED", f"{len(failed)} of {total} predictions failed (first: {name}: {why})"
    if r["skip"]:
        return "SKIPPED", r["skip"]
    return "OK", ""


def tier2_verdicts(r: dict, status: str, reason: str, quick: bool = False) -> dict:
    """The ``verdicts`` key of notebook 05's metrics.json (Tier 2, contract in docs/interfaces.md)."""
    from neusight_core import report
    rows = [x for sec in MODEL_SECTIONS for x in r.get(sec, pd.DataFrame()).to_dict(orient="records")]
    measured = [x for x in rows if x.get("measured_ms") is not None and pd.notna(x.get("measured_ms"))]
    predicted = [x for x in rows if x.get("predicted")]
    if status == "FAILED":
        text = reason
    elif not measured:
        text = (f"SKIPPED: {r['skip'] or 'nothing measured'}; predictions only, for {r['head']['predicted_for']} "
                f"({len(predicted)} of {len(rows)} scenarios predicted)")
    else:
        # the paper's scenarios apart from the extensions (Llama-2, vision, ...): one MAPE would mix what the
        # paper validated with what it never measured
        def mape(xs):
            a = [report.ape(x["measured_ms"], x["predicted"]["e2e_ms"]) for x in xs if x.get("predicted")]
            return (f"{np.mean(a):.1f} % over {len(a)}" if a else "none"), len(a)
        core = mape([x for x in measured if not x.get("extension")])[0]
        ext, n_ext = mape([x for x in measured if x.get("extension")])
        # rows come back from frames: a missing label is NaN there, not None
        with_label = [x for x in measured if pd.notna(x.get("label_gap_pct"))]
        flags = [x for x in with_label if x.get("flag_stack_differs") is True]
        errors = [x for x in rows if str(x.get("skipped_reason") or "").startswith("ERROR")]
        text = (f"measured {len(measured)} scenarios on {r['head']['device'].get('display_name', '?')}; our prediction vs "
                f"our measurement MAPE {core}" + (f" (extensions, extrapolated: {ext})" if n_ext else "")
                + "; our measurement vs the authors' label: "
                f"{len(flags)} of {len(with_label)} more than 15 % apart"
                + (f"; {len(errors)} measurement(s) failed (ERROR, reason in the tables)" if errors else ""))
    return {"tier": 2, "label": "live GPU", "quick": bool(quick), "summary": text}
