"""Mixture-of-experts layers (notebook 07, section 5d): the experts' grouped GEMMs as the tracer emits them, against
NVIDIA's measured MoE layers.

Hugging Face runs a mixture-of-experts layer's experts as two grouped GEMMs (transformers' default ``grouped_mm``
experts: gate and up projections of every expert in one kernel, then the down projection). The tracer cannot know
the routing on meta tensors and takes it as balanced (``aten_ops.grouped_gemm``); the predictors answer each grouped
GEMM as one dense GEMM over the stacked tokens that reads the reached experts' weights, a kernel no network trained
on. This module says how far that is from
measured MoE layers: ``aiconfigurator-core``'s ``moe/<framework>/<version>/moe_perf.parquet`` (read in place, as
``measured_kernels`` reads the GEMMs), BF16 weights, ``balanced`` routing, one GPU (no tensor or expert parallelism),
every kernel implementation each framework measured (Triton, CUTLASS, TensorRT-LLM's), each from the newest version
of the framework that measured it.

What is compared: the two grouped GEMMs (``kernels``, the same rows, dims, FLOPs and bytes as a trace:
tests/test_moe.py) against the whole measured layer, which also routes, permutes the tokens and applies the
activation (fused or not, by implementation): the prediction should be somewhat low. ``OLD_TRACER``: the same GEMMs
as the tracer emitted them until 2026-11-28, unclassified ops read as memory-bound over every expert's weights.
Nothing here is trained or tuned; the rows are validation only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import measured_kernels as mk
from neusight_core.plans import parallel_experts
from neusight_core.question import schema
from neusight_core.question.schema import OpClass, Precision
from neusight_core.studies import error_metric

FILE = "moe_perf.parquet"
COLUMNS = ("kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
           "moe_tp_size", "moe_ep_size", "distribution", "latency")
#: The series of the tracer's rows as it emitted them until 2026-11-28, before grouped GEMMs were classified
#: (unclassified ops, memory-bound over every expert's weights; answered by ``neusight`` seed by seed): named for what
#: it is, since a bare "before" said nothing in a table or legend.
OLD_TRACER = "old tracer (unclassified)"
#: The predictors compared: ``neusight`` per seed, the roofline, and the old tracer's rows (``OLD_TRACER``).
SCORED = ("neusight", "roofline", OLD_TRACER)
#: The largest group of GPUs notebook 07's summary and its parallel figure show (the saved table has every group the
#: database measured, up to 256 GPUs): the figure draws the counts the summary's table has.
SUMMARY_GPUS = 8
#: Token bands of the table (tokens per layer call: a decode batch, or a prefill's batch x seq).
BANDS = (0, 16, 256, 4096, np.inf)


def rows(gpus=None, parallel: bool = False, sample: int | None = None) -> pd.DataFrame:
    """The BF16, balanced, single-GPU MoE layers of ``gpus`` (default: the training and held-out GPUs; sealed ones are
    refused), one row per measurement (per framework and kernel source, the newest version that measured it), with
    ``device``, ``role``, ``framework``, ``version`` and ``latency_ms``. ``parallel``: also the layers one GPU of a
    tensor- or expert-parallel group runs (``moe_tp_size`` x ``moe_ep_size`` GPUs; the measured ``num_tokens`` are
    the whole group's), with those two columns. ``sample``: at most that many layers per GPU, drawn at random (seed 0;
    quick runs)."""
    gpus = list(mk.TRAINING + mk.HELD_OUT) if gpus is None else gpus
    base, parts = mk.data_root(), []
    for system in mk.system_names(gpus, False):
        try:
            files = mk.kernel_files(base, system, "moe", FILE, None, "all")
        except mk.MeasuredDataError:
            continue                                  # a GPU without MoE measurements
        newest = {}                                   # (framework, kernel source) -> the newest version measuring it
        for framework, version, path in files:        # (oldest first)
            raw = mk.read_table(path, COLUMNS)
            one = (raw.moe_tp_size == 1) & (raw.moe_ep_size == 1)
            raw = raw[(raw.moe_dtype == "bfloat16") & (raw.distribution == "balanced") & (parallel | one)
                      & (raw.latency > 0)]
            for src, g in raw.groupby("kernel_source"):
                newest[(framework, src)] = g.assign(system=system, device=mk.CATALOGUE.get(system, system),
                                                    role=mk.role(system), framework=framework, version=version,
                                                    latency_ms=g.latency.astype(float))
        parts += list(newest.values())
    if not parts:
        raise mk.MeasuredDataError("no BF16 MoE measurements for the GPUs asked for")
    out = pd.concat(parts, ignore_index=True).drop(columns=["latency", "moe_dtype", "distribution"] +
                                                   ([] if parallel else ["moe_tp_size", "moe_ep_size"]))
    if sample:
        out = out.sample(frac=1.0, random_state=0).groupby("device", sort=False).head(int(sample)).sort_index()
    return out.reset_index(drop=True)


def gated(kernel_source) -> np.ndarray:
    """Whether the layer's experts are gated (gate and up projections, SwiGLU: Mixtral, Qwen, DeepSeek) or not
    (one up projection: TensorRT-LLM's ``*_nongated`` kernels)."""
    return ~pd.Series(kernel_source).astype(str).str.contains("nongated").to_numpy()


def kernels(layers: pd.DataFrame, classified: bool = True) -> pd.DataFrame:
    """Two kernel rows per measured layer (``_layer``: its row in ``layers``): the up (gate and up) projection
    S x hidden -> (2 x) inter and the down projection S x inter -> hidden over its experts, S = tokens x top-k, as one
    GPU runs them (``parallel_experts.per_gpu``, the rows a trace and its ``tp`` / ``ep`` split emit), with the layer's
    ``moe_tp_size`` (the inter dim cut) and ``moe_ep_size`` (experts and rows spread) where ``layers`` has them;
    ``classified`` False: as unclassified memory-bound ops reading every expert's weights (``OLD_TRACER``)."""
    n = len(layers)
    tp = layers["moe_tp_size"].to_numpy(int) if "moe_tp_size" in layers else np.ones(n, int)
    ep = layers["moe_ep_size"].to_numpy(int) if "moe_ep_size" in layers else np.ones(n, int)
    recs = []
    for j, (tok, top, g, h, i, gate) in enumerate(zip(layers.num_tokens, layers.topk, layers.num_experts,
                                                      layers.hidden_size, layers.inter_size,
                                                      gated(layers.kernel_source))):
        S, g, h, i = int(tok) * int(top), int(g), int(h), int(i) // int(tp[j])
        for k, nn in ((h, i * (2 if gate else 1)), (i, h)):
            r = parallel_experts.per_gpu(S, g, k, nn, int(ep[j]))
            if not classified:                            # every expert this GPU holds, read whole
                r["bytes_read"] = 2.0 * r["M"] * k + 2.0 * (g // int(ep[j])) * k * nn + 4.0 * (g // int(ep[j]))
            recs.append({"_layer": j, **r})
    r = pd.DataFrame(recs)
    out = mk.kernel_frame("bmm", OpClass.BMM, schema.GROUPED_GEMM, r.B.to_numpy(float), r.M.to_numpy(float),
                           r.N.to_numpy(float), r.K.to_numpy(float))
    out["aten_op"] = "aten._grouped_mm.default"
    for c in ("flops", "bytes_read", "bytes_written"):
        out[c] = r[c].to_numpy(float)
    if not classified:
        out["op_class"], out["sub_op"] = OpClass.UNCLASSIFIED, ""
        out[["B", "M", "N", "K"]] = [1.0, np.nan, np.nan, np.nan]
        out["flops"] = 0.0
    out["dtype"], out["precision"] = "bfloat16", Precision.BF16
    out["device"] = layers.device.to_numpy()[r["_layer"].to_numpy()]
    out["_layer"] = r["_layer"].to_numpy()
    return out


def predict(layers: pd.DataFrame, seeds=(0,), quick: bool = False, before: bool = True) -> pd.DataFrame:
    """Long frame: per measured layer x predictor x seed, ``pred_ms`` (the two GEMMs summed), ``ape`` and ``err``
    (signed, %: > 0 = predicted slower than measured). ``before`` False: without the ``OLD_TRACER`` rows."""
    from neusight_core import predictors

    now, old = kernels(layers), (kernels(layers, classified=False) if before else None)
    n = len(layers)

    def per_layer(k, ms):
        return np.bincount(k["_layer"].to_numpy(), weights=np.asarray(ms, float), minlength=n)

    parts = [("roofline", 0, per_layer(now, predictors.get("roofline").predict(now, None)))]
    for s in seeds:
        p = predictors.get("neusight", quick=quick, seed=int(s))
        parts.append(("neusight", int(s), per_layer(now, p.predict(now, None))))
        if before:
            parts.append((OLD_TRACER, int(s), per_layer(old, p.predict(old, None))))
    out = []
    for name, seed, ms in parts:
        d = layers.assign(predictor=name, seed=seed, pred_ms=ms)
        d["err"] = (d.pred_ms - d.latency_ms) / d.latency_ms * 100
        d["ape"] = error_metric.ape(d.latency_ms, d.pred_ms)
        out.append(d)
    return pd.concat(out, ignore_index=True)


def over_seeds(long: pd.DataFrame, keys) -> pd.DataFrame:
    """Per ``keys`` x predictor: layers, MAPE and bias (%) as the mean over seeds, and the seed spread (max - min)
    of the MAPE; in the order the groups first appear."""
    keys = list(keys)
    per_seed = long.groupby(keys + ["predictor", "seed"], observed=True, sort=False).agg(
        layers=("ape", "size"), mape=("ape", "mean"), bias=("err", "mean")).reset_index()
    s = per_seed.groupby(keys + ["predictor"], observed=True, sort=False)
    out = s[["mape", "bias"]].mean()
    # a count, not a mean: every seed scores the same layers
    out.insert(0, "layers", s["layers"].max().astype(int))
    out["mape_spread"] = s["mape"].max() - s["mape"].min()
    return out.reset_index()


def _wide(t: pd.DataFrame, keys: list, scored) -> pd.DataFrame:
    """``over_seeds``' long table as one row per ``keys``: layers, then per predictor of ``scored`` its MAPE, bias and
    (seeded predictors) seed spread, as columns ``<predictor> <metric>``."""
    out = t[keys + ["layers"]].drop_duplicates(keys)
    for p in scored:
        metrics = ("mape", "bias") + (() if p == "roofline" else ("mape_spread",))
        mine = t[t.predictor == p][keys + list(metrics)].rename(columns={m: f"{p} {m}" for m in metrics})
        out = out.merge(mine, on=keys, how="left")
    return out


def table(long: pd.DataFrame, by=("device", "framework", "kernel_source")) -> pd.DataFrame:
    """Per ``by``: layers, and per predictor MAPE, bias and seed spread (``over_seeds``; the roofline has no seeds),
    and the measured layers' median TFLOPS at 4,096 tokens and more (how fast that implementation's GEMMs ran)."""
    by = list(by)
    out = _wide(over_seeds(long, by), by, SCORED)
    big = long[(long.num_tokens >= 4096) & (long.predictor == "roofline")]
    tf = (_flops(big) / big.latency_ms / 1e9).groupby([big[c] for c in by]).median().rename("measured TFLOPS, >= 4k tokens")
    return out.merge(tf.reset_index(), on=by, how="left").reset_index(drop=True)


def by_parallel(long: pd.DataFrame) -> pd.DataFrame:
    """Per GPU role x how the layer is split (``one GPU``; ``tp``: each expert sliced; ``ep``: the experts spread;
    ``tp x ep``) x GPUs in the group: layers, and per predictor (``neusight``, the roofline) MAPE and bias (%, mean over
    seeds) and the seed spread of ``neusight``."""
    tp, ep = long.moe_tp_size.to_numpy(int), long.moe_ep_size.to_numpy(int)
    split = np.select([(tp == 1) & (ep == 1), ep == 1, tp == 1], ["one GPU", "tp", "ep"], "tp x ep")
    keys = ["role", "split", "gpus"]
    out = _wide(over_seeds(long.assign(split=split, gpus=tp * ep), keys), keys, ("neusight", "roofline"))
    order = {"one GPU": 0, "tp": 1, "ep": 2, "tp x ep": 3}
    return out.sort_values(["role", "split", "gpus"], key=lambda c: c.map(order) if c.name == "split" else c) \
        .reset_index(drop=True)


def bands(long: pd.DataFrame) -> pd.DataFrame:
    """MAPE and bias (%) per token band x predictor, all GPUs and implementations pooled (mean over seeds)."""
    band = pd.cut(long.num_tokens, BANDS, right=False, labels=[f"{int(a)}-{'' if np.isinf(b) else int(b) - 1}"
                                                               for a, b in zip(BANDS[:-1], BANDS[1:])])
    t = over_seeds(long.assign(tokens=band), ["tokens"]).sort_values(["tokens", "predictor"])
    return t[["tokens", "predictor", "layers", "mape", "bias"]].reset_index(drop=True)


def _flops(d: pd.DataFrame) -> pd.Series:
    """FLOPs of a measured layer's two GEMMs: 2 x tokens x top-k x hidden x inter x (3 gated, 2 not)."""
    return 2.0 * d.num_tokens * d.topk * d.hidden_size * d.inter_size * np.where(gated(d.kernel_source), 3.0, 2.0)


def one_layer_config(hidden: int, inter: int, experts: int, top: int) -> dict:
    """A one-layer Mixtral-type config of one MoE layer shape (heads of 128, 8 KV heads, a small vocabulary): what a
    whole layer as Hugging Face runs it is traced (and timed, on a GPU) from."""
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": int(hidden),
            "intermediate_size": int(inter), "num_attention_heads": max(1, int(hidden) // 128),
            "num_key_value_heads": min(8, max(1, int(hidden) // 128)), "num_hidden_layers": 1, "vocab_size": 1000,
            "max_position_embeddings": 4096, "num_local_experts": int(experts), "num_experts_per_tok": int(top),
            "hidden_act": "silu", "tie_word_embeddings": False}


def block_rows(kernels: pd.DataFrame, router: bool = False) -> pd.DataFrame:
    """The rows of a traced table's MoE blocks (modules under ``.mlp.``: routing, permutation, the grouped GEMMs, the
    activation, the weighted sum), without the all-reduces of a split; ``router`` False: without the router's GEMM
    (NVIDIA's database times it as an op of its own)."""
    k = kernels
    keep = k.module.str.contains(r"\.mlp\.") & (k.op_class != OpClass.COMM)
    if not router:
        keep &= ~(k.module.str.endswith("mlp.gate") & (k.op_class == OpClass.LINEAR))
    return k[keep]
