"""Tier 1: our re-implementation predicts every labelled configuration of the release.

Input is the evaluation index (one row per labelled configuration; columns ``gpu``, ``model``,
``mode``, ``seq``, ``batch``, ``option`` and the label/authors' prediction columns). Output is the same
frame with, for every predictor ``p`` we ran:

| column | meaning |
|---|---|
| ``ours_<p>_ms`` | our end-to-end prediction (ms); NaN when the configuration could not be predicted |
| ``ours_<p>_ape`` | APE of it against ``label_e2e_ms`` (%) |
| ``ours_<p>_fw_ms``, ``ours_<p>_bw_ms`` | forward and backward (+ accumulation) parts |
| ``ours_<p>_top_class`` | the op class with the largest predicted time (what dominates the error) |
| ``ours_error`` | why a configuration has no prediction ("" when all predictors ran) |

Options map onto the model-latency call: ``fusion`` -> ``fusion=True``; ``dp4``/``tp4`` -> that plan on
4 GPUs; ``pp4_1`` -> PP on 4 GPUs with 1 micro-batch (the labels' naming). Link bandwidth is the
catalogue's for the GPU (``devices.yaml``), the efficiency the authors' 0.72.
"""
from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd

from neusight_core.studies import evaluation as ev
from neusight_core.studies import paper_tables as pt
from neusight_core.cost import engine, latency, tables
from neusight_core.question import schema
from neusight_core.studies.error_metric import ape
from neusight_core.question.schema import OpClass



def option_kwargs(option: str) -> dict:
    """Arguments of ``latency.predict_model`` for a label option (none, fusion, dp4, tp4, pp4_1), in the paper's
    setting (``scenario.PAPER``: eager attention, the kernel sum)."""
    from neusight_core.question.step import PAPER
    if option in (None, "", "none") or (isinstance(option, float) and np.isnan(option)):
        return dict(PAPER)
    if option == "fusion":
        return {**PAPER, "fusion": True}
    m = re.fullmatch(r"(dp|tp|pp)(\d+)(?:_(\d+))?", str(option))
    if not m:
        raise ValueError(f"unknown configuration option {option!r}")
    kw = {**PAPER, "parallel": m.group(1), "gpus": int(m.group(2))}
    if m.group(3):
        kw["micro_batches"] = int(m.group(3))
    return kw


def _reason_text(err: str, model: str) -> str:
    """The sweep's one-line error of a configuration as a whole sentence (never cut)."""
    if "unknown model config" in err:
        return (f"the authors' release ships no model config for {model!r} (and neusight_core has none), "
                "so the model cannot be traced")
    return err


def predict_configs(index: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS,
                    quick: bool = False, progress: bool = True, seeds=(0,)) -> pd.DataFrame:
    """Predict every row of ``index`` with each predictor; never fills in a number it did not compute.

    Runs as one sweep (``sweep.run``): kernel tables derived or taken from the trace cache, one
    predictor call per predictor x seed over all configurations. ``ours_<p>_*`` columns hold the first
    seed of ``seeds``; with more seeds, ``ours_<p>_s<seed>_ms`` / ``ours_<p>_s<seed>_ape`` are added for
    every seed. ``ours_wall_s`` is the sweep's wall time divided by the number of configurations.
    ``sweep_configs`` gives the tidy sweep frame itself.
    """
    return spread(index, sweep_configs(index, predictors, quick=quick, progress=progress, seeds=seeds),
                  predictors, seeds)


def spread(index: pd.DataFrame, long: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS, seeds=(0,)) -> pd.DataFrame:
    """``predict_configs``' frame from ``sweep_configs``' tidy frame of the same ``index`` (notebook 04 sweeps
    once and reuses the frame for the seed tables)."""
    wall = (engine.run_info(long).total_s if engine.RUN_KEY in long.attrs else np.nan) / max(len(index), 1)
    return _spread(index, long, [""] * len(index), wall, predictors, seeds)


def sweep_configs(index: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS, quick: bool = False, progress: bool = True,
                  seeds=(0,)) -> pd.DataFrame:
    """The tidy sweep frame of the labelled configurations (``sweep.run`` columns, one row per
    configuration x predictor x seed) with the index's ``gpu``, ``config``, ``option`` and
    ``label_e2e_ms`` beside it and ``ape`` (ours against the label)."""
    long, bad = _sweep(index, predictors, seeds, quick, progress)
    idx = index.reset_index(drop=True)
    reps = len(long) // max(len(idx), 1)
    keep = [c for c in ("gpu", "config", "option", "label_e2e_ms") if c in idx]   # an index may lack a name
    extra = pd.concat([idx[keep]] * reps, ignore_index=True)
    out = pd.concat([extra, long.drop(columns=[]).reset_index(drop=True)], axis=1)
    out["error"] = [b or e for b, e in zip(bad * reps, out["error"])]
    out["ape"] = ape(out["label_e2e_ms"], out["e2e_ms"].where(out["error"] == ""))
    out.attrs = dict(long.attrs)         # the sweep's RunInfo (no kernel tables: the sweep keeps none)
    return out


