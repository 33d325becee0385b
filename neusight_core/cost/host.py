"""The host's share of a step: eager PyTorch launches every kernel from Python, one after another.

A step of eager PyTorch is bound by whichever is slower: the GPU running its kernels, or the host dispatching
them (Python, the module code, the dispatcher, the CUDA launch). The model, with ``n`` launches, kernel sum ``t``
and a per-launch host cost ``h``:

    graph execution (CUDA graphs, torch.compile with cudagraphs, serving engines):  step = t
    eager execution:                                                               step = max(t + n g, n h)

``max`` and not ``t + n h``: the host runs ahead of the GPU while kernels are long (the launch queue holds about
a thousand), so its cost hides under the GPU's, and the GPU waits for the host while kernels are short. On the
lent H100 (docs/tier2/2026-11-26-h100-modern) the host-bound steps' wall time was their host time (decode
steps: 0.1-0.6 % apart) and the GPU-bound ones' was their kernel time plus 1-5 %. ``g`` is that remainder: what the
GPU itself spends on each launch that does not come from a graph (:data:`EAGER_GAP_US`).

``h`` comes from a calibration any machine can run: :func:`calibrate` times one decode step of a tiny Hugging
Face Llama (4 layers of width 64), whose kernels do almost nothing, and divides by the kernels the tracer counts
for it: the host's cost per kernel of eager Hugging Face code. On a GPU machine the step runs on the GPU; on
others on CPU tensors, plus :data:`CUDA_LAUNCH_EXTRA_US` per kernel for the CUDA launch.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from neusight_core.question.step import Step
from neusight_core.question.schema import Attention, Execution, Grads, Mode

#: The CUDA launch's cost beyond the CPU dispatcher's, per kernel: ``x.add_(1)`` on a one-element tensor
#: launched 5,000 times back to back on the lent H100's host (16-core Intel Xeon, torch 2.11, 2026-11-26) took
#: 7.87 and 11.55 us per launch in two runs, the same op on a CPU tensor 4.02 and 6.34 us: 3.85 and 5.21 us more.
CUDA_LAUNCH_EXTRA_US = 4.5

#: The default per-launch host cost h (us): this module's calibration run on the GPU (``calibrate(cuda=True)``, the
#: tiny Llama's eager decode step) on the lent machines of 2026-11-28: 32.4 and 25.5 us on one H100 host two runs
#: apart, 26.2 us on an H200 host (docs/tier2/2026-11-28-*-modern/modern_host.json); the median. Only the
#: calibration set it, not the steps those runs timed. Until then it was the same calibration on CPU tensors on our
#: 2-core test machine scaled to the lent hosts (7.6 us x 2.0 + CUDA_LAUNCH_EXTRA_US = 19.7 us), which the recorded
#: host-bound steps showed to undercount the library work of a GPU launch (docs/tier2.md). Hosts differ: two H100
#: machines (2026-11-26) ran the same decode step at 20.7 and 34.8 ms. Give yours with NEUSIGHT_HOST_LAUNCH_US (or
#: ``neusight host`` on it).
DEFAULT_LAUNCH_US = 26.2

#: The GPU's own cost per eager launch g (us): 500 one-element additions queued behind a sleeping kernel (the host
#: ahead, so that only the GPU is timed) took 2.04 us each on the lent H100 and 1.71 us on the lent H200
#: (2026-11-28), the same kernels replayed from a CUDA graph 1.03 and 0.90 us (docs/tier2/2026-11-28-h100-paths,
#: -h200-modern-paths, ``queued_launch.json``): 1.01 and 0.81 us more per launch; the mean. A kernel measurement:
#: the steps' walls did not set it (they showed the effect: GPU-bound eager steps took 1-5 % more than their kernels).
#: Give your GPU's with NEUSIGHT_EAGER_GAP_US (``neusight host`` on a GPU machine measures it: ``queued_launch_us``).
EAGER_GAP_US = 0.91


def _env_us(name: str, default: float, zero_ok: bool = False) -> float:
    """Microseconds from the environment variable ``name``, else ``default``; a clear error on anything else."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        x = float(v)
    except ValueError:
        x = float("nan")
    if not (np.isfinite(x) and (0 <= x if zero_ok else 0 < x) and x < 1e6):
        raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} number of microseconds, got {v!r}")
    return x


