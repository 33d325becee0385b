"""Notebook 05's modern section: BF16 Hugging Face steps as people run them today.

The paper times FP32 models with eager attention at batch sizes where the GPU is busy. Here a current open
model (configs written by us from the public config.json files, random weights) runs in BF16 with the
attention Hugging Face picks by default (``sdpa``: one fused kernel per layer) and, for comparison, eager
attention; prefill, one decode step on a KV cache, and a training step (forward + backward, no optimizer).

Each step is timed three ways in one loop, because each answers a different question:
- ``events_ms``: CUDA events around the call, mean of the 5 fastest of 25 (the paper's protocol);
- ``wall_ms`` / ``host_ms``: the host clock around the call with the queue drained first (median), and until
  the call returned to Python without waiting for the GPU: ``host_ms`` close to ``wall_ms`` means the host,
  not the GPU, set the pace;
- ``graph_ms``: the same step captured once in a CUDA graph and replayed (no host dispatch: what
  ``torch.compile`` with cudagraphs or a serving engine runs);
and ``kernel_ms`` / ``kernels``: the GPU time of the step's kernels and their count (profiler).

``host_calibration`` measures the host's per-launch cost: a trivial CUDA kernel launched back to back, and
the same tiny op on CPU tensors (a micro-benchmark any machine can run). Everything here is validation: no
measurement is ever fed to a predictor's ``fit``. Runs on CPU with ``device="cpu"`` (tests; no graph, no
profiler kernels), on a GPU with ``device="cuda"``.
"""
from __future__ import annotations

import csv
import json
import statistics
import time
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Callable

from neusight_core.studies import live, live_harness, live_kernels
from neusight_core.question.step import PAPER
from neusight_core.question.schema import Attention, Execution, Grads, Mode, Precision

# current open models of ours (model_configs), small to large: the small ones host-bound in eager PyTorch at batch 1
MODERN_MODELS = ("llama3_2_1b", "qwen2_5_1_5b", "llama2_7b", "llama3_8b")
STEP_PHASES = ("prefill", "decode", "train")
MEASURED_ATTENTIONS = (Attention.SDPA, Attention.EAGER)
STEP_KEY = ["model", "phase", "batch", "seq", "attention"]       # what names one measured step
STEP_COLUMNS = ("model", "phase", "batch", "seq", "attention", "status", "reason", "events_ms", "wall_ms", "host_ms",
           "graph_ms", "graph_status", "kernel_ms", "kernels", "attention_kernels", "peak_gib")


@dataclass(frozen=True)
class ModernCase:
    model: str
    phase: str        # prefill | decode | train
    batch: int
    seq: int          # prompt tokens (prefill, train) or tokens already in the KV cache (decode)
    attention: str    # sdpa | eager

    @property
    def name(self) -> str:
        return f"{self.model} {self.phase} b{self.batch} s{self.seq} {self.attention}"


def modern_cases(models=MODERN_MODELS, quick: bool = False) -> list[ModernCase]:
    """Per model: sdpa prefill (batch 1 x 2,048 and 8 x 512), decode (batch 1 and 32) and training (1 x 1,024),
    then eager attention at batch 1 for each phase. Quick: the batch-1 sdpa and eager steps at short lengths."""
    out = []
    for m in models:
        if quick:
            out += [ModernCase(m, "prefill", 1, 64, a) for a in MEASURED_ATTENTIONS]
            out += [ModernCase(m, "decode", 1, 64, a) for a in MEASURED_ATTENTIONS]
            out += [ModernCase(m, "train", 1, 64, Attention.SDPA)]
            continue
        out += [ModernCase(m, "prefill", 1, 2048, Attention.SDPA), ModernCase(m, "prefill", 8, 512, Attention.SDPA),
                ModernCase(m, "decode", 1, 2048, Attention.SDPA), ModernCase(m, "decode", 32, 1024, Attention.SDPA),
                ModernCase(m, "train", 1, 1024, Attention.SDPA),
                ModernCase(m, "prefill", 1, 2048, Attention.EAGER), ModernCase(m, "decode", 1, 2048, Attention.EAGER),
                ModernCase(m, "train", 1, 1024, Attention.EAGER)]
    return out