def _sweep(index, predictors, seeds, quick, progress):
    from neusight_core.cost import sweep
    n = len(index)
    rows, bad = [], [""] * n
    for i, r in enumerate(index.itertuples(index=False)):
        row = {"model": r.model, "device": r.gpu, "batch": r.batch, "seq": r.seq, "mode": r.mode}
        try:
            row.update(option_kwargs(r.option))
        except ValueError as e:
            bad[i] = str(e)
            row["batch"] = None            # the sweep records the row as an error; ours_error says why
        rows.append(row)
    long = sweep.run(pd.DataFrame(rows), _names(predictors), _seeds(seeds), quick=quick, progress=progress)
    return long, bad


def _names(predictors):
    return [predictors] if isinstance(predictors, str) else list(predictors)


def _seeds(seeds):
    return [int(seeds)] if isinstance(seeds, (int, np.integer)) else [int(x) for x in seeds]


def _spread(index, long, bad, wall, predictors, seeds) -> pd.DataFrame:
    predictors, seeds = _names(predictors), _seeds(seeds)
    out = index.copy()
    classes = list(schema.OP_CLASSES)
    failed = [dict() for _ in range(len(out))]     # per configuration: reason -> predictors that failed with it
    for k, seed in enumerate(seeds):
        for p in predictors:
            g = long[(long["predictor"] == p) & (long["seed"] == seed)].reset_index(drop=True)
            ok = (g["error"] == "").to_numpy()
            ms = np.where(ok, g["e2e_ms"].to_numpy(float), np.nan)
            if k == 0:
                out[f"ours_{p}_ms"] = ms
                out[f"ours_{p}_fw_ms"] = np.where(ok, g["fw_ms"].to_numpy(float), np.nan)
                out[f"ours_{p}_bw_ms"] = np.where(ok, (g["bw_ms"] + g["acc_ms"]).to_numpy(float), np.nan)
                for op in schema.PAPER_CLASSES:
                    out[f"ours_{p}_{op}_ms"] = np.where(ok, g[f"{op}_ms"].to_numpy(float), np.nan)
                per_class = g[[f"{c}_ms" for c in classes]].to_numpy(float)
                top = np.where(ok & np.isfinite(per_class).any(axis=1),
                               np.asarray(classes, dtype=object)[np.nan_to_num(per_class, nan=-1).argmax(axis=1)], "")
                out[f"ours_{p}_top_class"] = top
                out[f"ours_{p}_ape"] = ape(out["label_e2e_ms"], out[f"ours_{p}_ms"])
                for i in np.flatnonzero(~ok):
                    why = bad[i] or _reason_text(str(g["error"].iloc[i]), str(index["model"].iloc[i]))
                    failed[i].setdefault(why, []).append(p)
            if len(seeds) > 1:
                out[f"ours_{p}_s{seed}_ms"] = ms
                out[f"ours_{p}_s{seed}_ape"] = ape(out["label_e2e_ms"], out[f"ours_{p}_s{seed}_ms"])
    # one whole sentence per reason, never cut, naming the predictors (or all of them)
    out["ours_error"] = ["; ".join(f"{'all predictors' if len(ps) == len(predictors) else ', '.join(ps)}: {why}"
                                   for why, ps in f.items()) for f in failed]
    out["ours_wall_s"] = wall
    return out


def as_index(index: pd.DataFrame, ours: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS) -> pd.DataFrame:
    """The evaluation index with every ``pred_<p>_ms`` (and per-op ``pred_<p>_<OP>_ms``) replaced by
    ours, so that ``paper_tables.build_tables`` and ``claims.compute_claims`` regenerate the paper's
    tables and verdicts from our numbers with the same code as Tier 0."""
    from neusight_core.studies import evaluation
    out = index
    for p in predictors:
        out = evaluation.with_predictions(out, ours, predictor=p, column=f"ours_{p}_ms",
                                          per_op_columns={op: f"ours_{p}_{op}_ms" for op in schema.PAPER_CLASSES})
    return out


