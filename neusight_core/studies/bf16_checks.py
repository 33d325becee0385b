"""What a BF16 answer rests on (notebook 06): which kernels of a bf16 / fp16 prediction were checked against
measurements and at what held-out error (:func:`bf16_validation`), the physical floors of one request's steps and
where the predictions land against them (:func:`floors_table`), and the ways a Llama-2 step runs today, eager or fused
attention, as a graph or in eager PyTorch (:func:`execution_table`). Every number here is a prediction beyond what the
paper validated, and says so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import configs, devices
from neusight_core.cost import latency
from neusight_core.question import schema
from neusight_core.cost.request import parse
from neusight_core.question.schema import Attention, Execution, Mode, OpClass, Plan, Precision
from neusight_core.studies.whatif import H100, catalogue_gpus

def bf16_validation(tensor_core: bool = True, log=None) -> pd.DataFrame:
    """Which kernels of a bf16 / fp16 prediction were checked against measurements, and at what held-out error:
    one row per kernel family (status, GPUs, held-out MAPE), the numbers read from the BF16 log's
    ``held-out-evaluated`` record (``external_eval.held_out_record``), never typed in. ``tensor_core``: the
    predictor has the BF16 networks (``neusight``); without them every family is an extrapolation."""
    import neusight_core.predictors.memory_law as memory_law
    from neusight_core.data import measured_kernels
    from neusight_core.studies import external_eval
    rec = external_eval.held_out_record(log) or {}
    h = rec.get("neusight_held_out_mape_mean_over_seeds") or {}
    split = measured_kernels.split()
    def name(d):
        return devices.get_device(d).display_name.replace("NVIDIA ", "")
    train = ", ".join(name(d) for d in split["training"])

    def held(per_gpu: dict, kind: str = "") -> str:
        got = [f"{name(d.split(' ')[0])} {v:.1f} %" for d, v in per_gpu.items() if not kind or d.endswith(kind)]
        return "; ".join(got) if got else "not evaluated (no held-out-evaluated record)"
    if not tensor_core:
        why = "extrapolation: this predictor has no BF16 networks (FP32-trained networks at the BF16 peak)"
        return pd.DataFrame([{"kernels": k, "op classes": c, "status": why, "trained on": "", "held-out MAPE": ""}
                             for k, c in (("GEMM", "LINEAR, BMM"), ("fused attention", OpClass.ATTN),
                                          ("element-wise, softmax, layernorm", "VEC, SOFTMAX, LAYERNORM"))])
    gemm = held(h.get("gemm_per_gpu", {}))
    p90 = h.get("gemm_p90_per_gpu", {})
    if p90:
        gemm += " (P90 " + "; ".join(f"{name(d)} {v:.0f} %" for d, v in p90.items()) + ")"
    rows = [
        {"kernels": "GEMM", "op classes": "LINEAR, BMM", "status": "validated on measured BF16 kernels (notebook 07)",
         "trained on": train, "held-out MAPE": gemm},
        {"kernels": "fused attention", "op classes": "ATTN (prefill, decode)",
         "status": "validated on measured BF16 kernels (notebook 07), forward only (a backward is its forward's "
                   "network times a stated FLOP ratio); used where a model runs fused attention (sdpa: section "
                   "3c, the CLI's default), not in the what-if grid or the floors table, which trace the paper's "
                   "eager attention (BMM + softmax)",
         "trained on": train, "held-out MAPE": "prefill: " + held(h.get("attention_per_gpu", {}), "ATTN_prefill")
         + " | decode: " + held(h.get("attention_per_gpu", {}), "ATTN_decode")
         + (f" (from the evaluation of {h['attention_from']})" if h.get("attention_from") else "")},
        {"kernels": "element-wise, softmax, layernorm, copies", "op classes": ", ".join(memory_law.LAW_CLASSES),
         "status": "memory law (bytes over the L2's or DRAM's rate, plus a fixed time) fitted on measured BF16 "
                   "element-wise kernels (quantisers); other element-wise kernels, norms and copies: an extrapolation "
                   "of it",
         "trained on": "BF16 -> FP8 element-wise kernels of H100 SXM, H200 SXM, L40S (the A100 SXM has none)",
         "held-out MAPE": "on such kernels: notebook 07, section 5c"}]
    return pd.DataFrame(rows)


def floors(kernels: pd.DataFrame, gpu, weight_bytes: float) -> dict:
    """Physical floors of one step: its GEMM FLOPs (LINEAR, BMM, fused attention; times ``count``) at the GPU's
    dense tensor-core peak of the kernels' precision, and ``weight_bytes`` read once at the memory bandwidth;
    no kernel can beat either (sparsity and caches aside), so a step can beat neither."""
    from neusight_core.predictors import common
    dev = devices.get_device(gpu)
    gemm = kernels["op_class"].isin(common.PEAK_GEMM_CLASSES).to_numpy()
    prec = kernels["precision"].dropna().unique() if "precision" in kernels else []
    half = [p for p in prec if p in schema.HALF_PRECISIONS]
    peak = dev.gemm_peak_gflops(half[0] if half else Precision.FP32) * 1e9
    flops = float((kernels["flops"].fillna(0) * kernels["count"].fillna(1)).to_numpy(float)[gemm].sum())
    return {"gemm_flops": flops, "peak_tflops": peak / 1e12, "flops_floor_ms": flops / peak * 1e3,
            "weight_bytes": float(weight_bytes), "bandwidth_tbs": dev.mem_bw_gbs / 1e3,
            "bytes_floor_ms": float(weight_bytes) / (dev.mem_bw_gbs * 1e9) * 1e3}


def floors_table(model: str = "llama2_7b", gpu=H100, dtype: str = Precision.BF16, seq: int = 2048, predictor="neusight",
                 quick: bool = False) -> pd.DataFrame:
    """One request (batch 1) of ``model``: prefill of ``seq`` tokens and one decode step on a ``seq - 1`` KV cache,
    predicted on one GPU, beside its ``floors`` and the predicted time per kernel family (GEMM = LINEAR + BMM)."""
    from neusight_core.cost import engine
    from neusight_core.predictors import common
    pred = latency.loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    steps = (("prefill", seq, 0), ("decode", 1, seq - 1))
    got = engine.predict(parse([dict(model=model, batch=1, seq=s, mode=Mode.INF, past=past, dtype=dtype, device=gpu,
                                             attention=Attention.EAGER, execution=Execution.GRAPH)
                                        for _, s, past in steps]), [pred],
                         keep_kernels=True, raise_errors=True)
    rows = []
    run = engine.run_info(got)
    for (work, s, past), total, pk, m in zip(steps, got["e2e_ms"], run.kernels, run.memory):
        f = floors(pk, gpu, m["weights_gib"] * 2**30)
        gemm = pk["op_class"].isin(common.PEAK_GEMM_CLASSES)
        # the floor of the GEMMs alone: the larger of their FLOPs at the peak and the weights at the bandwidth
        rows.append({"workload": work, "tokens": s, "kv_cache": past, "predicted_ms": total,
                     "predicted_gemm_ms": float(pk.loc[gemm, "pred_ms"].sum()),
                     "predicted_other_ms": float(pk.loc[~gemm, "pred_ms"].sum()),
                     "flops_floor_ms": f["flops_floor_ms"], "bytes_floor_ms": f["bytes_floor_ms"],
                     "floor_ms": max(f["flops_floor_ms"], f["bytes_floor_ms"]),
                     "predicted / floor": total / max(f["flops_floor_ms"], f["bytes_floor_ms"]),
                     "gemm / floor": float(pk.loc[gemm, "pred_ms"].sum()) / max(f["flops_floor_ms"], f["bytes_floor_ms"]),
                     "gemm_tflop": f["gemm_flops"] / 1e12, "peak_tflops": f["peak_tflops"],
                     "weights_gb": f["weight_bytes"] / 1e9, "bandwidth_tbs": f["bandwidth_tbs"],
                     **{f"{c} ms": float(v) for c, v in pk.groupby("op_class")["pred_ms"].sum().items()}})
    return pd.DataFrame(rows)


def floors_sentence(t: pd.DataFrame) -> str:
    """Where ``floors_table``'s predictions land against the floors, and which kernels make the gap."""
    out = []
    for r in t.to_dict("records"):
        bound = "GEMM FLOPs at the dense peak" if r["flops_floor_ms"] >= r["bytes_floor_ms"] else "weights at the bandwidth"
        other = {k[:-3]: v for k, v in r.items() if k.endswith(" ms") and k[:-3] not in (OpClass.LINEAR, OpClass.BMM, OpClass.ATTN)}
        top = max(other, key=other.get) if other else None
        out.append(f"{r['workload']} ({r['tokens']} token(s), KV cache {r['kv_cache']}): predicted {r['predicted_ms']:.1f} ms, "
                   f"{r['predicted / floor']:.1f}x its floor of {r['floor_ms']:.1f} ms ({bound}); the GEMMs alone "
                   f"{r['predicted_gemm_ms']:.1f} ms ({r['gemm / floor']:.2f}x the floor; the validated kernels), the rest "
                   f"{r['predicted_other_ms']:.1f} ms" + (f", most of it {top} ({other[top]:.1f} ms, an extrapolation)" if top else ""))
    return "; ".join(out) + "."


