"""What-if predictions on the GPUs and precisions people use now (notebook 06; extension).

Everything here is a prediction of our NeuSight re-implementation; almost all of it is beyond what
the paper (or this artifact) validated. Every row carries ``validation``: ``paper setting`` only for
an FP32 prediction of a model the paper measured on a GPU of the release; otherwise the reasons it
is an extrapolation (``unseen GPU (spec sheet)``, ``precision bf16 untested``, ``model not in the
paper``, ``KV-cache decode not in the paper``).

* :func:`fp16mm_ours` -- Figure 10 (FP16 tensor-core BMM on H100, the release's ``fp16mm.csv``)
  re-predicted by our predictor, with the dense or the sparse tensor-core peak, or as the authors
  ran it (the release's ``NVIDIA_H100_80GB_HBM3_TP`` device in FP32 accounting). Notebook 04 can
  pass ``fp16mm_ours()`` as the ``fp16`` frame of ``claims.compute_claims`` to give C9 a verdict
  for our re-implementation; :func:`c9_verdict` does it for C9 alone.
* :func:`scenarios` / :func:`run` -- Llama-2 7B / 13B / 70B and Mixtral 8x7B (full runs, bf16) prefill and decode
  and GPT-3 2.7B training on every catalogue GPU in bf16 and fp32, with the smallest tensor-parallel split that
  fits when one GPU does not: latency, tokens per second, memory, cost per million tokens.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from neusight_core.step import Step
from neusight_core import configs, devices, kernel_table, latency, memory, schema, tables
from neusight_core.request import parse
from neusight_core.schema import OpClass, Precision

H100 = "NVIDIA_H100_80GB_HBM3"
SPARSE_FP16_H100 = 1979000.0    # the release's _TP device and the datasheet's "with sparsity" figure
PEAKS = ("dense", "sparse", "authors")


# ------------------------------------------------------------------------------ Figure 10 / C9
def fp16mm_kernels(fp16: pd.DataFrame, elem_bytes: float = 2.0, precision: str = Precision.FP16) -> pd.DataFrame:
    """The Figure 10 BMM shapes as a kernel table (release convention: [M x N] @ [N x K])."""
    B, M, N, K = (fp16[c].astype(float).to_numpy() for c in ("B", "M", "N", "K"))
    n = len(fp16)
    return pd.DataFrame({
        "phase": "fw", "aten_op": "aten.bmm.default", "op_class": OpClass.BMM, "sub_op": "",
        "B": B, "M": M, "N": N, "K": K, "H": np.nan, "flops": 2.0 * B * M * N * K,
        "bytes_read": elem_bytes * B * (M * N + N * K), "bytes_written": elem_bytes * B * M * K,
        "dtype": "float16" if elem_bytes == 2 else "float32", "module": "", "layer": -1, "count": 1,
        "comm_kind": "", "comm_bytes": 0.0, "overlap": False, "stage": 0, "precision": [precision] * n})


def fp16mm_ours(predictor="neusight", quick: bool = False, peak: str = "dense", fp16: pd.DataFrame | None = None,
                tensor_core: bool = True) -> pd.DataFrame:
    """Figure 10 re-predicted: columns B, M, N, K, label_ms (the release's measurement), pred_ms (ours).

    ``peak``: ``dense`` = the H100's dense FP16 tensor-core peak from the catalogue (989.4 TFLOPS),
    2-byte elements; ``sparse`` = the same with the datasheet's "with sparsity" 1,979 TFLOPS, the
    figure the release's ``NVIDIA_H100_80GB_HBM3_TP.json`` uses; ``authors`` = that release device
    itself in FP32 accounting (4-byte elements against doubled bandwidth, L2 and memory, as the
    authors' code ran it). ``tensor_core=False``: a predictor with BF16 / FP16 tensor-core networks (``neusight``)
    predicts without them (``predict_extrapolated``: its FP32 networks, as before those networks existed)."""
    from neusight_core.studies import paper_tables
    if peak not in PEAKS:
        raise ValueError(f"peak must be one of {', '.join(PEAKS)}, got {peak!r}")
    fp16 = paper_tables.load_fp16mm() if fp16 is None else fp16
    pred = latency.loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    if peak == "authors":
        k, dev = fp16mm_kernels(fp16, 4.0, Precision.FP32), devices.get_device("NVIDIA_H100_80GB_HBM3_TP")
    else:
        k, dev = fp16mm_kernels(fp16), devices.get_device(H100)
        if peak == "sparse":
            dev = dataclasses.replace(dev, name=dev.name + "_sparse_fp16", fp16_tensor_gflops=SPARSE_FP16_H100)
    out = fp16[["B", "M", "N", "K", "label_ms"]].copy()
    fn = pred.predict if tensor_core or not hasattr(pred, "predict_extrapolated") else pred.predict_extrapolated
    out["pred_ms"] = fn(k, dev)
    return out



def c9_verdict(fp16_ours: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, detail) of claim C9 computed from ``fp16_ours`` (``claims.compute_claims``)."""
    from neusight_core.studies import claims as cl
    reg = cl.load_claims()
    reg = {**reg, "claims": [c for c in reg["claims"] if c["id"] == "C9"]}
    return cl.compute_claims(pd.DataFrame(), fp16_ours, claims=reg)


# ------------------------------------------------------------------------------ scenarios
PAPER_MODELS = ("bert_large", "gpt2_large", "gpt3_xl", "gpt3_27", "opt_13", "switchxl4")


def catalogue_gpus() -> list[str]:
    """Every GPU of the catalogue except the release's FP16 accounting variant of the H100."""
    d = devices.list_devices()
    return d.loc[~d["variant"], "name"].tolist()


#: mixture-of-experts models of the full what-if (bf16 only: their experts run as grouped GEMMs, which torch takes in
#: bf16 only; tensor-parallel where one GPU does not fit, each expert sliced: parallel_experts.py)
MOE_MODELS = ("mixtral_8x7b",)


def scenarios(quick: bool = False) -> list[dict]:
    """The what-if workloads: Llama-2 (and, in full runs, Mixtral 8x7B) prefill / decode (one request or a batch),
    GPT-3 2.7B training."""
    seq = 512 if quick else 2048
    batches = (1, 8)
    llamas = ("llama2_7b", "llama2_13b") if quick else ("llama2_7b", "llama2_13b", "llama2_70b") + MOE_MODELS
    out = []
    for m in llamas:
        for b in batches:
            out.append(dict(model=m, workload="prefill", mode="inf", batch=b, seq=seq, past=0))
            out.append(dict(model=m, workload="decode", mode="inf", batch=b, seq=1, past=seq - 1))
    for b in ((1,) if quick else (1, 4)):
        out.append(dict(model="gpt3_27", workload="training", mode="train", batch=b, seq=seq, past=0))
    return out


def validation(model: str, gpu, dtype: str, past: int = 0, tensor_core: bool = False) -> str:
    """``tensor_core``: the predictor has BF16 tensor-core networks (``neusight``): its bf16 / fp16
    GEMMs were then checked against measured kernels (notebook 07), its other kernels were not."""
    dev = devices.get_device(gpu)
    why = []
    if dev.source.startswith("spec sheet") or "authors' release" not in dev.source:
        why.append("unseen GPU (spec sheet)")
    if dtype != Precision.FP32 and tensor_core and dtype in schema.HALF_PRECISIONS:
        why.append(f"precision {dtype}: GEMMs from networks trained on measured kernels of 4 GPUs (notebook 07), "
                   "other kernels untested")
    elif dtype != Precision.FP32:
        why.append(f"precision {dtype} untested")
        if not dev.has_tensor_peak(dtype):
            why.append(f"no {dtype} tensor cores: FP32 peak")
    if model not in PAPER_MODELS:
        why.append("model not in the paper")
    if model in MOE_MODELS:
        why.append("mixture of experts: grouped GEMMs of balanced routing (notebook 07 sections 5d-5e)")
    if past:
        why.append("KV-cache decode not in the paper")
    return "paper setting" if not why else "extrapolation: " + ", ".join(why)


# ------------------------------------------------------------------------------ what BF16 rests on
def bf16_validation(tensor_core: bool = True, log=None) -> pd.DataFrame:
    """Which kernels of a bf16 / fp16 prediction were checked against measurements, and at what held-out error:
    one row per kernel family (status, GPUs, held-out MAPE), the numbers read from the BF16 log's
    ``held-out-evaluated`` record (``external_eval.held_out_record``), never typed in. ``tensor_core``: the
    predictor has the BF16 networks (``neusight``); without them every family is an extrapolation."""
    import neusight_core.predictors.memory_law as memory_law
    from neusight_core import measured_kernels
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
    from neusight_core import engine
    from neusight_core.predictors import common
    pred = latency.loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    steps = (("prefill", seq, 0), ("decode", 1, seq - 1))
    got = engine.predict(parse([dict(model=model, batch=1, seq=s, mode="inf", past=past, dtype=dtype, device=gpu,
                                             attention="eager", execution="graph") for _, s, past in steps]), [pred],
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
EXECUTION_VARIANTS = (("eager attention, graph", "eager", "graph"), ("sdpa, graph", "sdpa", "graph"),
                      ("sdpa, eager PyTorch", "sdpa", "eager"))


def execution_table(gpus=None, quick: bool = False, predictor="neusight", seeds=(0,)) -> pd.DataFrame:
    """Llama-2 7B / 13B / 70B in BF16, one request: prefill of 2,048 tokens and one decode step on a 2,048-token
    KV cache, in each of ``EXECUTION_VARIANTS``, on every catalogue GPU (``gpus``), through ``engine.predict``. The
    70B runs tensor-parallel over 8 GPUs (``tp8``; its 140 GB of weights fit no single GPU). Beside each: the
    physical floor per GPU, max(2 x GEMM parameters x tokens / the dense BF16 peak, weights / the memory bandwidth;
    the GEMM parameters are the weights less the input embedding), and
    the memory verdict; a configuration that does not fit says so in ``fit`` (its time is the time it would take).
    Quick: Llama-2-7B at 512 tokens on three GPUs. Every row is an extrapolation (BF16 end to end is validated on the
    H100 only, docs/tier2.md)."""
    from neusight_core import engine
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
                                     execution=ex, **({"parallel": "tp", "gpus": tp} if tp else {})))
                    meta.append({"model": model, "plan": f"tp{tp}" if tp else "1 GPU", "workload": work,
                                 "tokens": s, "variant": label})
    df = engine.predict(parse(reqs), predictor, seeds=seeds, quick=quick)
    out = pd.concat([pd.DataFrame(meta * (len(df) // len(meta))), df[["device", "seed", "e2e_ms", "kernel_ms",
                    "host_ms", "host_bound", "memory_weights_gib", "memory_fits", "memory_verdict", "error"]]], axis=1)
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


def tokens(sc: dict) -> int:
    """Tokens one step processes (prefill/training: batch x seq; decode: one per sequence)."""
    return sc["batch"] * (1 if sc["workload"] == "decode" else sc["seq"])


def _tp_degrees(max_gpus: int) -> list[int]:
    """Tensor-parallel sizes tried when one GPU does not fit: 2, then the whole server (each plan of a
    70B model costs seconds to build, so not every size in between)."""
    return sorted({n for n in (2, max_gpus) if 1 < n <= max_gpus})


def check_parameters(gpu_price_per_hour=None, max_gpus=8) -> tuple[float | None, int]:
    """Notebook 06's parameters, checked (a negative price gave negative costs, ``max_gpus=0``
    dropped Llama-2-70B without a word): (price or None, max_gpus); a bad one is a one-line ValueError."""
    price = None if gpu_price_per_hour in (None, "", "None") else gpu_price_per_hour
    if price is not None:
        try:
            price = float(price)
        except (TypeError, ValueError):
            price = float("nan")
        if not (np.isfinite(price) and price > 0):
            raise ValueError(f"gpu_price_per_hour must be a positive price of one GPU-hour (or None), "
                             f"got {gpu_price_per_hour!r}")
    if isinstance(max_gpus, bool) or not isinstance(max_gpus, (int, np.integer)) or not 1 <= int(max_gpus) <= 1024:
        raise ValueError(f"max_gpus must be a whole number of GPUs from 1 to 1024, got {max_gpus!r}")
    return price, int(max_gpus)


def run(gpus=None, dtypes=(Precision.BF16, Precision.FP32), quick: bool = False, predictor="neusight",
        gpu_price_per_hour: float | None = None, max_gpus: int = 8, optimizer: str = "adamw",
        progress=None) -> pd.DataFrame:
    """One row per (scenario, dtype, GPU): the single-GPU prediction, or the smaller TP split (2 or
    ``max_gpus`` GPUs) whose per-GPU memory fits, or ``does not fit on max_gpus`` with no latency (a time for a
    run that cannot happen would show in every table and figure). GPUs without NVLink get no TP latency.

    A grid of scenarios through the engine (no second pipeline): the engine's memory columns choose the
    plan (one call per TP size, for the cells still without one; a footprint does not depend on the GPU), one
    more call predicts the chosen plans; this module adds tokens, price and the validation label."""
    from neusight_core import engine
    gpu_price_per_hour, max_gpus = check_parameters(gpu_price_per_hour, max_gpus)
    gpus = list(gpus or catalogue_gpus())
    pred = latency.loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    tensor_core = bool(getattr(getattr(pred, "tc", None), "nets", None))   # BF16 networks
    cells = [(sc, dt) for sc in scenarios(quick) for dt in dtypes
             # fp32 (the paper's protocol): batch 1 of the smaller dense models, a reference
             if not (dt == Precision.FP32 and (sc["batch"] != 1 or sc["model"] in ("llama2_70b",) + MOE_MODELS))]
    devs = {g: devices.get_device(g) for g in gpus}

    def request(sc, dt, n, g):
        return dict(model=sc["model"], batch=sc["batch"], seq=sc["seq"], mode=sc["mode"], past=sc["past"], dtype=dt,
                    device=g, parallel="tp" if n > 1 else None, gpus=n, attention="eager", execution="graph")

    # the plan: per cell, the memory of each TP size asked once (on the first GPU still looking), smallest first
    mem = {}                                    # (cell, n) -> engine row (memory columns) or None (no such plan)
    chosen = {}                                 # (cell, gpu) -> n
    for n in [1] + _tp_degrees(max_gpus):
        ask = [(c, next(g for g in gpus if (c, g) not in chosen)) for c in range(len(cells))
               if any((c, g) not in chosen for g in gpus)]
        if not ask:
            break
        # a nominal link, so that the split of a GPU without NVLink is sized too (this call's times are not used)
        m = engine.predict(parse([{**request(*cells[c], n, g), "link_gbs": 1.0 if n > 1 else None} for c, g in ask]),
                           "roofline", use_derivation=False, optimizer=optimizer)
        for (c, _), (_, row) in zip(ask, m.iterrows()):
            mem[c, n] = None if pd.isna(row["memory_total_gib"]) else row
            for g in gpus:
                if (c, g) not in chosen and mem[c, n] is not None and row["memory_total_gib"] <= devs[g].mem_gb:
                    chosen[c, g] = n
    runs = [(c, g) for c in range(len(cells)) for g in gpus
            if (c, g) in chosen and (chosen[c, g] == 1 or devs[g].link_gbs is not None)]
    t0 = time.perf_counter()
    lat = engine.predict(parse([request(*cells[c], chosen[c, g], g) for c, g in runs]), [pred], quick=quick,
                         use_derivation=False, memory_columns=False, raise_errors=True)
    e2e = dict(zip(runs, lat["e2e_ms"]))
    rows = []
    for c, (sc, dt) in enumerate(cells):
        for g in gpus:
            dev = devs[g]
            if (c, g) not in chosen:
                # a run that cannot happen gets no time (a figure or table would show one)
                m = mem[c, 1]
                rows.append(_row(sc, dt, dev, 1, m, None, f"does not fit on {max_gpus}: needs "
                                 f"{m['memory_total_gib']:.1f} GiB on one GPU, has {dev.mem_gb:g} GiB", quick,
                                 tensor_core=tensor_core))
            elif (c, g) not in e2e:
                # no NVLink: PCIe-only GPUs get no tensor-parallel latency (we have no link model for them)
                n = chosen[c, g]
                rows.append(_row(sc, dt, dev, n, mem[c, n], None, f"fits on {n} (tp{n}); no NVLink: TP latency not "
                                 "modelled", quick, tensor_core=tensor_core))
            else:
                n = chosen[c, g]
                rows.append(_row(sc, dt, dev, n, mem[c, n], e2e[c, g], "fits", quick, gpu_price_per_hour,
                                 tensor_core=tensor_core))
    if progress:
        progress(f"{len(cells)} scenarios x {len(gpus)} GPUs, {len(runs)} predicted: {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


def _row(sc, dt, dev, n, m, e2e_ms, fit, quick, price=None, tensor_core: bool = False) -> dict:
    tok = tokens(sc)
    tps = tok / (e2e_ms / 1e3) if e2e_ms else np.nan
    cost = (price * n / 3600.0) / tps * 1e6 if (price and e2e_ms) else np.nan
    return {"model": sc["model"], "workload": sc["workload"], "batch": sc["batch"], "seq": sc["seq"],
            "past": sc["past"], "dtype": dt, "gpu": dev.name, "gpus": n, "plan": f"tp{n}" if n > 1 else "1 GPU",
            "latency_ms": e2e_ms if e2e_ms else np.nan, "tokens_per_s": tps, "cost_per_mtok": cost,
            **{f"mem_{k}_gib": m[f"memory_{k}_gib"] for k in ("total", "weights", "grads", "optimizer", "activations",
                                                             "kv_cache")},
            "device_gib": dev.mem_gb, "fit": fit,
            "validation": validation(sc["model"], dev, dt, sc["past"], tensor_core)}


# ------------------------------------------------------------------------------ CPU validation table
def memory_validation(quick: bool = False) -> pd.DataFrame:
    """Traced activation peak vs PyTorch's measured peak on small real CPU models (as tests/test_memory.py)."""
    import transformers
    from neusight_core import trace
    cfgs = {"GPT-2 small": transformers.GPT2Config(resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                                   architectures=["GPT2LMHeadModel"]),
            "BERT-base": transformers.BertConfig(hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                                                 architectures=["BertForMaskedLM"]),
            "Llama (2 layers, d 512)": transformers.LlamaConfig(
                hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=32000, architectures=["LlamaForCausalLM"])}
    rows = []
    for name, cfg in cfgs.items():
        if quick and name == "GPT-2 small":
            continue   # the slowest to profile here; tests/test_memory.py covers it
        model = memory.build_cpu_model(cfg)
        # GPT-2 small and BERT-base take seconds per profiled step here: two cases; the small Llama more
        cases = [(1, 32, "train"), (2, 32, "inf")] + ([(4, 64, "train"), (4, 64, "inf")] if "Llama" in name and not quick else [])
        for b, s, mode in cases:
            meas = memory.measure_cpu_peak(cfg, b, s, mode, model=model)["peak_bytes"]
            traced = trace.trace_model(cfg, b, s, mode, authors_heads=False)
            predicted = kernel_table.info(traced).memory["activation_peak_bytes"]
            rows.append({"model": name, "batch": b, "seq": s, "mode": mode, "measured_mb": meas / 1e6,
                         "predicted_mb": predicted / 1e6, "error_pct": (predicted - meas) / meas * 100})
        del model
    return pd.DataFrame(rows)


def label_fit_check(optimizer: str = "none") -> pd.DataFrame:
    """Every single-GPU training configuration of the paper's models on every GPU that has training
    labels: is there a label (the authors ran it, so it fitted), and do we predict it fits? The
    authors' loop has no optimizer step (``optimizer="none"``). A label we predict not to fit is
    an overestimate; no label where we predict a fit says nothing (they did not try everything)."""
    from neusight_core import paths
    labels = paths.labels_dir()
    gpus = sorted(p.name for p in labels.iterdir() if p.is_dir() and any(p.glob("*-train-*[0-9].json")))
    configs = sorted({tuple(f.stem.split("-")[i] for i in (0, 2, 3)) for g in gpus
                      for f in (labels / g).glob("*-train-*[0-9].json") if not f.stem.startswith("switchxl4")})
    rows = []
    for model, seq, batch in configs:
        m = memory.footprint(tables.trace(Step(model=model, batch=int(batch), seq=int(seq), mode="train")), optimizer=optimizer)
        for g in gpus:
            cap = devices.get_device(g).mem_gb
            rows.append({"model": model, "seq": int(seq), "batch": int(batch), "gpu": g, "predicted_gib": m["total_gib"],
                         "device_gib": cap, "predicted_fits": m["total_gib"] <= cap,
                         "authors_label": (labels / g / f"{model}-train-{seq}-{batch}.json").is_file()})
    return pd.DataFrame(rows)