def figure_mask(df: pd.DataFrame, figure: str) -> pd.Series:
    """Rows of ``df`` that are labelled cells of a paper figure (``paper_tables.FIGURES`` name): the same
    selection as ``paper_tables.figure_cells`` and the claims (e.g. the 54 Figure 7 configurations)."""
    spec = pt.FIGURES[figure]
    cells = {(m, b) for m, bs in spec.headings for b in bs}
    return ((df["mode"] == spec.mode) & (df["option"] == "none") & df["gpu"].isin(spec.gpus)
            & pd.Series([(m, b) in cells and sq == ev.MODEL_SEQ.get(m) for m, b, sq
                         in zip(df["model"], df["batch"], df["seq"])], index=df.index))


def pooled_mape(df: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS) -> pd.DataFrame:
    """MAPE per group for ours and the authors', tidy: group, predictor, source, mape, n.

    One definition per group, the paper's: NVIDIA inference = the labelled cells of Figure 7,
    NVIDIA training = Figure 8, unseen NVIDIA GPUs = their H100 / L4 / A100-80GB cells, AMD = Figure 9,
    fusion = the fused configurations of Table 7, distributed = Table 8. The claims use the same cells."""
    f7, f8 = figure_mask(df, "nvidia_inf"), figure_mask(df, "nvidia_train")
    groups = {
        "NVIDIA inference": f7,
        "NVIDIA training": f8,
        "unseen NVIDIA GPUs": (f7 | f8) & df["ood_gpu"].astype(bool),
        "fusion": df["option"] == "fusion",
        "distributed": df["option"].isin(["dp4", "tp4", "pp4_1"]),
        "AMD": figure_mask(df, "amd_inf") | figure_mask(df, "amd_train"),
    }
    rows = []
    for g, m in groups.items():
        for p in predictors:
            for source, col in (("ours", f"ours_{p}_ape"), ("authors", f"ape_{p}")):
                if col not in df:
                    continue
                v = df.loc[m, col].dropna()
                rows.append({"group": g, "predictor": p, "source": source,
                             "mape": float(v.mean()) if len(v) else np.nan, "n": int(len(v))})
    return pd.DataFrame(rows)


#: The quick subset (CI and ``./run_all.sh --quick``): one of each kind of configuration, on a seen and
#: an unseen GPU, small models only so that tracing stays in seconds.
QUICK_CONFIGS = (
    ("NVIDIA_H100_80GB_HBM3", "bert_large-inf-512-8"),
    ("NVIDIA_H100_80GB_HBM3", "gpt2_large-inf-1024-4"),
    ("NVIDIA_H100_80GB_HBM3", "bert_large-train-512-2"),
    ("NVIDIA_H100_80GB_HBM3", "bert_large-inf-512-8-fusion"),
    ("NVIDIA_H100_80GB_HBM3", "gpt2_large-train-1024-4-dp4"),
    ("Tesla_V100-PCIE-32GB", "bert_large-inf-512-8"),
)


def select_configs(index: pd.DataFrame, quick: bool = False) -> pd.DataFrame:
    """Every labelled configuration, or the quick subset."""
    if not quick:
        return index.reset_index(drop=True)
    keep = pd.Series(list(zip(index["gpu"], index["config"]))).isin(QUICK_CONFIGS).to_numpy()
    return index[keep].reset_index(drop=True)


def prediction_time(model: str, device: str, batch: int, seq: int, mode: str, predictor: str = "neusight",
                    quick: bool = False, repeats: int = 3, **kw) -> dict:
    """Wall time to predict one configuration: ``load_s`` (predictor weights, once per process),
    ``cold_s`` (trace + predict, no trace cached anywhere: the on-disk trace cache is bypassed),
    ``disk_hit_s`` (trace read from the on-disk trace cache, as in a new process) and ``warm_s``
    (predict only: the fastest of ``repeats`` calls with the trace cached in the process)."""
    import os
    latency.loaded_predictor.cache_clear()
    t0 = time.perf_counter()
    latency.loaded_predictor(predictor, quick)
    load = time.perf_counter() - t0
    tables.trace_memo.cache_clear()
    old = os.environ.get("NEUSIGHT_TRACE_CACHE_OFF")
    os.environ["NEUSIGHT_TRACE_CACHE_OFF"] = "1"
    try:
        t0 = time.perf_counter()
        latency.predict_model(model, device, batch, seq, mode, predictor=predictor, quick=quick, **kw)
        cold = time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("NEUSIGHT_TRACE_CACHE_OFF", None)
        else:
            os.environ["NEUSIGHT_TRACE_CACHE_OFF"] = old
    tables.trace_memo.cache_clear()
    latency.predict_model(model, device, batch, seq, mode, predictor=predictor, quick=quick, **kw)  # fill the disk cache
    tables.trace_memo.cache_clear()
    t0 = time.perf_counter()
    latency.predict_model(model, device, batch, seq, mode, predictor=predictor, quick=quick, **kw)
    disk_hit = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        latency.predict_model(model, device, batch, seq, mode, predictor=predictor, quick=quick, **kw)
        warm.append(time.perf_counter() - t0)
    return {"model": model, "device": device, "batch": batch, "seq": seq, "mode": mode,
            "predictor": predictor, "load_s": load, "cold_s": cold, "disk_hit_s": disk_hit, "warm_s": min(warm)}


