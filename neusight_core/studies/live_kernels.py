"""Kernels timed on the local GPU (notebook 05's kernel section): transformer-shaped GEMMs, batched GEMMs and
vector ops, and the distinct convolutions of a ResNet-50 training step, measured with the harness
(``live_harness``), with their per-kind error and scatter; and the memory kernels of BF16 decode steps
(``memory_kernel_sweep``, measured by the modern section). Nothing measured here trains a predictor.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from neusight_core.question.step import Step
from neusight_core.studies.live_harness import HarnessConfig, Measurement, TimeBudget, harness_dtype, is_oom, measure
from neusight_core.question.schema import Mode, OpClass, Precision

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
        rows.append(dict(op_class=OpClass.LINEAR, sub_op="", B=1, M=m, N=n, K=k, H=np.nan,
                         flops=2 * m * n * k, bytes_read=4 * (m * n + n * k + k), bytes_written=4 * m * k))
    for b, m, n, k in bmm:
        rows.append(dict(op_class=OpClass.BMM, sub_op="", B=b, M=m, N=n, K=k, H=np.nan,
                         flops=2 * b * m * n * k, bytes_read=4 * b * (m * n + n * k), bytes_written=4 * b * m * k))
    for b, h in vec:
        n = b * h
        for sub, ins, ops in (("add", 2, 1), ("mul", 2, 1), ("gelu", 1, 1)):
            rows.append(dict(op_class=OpClass.VEC, sub_op=sub, B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
                             flops=ops * n, bytes_read=4 * ins * n, bytes_written=4 * n))
        rows.append(dict(op_class=OpClass.SOFTMAX, sub_op="", B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
                         flops=5 * n, bytes_read=4 * n, bytes_written=4 * n))
        rows.append(dict(op_class=OpClass.LAYERNORM, sub_op="", B=b, M=np.nan, N=np.nan, K=np.nan, H=h,
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
    if row.get("memory_kind") in ELEMENTWISE_KINDS:
        return _elementwise_callable(row, device)
    if c == OpClass.MEM:
        return _memory_callable(row, device)
    if c == OpClass.LINEAR:
        x, w, b = mk(row["M"], row["N"]), mk(row["K"], row["N"]), (mk(row["K"]) if bias else None)
        return lambda: F.linear(x, w, b)
    if c == OpClass.BMM:
        a, b = mk(row["B"], row["M"], row["N"]), mk(row["B"], row["N"], row["K"])
        return lambda: torch.bmm(a, b)
    if c == OpClass.CONV:
        return _conv_callable(row, mk)
    x = mk(row["B"], row["H"])
    if c == OpClass.SOFTMAX:
        return lambda: torch.softmax(x, dim=-1)
    if c == OpClass.LAYERNORM:
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
    from neusight_core.data import dataset
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


#: (batch, KV heads, cached tokens, head dim) of the KV-cache appends of BF16 decode steps: Hugging Face's
#: DynamicCache.update puts each layer's new keys (and values) after its cache with torch.cat along the sequence,
#: which reads and writes the whole cache. 2, 8 and 32 KV heads of 128 are Qwen2.5-1.5B's, Llama-3-8B's and
#: Llama-2-7B's. Inside the recorded decode steps such an append ran at 0.60-0.68 TB/s on the lent H100 and H200
#: alike, on the strided cache that the harness's crop left (docs/tier2.md, 2026-11-27); the release has no kernel of
#: this class: every predictor puts it at the roofline.
#: Appends that move under 4 MB are left out: timed one launch at a time they measure the launch (16-23 us on the
#: lent H100 and H200), not the copy.
KV_APPENDS = tuple((b, h, p, 128) for b in (1, 8) for h in (2, 8, 32) for p in (128, 512, 2048, 8192)
                   if b * h * (p + 1) * 128 * 4 >= 4e6)
QUICK_KV_APPENDS = ((1, 2, 16, 8), (2, 2, 40, 8))


#: BF16 element-wise kernels of Hugging Face models, to check the memory law (``predictors/memory_law.py``) on
#: PyTorch's own kernels, below and above a 50 MB L2, as (rows, row length, kind): ``mul`` (x * y, contiguous: the
#: vectorised kernel the law was fitted on; tokens x a hidden size of 4,096), ``rotary_mul`` (q * cos as Llama's
#: rotary embedding does it: q of [1, heads, 2048, 128] a transposed view, cos of [1, 1, 2048, 128] broadcast;
#: PyTorch's non-vectorised path, about 1.4 TB/s inside the recorded prefill steps on both GPUs; rows = heads x
#: 2,048) and ``to_fp32`` (RMSNorm's upcast, a MEM row). Each moves 1 M to 64 M elements.
ELEMENTWISE_KINDS = ("mul", "rotary_mul", "to_fp32", "rotate_half")
ROTARY_SEQ, ROTARY_HEAD, HIDDEN = 2048, 128, 4096
ELEMENTWISE = tuple(row for m in (1, 4, 16, 64) for row in (
    (256 * m, HIDDEN, "mul"), (4 * m * ROTARY_SEQ, ROTARY_HEAD, "rotary_mul"), (256 * m, HIDDEN, "to_fp32"),
    (4 * m * ROTARY_SEQ, ROTARY_HEAD, "rotate_half")))
QUICK_ELEMENTWISE = ((16, 64, "mul"), (ROTARY_SEQ, 8, "rotary_mul"), (16, 64, "to_fp32"), (ROTARY_SEQ, 8, "rotate_half"))


def elementwise_rows(sizes) -> list[dict]:
    """Kernel-table rows of ``(rows, row length, kind)`` (``ELEMENTWISE``), in the tracer's convention: B rows of H
    elements; a ``rotary_mul`` reads its cos table (2,048 positions x H) once, a ``to_fp32`` writes FP32, a
    ``rotate_half`` is the ``cat`` of two half rows (Llama's rotary ``rotate_half``: on the lent H100 it ran at
    0.84 TB/s inside a prefill step, docs/tier2.md; timed alone here, a kernel measurement)."""
    rows = []
    for b, h, kind in sizes:
        n = float(b) * float(h)
        if kind == "to_fp32":
            rows.append(dict(op_class=OpClass.MEM, aten_op="aten._to_copy.default", sub_op="", flops=0.0,
                             bytes_read=2 * n, bytes_written=4 * n,
                             dtype="float32", precision=Precision.FP32))      # the tracer's: the output's type
        elif kind == "rotate_half":
            rows.append(dict(op_class=OpClass.MEM, aten_op="aten.cat.default", sub_op="", flops=0.0,
                             bytes_read=2 * n, bytes_written=2 * n, dtype="bfloat16", precision=Precision.BF16))
        elif kind in ("mul", "rotary_mul"):
            other = n if kind == "mul" else ROTARY_SEQ * float(h)         # cos: one (position, dim) table
            rows.append(dict(op_class=OpClass.VEC, aten_op="aten.mul.Tensor", sub_op="mul", flops=n,
                             bytes_read=2 * (n + other), bytes_written=2 * n))
        else:
            raise ValueError(f"element-wise sweep: unknown kind {kind!r} (one of {', '.join(ELEMENTWISE_KINDS)})")
        rows[-1].update(B=float(b), M=np.nan, N=np.nan, K=np.nan, H=float(h), memory_kind=kind)
    return rows


def _elementwise_callable(row, device: str) -> Callable[[], object]:
    """An ``elementwise_rows`` row's kernel, from BF16 tensors."""
    import torch
    b, h, kind = int(row["B"]), int(row["H"]), row["memory_kind"]
    if kind == "to_fp32":
        x = torch.randn(b, h, device=device, dtype=torch.bfloat16)
        return lambda: x.float()
    if kind == "mul":
        x, y = (torch.randn(b, h, device=device, dtype=torch.bfloat16) for _ in range(2))
        return lambda: x * y
    heads = max(1, b // ROTARY_SEQ)
    q = torch.randn(1, ROTARY_SEQ, heads, h, device=device, dtype=torch.bfloat16).transpose(1, 2)
    if kind == "rotate_half":         # cat((-x2, x1), -1) of q's halves, as Llama's rotate_half; the neg not timed
        minus_x2, x1 = -q[..., h // 2:], q[..., : h // 2]
        return lambda: torch.cat((minus_x2, x1), dim=-1)
    cos = torch.randn(1, 1, ROTARY_SEQ, h, device=device, dtype=torch.bfloat16)
    return lambda: q * cos


def memory_kernel_sweep(quick: bool = False, appends=None, elementwise=None) -> pd.DataFrame:
    """Each KV-cache append of ``appends`` (default ``KV_APPENDS``) as an ``aten.cat`` row and, beside it, a plain
    copy of the same bytes (``aten.clone``: the bandwidth a copy of that size reaches), in the tracer's convention
    for MEM rows (B = the output's rows, H = its last dimension, bytes read = the inputs', written = the output's)
    in BF16. ``cat_rows`` x ``cat_past`` x H is one cache before the append (rows = batch x KV heads).
    ``cache_layout``: ``contiguous`` (generation's cache: the previous append's output) or, for a second append row,
    ``strided`` (the first ``cat_past`` tokens of a longer buffer: the view a crop leaves, as the recorded decode
    steps had). Timed one launch at a time, a kernel of a few MB or less is bound by the launch (about 16 us here), not
    by its bytes. Then the BF16 element-wise kernels of ``elementwise`` (default ``ELEMENTWISE``; column
    ``memory_kind``: ``kv_append`` / ``copy`` for the rows above)."""
    appends = appends if appends is not None else (QUICK_KV_APPENDS if quick else KV_APPENDS)
    elementwise = elementwise if elementwise is not None else (QUICK_ELEMENTWISE if quick else ELEMENTWISE)
    rows = []
    for b, h, past, d in appends:
        n = b * h * (past + 1) * d              # elements of the cache after the append
        for op, layout in (("aten.cat.default", "contiguous"), ("aten.cat.default", "strided"),
                           ("aten.clone.default", "contiguous")):
            rows.append(dict(op_class=OpClass.MEM, aten_op=op, sub_op="", B=b * h * (past + 1), M=np.nan, N=np.nan,
                             K=np.nan, H=d, flops=0.0, bytes_read=2.0 * n, bytes_written=2.0 * n,
                             cat_rows=b * h, cat_past=past, batch=b, kv_heads=h, cache_layout=layout,
                             memory_kind="kv_append" if op == "aten.cat.default" else "copy"))
    df = pd.DataFrame(rows + elementwise_rows(elementwise))
    df["dtype"] = df["dtype"].fillna("bfloat16") if "dtype" in df else "bfloat16"
    df["precision"] = df["precision"].fillna(Precision.BF16) if "precision" in df else Precision.BF16
    df["count"] = 1
    return df


def _memory_callable(row, device: str) -> Callable[[], object]:
    """A ``memory_kernel_sweep`` row's kernel: the append (cache in the row's layout, then one new token, along
    the sequence) or the copy of the appended cache, in the row's dtype."""
    import torch
    dt = getattr(torch, str(row["dtype"]))
    rows, past, d = int(row["cat_rows"]), int(row["cat_past"]), int(row["H"])
    if row["aten_op"] == "aten.cat.default":
        new = torch.randn(rows, 1, d, device=device, dtype=dt)
        if row.get("cache_layout", "contiguous") == "strided":
            cache = torch.randn(rows, past + 1, d, device=device, dtype=dt)[:, :past]
        else:
            cache = torch.randn(rows, past, d, device=device, dtype=dt)
        return lambda: torch.cat([cache, new], dim=-2)
    if row["aten_op"] == "aten.clone.default":
        x = torch.randn(rows, past + 1, d, device=device, dtype=dt)
        return lambda: x.clone()
    raise ValueError(f"memory kernel sweep: unsupported op {row['aten_op']!r}")


def measure_memory_kernels(path, device: str = "cuda", budget: TimeBudget | None = None,
                           quick: bool = False) -> pd.DataFrame:
    """``memory_kernel_sweep`` timed on ``device`` (CUDA events on a GPU, the wall clock elsewhere: a dry run),
    with the bandwidth each reached (``achieved_gbs``: bytes read and written per second), written to ``path``
    (CSV) whatever the budget leaves out."""
    import time

    def wall_ms(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    k = measure_kernels(memory_kernel_sweep(quick), None if device == "cuda" else wall_ms,
                        HarnessConfig(precision=Precision.BF16), budget, device)
    ms = pd.to_numeric(k["measured_ms"], errors="coerce")
    k["achieved_gbs"] = (k["bytes_read"] + k["bytes_written"]) / (ms * 1e6)
    k.to_csv(path, index=False)
    return k


#: the image model whose convolutions the kernel section measures, and at which batch and image side
CONV_SWEEP = ("resnet50", 32, 224)


def conv_kernel_sweep(quick: bool = False) -> pd.DataFrame:
    """The distinct convolutions of one ResNet-50 training step (``CONV_SWEEP``; forward, dgrad and wgrad rows
    of the tracer, ``count`` = how often each occurs in the step), in the kernel-table convention. The release
    measures forward 3 x 3 stride-1 convolutions only: the strided, 1 x 1 and 7 x 7 ones and every backward row
    are the convolution extrapolations that a GPU can check. Quick: batch 2, one row of each kind."""
    from neusight_core.tracing import trace_cache
    model, batch, size = CONV_SWEEP
    t = trace_cache.trace(Step(model=model, batch=2 if quick else batch, seq=size, mode=Mode.TRAIN))
    conv = t[t["op_class"] == OpClass.CONV]
    keys = ["sub_op", "B", "conv_cin", "conv_cout", "conv_k", "conv_in", "conv_stride", "conv_pad", "conv_groups"]
    rows = (conv.groupby(keys, sort=False, dropna=False)
            .agg(**{c: (c, "first") for c in ("M", "N", "K", "H", "flops", "bytes_read", "bytes_written")},
                 count=("count", "sum"))
            .reset_index())
    rows.insert(0, "op_class", OpClass.CONV)
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
            fn = kernel_callable(row, device, dtype=harness_dtype(cfg))
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
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
    return k["op_class"].where(k["op_class"] != OpClass.CONV, "CONV " + k["sub_op"].astype(str))


def kernel_mape(k: pd.DataFrame) -> pd.DataFrame:
    """Per ``kernel_kind`` of the measured kernel rows: ``kernels`` measured, ``MAPE %`` and ``bias %`` (mean
    signed error) of ``pred_ms`` against ``measured_ms``."""
    m = k.dropna(subset=["measured_ms", "pred_ms"])
    err = (m["pred_ms"] / m["measured_ms"] - 1) * 100
    return (pd.DataFrame({"kind": kernel_kind(m), "ape": err.abs(), "err": err}).groupby("kind", sort=False)
            .agg(kernels=("ape", "size"), **{"MAPE %": ("ape", "mean"), "bias %": ("err", "mean")}).reset_index())