def launch_us() -> float:
    """The per-launch host cost in use: ``NEUSIGHT_HOST_LAUNCH_US`` if set (a positive number of us), else
    ``DEFAULT_LAUNCH_US``."""
    return _env_us("NEUSIGHT_HOST_LAUNCH_US", DEFAULT_LAUNCH_US)


def eager_gap_us() -> float:
    """The GPU's cost per eager launch in use: ``NEUSIGHT_EAGER_GAP_US`` if set (a number of us, 0 or more), else
    ``EAGER_GAP_US``."""
    return _env_us("NEUSIGHT_EAGER_GAP_US", EAGER_GAP_US, zero_ok=True)


def step_ms(kernel_ms, launches, execution, per_launch_us: float | None = None, gap_us: float | None = None):
    """(step ms, host ms, host-bound) of steps with kernel sums ``kernel_ms`` and ``launches`` kernels, each
    executed ``execution`` (eager | graph; arrays or scalars). Graph: the kernel sum, no host time. Eager: the GPU's
    time (kernels plus ``gap_us``, default ``eager_gap_us()``, per launch) or the host's, whichever is longer."""
    h = launch_us() if per_launch_us is None else float(per_launch_us)
    g = eager_gap_us() if gap_us is None else float(gap_us)
    t = np.asarray(kernel_ms, dtype=float)
    eager = np.asarray(execution) == Execution.EAGER
    n = np.asarray(launches, dtype=float)
    host = np.where(eager, n * h / 1e3, 0.0)
    gpu = np.where(eager, t + n * g / 1e3, t)
    return np.maximum(gpu, host), host, eager & (host > gpu)


def _tiny_llama(layers: int = 4):
    """The calibration's model: a Llama of ``layers`` layers (4) of width 64 (its kernels do almost nothing)."""
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=layers, vocab_size=128, max_position_embeddings=64)


def tiny_step_us(device: str = "cpu", repeats: int = 30, layers: int = 4) -> dict:
    """Host us per kernel of a tiny Llama's eager steps on ``device``: one token decoded on a KV cache of 8
    (``decode_us``), and forward + backward of 8 tokens (``train_us``, as notebook 05 times a training step).
    Each is the median of ``repeats`` steps after 5 warm-ups (on a GPU, each step until the GPU finished),
    divided by the kernels the tracer counts for it. On a GPU those kernels take a few us each, so the step is
    the host's time: the dispatcher, the module code, the CUDA launch and the libraries' host work (cuBLAS's
    choice of kernel) that the CPU run does not have. On the CPU the kernels run on the host itself; one thread."""
    import torch
    from transformers import AutoModelForCausalLM
    from neusight_core.tracing import trace
    cfg = _tiny_llama(layers)
    counts = {"decode": int(trace.trace_model(Step(model=cfg, batch=1, seq=1, mode=Mode.INF, past=8, attention=Attention.SDPA))["count"].sum()),
              # the timed step starts from no gradients (zero_grad(set_to_none=True)): no accumulation kernels
              "train": int(trace.trace_model(Step(model=cfg, batch=1, seq=8, mode=Mode.TRAIN, attention=Attention.SDPA, grads=Grads.FRESH))["count"].sum())}
    cuda = device == "cuda"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation=Attention.SDPA).to(device)
        ids = torch.randint(0, 128, (1, 8), device=device)
        one = torch.randint(0, 128, (1, 1), device=device)
        with torch.no_grad():
            cache = m.eval()(ids, use_cache=True).past_key_values

        def decode():
            with torch.no_grad():
                m(one, past_key_values=cache, use_cache=True)
            cache.crop(-1)

        def train():
            m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            m.zero_grad(set_to_none=True)
        out = {}
        for name, fn in (("decode", decode), ("train", train)):
            m.train(name == "train")
            ts = []
            for i in range(5 + repeats):
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                if i >= 5:
                    ts.append(time.perf_counter() - t0)
            out[f"{name}_us"] = statistics.median(ts) * 1e6 / counts[name]
            out[f"{name}_kernels"] = counts[name]
    finally:
        torch.set_num_threads(threads)
    return out