def per_gpu_mape(df: pd.DataFrame, predictors=ev.RELEASE_PREDICTORS) -> pd.DataFrame:
    """MAPE per GPU and mode (plain configurations), ours next to the authors': gpu, mode, predictor,
    ours, authors, n."""
    plain = df[df["option"] == "none"]
    rows = []
    for (gpu, mode), g in plain.groupby(["gpu", "mode"]):
        for p in predictors:
            rows.append({"gpu": gpu, "mode": mode, "predictor": p,
                         "ours": g[f"ours_{p}_ape"].mean(),
                         "authors": g[f"ape_{p}"].mean() if f"ape_{p}" in g else np.nan,   # none for neusight-paper
                         "n": int(g[f"ours_{p}_ape"].notna().sum())})
    return pd.DataFrame(rows)


#: The claims whose numbers are MAPEs of whole-model predictions: the headline comparison of Tier 1.
HEADLINE_CLAIMS = ("C2", "C3", "C4", "C5", "C7", "C8", "C10")


def paper_comparison(tier0_detail: pd.DataFrame, ours_detail: pd.DataFrame,
                     claim_ids=HEADLINE_CLAIMS) -> pd.DataFrame:
    """Paper value / the authors' pairs / our re-implementation for the headline claims, on the same
    cells (each claim's primary aggregation, from ``claims.compute_claims`` detail frames):
    claim, quantity, paper, authors, ours, ours_minus_paper, n_cells (ours)."""
    key = ["claim", "quantity"]
    a = tier0_detail[tier0_detail["primary"]].set_index(key)
    o = ours_detail[ours_detail["primary"]].set_index(key)
    rows = []
    for (cid, q), r in o.iterrows():
        if cid not in claim_ids:
            continue
        rows.append({"claim": cid, "quantity": q, "paper": r["expected"],
                     "authors": a["computed"].get((cid, q), np.nan), "ours": r["computed"],
                     "ours_minus_paper": r["computed"] - r["expected"], "n_cells": r["n_cells"]})
    return pd.DataFrame(rows)


def small_kernel_report(model: str, device: str, batch: int, seq: int, mode: str, option: str = "none",
                        threshold_us: float = 10.0, quick: bool = False) -> pd.DataFrame:
    """Where an element-wise-heavy miss comes from: our NeuSight's predicted time of the VEC/MEM kernels of
    one configuration, split by whether the kernel's bandwidth roofline time is below ``threshold_us``,
    next to that roofline time. Columns: op_class, size, launches, predicted_ms, roofline_ms."""
    from neusight_core.data import devices
    dev = devices.get_device(device)
    k = latency.predict_model(model, dev, batch, seq, mode, quick=quick, **option_kwargs(option))["kernels"]
    k = k[k["op_class"].isin([OpClass.VEC, OpClass.MEM])].copy()
    per_launch_roof = (k["bytes_read"] + k["bytes_written"]) / (dev.mem_bw_gbs * 1e9) * 1e3
    k["roofline_ms"] = per_launch_roof * k["count"]
    k["size"] = np.where(per_launch_roof * 1e3 < threshold_us, f"< {threshold_us:g} us at roofline",
                         f">= {threshold_us:g} us at roofline")
    return (k.groupby(["op_class", "size"])
            .agg(launches=("count", "sum"), predicted_ms=("pred_ms", "sum"), roofline_ms=("roofline_ms", "sum"))
            .reset_index())


def training_floor(op_class: str = OpClass.VEC, max_elems: int = 2**16) -> pd.DataFrame:
    """Median measured latency of the smallest kernels of a class in the training data, per training GPU:
    the fixed per-kernel cost the predictors learn (device, kernels, median_us)."""
    from neusight_core.data import dataset
    k = dataset.training_data().of_class(op_class)
    small = k[(k["B"] * k["H"]) <= max_elems]
    return (small.groupby("device")["latency_ms"].agg(kernels="size", median_us="median")
            .assign(median_us=lambda d: d["median_us"] * 1e3).reset_index())
