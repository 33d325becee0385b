"""Memory footprint of a prediction, per GPU, against the device's memory (extension).

``footprint(kernels, device, optimizer="adamw", master_weights=True)`` takes the kernel table ONE GPU
runs (``trace.trace_model`` -> optional ``parallel.apply_plan``) and returns the bytes of

* ``weights``: the GPU's share of the parameters (``TableInfo.params``) in the trace's dtype;
* ``grads`` (training): one gradient per weight, same dtype (gradients kept between steps, as in
  the authors' loop and in ``trace_model(accumulate_grads=True)``);
* ``optimizer`` (training): AdamW keeps two FP32 moments per parameter (8 B); SGD with momentum one
  (4 B); ``none`` nothing. With fp16/bf16 weights and ``master_weights`` (default), an FP32 master
  copy (4 B) too: mixed-precision AdamW = 2 + 2 + 4 + 8 = 16 B per parameter, as FP32 AdamW
  (4 + 4 + 8);
* ``activations``: the peak, over the traced step, of the bytes of every buffer the ops allocate
  (activations, tensors saved for backward, temporaries, new gradients), from the traced tensors'
  sizes and lifetimes (``trace._Recorder``), not from a formula;
* ``kv_cache`` (decode, ``past`` > 0): the cache the step starts from (its growth in the step is in
  the activations);

and ``total`` against the device's memory: ``fits`` or ``does not fit: needs X GiB, has Y GiB``.
Units are GiB (2**30 bytes): the "80 GB" of an H100 or A100 is 80 GiB of HBM (CUDA reports 79.6 and
80.0 GiB), so the catalogue's ``mem_gb`` is read as GiB, as the authors' code does. The CUDA
context, cuBLAS workspaces and allocator fragmentation (typically 1-3 GiB) are not modelled.
Check against the release: every single-GPU training configuration the authors measured (their loop
has no optimizer step, so ``optimizer="none"``) is predicted to fit on its GPU, including GPT-3
2.7B at 75 GiB on the 80 GiB H100 and A100-80GB (tests/test_memory.py).

Parallel plans divide what they divide:

* ``dp``: every GPU holds all weights, gradients and optimizer state (plain DDP, no ZeRO); the
  activations are those of its batch / n (the plan retraced the model at that batch).
* ``tp``: column-parallel linears (weight and bias), row-parallel weights and the vocab-parallel
  embedding / LM head are split n ways, everything else is replicated (the same Megatron split as
  ``parallel.tp_split``); each activation buffer shrinks as the kernel that wrote it does (its bytes
  written after / before the split); the KV cache is split by KV heads, and beyond as many GPUs as KV
  heads (grouped-query attention) each GPU keeps one KV head and its K/V projections (``parallel.kv_ways``).
  A mixture-of-experts layer's expert weights are split n ways too (``tp``: a slice of every expert; ``ep``: 1/n of
  the experts whole; ``parallel_experts``).
* ``pp``: each stage holds the parameters of its layers (embeddings on the first, the head on the
  last); a stage's activations are the peak of the buffers its kernels allocate for one
  micro-batch, plus (m - 1) x what it still holds at the end of the forward pass (GPipe keeps
  every micro-batch's saved tensors until its backward). The worst stage is reported.

Validated on CPU (tests/test_memory.py): the traced activation peak against PyTorch's own
allocation records (``torch.profiler`` with ``profile_memory``) for small real models. On a GPU,
kernels with their own workspaces (cuBLAS, flash attention) and the caching allocator's rounding add
to it; a GPU run measures that (notebook 05).
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pandas as pd

from neusight_core.tracing import table_info
from neusight_core.question import schema
from neusight_core.question.schema import Attention, Mode, OpClass, Plan, Precision

GIB = float(2**30)
OPTIMIZERS = {"adamw": 8.0, "adam": 8.0, "sgd": 4.0, "none": 0.0}   # FP32 state bytes per parameter


class MemoryInputError(ValueError):
    """Bad arguments to footprint (unknown optimizer, a table without a trace's TableInfo)."""


# ------------------------------------------------------------------------------ parameters
def _param_stage(name: str, n: int, num_layers: int) -> int:
    from neusight_core.plans import parallel
    from neusight_core.tracing import trace
    layer = trace.layer_of(name)
    if layer >= 0:
        return min(int(layer // (num_layers / n)), n - 1)
    mod = name.rsplit(".", 1)[0]
    if parallel.EMBED_MODULE.search(mod) or "embed" in name or "wpe" in name:
        return 0
    return n - 1


def _tp_share(name: str, n: int, kv_ways: int | None = None) -> float:
    """Fraction of parameter ``name`` one of n tensor-parallel GPUs holds (K/V projections: 1 / ``kv_ways``,
    ``parallel.kv_ways``: one KV head per GPU at least)."""
    from neusight_core.plans import parallel, parallel_experts
    mod, _, leaf = name.rpartition(".")
    kind = parallel.module_kind(mod)
    if kind == "col" and kv_ways and parallel.KV_MODULE.search(mod):
        return 1.0 / kv_ways
    if kind == "col" or (kind == "row" and leaf == "weight") or parallel.EMBED_MODULE.search(mod):
        return 1.0 / n
    if parallel_experts.holds_experts(mod):      # a slice of every expert (tp) or 1/n of the experts (ep)
        return 1.0 / n
    return 1.0


def _info(kernels: pd.DataFrame) -> "table_info.TableInfo":
    got = table_info.info_or_none(kernels)
    if got is None:
        raise MemoryInputError("footprint needs a kernel table from trace.trace_model (it carries no TableInfo)")
    return got


def param_counts(kernels: pd.DataFrame) -> list[float]:
    """Parameters held per GPU (one entry; PP: one entry per stage)."""
    a = _info(kernels)
    params, plan, n = a.params, a.plan, a.gpus
    if plan in schema.TENSOR_PLANS and n > 1:
        from neusight_core.plans import parallel
        kvw = parallel.kv_ways(a.config, n)
        return [sum(v * _tp_share(k, n, kvw) for k, v in params.items())]
    if plan == Plan.PP and n > 1:
        per = [0.0] * n
        L = a.num_layers or 1
        for k, v in params.items():
            per[_param_stage(k, n, L)] += v
        return per
    return [float(sum(params.values()))]


# ------------------------------------------------------------------------------ activations
def _row_frame(kernels: pd.DataFrame, rows: int) -> pd.DataFrame | None:
    """The kernel rows in trace order (COMM rows of a plan dropped), or None if they do not line up
    with the trace (e.g. a fused table: its memory is the unfused trace's)."""
    k = kernels[kernels["op_class"] != OpClass.COMM] if "op_class" in kernels else kernels
    if len(k) != rows or _info(kernels).fused:
        return None
    return k.reset_index(drop=True)


def _scale(k: pd.DataFrame) -> np.ndarray:
    """Per row, bytes written now / bytes written when traced (a TP split shrinks both)."""
    if "writes" not in k:
        return np.ones(len(k))
    orig = np.array([sum(b for _, b in w) if isinstance(w, tuple) else 0.0 for w in k["writes"]], float)
    now = k["bytes_written"].fillna(0).to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(orig > 0, now / orig, 1.0)
    return np.clip(np.nan_to_num(f, nan=1.0), 0.0, 1.0)


def _timeline(tl, row_factor: np.ndarray, row_stage: np.ndarray | None, stage: int | None,
              last_fw_row: int | None, base_bufs=(), base_factor: float = 1.0):
    """(peak, live bytes just after ``last_fw_row``) of the events without the KV cache the step
    starts from (``base_bufs``, counted at ``base_factor`` of their size, on every stage), each
    buffer scaled by the factor of the row that allocated it and restricted to ``stage``'s rows."""
    row, buf, byt = tl.row, tl.buf, tl.bytes
    nrows = len(row_factor)
    base = set(int(b) for b in base_bufs)
    alloc = byt > 0
    size, keep = {}, {}
    for r, b, x in zip(row[alloc], buf[alloc], byt[alloc]):
        b = int(b)
        rr = min(int(r), nrows - 1) if nrows else 0
        if b in base:
            size[b], keep[b] = x * base_factor, True
            continue
        size[b] = x * (row_factor[rr] if nrows else 1.0)
        keep[b] = stage is None or (row_stage is not None and nrows > 0 and row_stage[rr] == stage)
    start = sum(size[b] for b in base if b in size)
    live, peak, at_fw_end = -start, 0.0, None
    for r, b, x in zip(row, buf, byt):
        if last_fw_row is not None and at_fw_end is None and r > last_fw_row:
            at_fw_end = live
        b = int(b)
        if not keep.get(b, False):
            continue
        live += size[b] if x > 0 else -size[b]
        peak = max(peak, live)
    if at_fw_end is None:
        at_fw_end = live
    return peak, at_fw_end


def activation_bytes(kernels: pd.DataFrame) -> tuple[list[float], list[str]]:
    """Peak activation bytes per GPU (PP: per stage) and notes on how they were obtained."""
    a = _info(kernels)
    mem = a.memory
    if not mem:
        raise MemoryInputError("the kernel table has no memory timeline: trace it with trace.trace_model")
    tl, notes = mem["events"], []
    plan, n = a.plan, a.gpus
    rows = int(tl.row.max()) + 1 if len(tl) else 0
    k = _row_frame(kernels, int(mem.get("rows", rows)))
    if k is None:
        notes.append("activations of the unfused trace (fusion keeps intermediates out of memory: an upper bound)"
                     if a.fused else "activations of the unsplit trace")
        return [mem["activation_peak_bytes"]] * (n if plan == Plan.PP else 1), notes
    kv = mem.get("kv_bufs", ())
    if plan in schema.TENSOR_PLANS and n > 1:
        from neusight_core.plans import parallel
        peak, _ = _timeline(tl, _scale(k), None, None, None, kv, 1.0 / parallel.kv_ways(a.config, n))
        return [peak], notes
    if plan == Plan.PP and n > 1:
        m = a.micro_batches or 1
        st = k["stage"].fillna(0).astype(int).to_numpy()
        fw = np.flatnonzero(k["phase"].to_numpy() == "fw")
        last_fw = int(fw.max()) if len(fw) else None
        out = []
        for s in range(n):
            peak, saved = _timeline(tl, np.ones(len(k)), st, s, last_fw, kv, 1.0 / n)
            out.append(peak + (m - 1) * saved)
        if m > 1:
            notes.append(f"GPipe: each stage keeps the saved tensors of {m} micro-batches")
        return out, notes
    return [mem["activation_peak_bytes"]], notes


# ------------------------------------------------------------------------------ footprint
def footprint(kernels: pd.DataFrame, device=None, optimizer: str = "adamw", master_weights: bool = True) -> dict:
    """Per-GPU memory of the step the table describes (see the module docstring)."""
    if optimizer not in OPTIMIZERS:
        raise MemoryInputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return footprint_of(**footprint_parts(kernels), device=device, optimizer=optimizer, master_weights=master_weights)


def footprint_parts(kernels: pd.DataFrame) -> dict:
    """What ``footprint`` reads of a kernel table, as ``footprint_of``'s keyword arguments (no device, no optimizer):
    kept instead of the table where many tables are predicted (the engine, a sweep)."""
    a = _info(kernels)
    plan, n = a.plan, a.gpus
    acts, notes = activation_bytes(kernels)
    kv = float((a.memory or {}).get("kv_cache_bytes", 0.0))
    if plan in schema.TENSOR_PLANS and n > 1:            # split by KV heads, one KV head per GPU at least
        from neusight_core.plans import parallel
        kv /= parallel.kv_ways(a.config, n)
    elif plan == Plan.PP and n > 1:
        kv /= n
    return dict(params=param_counts(kernels), acts=acts, kv=kv, dtype=a.dtype, mode=a.mode,
                notes=notes, plan=plan, n=n)


def footprint_of(params: list[float], acts: list[float], kv: float, dtype: str, mode: str, device=None,
                 optimizer: str = "adamw", master_weights: bool = True, notes=(), plan=None, n: int = 1) -> dict:
    """``footprint`` from its parts: parameters and activation bytes per GPU (PP: per stage), the KV cache's
    bytes per GPU, the trace's dtype and mode (a derived table's parts come from ``family_memory``)."""
    if optimizer not in OPTIMIZERS:
        raise MemoryInputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    e = schema.element_bytes(dtype)
    train = mode == Mode.TRAIN
    opt_per_param = OPTIMIZERS[optimizer] + (4.0 if master_weights and e == 2 else 0.0)
    per = []
    for p, act in zip(params if len(params) > 1 else params * len(acts), acts):
        w = p * e
        g = p * e if train else 0.0
        o = p * opt_per_param if train else 0.0
        per.append({"weights": w, "grads": g, "optimizer": o, "activations": act, "kv_cache": kv,
                    "total": w + g + o + act + kv})
    worst = int(np.argmax([x["total"] for x in per]))
    r = per[worst]
    out = {f"{key}_gib": r[key] / GIB for key in ("weights", "grads", "optimizer", "activations", "kv_cache", "total")}
    out["params_per_gpu"] = float(params[worst if len(params) > 1 else 0])
    out["dtype"] = dtype
    out["optimizer"] = optimizer if train else None
    out["master_weights"] = bool(master_weights and e == 2 and train)
    out["per_gpu"] = plan is not None and n > 1
    out["gpus"] = n
    if plan == Plan.PP and n > 1:
        out["stage"] = worst
        out["stage_total_gib"] = [x["total"] / GIB for x in per]
    if device is not None:
        from neusight_core.data import devices
        dev = devices.get_device(device)
        out["device"] = dev.name
        out["device_gib"] = float(dev.mem_gb)
        out["fits"] = bool(r["total"] <= dev.mem_gb * GIB)
        where = " per GPU" if out["per_gpu"] else ""
        out["verdict"] = ("fits" if out["fits"] else
                          f"does not fit: needs {r['total'] / GIB:.1f} GiB{where}, has {dev.mem_gb:g} GiB")
    out["notes"] = list(notes)
    return out


def format_footprint(m: dict) -> list[str]:
    """Text lines for the CLI."""
    where = f" per GPU ({m['gpus']} GPUs" + (f", worst stage {m['stage']}" if "stage" in m else "") + ")" \
        if m.get("per_gpu") else ""
    head = f"memory{where}: {m['total_gib']:.2f} GiB of {m['device_gib']:g} GiB -> {m['verdict']}" \
        if "device_gib" in m else f"memory{where}: {m['total_gib']:.2f} GiB"
    lines = [head]
    for key, label in (("weights_gib", "weights"), ("grads_gib", "gradients"), ("optimizer_gib", "optimizer"),
                       ("activations_gib", "activations (peak)"), ("kv_cache_gib", "KV cache")):
        if m.get(key):
            lines.append(f"    {label:<19} {m[key]:10.2f} GiB")
    if m.get("optimizer"):
        lines.append(f"    ({m['optimizer']}, {m['dtype']}"
                     + (", FP32 master weights" if m.get("master_weights") else "") + ")")
    lines += [f"    note: {x}" for x in m.get("notes", [])]
    return lines


# ------------------------------------------------------------------------------ CPU measurement
@contextlib.contextmanager
def _native_stderr_silenced():
    """Send the process's stderr (file descriptor 2) to /dev/null for the block: libkineto writes "USDT: ...
    profiler_start / profiler_stop" there from C++ at every profile (16 lines in notebook 06's memory check), which
    Python's sys.stderr cannot catch. Python errors raised in the block still propagate as exceptions."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def measure_cpu_peak(config, batch: int, seq: int, mode: str = Mode.TRAIN, seed: int = 0, model=None) -> dict:
    """Run one step of a small REAL model on this CPU and return PyTorch's own account of its memory.

    The model is built from ``config`` (a ``transformers`` config with ``architectures``; pass
    ``model`` to reuse one) in FP32 with eager attention, no KV cache (as the tracer). Training = forward + loss +
    backward with gradients already allocated (as ``trace_model(accumulate_grads=True)``);
    inference = a ``no_grad`` forward. The allocator's own records (``torch.profiler`` with
    ``profile_memory=True``: every allocation and free of the CPU allocator, with sizes) give
    ``peak_bytes`` = the highest sum of bytes allocated during the step and still alive, which is
    what ``activation_peak_bytes`` predicts. Weights and gradients exist before the step.
    """
    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    if model is None:
        model = build_cpu_model(config, seed)
    train = mode == Mode.TRAIN
    model.train(train)
    torch.manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    if train:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if train:
            out = model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
            del out
        else:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
    for p in model.parameters():
        p.grad = None
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    events.sort()
    live = np.cumsum([b for _, b in events]) if events else np.zeros(1)
    return {"peak_bytes": float(live.max()), "allocations": sum(1 for _, b in events if b > 0),
            "params": int(sum(p.numel() for p in model.parameters()))}


def build_cpu_model(config, seed: int = 0):
    """A real FP32 CPU model of ``config`` with eager attention and its usual random initialisation."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, config.architectures[0])
    return cls._from_config(config, attn_implementation=Attention.EAGER, dtype=torch.float32).float()


def min_memory_gb(dims: dict, batch: int, seq: int, mode: str, parallel, gpus: int, past: int = 0,
                  dtype: str = Precision.FP32) -> float:
    """A lower bound of the memory one GPU needs (GB, in ``dtype``): the weights (attention 4h^2 + MLP 2hI per
    layer + embeddings, sharded over the GPUs for TP/PP) + one hidden-state tensor + the KV cache.
    Training needs far more (gradients, optimizer-free activations); the full footprint is not modelled here."""
    L, h = dims.get("number of layers", 1), dims.get("hidden size", 1)
    weights = L * (4 * h * h + 2 * h * dims.get("intermediate size", 4 * h)) + dims.get("vocabulary size", 0) * h
    shard = gpus if parallel in schema.TENSOR_PLANS + (Plan.PP,) else 1
    b = batch / gpus if parallel in (Plan.DP, Plan.PP) else batch
    # image models (dims["image channels"]): seq is the image side and the input is b x channels x side^2
    act = b * seq * seq * dims["image channels"] if "image channels" in dims else b * seq * h
    kv = 2 * L * b * past * h / (gpus if parallel in schema.TENSOR_PLANS else 1)
    return schema.element_bytes(dtype) * (weights / shard * (2 if mode == Mode.TRAIN else 1) + act + kv) / 1e9