# ---------------------------------------------------------------- the host's per-launch cost
def host_calibration(device: str = "cuda", n: int = 5000) -> dict:
    """Microseconds per call of ``x.add_(1)`` on a one-element tensor, launched back to back: on the CPU
    (the dispatcher alone; runs anywhere) and, on a GPU, as a CUDA launch (host time until the last launch
    returned, and until the GPU finished). Median of 5 repetitions (``host.launch_times``); on a GPU also
    ``host.calibrate``'s per-kernel costs of a tiny Hugging Face model's eager steps (``hf_*``): decode on CPU
    tensors (``hf_per_kernel_cpu_us``, and ``hf_launch_us`` with the CUDA launch added), and decode and training
    on the GPU (``hf_gpu_decode_us``, ``hf_gpu_train_us``), and the GPU's own cost per eager launch (``eager_gap_us``)."""
    from neusight_core.cost import host
    out = {"cpu_dispatch_us": host.launch_times("cpu", n)[0], "n": n}
    if device == "cuda":
        h, t = host.launch_times("cuda", n)
        out.update(cuda_launch_host_us=h, cuda_launch_total_us=t)
        c = host.calibrate(cuda=True)
        out.update(hf_per_kernel_cpu_us=c["per_kernel_cpu_us"],
                   hf_launch_us=c["per_kernel_cpu_us"] + c["cuda_launch_extra_us"],
                   hf_gpu_decode_us=c.get("gpu_decode_us"), hf_gpu_train_us=c.get("gpu_train_us"),
                   eager_gap_us=c.get("eager_gap_us"))
    return out


# ---------------------------------------------------------------- one model, its steps
def build(model: str, device: str, dtype, num_layers: int | None = None):
    """A random-weight causal LM of config ``model`` on ``device`` in ``dtype``, sdpa attention."""
    import copy
    import torch
    from transformers import AutoModelForCausalLM
    cfg = copy.deepcopy(live.load_model_config(model))
    if num_layers is not None:
        cfg.num_hidden_layers = int(num_layers)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=Attention.SDPA)
    return m.to(device=device, dtype=dtype), cfg


def set_attention(m, attention: str) -> None:
    """Switch a built model between sdpa and eager attention (transformers 5: ``set_attn_implementation``)."""
    if attention not in MEASURED_ATTENTIONS:
        raise ValueError(f"attention must be one of {MEASURED_ATTENTIONS}, not {attention!r}")
    if hasattr(m, "set_attn_implementation"):
        m.set_attn_implementation(attention)
    else:  # older transformers read the config at every forward
        m.config._attn_implementation = attention


