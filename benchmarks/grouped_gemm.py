"""The kernel Hugging Face runs for a mixture-of-experts layer's experts, ``torch._grouped_mm``, timed on the local
GPU against our prediction of it (docs/recipes.md, "Mixture of experts": NVIDIA's database measures other
implementations only). Validation data for docs/tier2/, never training data.

Per model shape (Mixtral 8x7B, Qwen3 30B-A3B) and tokens per call (a decode batch or a prefill), the up (gate and up)
and down projections of every expert, BF16, routing balanced as the tracer assumes it (the routed rows spread evenly
over min(experts, rows) experts); each timed inside a CUDA graph of ``--graph-calls`` launches (no host dispatch in
the time), notebook 05's protocol (warm-up, 25 runs, mean of the 5 fastest), next to ``neusight`` seed 0 and the
roofline on the rows ``studies/moe_eval.kernels`` makes (the tracer's rows).

Then (unless ``--no-block``) the whole MoE block as Hugging Face runs it (``MixtralSparseMoeBlock`` of a one-layer
config of each shape, random BF16 weights, so the router spreads the tokens about evenly): router, routing,
permutation, both grouped GEMMs, activation and weighted sum, timed inside a CUDA graph where it can be captured (else
eagerly, said in ``status``), next to the sum of ``neusight``'s and the roofline's predictions of the block's traced
rows (``moe_eval.block_rows``, the router's GEMM included): ``moe_block.csv``. docs/recipes.md compares the traced
block with NVIDIA's fused layers; this says how fast Hugging Face's own runs.

    python benchmarks/grouped_gemm.py --out DIR              # on a GPU (about a minute on an H100)
    python benchmarks/grouped_gemm.py --out DIR --dry-run    # on the CPU, tiny shapes: the code path only, no numbers
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (hidden, each expert's intermediate size, experts, experts per token): the public configs in model_configs/
SHAPES = {"mixtral_8x7b": (4096, 14336, 8, 2), "qwen3_30b_a3b": (2048, 768, 128, 8)}
TOKENS = (1, 8, 64, 512, 4096, 16384)
DRY = {"tiny": (64, 32, 8, 2)}


def balanced_offsets(rows: int, experts: int):
    """Cumulative row ends per expert (int32) of ``rows`` routed rows spread evenly over min(experts, rows) experts."""
    import torch
    reached = max(1, min(experts, rows))
    per = np.full(reached, rows // reached)
    per[: rows % reached] += 1
    sizes = np.concatenate([per, np.zeros(experts - reached, int)])
    return torch.tensor(np.cumsum(sizes), dtype=torch.int32)


def layers(shapes: dict, tokens, device_name: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "num_tokens": t, "hidden_size": h, "inter_size": i, "num_experts": e, "topk": k,
                          "kernel_source": "torch._grouped_mm", "device": device_name}
                         for m, (h, i, e, k) in shapes.items() for t in tokens])


def graph_timer(calls: int):
    """Times ``fn`` as one replay of a CUDA graph of ``calls`` launches, per launch (ms)."""
    import torch
    graphs = {}

    def timer(fn):
        g = graphs.get(fn)
        if g is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()                                   # warm the kernel outside the capture
            torch.cuda.current_stream().wait_stream(s)
            g = graphs[fn] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(calls):
                    fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / calls
    return timer


def cpu_timer(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def harness(device: str, calls: int):
    """(timer, live_harness config): a CUDA graph of ``calls`` launches and notebook 05's protocol on a GPU; the wall
    clock and three runs on the CPU (a dry run)."""
    from neusight_core.studies import live_harness
    if device == "cuda":
        return graph_timer(calls), live_harness.HarnessConfig(precision="bf16")
    return cpu_timer, live_harness.HarnessConfig(runs=3, fastest=1, warmup=1, precision="bf16")


def measure(frame: pd.DataFrame, device: str, calls: int) -> list:
    """ms per launch of each layer's up and down projections, in ``moe_eval.kernels``'s row order."""
    import torch

    from neusight_core.studies import live_harness
    timer, cfg = harness(device, calls)
    out = []
    for r in frame.itertuples():
        S = int(r.num_tokens) * int(r.topk)
        offs = balanced_offsets(S, int(r.num_experts)).to(device)
        for k, n in ((r.hidden_size, 2 * r.inter_size), (r.inter_size, r.hidden_size)):
            a = torch.randn(S, int(k), dtype=torch.bfloat16, device=device)
            w = torch.randn(int(r.num_experts), int(k), int(n), dtype=torch.bfloat16, device=device)
            fn = (lambda a=a, w=w, offs=offs: torch._grouped_mm(a, w, offs=offs))
            try:
                m = live_harness.measure(fn, timer, cfg)
                out.append((m.mean_ms if m.status == "OK" else np.nan, m.status))
            except Exception as e:  # noqa: BLE001 - one shape's failure is recorded, the others go on
                out.append((np.nan, f"ERROR: {str(e).splitlines()[0][:160]}"))
            del a, w
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def measure_blocks(shapes: dict, tokens, device: str, calls: int, name: str, quick: bool) -> pd.DataFrame:
    """One row per shape x tokens: the measured MoE block (ms per call) and the predictions of its traced rows."""
    import json
    import tempfile

    import torch
    import transformers

    from neusight_core import predictors
    from neusight_core.question.step import Step
    from neusight_core.tracing import trace
    from neusight_core.studies import live_harness, moe_eval
    timer, cfg = harness(device, calls)
    nets, roof = predictors.get("neusight", quick=quick, seed=0), predictors.get("roofline")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for model, (h, i, e, k) in shapes.items():
            body = moe_eval.one_layer_config(h, i, e, k)
            path = Path(d) / f"{model}.json"
            path.write_text(json.dumps(body))
            conf = transformers.AutoConfig.for_model(**{x: v for x, v in body.items() if x != "architectures"})
            torch.manual_seed(0)
            with torch.device(device):                   # initialised where it runs (Mixtral's 2.8 GB of experts)
                block = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16).model.layers[0].mlp
            for t in tokens:
                kern = moe_eval.block_rows(trace.trace_model(Step(model=str(path), batch=int(t), seq=1, mode="inf", dtype="bf16", attention="sdpa")), router=True)
                x = torch.randn(1, int(t), int(h), dtype=torch.bfloat16, device=device)
                fn = (lambda x=x: block(x))
                status = ""
                try:
                    m = live_harness.measure(fn, timer, cfg)
                    ms, status = (m.mean_ms if m.status == "OK" else np.nan), m.status
                except Exception as err:  # noqa: BLE001 - a block that cannot be captured is timed eagerly
                    if device != "cuda":
                        ms, status = np.nan, f"ERROR: {str(err).splitlines()[0][:160]}"
                    else:
                        torch.cuda.synchronize()

                        def eager(fn=fn):
                            t0 = time.perf_counter()
                            fn()
                            torch.cuda.synchronize()
                            return (time.perf_counter() - t0) * 1e3
                        m = live_harness.measure(fn, lambda f: eager(f), cfg)
                        ms = m.mean_ms if m.status == "OK" else np.nan
                        status = f"eager (no CUDA graph: {str(err).splitlines()[0][:100]}); {m.status}"
                rows.append({"device": name, "model": model, "num_tokens": int(t), "kernels": len(kern),
                             "measured_ms": ms, "status": status,
                             "neusight_ms": float(np.sum(nets.predict(kern, name))),
                             "roofline_ms": float(np.sum(roof.predict(kern, name)))})
                del x
            del block
            if device == "cuda":
                torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for grouped_gemm.csv")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: exercise the code, report no numbers")
    ap.add_argument("--device-name", help="catalogue GPU to predict for (default: the local GPU; dry run: H100)")
    ap.add_argument("--graph-calls", type=int, default=20)
    ap.add_argument("--no-block", action="store_true", help="time the grouped GEMMs only, not the whole MoE block")
    a = ap.parse_args(argv)
    import torch

    from neusight_core.data import devices
    from neusight_core import predictors
    from neusight_core.studies import live_harness, moe_eval
    if not a.dry_run and not torch.cuda.is_available():
        print("SKIPPED: no CUDA GPU (use --dry-run to exercise the code on the CPU)")
        return 0
    if a.device_name:
        name = devices.get_device(a.device_name).name
    elif a.dry_run:
        name = devices.get_device("H100").name
    else:
        det = live_harness.identify(live_harness.local_properties())
        if not det.known:
            print(f"SKIPPED: the local GPU {det.display_name!r} is not in the catalogue")
            return 0
        name = det.name
    frame = layers(DRY if a.dry_run else SHAPES, (1, 4, 16) if a.dry_run else TOKENS, name)
    measured = measure(frame, "cpu" if a.dry_run else "cuda", a.graph_calls)
    k = moe_eval.kernels(frame)
    rows = k[["_layer", "B", "M", "N", "K", "flops", "bytes_read", "bytes_written"]].copy()
    rows["projection"] = np.tile(["up", "down"], len(frame))
    for c in ("model", "num_tokens", "num_experts", "topk"):
        rows[c] = frame[c].to_numpy()[rows["_layer"].to_numpy()]
    rows["measured_ms"] = [m for m, _ in measured]
    rows["status"] = [s for _, s in measured]
    rows["neusight_ms"] = predictors.get("neusight", quick=a.dry_run, seed=0).predict(k, None)
    rows["roofline_ms"] = predictors.get("roofline").predict(k, None)
    if a.dry_run:
        rows["measured_ms"] = np.nan                      # CPU times say nothing of a GPU
        rows["status"] = "DRY RUN (CPU): " + rows["status"]
    rows.insert(0, "device", name)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows.drop(columns="_layer").to_csv(out / "grouped_gemm.csv", index=False)
    ok = rows["measured_ms"].notna()
    if ok.any():
        err = (rows.loc[ok, "neusight_ms"] - rows.loc[ok, "measured_ms"]) / rows.loc[ok, "measured_ms"] * 100
        print(f"{name}: {int(ok.sum())} grouped GEMMs, neusight MAPE {err.abs().mean():.1f} %, bias {err.mean():+.1f} %")
    print(rows.drop(columns=["_layer", "bytes_read", "bytes_written"]).round(4).to_string(index=False))
    if not a.no_block:
        blocks = measure_blocks(DRY if a.dry_run else SHAPES, (1, 16) if a.dry_run else TOKENS,
                                "cpu" if a.dry_run else "cuda", a.graph_calls, name, a.dry_run)
        if a.dry_run:
            blocks["measured_ms"] = np.nan
            blocks["status"] = "DRY RUN (CPU): " + blocks["status"].astype(str)
        blocks.to_csv(out / "moe_block.csv", index=False)
        print(blocks.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
