"""PyTorch's BF16 element-wise, cast and cat kernels timed alone on a GPU, by the path PyTorch runs them on.

The memory law (predictors/memory_law.py) was fitted on NVIDIA's database, whose only element-wise kernel is a
vectorised quantiser. Eager PyTorch runs an element-wise op on one of several kernels (ATen's
``gpu_kernel_impl``): a vectorised one when every operand is contiguous and of one type, an unrolled one when a
contiguous operand needs a type conversion, and a generic one (an offset computed per element) when an operand is a
strided view or broadcast; ``cat`` has its own. Inside a recorded Llama prefill the generic and cat kernels ran at a
third to a half of the law's bandwidth (docs/tier2.md). Here each kind of kernel a Llama step runs is timed alone,
from 0.5 MB to 1.6 GB moved, with its path (``access``, as the tracer labels a row), so that a model of each path
can be fitted on kernel measurements and the steps stay validation.

Timer: CUDA events with the host ahead of the GPU (a ~0.5 ms ``torch.cuda._sleep`` is queued first, so that the
start event waits for it and the kernel is already queued behind it): the kernel's time on the GPU, without the
host's dispatch that one-launch event timings include (``queued_ms``; ``event_ms`` is the plain event timing, as
notebook 05's sweep times, for comparison). Mean of the 5 fastest of 20 after 3 warm-ups. Also the GPU's own time
per queued one-element launch, eager and in a CUDA graph (500 launches: fewer than the launch queue holds).

    python benchmarks/elementwise_paths.py --out DIR          # on a GPU; on a CPU: a dry run on small tensors
    python benchmarks/elementwise_paths.py --fit              # memory_law.fit_paths on the recorded runs
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: name -> access path as timed on 2026-11-28 (the CSV's ``access``: "contiguous" = vectorised, "cat", "reduction";
#: written by hand then). The fit reads the tracer's own label of each kind instead (``traced_access``), which differs
#: for rotary_add (two transposed views laid out alike: vectorised, and timed at the law's rate) and kv_append (a
#: contiguous cat: the law).
KINDS = {"mul": "contiguous", "silu": "contiguous", "clone": "contiguous", "pow_fp32": "contiguous",
         "to_bf16": "contiguous", "weight_mul": "strided", "rsqrt_mul_fp32": "strided", "rotary_mul": "strided",
         "rotary_add": "strided", "to_fp32": "upcast", "rotate_half": "cat", "kv_append": "cat",
         "mean_fp32": "reduction"}
#: kinds timed after the fit (2026-11-28, third call), to check the path's rate on kernels it was not fitted on:
#: rotate_half's negation of a strided half, and the copy of a transposed view into a contiguous one
CHECK_KINDS = {"neg_half": "strided", "transpose_copy": "strided"}
#: the runs whose kernels ``fit`` reads: folder -> GPU
RECORDED = {"docs/tier2/2026-11-28-h100-paths": "H100", "docs/tier2/2026-11-28-h200-modern-paths": "H200"}
FP32_OUT = {"to_fp32", "pow_fp32", "rsqrt_mul_fp32", "mean_fp32"}
HIDDEN, HEAD = 4096, 128
SIZES = tuple(4 ** k for k in range(9, 15))          # elements of the output: 2^18 .. 2^28
QUICK_SIZES = (2 ** 12, 2 ** 14)


def kernel(kind: str, n: int, device: str):
    """(callable, bytes read, bytes written) of ``kind`` with an output of ``n`` elements, bytes counted as the
    tracer counts them (a broadcast operand once, a view's elements as it has them)."""
    import torch
    import torch.nn.functional as F
    bf, f32 = torch.bfloat16, torch.float32
    rows = max(1, n // HIDDEN)
    h = n // rows

    def t(*shape, dt=bf):
        return torch.randn(*shape, device=device, dtype=dt)
    if kind in ("mul", "silu", "clone", "to_fp32", "weight_mul"):
        x = t(rows, h)
        if kind == "mul":
            y = t(rows, h)
            return (lambda: x * y), 4 * n, 2 * n
        if kind == "weight_mul":
            w = t(h)
            return (lambda: x * w), 2 * n + 2 * h, 2 * n
        if kind == "to_fp32":
            return (lambda: x.float()), 2 * n, 4 * n
        return (lambda: F.silu(x)) if kind == "silu" else (lambda: x.clone()), 2 * n, 2 * n
    if kind in ("pow_fp32", "to_bf16", "rsqrt_mul_fp32", "mean_fp32"):
        x = t(rows, h, dt=f32)
        if kind == "pow_fp32":
            return (lambda: x.pow(2)), 4 * n, 4 * n
        if kind == "to_bf16":
            return (lambda: x.to(bf)), 4 * n, 2 * n
        if kind == "rsqrt_mul_fp32":
            r = t(rows, 1, dt=f32)
            return (lambda: x * r), 4 * n + 4 * rows, 4 * n
        return (lambda: x.mean(-1, keepdim=True)), 4 * n, 4 * rows
    # Llama's rotary and cache shapes: (batch 1, heads, tokens, 128) from a (1, tokens, heads, 128) projection
    seq = 2048
    heads = max(1, n // (seq * HEAD))
    s = n // (heads * HEAD)
    q = t(1, s, heads, HEAD).transpose(1, 2)
    if kind == "rotary_mul":
        cos = t(1, 1, s, HEAD)
        return (lambda: q * cos), 2 * n + 2 * s * HEAD, 2 * n
    if kind == "rotary_add":
        k = t(1, s, heads, HEAD).transpose(1, 2)
        return (lambda: q + k), 4 * n, 2 * n
    if kind == "rotate_half":
        a, b = -q[..., HEAD // 2:], q[..., : HEAD // 2]
        return (lambda: torch.cat((a, b), dim=-1)), 2 * n, 2 * n
    if kind == "neg_half":
        half = q[..., HEAD // 2:]
        return (lambda: -half), n, n
    if kind == "transpose_copy":
        return (lambda: q.contiguous()), 2 * n, 2 * n
    if kind == "kv_append":
        cache, new = t(heads, s - 1, HEAD), t(heads, 1, HEAD)
        return (lambda: torch.cat([cache, new], dim=-2)), 2 * n, 2 * n
    raise ValueError(f"unknown kind {kind!r} (one of {', '.join({**KINDS, **CHECK_KINDS})})")


def timed_ms(fn, cuda: bool, queued: bool, warmup: int = 3, runs: int = 20, fastest: int = 5) -> float:
    """Mean of the ``fastest`` of ``runs`` timings in ms (module docstring); the wall clock on a CPU."""
    import torch
    ts = []
    for i in range(warmup + runs):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(1_000_000)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            ts.append(ms)
    return statistics.mean(sorted(ts)[:fastest])


def traced_access(kind: str) -> str:
    """The tracer's ``access`` label (``aten_ops.access``) of ``kind``'s kernel, from small CPU tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from neusight_core.tracing import aten_ops
    seen = []

    class Last(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            base = aten_ops.op_name(func)[0]
            outs, ins = aten_ops.tensors_in(out), aten_ops.tensors_in((args, kwargs or {}))
            c = aten_ops.classify(base, args, kwargs or {}, outs, ins)
            if c is not None:
                seen.append(aten_ops.access(base, c[0], ins, outs))
            return out
    fn, _, _ = kernel(kind, 2 * 2048 * HEAD, "cpu")
    with Last():
        fn()
    return seen[-1]


def recorded_kernels(runs=None):
    """The recorded runs' kernels as kernel-table rows for ``memory_law.fit_paths`` (``access`` = the tracer's)."""
    import pandas as pd
    from neusight_core.question.schema import Precision
    frames = []
    for folder, gpu in (runs or RECORDED).items():
        d = pd.read_csv(ROOT / folder / "elementwise_paths.csv")
        d = d[d["status"] == "OK"].copy()
        d["access"] = d["kind"].map({k: traced_access(k) for k in d["kind"].unique()})
        d["precision"] = [Precision.FP32.value if k in FP32_OUT else Precision.BF16.value for k in d["kind"]]
        d["op_class"] = "VEC"
        d["measured_ms"], d["device"], d["run"] = d["queued_ms"], gpu, Path(folder).name
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def fit_report() -> int:
    """The paths' rates fitted on the recorded kernels, and each kind's error by the law with and without them."""
    import numpy as np
    import pandas as pd
    from neusight_core.predictors import memory_law
    k = recorded_kernels()
    from neusight_core.predictors.training import memory_law_params
    law_p = memory_law_params()
    rates = memory_law.fit_paths(k, law_p)
    print("fitted gamma (output elements / SM / cycle):", {p: round(g, 3) for p, g in rates.items()})
    print("in use (memory_law.PATH_RATE):              ", memory_law.PATH_RATE)
    big = k[k["elements"] >= memory_law.PATH_FIT_MIN_ELEMENTS].reset_index(drop=True)
    law = memory_law.time_ms(big.assign(access=""), None, law_p)
    paths = memory_law.time_ms(big, None, law_p)
    big["law_ape"] = np.abs(law / big["measured_ms"] - 1) * 100
    big["paths_ape"] = np.abs(paths / big["measured_ms"] - 1) * 100
    pd.set_option("display.width", 200)
    print(f"\nAPE % of kernels of >= {memory_law.PATH_FIT_MIN_ELEMENTS:,} elements (training data of the fit)")
    print(big.groupby(["device", "access", "kind"])[["law_ape", "paths_ape"]].mean().round(1).to_string())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--fit", action="store_true", help="fit the paths' rates on the recorded runs (no GPU)")
    a = ap.parse_args(argv)
    if a.fit:
        return fit_report()
    import pandas as pd
    import torch
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    rows = []
    for kind in a.kinds.split(","):
        for n in (SIZES if cuda else QUICK_SIZES):
            try:
                fn, r, w = kernel(kind, n, dev)
                q = timed_ms(fn, cuda, True)
                e = timed_ms(fn, cuda, False)
                rows.append(dict(kind=kind, access={**KINDS, **CHECK_KINDS}[kind], elements=n, bytes_read=r, bytes_written=w,
                                 queued_ms=q, event_ms=e, achieved_gbs=(r + w) / (q * 1e6), status="OK"))
            except Exception as ex:  # noqa: BLE001 - one kernel's failure costs the others nothing
                rows.append(dict(kind=kind, access={**KINDS, **CHECK_KINDS}.get(kind, ""), elements=n, status="ERROR",
                                 reason=str(ex).splitlines()[0][:200]))
            del fn
            print(rows[-1], flush=True)
        if cuda:
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        df.to_csv(Path(a.out) / "elementwise_paths.csv", index=False)
        if cuda:
            import json
            from neusight_core.cost import host
            (Path(a.out) / "queued_launch.json").write_text(json.dumps(host.queued_launch_us(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
