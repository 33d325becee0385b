"""What-if predictions on the GPUs and precisions people use now (notebook 06; extension).

Everything here is a prediction of our NeuSight re-implementation; almost all of it is beyond what
the paper (or this artifact) validated. Every row carries ``validation``: ``paper setting`` only for
an FP32 prediction of a model the paper measured on a GPU of the release; otherwise the reasons it
is an extrapolation (``unseen GPU (spec sheet)``, ``precision bf16 untested``, ``model not in the
paper``, ``KV-cache decode not in the paper``).

* :func:`scenarios` / :func:`run` -- Llama-2 7B / 13B / 70B and Mixtral 8x7B (full runs, bf16) prefill and decode
  and GPT-3 2.7B training on every catalogue GPU in bf16 and fp32, with the smallest tensor-parallel split that
  fits when one GPU does not: latency, tokens per second, memory, cost per million tokens.
* :func:`serving` -- Llama-3.1 8B and 70B served on every catalogue GPU (``cost/serving.py``): TTFT, TPOT,
  tokens per second per GPU, cost per million tokens.
* :func:`memory_validation` / :func:`label_fit_check` -- the memory model against PyTorch's allocator on small CPU
  models, and against which training configurations the authors could run.

Figure 10 / C9 are ``figure10.py``'s; what a BF16 answer rests on (validated kernels, floors, execution variants),
``bf16_checks.py``'s.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.tracing import table_info
from neusight_core.cost import latency, memory, tables
from neusight_core.question import schema
from neusight_core.question.step import Step
from neusight_core.cost.request import parse
from neusight_core.question.schema import Attention, Execution, Mode, Plan, Precision

#: the GPU of the paper's own what-if figures (Figure 10, the floors table)
H100 = "NVIDIA_H100_80GB_HBM3"


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
            out.append(dict(model=m, workload="prefill", mode=Mode.INF, batch=b, seq=seq, past=0))
            out.append(dict(model=m, workload="decode", mode=Mode.INF, batch=b, seq=1, past=seq - 1))
    for b in ((1,) if quick else (1, 4)):
        out.append(dict(model="gpt3_27", workload="training", mode=Mode.TRAIN, batch=b, seq=seq, past=0))
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
    from neusight_core.cost import engine
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
                    device=g, parallel=Plan.TP if n > 1 else None, gpus=n, attention=Attention.EAGER, execution=Execution.GRAPH)

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
    runs = [(c, g) for c in range(len(cells)) for g in gpus if (c, g) in chosen and linked(devs[g], chosen[c, g])]
    t0 = time.perf_counter()
    lat = engine.predict(parse([request(*cells[c], chosen[c, g], g) for c, g in runs]), [pred], quick=quick,
                         use_derivation=False, memory_columns=False, raise_errors=True)
    e2e = dict(zip(runs, lat["e2e_ms"]))
    # each answer's interval (cost/error_model.py; NaN where the weights have no error model yet)
    bounds = dict(zip(runs, zip(lat["lo_ms"], lat["hi_ms"])))
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
                # no NVLink joins n of these GPUs: no tensor-parallel latency (we have no PCIe link model)
                n = chosen[c, g]
                why = (f"no NVLink joins {n} (its bridge joins {dev.link_gpus})" if dev.link_gbs is not None
                       else "no NVLink")
                rows.append(_row(sc, dt, dev, n, mem[c, n], None, f"fits on {n} (tp{n}); {why}: TP latency not "
                                 "modelled", quick, tensor_core=tensor_core))
            else:
                n = chosen[c, g]
                rows.append(_row(sc, dt, dev, n, mem[c, n], e2e[c, g], "fits", quick, gpu_price_per_hour,
                                 tensor_core=tensor_core, bounds=bounds[c, g]))
    if progress:
        progress(f"{len(cells)} scenarios x {len(gpus)} GPUs, {len(runs)} predicted: {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


def linked(dev, n: int) -> bool:
    """Whether ``n`` of ``dev`` can run a tensor-parallel split at its link speed: one GPU always; more need a link
    (NVLink / xGMI) that joins that many (an NVLink bridge joins two PCIe cards)."""
    return n == 1 or (dev.link_gbs is not None and (dev.link_gpus is None or n <= dev.link_gpus))


def _row(sc, dt, dev, n, m, e2e_ms, fit, quick, price=None, tensor_core: bool = False, bounds=(np.nan, np.nan)) -> dict:
    tok = tokens(sc)
    tps = tok / (e2e_ms / 1e3) if e2e_ms else np.nan
    cost = (price * n / 3600.0) / tps * 1e6 if (price and e2e_ms) else np.nan
    return {"model": sc["model"], "workload": sc["workload"], "batch": sc["batch"], "seq": sc["seq"],
            "past": sc["past"], "dtype": dt, "gpu": dev.name, "gpus": n, "plan": f"tp{n}" if n > 1 else "1 GPU",
            "latency_ms": e2e_ms if e2e_ms else np.nan, "lo_ms": float(bounds[0]), "hi_ms": float(bounds[1]),
            "tokens_per_s": tps, "cost_per_mtok": cost,
            **{f"mem_{k}_gib": m[f"memory_{k}_gib"] for k in ("total", "weights", "grads", "optimizer", "activations",
                                                             "kv_cache")},
            "device_gib": dev.mem_gb, "fit": fit,
            "validation": validation(sc["model"], dev, dt, sc["past"], tensor_core)}


# ------------------------------------------------------------------------------ CPU validation table
#: the serving what-if: Llama-3.1 models and the TP they are served with (70B: over 8 GPUs, as NVIDIA's runs of it)
SERVING_MODELS = (("llama3_8b", 1), ("llama3_70b", 8))
SERVING_CONCURRENCY = (8, 32, 128)


#: ``serving``'s ``validation`` of a GPU the serving constants were fitted on
SERVING_SEEN_GPU = "GPU of the development rows"


def serving(gpus=None, dtypes=(Precision.BF16,), quick: bool = False, predictor="neusight",
            gpu_price_per_hour: float | None = None, engine=schema.ServingEngine.VLLM, isl: int = 1024,
            osl: int = 1024) -> pd.DataFrame:
    """The catalogue's GPUs serving Llama-3.1-8B (one GPU) and 70B (TP 8) at a few concurrencies through
    ``cost.serving``: TTFT, TPOT, output tokens/s per GPU, cost per million output tokens (with a price per
    GPU-hour), and ``validation``: what the answer rests on beyond the serving model's development rows. A GPU
    without a link for TP 8 gets its one-line error in its row; a run that does not fit says so (``fits``)."""
    from neusight_core.cost import serving as serving_model
    gpus = list(gpus) if gpus is not None else catalogue_gpus()
    qs = [dict(model=m, device=g, tp=tp, dtype=dt, engine=engine, isl=isl, osl=osl, concurrency=c)
          for m, tp in SERVING_MODELS for dt in dtypes for g in gpus for c in SERVING_CONCURRENCY]
    df = serving_model.predict(qs, predictor, quick=quick)
    # the GPUs of the rows the engine's constants were fitted on (the constants file's ``covers``)
    seen = {x.split(" / ")[1] for x in serving_model.constants(engine)[0].covers}
    df["validation"] = np.where(df["device"].isin(seen), SERVING_SEEN_GPU,
                                "GPU outside the serving model's development rows")
    if gpu_price_per_hour:
        df["cost_per_mtok"] = gpu_price_per_hour / 3600 / df["tokens_per_s_per_gpu"] * 1e6
    return df


def memory_validation(quick: bool = False) -> pd.DataFrame:
    """Traced activation peak vs PyTorch's measured peak on small real CPU models (as tests/test_memory.py)."""
    import transformers
    from neusight_core.tracing import trace
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
        cases = [(1, 32, Mode.TRAIN), (2, 32, Mode.INF)] + ([(4, 64, Mode.TRAIN), (4, 64, Mode.INF)]
                                                            if "Llama" in name and not quick else [])
        for b, s, mode in cases:
            meas = memory.measure_cpu_peak(cfg, b, s, mode, model=model)["peak_bytes"]
            traced = trace.trace_model(Step(model=cfg, batch=b, seq=s, mode=mode), authors_heads=False)
            predicted = table_info.info(traced).memory["activation_peak_bytes"]
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
        m = memory.footprint(tables.trace(Step(model=model, batch=int(batch), seq=int(seq), mode=Mode.TRAIN)), optimizer=optimizer)
        for g in gpus:
            cap = devices.get_device(g).mem_gb
            rows.append({"model": model, "seq": int(seq), "batch": int(batch), "gpu": g, "predicted_gib": m["total_gib"],
                         "device_gib": cap, "predicted_fits": m["total_gib"] <= cap,
                         "authors_label": (labels / g / f"{model}-train-{seq}-{batch}.json").is_file()})
    return pd.DataFrame(rows)