def calibrate(cuda: bool = False, repeats: int = 30) -> dict:
    """The per-launch host cost ``launch_us`` of this machine. With ``cuda`` and a GPU present: the tiny Llama's
    decode step run on the GPU (``tiny_step_us``: ``gpu_decode_us``, and ``gpu_train_us`` for a training step).
    Otherwise: the same step on CPU tensors (``per_kernel_cpu_us``) plus the CUDA launch's extra cost
    (``CUDA_LAUNCH_EXTRA_US``). The CPU figures are always measured; ``launch_source`` says which one is used.

    Why the GPU run where there is one: on the lent GPUs' hosts the CPU-based figure (12.1-24.1 us) fell short of
    the host time per kernel of the recorded host-bound decode steps (18-43 us; docs/tier2.md), which pay for
    library calls and launches the CPU run does not make."""
    import torch
    cpu = tiny_step_us("cpu", repeats)
    out = {"per_kernel_cpu_us": cpu["decode_us"], "kernels": cpu["decode_kernels"],
           "train_per_kernel_cpu_us": cpu["train_us"], "train_kernels": cpu["train_kernels"]}
    if cuda and torch.cuda.is_available():
        gpu, q = tiny_step_us("cuda", repeats), queued_launch_us()
        out.update(eager_gap_us=max(0.0, q["eager_queued_us"] - q["graph_us"]), queued=q)
        out.update(cuda_launch_extra_us=_cuda_launch_extra_us(), extra_source="measured here",
                   gpu_decode_us=gpu["decode_us"], gpu_train_us=gpu["train_us"], launch_us=gpu["decode_us"],
                   launch_source="a tiny Llama's eager decode step on this GPU")
    else:
        out.update(cuda_launch_extra_us=CUDA_LAUNCH_EXTRA_US, extra_source="CUDA_LAUNCH_EXTRA_US (lent H100, 2026-11-26)",
                   launch_us=cpu["decode_us"] + CUDA_LAUNCH_EXTRA_US,
                   launch_source="a tiny Llama's eager decode step on the CPU + CUDA_LAUNCH_EXTRA_US")
    return out


def launch_times(device: str, n: int = 5000) -> tuple[float, float]:
    """us per call of ``x.add_(1)`` on a one-element tensor on ``device`` (cpu | cuda), ``n`` calls back to back
    after 200 warm-ups: until the last call returned to Python (the host's cost) and until the device finished
    (the same on CPU). Median of 5 repetitions."""
    import torch
    cuda = device == "cuda"
    with torch.no_grad():
        x = torch.zeros(1, device=device)
        for _ in range(200):
            x.add_(1)
        host, total = [], []
        for _ in range(5):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                x.add_(1)
            t1 = time.perf_counter()
            if cuda:
                torch.cuda.synchronize()
            host.append((t1 - t0) / n * 1e6)
            total.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(host), statistics.median(total)


def _cuda_launch_extra_us(n: int = 5000) -> float:
    """us per ``x.add_(1)`` launch on the GPU minus the same on the CPU (host time)."""
    return max(0.0, launch_times("cuda", n)[0] - launch_times("cpu", n)[0])


def queued_launch_us(n: int = 500, repeats: int = 5) -> dict:
    """us per one-element ``add_`` on the GPU with ``n`` launches queued behind a sleeping kernel (the host ahead:
    only the GPU is timed), eager and replayed from a CUDA graph; median of ``repeats``. ``n`` stays under the
    launch queue's depth: with 2,000 the host set the pace again (docs/tier2/2026-11-28-h100-modern-3)."""
    import torch
    x = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        x.add_(1)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(n):
                x.add_(1)
    torch.cuda.synchronize()
    eager, graph = [], []
    for _ in range(repeats):
        for out, body in ((eager, lambda: [x.add_(1) for _ in range(n)]), (graph, g.replay)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(40_000_000)        # ~20 ms, longer than queueing n launches takes the host
            a.record()
            body()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / n)
    return {"eager_queued_us": statistics.median(eager), "graph_us": statistics.median(graph), "n": n}