def step_callable(m, cfg, case: ModernCase, device: str) -> tuple[Callable[[], object], list]:
    """The zero-argument step of ``case`` and the tensors it reads that must outlive it (the KV cache that
    a captured graph reads)."""
    import torch
    from neusight_core.tracing.meta_device_model import cache_tensors
    vocab = int(cfg.vocab_size)
    set_attention(m, case.attention)
    if case.phase == "train":
        m.train()
        ids = torch.randint(0, vocab, (case.batch, case.seq), device=device)

        def train():
            out = m(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()              # optimizer step excluded, as in the paper and our tracer
            m.zero_grad(set_to_none=True)
        return train, [ids]
    m.eval()
    if case.phase == "prefill":
        ids = torch.randint(0, vocab, (case.batch, case.seq), device=device)

        def prefill():
            with torch.no_grad():
                return m(input_ids=ids, use_cache=False)
        return prefill, [ids]
    if case.phase != "decode":
        raise ValueError(f"phase must be one of {STEP_PHASES}, not {case.phase!r}")
    with torch.no_grad():
        cache = m(input_ids=torch.randint(0, vocab, (case.batch, case.seq), device=device),
                  use_cache=True).past_key_values
    ids = torch.randint(0, vocab, (case.batch, 1), device=device)
    layers = getattr(cache, "layers", None) or []
    kept = [(layer.keys.contiguous(), layer.values.contiguous()) for layer in layers]

    def decode():
        with torch.no_grad():
            out = m(input_ids=ids, past_key_values=cache, use_cache=True)
        cache.crop(-1)                       # back to ``seq`` tokens: every call decodes the same step
        # ...and back to the contiguous tensors: crop leaves a strided view of the appended cache, so the next call
        # would append (torch.cat) to a strided cache, which generation never does (there the cache is the previous
        # append's contiguous output), and a slower copy. Measured on the lent H100 and H200
        # (docs/tier2.md, 2026-11-27): that append ran at 0.60-0.68 TB/s on both GPUs alike, where contiguous
        # appends of the same sizes timed alone reached 1.4-2.6 TB/s (H100) and 2.0-3.6 TB/s (H200).
        for layer, (k, v) in zip(layers, kept):
            layer.keys, layer.values = k, v
        return out
    return decode, [ids, cache, *cache_tensors(cache), *(t for kv in kept for t in kv)]


def time_step(fn: Callable[[], object], device: str, warmup: int = 3, runs: int = 25, fastest: int = 5) -> dict:
    """events_ms (mean of the fastest), wall_ms and host_ms (medians) over ``runs`` calls after ``warmup``."""
    import torch
    cuda = device == "cuda"
    for _ in range(warmup):
        fn()
    ev, wall, host = [], [], []
    for _ in range(runs):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        if cuda:
            a.record()
        fn()
        t1 = time.perf_counter()
        if cuda:
            b.record()
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
        ev.append(a.elapsed_time(b) if cuda else (t2 - t0) * 1e3)
    return {"events_ms": statistics.fmean(sorted(ev)[:fastest]), "wall_ms": statistics.median(wall),
            "host_ms": statistics.median(host)}


ATTENTION_KERNEL_WORDS = ("flash", "fmha", "attention", "sdpa")
#: the kernels per step that modern_kernels.json keeps, by time: 12 until 2026-11-28, which left some steps' smaller
#: GEMM and attention kernels out (benchmarks/step_breakdown.py sorts them); 30 since, to keep those too
TOP_KERNELS = 30


def kernel_profile(fn: Callable[[], object], calls: int = 2) -> tuple[float, float, float, list]:
    """GPU kernel time per call (ms), kernels per call, fused-attention kernels per call, and the ``TOP_KERNELS``
    kernels of most time (name, ms per call, count per call). The profiler's CUDA activity: kernels, memsets and
    copies."""
    import torch
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total, count, attn, by_name = 0.0, 0, 0, {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        total += us
        count += 1
        low = e.name.lower()
        attn += any(w in low for w in ATTENTION_KERNEL_WORDS)
        t, c = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (t + us, c + 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    return (total / calls / 1e3, count / calls, attn / calls,
            [(n[:120], t / calls / 1e3, c / calls) for n, (t, c) in top])


def graph_time(fn: Callable[[], object], warmup: int = 3, runs: int = 25, fastest: int = 5) -> float:
    """The step captured in one CUDA graph, replayed: mean of the fastest ``fastest`` of ``runs`` (events)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):       # warm-up on a side stream, as torch.cuda.graph asks
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ev = []
    for i in range(warmup + runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        if i >= warmup:
            ev.append(a.elapsed_time(b))
    del g
    return statistics.fmean(sorted(ev)[:fastest])


def measure_case(m, cfg, case: ModernCase, device: str, graph: bool = True) -> tuple[dict, list]:
    """One case's row (``STEP_COLUMNS``) and its top kernels; OOM and errors are recorded in the row."""
    import torch
    row = {**asdict(case), "status": "OK", "reason": ""}
    top: list = []
    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        fn, keep = step_callable(m, cfg, case, device)
        row.update(time_step(fn, device))
        if cuda:
            try:
                row["kernel_ms"], row["kernels"], row["attention_kernels"], top = kernel_profile(fn)
            except Exception as e:  # noqa: BLE001 - the profiler is optional: the timings stand without it
                row["reason"] = f"profiler: {live_harness.error_line(e)[:200]}"
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if graph:
                try:
                    torch.cuda.empty_cache()
                    row["graph_ms"], row["graph_status"] = graph_time(fn), "OK"
                except Exception as e:  # noqa: BLE001 - a step that cannot be captured keeps its eager numbers
                    row["graph_status"] = ("OOM" if live_harness.is_oom(e) else "ERROR: ") + live_harness.error_line(e)[:200]
                    torch.cuda.synchronize()
        del fn, keep
    except Exception as e:  # noqa: BLE001 - recorded on this case; the other cases are still measured
        row["status"] = "OOM" if live_harness.is_oom(e) else "ERROR"
        row["reason"] = live_harness.error_line(e)[:300]
    finally:
        if m is not None:
            m.zero_grad(set_to_none=True)
        live_harness.free_cuda()
    return row, top


def run_modern(out_dir, cases: list[ModernCase] | None = None, device: str = "cuda", time_budget_s: float = 300,
               dtype: str = Precision.BF16, num_layers: int | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """Measure ``cases`` (default ``modern_cases()``), model by model, into ``out_dir``/modern_steps.csv (written
    after every case, so a run cut short keeps what it measured), modern_kernels.json (top kernels per case),
    modern_host.json (``host_calibration``) and modern_memory_kernels.csv (``live_kernels.measure_memory_kernels``,
    a tenth of the budget: small shapes off a GPU). Cases the budget leaves out say BUDGET."""
    import torch
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = list(cases if cases is not None else modern_cases())
    tdt = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16, Precision.FP32: torch.float32}[dtype]
    clock = live_harness.TimeBudget(time_budget_s)
    host = host_calibration(device)
    host.update(live_harness.software_versions())
    (out / "modern_host.json").write_text(json.dumps(host, indent=1))
    log(f"[modern] host: {json.dumps({k: v for k, v in host.items() if k.endswith('_us')})}")
    # the KV-cache appends of decode steps and same-size copies, on a tenth of the budget (live_kernels); a failure
    # here is logged and costs the steps below nothing
    try:
        mem = live_kernels.measure_memory_kernels(out / "modern_memory_kernels.csv", device, clock.share(0.1, 1),
                                                  quick=device != "cuda")
        gbs = mem.groupby("aten_op")["achieved_gbs"].median()
        log(f"[modern] memory kernels: {int((mem['status'] == 'OK').sum())} of {len(mem)} measured; median GB/s "
            + ", ".join(f"{op.split('.')[1]} {v:.0f}" for op, v in gbs.items()))
    except Exception as e:  # noqa: BLE001 - the steps are what the section is for
        log(f"[modern] memory kernels failed: {live_harness.error_line(e)[:250]}")
    rows, tops = [], {}
    def key(c):        # a config object (tests) is its own model
        return c.model if isinstance(c.model, str) else id(c.model)
    models = list({key(c): c.model for c in cases}.items())
    for i, (k, model) in enumerate(models):
        share = clock.share(1.0, len(models) - i)
        mine = [c for c in cases if key(c) == k]
        m = cfg = None
        if share.remaining() > 0:
            try:
                m, cfg = build(model, device, tdt, num_layers)
            except Exception as e:  # noqa: BLE001
                rows += [{**asdict(c), "status": "OOM" if live_harness.is_oom(e) else "ERROR",
                          "reason": f"building the model failed: {live_harness.error_line(e)[:250]}"} for c in mine]
                mine = []
        for c in mine:
            if m is None or share.remaining() <= 0:
                rows.append({**asdict(c), "status": "BUDGET", "reason": "time budget exhausted before this case"})
                continue
            t0 = time.monotonic()
            row, top = measure_case(m, cfg, c, device)
            rows.append(row)
            tops[c.name] = top
            log(f"[modern] {c.name}: {row['status']} events {row.get('events_ms', float('nan')):.2f} ms, wall "
                f"{row.get('wall_ms', float('nan')):.2f}, host {row.get('host_ms', float('nan')):.2f}, graph "
                f"{row.get('graph_ms', float('nan')):.2f}, kernels {row.get('kernel_ms', float('nan')):.2f} ms / "
                f"{row.get('kernels', 0):.0f} ({time.monotonic() - t0:.1f} s) {row.get('reason', '')}")
            _write_rows(out / "modern_steps.csv", rows)
        del m
        live_harness.free_cuda()
    _write_rows(out / "modern_steps.csv", rows)
    (out / "modern_kernels.json").write_text(json.dumps(tops, indent=1))
    return rows


# ---------------------------------------------------------------- predictions against the measurements
#: What each measured time is compared with: the kernel sum with the steps executed as a graph, the eager wall
#: time with eager execution (host.py), and the paper's setting: what the tool answered before it modelled today's
#: steps (eager attention whatever the step ran, the kernel sum, no host) against the eager wall time. Named for what
#: it is, so that a table or legend that shows it says so (it was called "before").
PAPER_SETTING = "paper's setting"
VARIANTS = {"graph": ("kernel_ms", Execution.GRAPH), "eager": ("wall_ms", Execution.EAGER), PAPER_SETTING: ("wall_ms", PAPER_SETTING)}


def request_of(row, device: str, execution: str, grads: str = Grads.FRESH) -> dict:
    """The engine request of a measured step (``modern_steps.csv`` row): prefill = inference of ``seq`` tokens,
    decode = one token on a KV cache of ``seq``, train = forward + backward of ``seq`` tokens from no gradients
    (``step_callable`` sets them to None after each step: ``grads`` fresh; ``accumulate`` for the answer before
    that was modelled); BF16. ``PAPER_SETTING``: what the tool answered before it modelled today's steps (the
    paper's setting: eager attention, the kernel sum)."""
    phase, s = row["phase"], int(row["seq"])
    req = dict(model=row["model"], device=device, batch=int(row["batch"]), dtype=Precision.BF16,
               mode=Mode.TRAIN if phase == "train" else Mode.INF, seq=1 if phase == "decode" else s,
               past=s if phase == "decode" else 0)
    if execution == PAPER_SETTING:
        return dict(req, **PAPER)
    return dict(req, attention=row["attention"], execution=execution, grads=grads)


def predict_steps(steps, device: str = "H100", predictors=("neusight", "roofline"), seeds=(0,),
                  quick: bool = False, grads: str = Grads.FRESH):
    """Every measured OK step x ``VARIANTS`` x predictor x seed through ``engine.predict``: one row each with
    ``measured_ms`` (the variant's measured column), ``predicted_ms``, ``error_pct`` and the prediction's host
    time and verdict (``grads``: ``request_of``'s)."""
    import pandas as pd
    from neusight_core.cost import engine
    from neusight_core.cost import request
    ok = steps[steps["status"] == "OK"].reset_index(drop=True)
    frames = []
    for variant, (col, execution) in VARIANTS.items():
        reqs = [request_of(r, device, execution, grads) for r in ok.to_dict("records")]
        p = engine.predict(request.parse(reqs), list(predictors), seeds=seeds, quick=quick)
        n = len(ok)
        for j in range(len(p) // max(n, 1)):
            part = p.iloc[j * n:(j + 1) * n].reset_index(drop=True)
            f = ok[STEP_KEY].copy()
            f["variant"], f["predictor"], f["seed"] = variant, part["predictor"], part["seed"]
            f["measured_ms"] = ok[col].astype(float)
            f["predicted_ms"] = part["e2e_ms"].astype(float)
            f["kernel_pred_ms"], f["host_pred_ms"] = part["kernel_ms"], part["host_ms"]
            f["host_bound"] = part["host_bound"]
            f["error"] = part["error"]
            frames.append(f)
    out = pd.concat(frames, ignore_index=True)
    out["error_pct"] = (out["predicted_ms"] / out["measured_ms"] - 1) * 100
    return out


def step_mape(pred):
    """MAPE (%) by predictor x variant x phase and pooled, mean over seeds with min and max."""
    import pandas as pd
    d = pred.assign(ape=pred["error_pct"].abs())
    per = d.groupby(["predictor", "variant", "seed", "phase"])["ape"].mean().unstack("phase")
    per["pooled"] = d.groupby(["predictor", "variant", "seed"])["ape"].mean()
    g = per.groupby(["predictor", "variant"])
    out = pd.concat({"mean": g.mean(), "min": g.min(), "max": g.max()}, axis=1).round(1)
    out.columns = [f"{a} {b}" for a, b in out.columns]          # "mean pooled", "min decode", ...
    return out


#: What notebook 05's modern-step tables hold, the line above each Markdown table (``report.save_table``'s ``title``;
#: ``table_title``): the metric, the variants and the seeds, which the columns ("mean pooled", "min decode") do not say.
STEP_TABLE_TITLES = {
    "mape": "{run}: MAPE (%) of the measured steps per predictor x variant (graph: against the kernel sums; eager and "
            "paper's setting (eager attention, the kernel sum, no host): against the eager wall times), by phase and "
            "pooled; mean, min and max over {seeds}.",
    "run_to_run": "The floor: one recorded run's measurements taken as the prediction of another run of the same GPU "
                  "kind, MAPE (%) by phase and pooled, of the kernel sums and of the eager wall times; steps: the OK "
                  "steps both runs measured (a count). No predictor, no seed.",
    "two_machines": "MAPE (%) against two machines' range (a prediction between a step's two measurements counts as "
                    "exact), per GPU x harness x predictor x variant, by phase and pooled; mean, min and max over "
                    "{seeds}; steps: a count.",
}


def table_title(name: str, seeds=(0,), run: str = "") -> str:
    """The title line of notebook 05's modern table ``name`` (``STEP_TABLE_TITLES``) over ``seeds``, of ``run``."""
    seeds = [int(x) for x in seeds]
    over = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    return STEP_TABLE_TITLES[name].format(seeds=over, run=run)


#: The recorded runs of this section (docs/tier2/<run>/modern_steps.csv): name -> (GPU, folder). Those of 2026-11-26
#: and -27 append decode steps to the strided cache the crop left; later ``step_callable`` restores a contiguous one.
RECORDED = {f"recorded {gpu} {day}": (gpu, f"docs/tier2/{day}-{gpu.lower()}-modern")
            for day in ("2026-11-26", "2026-11-27", "2026-11-28") for gpu in ("H100", "H200")}
RECORDED.update({f"recorded {g} 2026-11-28 ({i})": (g, f"docs/tier2/2026-11-28-{g.lower()}-modern-{x}")
                 for g, i, x in (("H100", 2, 2), ("H100", 3, 3), ("H200", 2, "paths"))})
#: the runs whose decode steps appended to a strided cache: compared with each other only (``recorded_agreement``)
STRIDED_APPENDS = {n for n in RECORDED if "2026-11-28" not in n}


def recorded_agreement() -> "pd.DataFrame":
    """The floor under any prediction of these steps: each recorded run's measurement taken as the prediction of
    every other run of the same GPU kind and harness (``STRIDED_APPENDS``: another machine, another day, or the
    same machine minutes later), MAPE % on their common OK steps, by phase and pooled, for the kernel sums and the
    eager wall times (``benchmarks/wall_reproducibility.py``)."""
    import pandas as pd
    from neusight_core import paths
    key = STEP_KEY
    by_gpu: dict[str, list] = {}
    for name, (gpu, folder) in RECORDED.items():
        s = pd.read_csv(paths.REPO_ROOT / folder / "modern_steps.csv")
        by_gpu.setdefault(gpu, []).append((name, s[s["status"] == "OK"]))
    rows = []
    for gpu, runs in by_gpu.items():
        for na, a in runs:
            for nb, b in [r for r in runs if r[0] != na and (r[0] in STRIDED_APPENDS) == (na in STRIDED_APPENDS)]:
                for col, what in (("kernel_ms", "kernel sums"), ("wall_ms", "eager walls")):
                    m = a[key + [col]].merge(b[key + [col]], on=key, suffixes=("_a", "_b")).dropna()
                    ape = (m[f"{col}_a"] / m[f"{col}_b"] - 1).abs() * 100
                    rows.append({"GPU": gpu, "measured": what, "taken as prediction": na, "of": nb,
                                 **ape.groupby(m["phase"]).mean().round(1).to_dict(), "pooled": round(ape.mean(), 1),
                                 "steps": len(m)})
    return pd.DataFrame(rows)


def section(out_dir, quick: bool = False, time_budget_s: float = 300, predictors=("neusight", "roofline"),
            seeds=(0,)) -> dict:
    """Notebook 05's modern section: measure on the local GPU (``run_modern``; SKIPPED with the reason without
    one), and predict both the local measurements and the recorded runs (``RECORDED``). Quick: the quick cases
    and 8 steps of each recorded run. Returns ``status``, ``reason``, ``steps`` (local, or None), ``pred`` (every
    prediction, column ``run``), ``mape`` (``step_mape`` per run) and ``agreement`` (``recorded_agreement``)."""
    import pandas as pd
    from neusight_core import paths
    from neusight_core.studies import live_harness
    out = Path(out_dir)
    reason = live_harness.no_gpu_reason()
    runs, steps = {}, None
    if reason is None:
        rows = run_modern(out / "modern", modern_cases(quick=quick), device="cuda", time_budget_s=time_budget_s)
        steps = pd.DataFrame(rows)
        props = live_harness.local_properties()
        runs["local"] = (steps, live_harness.identify(props).name)
    for name, (gpu, folder) in RECORDED.items():
        f = paths.REPO_ROOT / folder / "modern_steps.csv"
        if f.is_file():
            rec = pd.read_csv(f)
            runs[name] = (rec.head(8) if quick else rec, gpu)
    preds = [predict_steps(df, dev, predictors, seeds, quick).assign(run=name) for name, (df, dev) in runs.items()]
    pred = pd.concat(preds, ignore_index=True) if preds else pd.DataFrame()
    mape = {name: step_mape(pred[pred["run"] == name]) for name in runs}
    return {"status": "OK" if reason is None else "SKIPPED", "reason": reason or "", "steps": steps, "pred": pred,
            "mape": mape, "agreement": recorded_agreement()}


def _write_rows(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description="notebook 05's modern section on its own")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    if a.device == "cuda":
        from neusight_core.studies import live_harness
        why = live_harness.no_gpu_reason()
        if why:                       # as the notebook says it: one line, nothing measured, not a failure
            print(f"SKIPPED: {why}")
            raise SystemExit(0)
    run_modern(a.out, modern_cases(quick=a.quick), device=a.device, time_budget_s=a.budget_s)