#: The three ways a Llama-2 step can run today, as (label, attention, execution): the paper's eager
#: attention counted as its kernel sum, fused attention as a graph (serving engines), and fused attention in eager
#: PyTorch (what a Hugging Face script runs, host launches included).
EXECUTION_VARIANTS = (("eager attention, graph", Attention.EAGER, Execution.GRAPH),
                      ("sdpa, graph", Attention.SDPA, Execution.GRAPH),
                      ("sdpa, eager PyTorch", Attention.SDPA, Execution.EAGER))


def execution_table(gpus=None, quick: bool = False, predictor="neusight", seeds=(0,)) -> pd.DataFrame:
    """Llama-2 7B / 13B / 70B in BF16, one request: prefill of 2,048 tokens and one decode step on a 2,048-token
    KV cache, in each of ``EXECUTION_VARIANTS``, on every catalogue GPU (``gpus``), through ``engine.predict``. The
    70B runs tensor-parallel over 8 GPUs (``tp8``; its 140 GB of weights fit no single GPU). Beside each: the
    physical floor per GPU, max(2 x GEMM parameters x tokens / the dense BF16 peak, weights / the memory bandwidth;
    the GEMM parameters are the weights less the input embedding), and
    the memory verdict; a configuration that does not fit says so in ``fit`` (its time is the time it would take).
    Quick: Llama-2-7B at 512 tokens on three GPUs. Every row is an extrapolation (BF16 end to end is validated on the
    H100 only, docs/tier2.md)."""
    from neusight_core.cost import engine
    every = catalogue_gpus()
    gpus = list(gpus or ([g for g in every if g == H100 or "A100-SXM4-40" in g or g.endswith("L4")] if quick
                         else every))
    seq = 512 if quick else 2048
    models = (("llama2_7b", None),) if quick else (("llama2_7b", None), ("llama2_13b", None), ("llama2_70b", 8))
    reqs, meta = [], []
    for model, tp in models:
        for g in gpus:
            for work, s, past in (("prefill", seq, 0), ("decode", 1, seq)):
                for label, att, ex in EXECUTION_VARIANTS:
                    reqs.append(dict(model=model, device=g, batch=1, seq=s, past=past, dtype=Precision.BF16, attention=att,
                                     execution=ex, **({"parallel": Plan.TP, "gpus": tp} if tp else {})))
                    meta.append({"model": model, "plan": f"tp{tp}" if tp else "1 GPU", "workload": work,
                                 "tokens": s, "variant": label})
    df = engine.predict(parse(reqs), predictor, seeds=seeds, quick=quick)
    out = pd.concat([pd.DataFrame(meta * (len(df) // len(meta))), df[["device", "seed", "e2e_ms", "lo_ms", "hi_ms",
                    "kernel_ms", "host_ms", "host_bound", "memory_weights_gib", "memory_fits", "memory_verdict", "error"]]], axis=1)
    dev = {g: devices.get_device(g) for g in out["device"].dropna().unique()}
    # the weights per GPU of each (model, plan, GPU); derived tables (eager attention) have no memory columns
    w = out.groupby(["model", "plan", "device"])["memory_weights_gib"].transform("max").to_numpy(float) * 2**30
    peak = out["device"].map(lambda g: dev[g].gemm_peak_gflops(Precision.BF16) * 1e9 if g in dev else np.nan).to_numpy(float)
    bw = out["device"].map(lambda g: dev[g].mem_bw_gbs * 1e9 if g in dev else np.nan).to_numpy(float)
    # GEMM parameters per GPU: the weights (2 bytes each) less the input embedding, a lookup (split like the rest)
    emb = out["model"].map(lambda m: float(configs.config_content(m)["vocab_size"])
                           * float(configs.config_content(m)["hidden_size"])).to_numpy(float)
    ways = out["plan"].map(lambda p: 1.0 if p == "1 GPU" else float(p[2:])).to_numpy(float)
    gemm_params = w / 2 - emb / ways
    out["floor_ms"] = np.maximum(2 * gemm_params * out["tokens"].to_numpy(float) / peak, w / bw) * 1e3
    out["x_floor"] = out["e2e_ms"] / out["floor_ms"]
    fits = out.groupby(["model", "plan", "device", "workload"])["memory_fits"].transform(
        lambda v: v.dropna().all() if v.notna().any() else np.nan)
    out["fit"] = np.where(fits.isna(), "unknown", np.where(fits.fillna(True).astype(bool), "fits", "does not fit"))
    return out
