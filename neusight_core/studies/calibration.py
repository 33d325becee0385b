"""The error model behind each answer's interval: measured, calibrated and checked (notebook 08, docs/error_bars.md).

``fit(recipe, seed)`` measures the parts of ``cost/error_model.py`` and calibrates them, on the training GPUs only:

1. **kernel parts, one GPU left out.** For each of the release's five training GPUs, the recipe trained (quick) without
   it (``drop_gpu``) predicts that GPU's kernel records (the release's training records and its test-set rows, tiles
   looked up as for an unseen GPU); the tensor-core networks likewise on NVIDIA's measured BF16 kernels of their four
   training GPUs; the memory law (``memory_bound_eval.left_out_ms``) on the measured quantiser kernels; the
   all-reduce's fixed cost (``network.fit_latency``) on the NVLink GPUs' measured all-reduces. Per part (what
   answered a kernel, ``KernelPredictor.answered_by``) and held-out GPU: the time-weighted mean log residual (the GPU's
   shared bias) and the spread around it.
2. **seeds.** The same folds trained with the next seed: how far two seeds answer the calibration steps apart.
3. **calibration, split by GPU.** Each training GPU's labelled end-to-end steps (the release's labels: single GPU, with
   and without fusion), predicted by the fold that never saw that GPU, give z = log(measured / predicted) / sigma;
   their quantiles set the interval at any coverage (split conformal).

Nothing here reads an unseen or held-out GPU. ``check(...)`` then scores the intervals on the check sets, none of which
fitted or calibrated anything: the release's unseen GPUs (H100, A100-80GB, L4), its multi-GPU labels, NVIDIA's measured
kernels of the held-out B200 and GB200, and the recorded GPU steps of docs/tier2 (2026-11-28 runs, two or more per
step).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from neusight_core import predictors as P
from neusight_core.question.schema import Precision
from neusight_core.cost import engine, error_model as em
from neusight_core.cost.request import parse
from neusight_core.data import dataset, devices, measured_kernels as mk
from neusight_core.predictors.base import ANSWER_COMM, ANSWER_LAW, ANSWER_TENSOR_CORE
from neusight_core.studies import evaluation as ev

#: the release's unseen GPUs (the paper's Figure 8 / Table 5): a check set, never fitted on
UNSEEN = ("NVIDIA_H100_80GB_HBM3", "NVIDIA_A100_80GB_PCIe", "NVIDIA_L4")
#: the coverages the check reports
LEVELS = (0.5, 0.8, 0.95)
#: kernel records per training GPU and part scored in step 1 (a fixed random subset: minutes, not hours)
KERNEL_SAMPLE = 4000


def training_gpus() -> list[str]:
    return [d.name for d in devices.training_devices()]


#: the method's version, kept in each saved model: a model made by another is made again (``ensure``)
METHOD_VERSION = 1

#: how a fold is trained: ``quick`` (the quick weights' subset and epochs: seconds), ``subset`` (the quick subset
#: of FOLD_ROWS records per class with the recipe's own epochs: minutes) or ``full`` (the recipe's own training:
#: about 12 min a fold here). The adopted model uses quick folds; the other two were tried (docs/error_bars.md).
FOLD_ROWS = 4000
FOLDS = {"quick": dict(quick=True), "subset": dict(quick=False, rows=FOLD_ROWS), "full": dict(quick=False)}


def fold(recipe: str, seed: int, gpu: str | list, folds: str = "quick"):
    """The recipe trained without ``gpu``'s records, or without those of each GPU of a list (``FOLDS[folds]``):
    trained once, kept with the weights."""
    if folds not in FOLDS:
        raise ValueError(f"folds must be one of {', '.join(FOLDS)}, got {folds!r}")
    if not isinstance(gpu, str) and len(gpu) == 1:
        gpu = gpu[0]            # one GPU is keyed by its name: the same weights however it is asked for
    return P.get(recipe, seed=seed, config={"drop_gpu": gpu if isinstance(gpu, str) else list(gpu)}, **FOLDS[folds])


# ------------------------------------------------------------------------------ 1. the kernel parts
def _sample(df: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    return df if len(df) <= n else df.sample(n, random_state=seed)


def kernel_records() -> pd.DataFrame:
    """The FP32 networks' scored kernels: the release's training records and its test-set rows of the training GPUs."""
    train = dataset.training_data()
    seen = dataset.seen_test_kernels(0.0)
    cols = [c for c in train.kernels.columns if c in seen.columns]
    return pd.concat([train.kernels, seen[cols]], ignore_index=True)


def held_out_residuals(p, rows: pd.DataFrame, gpu: str, seed: int) -> pd.DataFrame:
    """``gpu``'s kernels (``KERNEL_SAMPLE`` per class) by ``p``, which never saw it: one row per kernel (``part``,
    ``gpu``, ``measured_ms``, ``predicted_ms``)."""
    k = rows[rows["device"] == gpu]
    k = pd.concat([_sample(d, KERNEL_SAMPLE, seed) for _, d in k.groupby("op_class")], ignore_index=True)
    k = k.drop(columns=[c for c in ("tile_m", "tile_k", "tile") if c in k])   # looked up, as for an unseen GPU
    return pd.DataFrame({"part": p.answered_by(k), "gpu": gpu, "measured_ms": k["latency_ms"].to_numpy(float),
                         "predicted_ms": p.predict(k, gpu)})


def network_residuals(recipe: str, seed: int, folds: str = "quick") -> pd.DataFrame:
    """Step 1 for the FP32 networks: one row per scored kernel (``part``, ``gpu``, ``measured_ms``, ``predicted_ms``)."""
    rows = kernel_records()
    return pd.concat([held_out_residuals(fold(recipe, seed, g, folds), rows, g, seed) for g in training_gpus()],
                     ignore_index=True)


def held_out_biases(recipe: str, seed: int, left_out: int, folds: str = "quick") -> pd.DataFrame:
    """Each training GPU's bias per FP32 network part (time-weighted mean log residual), by folds trained without it
    and ``left_out - 1`` other training GPUs (every such combination: a row per GPU, part and other GPUs left out)."""
    import itertools
    rows, gpus, out = kernel_records(), training_gpus(), []
    for drop in itertools.combinations(gpus, left_out):
        p = fold(recipe, seed, drop, folds)
        for g in drop:
            for _, x in part_sizes(held_out_residuals(p, rows, g, seed)).iterrows():
                out.append({"training GPUs": len(gpus) - left_out, "gpu": g, "part": x["part"],
                            "also left out": ", ".join(d for d in drop if d != g), "bias": x["bias_per_gpu"].get(g)})
    return pd.DataFrame(out)


def bias_by_training_gpus(recipe: str = "neusight", seed: int = 0, folds: str = "quick") -> pd.DataFrame:
    """Does a held-out GPU's bias shrink as training GPUs are added? Per FP32 network part, the root mean square of the
    held-out GPUs' biases with one (four training GPUs) and two (three) left out: were it to shrink fast, the
    deployed networks (five) would err less on a new GPU than the folds say (docs/error_bars.md: it barely does)."""
    b = pd.concat([held_out_biases(recipe, seed, n, folds) for n in (1, 2)], ignore_index=True)
    return (b.dropna(subset=["bias"]).groupby(["part", "training GPUs"])["bias"]
            .apply(lambda x: float(np.sqrt(np.mean(np.square(x))))).unstack())


def tensor_core_residuals(recipe: str, seed: int, quick: bool = True) -> pd.DataFrame:
    """Step 1 for the BF16 tensor-core networks: each trained (``quick``, or as the full weights train them: about a
    minute a fold) without one of their training GPUs."""
    from neusight_core.predictors import tensor_core as tc
    config = P.create(recipe, seed).config.get("tensor_core")
    if not config or mk.unavailable():
        return pd.DataFrame(columns=["part", "gpu", "measured_ms", "predicted_ms"])
    nets_of = tuple(config.get("networks", tc.NETWORKS))
    rows = mk.training_kernels(nets_of)
    out = []
    for g in sorted(rows["device"].unique()):
        nets = tc.TensorCoreNets(config, seed=seed)
        nets.fit(rows[rows["device"] != g], quick=quick, law=P.memory_law_params())
        k = rows[rows["device"] == g].reset_index(drop=True)
        k = pd.concat([_sample(d, KERNEL_SAMPLE, seed) for _, d in k.groupby(tc.network_of(k))], ignore_index=True)
        pred = nets.predict(k, law=P.memory_law_params())
        ok = np.isfinite(pred)
        out.append(pd.DataFrame({"part": ANSWER_TENSOR_CORE + " " + tc.network_of(k)[ok].astype(object), "gpu": g,
                                 "measured_ms": k["latency_ms"].to_numpy(float)[ok], "predicted_ms": pred[ok]}))
    return pd.concat(out, ignore_index=True)


def law_residuals() -> pd.DataFrame:
    """Step 1 for the memory law and the all-reduce's fixed cost (no seeds: fits, not networks)."""
    from neusight_core.cost import network
    from neusight_core.studies import memory_bound_eval as mbe
    out = []
    if not mk.unavailable():
        q = mk.load_quantize("training")
        for g in sorted(q["device"].unique()):
            k = q[q["device"] == g]
            out.append(pd.DataFrame({"part": ANSWER_LAW, "gpu": g, "measured_ms": k["latency_ms"].to_numpy(float),
                                     "predicted_ms": mbe.left_out_ms(q, k, g)}))
        a = mk.load_allreduce("training")
        for g in sorted(a["device"].unique()):
            k = a[a["device"] == g]
            fit = network.fit_latency(a[a["device"] != g])
            pred = network.ring_ms(k["bytes"], k["gpus"], k["link_gbs"]) + network.fixed_us(k["gpus"], fit) / 1e3
            out.append(pd.DataFrame({"part": ANSWER_COMM, "gpu": g, "measured_ms": k["latency_ms"].to_numpy(float),
                                     "predicted_ms": np.asarray(pred, float)}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["part", "gpu", "measured_ms", "predicted_ms"])


def seen_residuals(recipe: str, seed: int, quick: bool) -> pd.DataFrame:
    """Step 1 on the GPUs each part was trained on: the answering weights on their own training GPUs' kernels (the
    release's records and test-set rows; NVIDIA's measured kernels), the memory law and the all-reduce's fixed cost
    as fitted on all of theirs. What a question about one of those GPUs can expect."""
    from neusight_core.cost import network
    p = P.get(recipe, quick=quick, seed=seed)
    train = dataset.training_data()
    seen = dataset.seen_test_kernels(0.0)
    rows = pd.concat([train.kernels, seen[[c for c in train.kernels.columns if c in seen.columns]]], ignore_index=True)
    rows = pd.concat([_sample(d, KERNEL_SAMPLE, seed) for _, d in rows.groupby(["device", "op_class"])], ignore_index=True)
    rows = rows.drop(columns=[c for c in ("tile_m", "tile_k", "tile") if c in rows])    # looked up, as a question's
    out = [pd.DataFrame({"part": p.answered_by(rows), "gpu": rows["device"].to_numpy(),
                         "measured_ms": rows["latency_ms"].to_numpy(float), "predicted_ms": p.predict(rows, None)})]
    if not mk.unavailable() and getattr(p, "tc", None) is not None and p.tc.nets:
        from neusight_core.predictors import memory_law, tensor_core as tc
        k = mk.training_kernels(tuple(p.tc.config["networks"]))
        k = pd.concat([_sample(d, KERNEL_SAMPLE, seed) for _, d in k.groupby(["device", tc.network_of(k)])],
                      ignore_index=True)
        pred = p.tc.predict(k, law=p.law_numbers())
        ok = np.isfinite(pred)
        out.append(pd.DataFrame({"part": ANSWER_TENSOR_CORE + " " + tc.network_of(k)[ok].astype(object),
                                 "gpu": k["device"].to_numpy()[ok], "measured_ms": k["latency_ms"].to_numpy(float)[ok],
                                 "predicted_ms": pred[ok]}))
        q = mk.load_quantize("training")
        out.append(pd.DataFrame({"part": ANSWER_LAW, "gpu": q["device"].to_numpy(),
                                 "measured_ms": q["latency_ms"].to_numpy(float),
                                 "predicted_ms": memory_law.time_ms(q, None, P.memory_law_params())}))
        a = mk.load_allreduce("training")
        pred = network.ring_ms(a["bytes"], a["gpus"], a["link_gbs"]) + network.fixed_us(a["gpus"]) / 1e3
        out.append(pd.DataFrame({"part": ANSWER_COMM, "gpu": a["device"].to_numpy(),
                                 "measured_ms": a["latency_ms"].to_numpy(float), "predicted_ms": np.asarray(pred, float)}))
    return pd.concat(out, ignore_index=True)


#: a GPU whose median kernel of a part is predicted more than 100x off (|log residual| > ln 100) is a failed fold,
#: not an error to size: the FP32 convolution network trained without the P4 (on P100, T4 and V100 only, the slowest
#: GPU then outside its range) predicts every P4 convolution 10^5x too slow (docs/error_bars.md)
BROKEN_FOLD = math.log(100.0)


def part_sizes(res: pd.DataFrame) -> pd.DataFrame:
    """Per part: ``shared`` (RMS over held-out GPUs of their time-weighted mean log residual), ``independent`` (RMS
    of the time-weighted spread around it), ``largest_bias`` (the largest |mean| of one GPU), GPUs and kernels."""
    res = res[np.isfinite(res["predicted_ms"]) & (res["predicted_ms"] > 0) & (res["measured_ms"] > 0)]
    e = np.log(res["measured_ms"].to_numpy(float) / res["predicted_ms"].to_numpy(float))
    d = res.assign(e=e, w=res["measured_ms"].to_numpy(float))
    rows = []
    for part, g in d.groupby("part"):
        per, broken = [], []
        for gpu, x in g.groupby("gpu"):
            if float(np.median(np.abs(x["e"]))) > BROKEN_FOLD:
                broken.append(gpu)      # not an error to size: a failed extrapolation, named in the model's rows
                continue
            b = float(np.average(x["e"], weights=x["w"]))
            per.append((gpu, b, math.sqrt(float(np.average((x["e"] - b) ** 2, weights=x["w"]))), len(x)))
        if not per:
            continue            # every fold failed: a part without data (``error_model.nearest``)
        bias = np.array([p[1] for p in per])
        rows.append({"part": part, "shared": float(np.sqrt(np.mean(bias**2))),
                     "independent": float(np.sqrt(np.mean([p[2] ** 2 for p in per]))),
                     "largest_bias": float(np.max(np.abs(bias))), "gpus": len(per), "kernels": int(sum(p[3] for p in per)),
                     "bias_per_gpu": {p[0]: round(p[1], 4) for p in per}, "broken_folds": broken})
    return pd.DataFrame(rows)


def seen_gpus(sizes: pd.DataFrame) -> dict:
    """Part -> the GPUs its in-sample numbers come from (``part_sizes``' ``bias_per_gpu``)."""
    return {r["part"]: sorted(r["bias_per_gpu"]) for _, r in sizes.iterrows()}


# ------------------------------------------------------------------------------ 2-3. seeds and calibration
def labelled_steps(gpus, options=("none", "fusion")) -> pd.DataFrame:
    """The release's labelled configurations of ``gpus`` with one of ``options`` (``option_kwargs``' settings)."""
    idx = ev.build_index()
    return idx[idx["gpu"].isin(list(gpus)) & idx["option"].isin(list(options))].reset_index(drop=True)


def requests_of(idx: pd.DataFrame, coverage: float = 0.8) -> list:
    from neusight_core.studies.reproduce import option_kwargs
    return parse([{"model": r.model, "device": r.gpu, "batch": int(r.batch), "seq": int(r.seq), "mode": r.mode,
                   "coverage": coverage, **option_kwargs(r.option)} for r in idx.itertuples(index=False)])


def fold_predictions(recipe: str, seed: int, model: em.ErrorModel, idx: pd.DataFrame, folds: str = "quick") -> pd.DataFrame:
    """Each training GPU's labelled steps by its fold: ``e2e_ms`` and ``sigma`` beside ``label_e2e_ms``. The fold
    never saw the GPU: its spread is the held-out one (no part counts the GPU among its training GPUs)."""
    model = dataclasses.replace(model, seen_gpus={})
    parts = []
    for g, sub in idx.groupby("gpu"):
        sub = sub.reset_index(drop=True)
        f = engine.predict(requests_of(sub), [(recipe, fold(recipe, seed, g, folds))], quick=True, memory_columns=False,
                           error_model=model)
        parts.append(pd.concat([sub[["gpu", "model", "mode", "batch", "seq", "option", "label_e2e_ms"]],
                                f[["e2e_ms", "sigma", "error"]]], axis=1))
    return pd.concat(parts, ignore_index=True)


def fit(recipe: str = "neusight", seed: int = 0, quick: bool = True, log=print, folds: str = "quick") -> em.ErrorModel:
    """Steps 1-3 for ``recipe`` and ``seed``, for its ``quick`` or full weights, its held-out parts and scale from
    ``folds`` (``FOLDS``: quick unless a study asks, a full fold costs a full training); the model is saved beside the
    weights (``error_model.save``)."""
    log(f"calibration of {recipe} seed {seed}: kernel parts, one training GPU left out")
    res = pd.concat([network_residuals(recipe, seed, folds), tensor_core_residuals(recipe, seed, folds == "quick"),
                     law_residuals()],
                    ignore_index=True)
    sizes = part_sizes(res)
    log("  the same on each part's own training GPUs, by the weights that answer")
    own = part_sizes(seen_residuals(recipe, seed, quick))
    gpus_of = seen_gpus(own)
    base = em.ErrorModel(recipe, seed, quick, shared=dict(zip(sizes["part"], sizes["shared"])),
                         independent=dict(zip(sizes["part"], sizes["independent"])),
                         shared_outside=dict(zip(sizes["part"], sizes["largest_bias"])),
                         seen_shared=dict(zip(own["part"], own["shared"])),
                         seen_independent=dict(zip(own["part"], own["independent"])), seen_gpus=gpus_of)
    idx = labelled_steps(training_gpus())
    # the seeds' spread from quick folds whatever ``folds`` is: a second seed of slower folds would double their cost
    log(f"  seeds: the calibration steps by the quick folds of seeds {seed} and {seed + 1}")
    a = fold_predictions(recipe, seed, base, idx)
    b = fold_predictions(recipe, seed + 1, base, idx)
    ok = (a["error"] == "") & (b["error"] == "")
    seed_sigma = float(np.std(np.log(a.loc[ok, "e2e_ms"] / b.loc[ok, "e2e_ms"])) / math.sqrt(2))
    model = dataclasses.replace(base, seed_sigma=seed_sigma)
    log("  calibration: z = log(label / prediction) / sigma on the training GPUs' labelled steps, each by its fold")
    c = fold_predictions(recipe, seed, model, idx, folds)
    c = c[(c["error"] == "") & np.isfinite(c["sigma"]) & (c["sigma"] > 0)]
    z = np.sort(np.log(c["label_e2e_ms"] / c["e2e_ms"]).to_numpy(float) / c["sigma"].to_numpy(float))
    rows = {"version": METHOD_VERSION,
            "parts": sizes.drop(columns=["shared", "independent", "largest_bias"]).to_dict(orient="records"),
            "seen_parts": own.drop(columns=["shared", "independent", "largest_bias"]).to_dict(orient="records"),
            "calibration_steps": int(len(z)), "calibration_gpus": sorted(c["gpu"].unique()),
            "seeds_from": [seed, seed + 1], "seed_steps": int(ok.sum()), "folds": f"{folds} (drop_gpu)"}
    model = dataclasses.replace(model, scores=tuple(float(x) for x in z), rows=rows,
                              notes=f"held-out parts and the scale from {folds} folds (one training GPU left out)"
                                    + ("" if quick or folds != "quick" else
                                       "; for full weights (full folds were tried: they err more on the GPU left out, "
                                       "docs/error_bars.md)"))
    em.save(model)
    return model


def ensure(recipe: str = "neusight", seed: int = 0, quick: bool = True, log=print) -> em.ErrorModel:
    """The saved error model of these weights when it is newer than they are and made by this ``METHOD_VERSION``,
    else ``fit`` (made once per recipe, seed and kind of weights, and again when the weights are retrained or the
    method changes)."""
    model = em.load(recipe, seed, quick)
    meta = P.folder(recipe, quick, seed) / "meta.json"
    if (model is not None and model.rows.get("version") == METHOD_VERSION and meta.exists()
            and em.path_of(recipe, seed, quick).stat().st_mtime >= meta.stat().st_mtime):
        return model
    return fit(recipe, seed, quick, log)


def parts_table(model: em.ErrorModel) -> pd.DataFrame:
    """The model's parts: shared and own spread (% in log) on a held-out GPU, the largest held-out GPU's bias, what
    they rest on, and the same on the part's own training GPUs."""
    rest = {r["part"]: r for r in model.rows.get("parts", [])}
    return pd.DataFrame([{"part": p, "shared (%)": round(100 * model.shared[p], 1),
                          "own, per kernel (%)": round(100 * model.independent.get(p, 0.0), 1),
                          "largest GPU bias (%)": round(100 * model.shared_outside.get(p, model.shared[p]), 1),
                          "held-out GPUs": int(rest.get(p, {}).get("gpus", 0)),
                          "kernels": int(rest.get(p, {}).get("kernels", 0)),
                          "failed folds (left out)": ", ".join(rest.get(p, {}).get("broken_folds", [])),
                          "shared on its training GPUs (%)": round(100 * model.seen_shared.get(p, float("nan")), 1),
                          "own there (%)": round(100 * model.seen_independent.get(p, float("nan")), 1)}
                         for p in sorted(model.shared)])


# ------------------------------------------------------------------------------ the check sets
#: the recorded runs of docs/tier2 the check reads: those of 2026-11-28, whose harness restores a contiguous KV cache
#: (``live_modern.STRIDED_APPENDS``: the earlier ones are compared with each other only)
def recorded_runs() -> dict:
    from neusight_core.studies import live_modern
    return {n: v for n, v in live_modern.RECORDED.items() if n not in live_modern.STRIDED_APPENDS}


#: a check set's points (``check``)
POINT_COLUMNS = ["set", "measured_lo", "measured_hi", "estimate", "sigma", "widest", "gpu", "sigma_shared"]


def shared_only(model: em.ErrorModel) -> em.ErrorModel:
    """``model`` without its per-kernel parts: the spread every answer on one GPU shares (the parts' biases, the
    seeds', the host's), which ``calibrated_range`` draws once per GPU. The seeds' spread counts as shared because one
    set of weights errs alike on similar answers; it is small (about 5 %), so the choice barely moves the range."""
    return dataclasses.replace(model, independent={}, seen_independent={})


def _points(name: str, frame: pd.DataFrame, lo, hi, gpu, shared: pd.DataFrame) -> pd.DataFrame:
    """A check set's points: the measured range [lo, hi] (one measurement: lo = hi) beside the answer, its GPU and
    the shared part of its spread (``shared``: the same requests answered with ``shared_only``)."""
    ok = (frame["error"] == "") & np.isfinite(frame["sigma"].to_numpy(float))
    widest = frame["interval_by"].fillna("").str.replace(r" \d+%.*$", "", regex=True)
    return pd.DataFrame({"set": name, "measured_lo": np.asarray(lo, float), "measured_hi": np.asarray(hi, float),
                         "estimate": frame["e2e_ms"].to_numpy(float), "sigma": frame["sigma"].to_numpy(float),
                         "widest": widest.to_numpy(object), "gpu": np.asarray(gpu, object),
                         "sigma_shared": shared["sigma"].to_numpy(float)})[ok.to_numpy()]


def labelled_points(recipe: str, seed: int, quick: bool, model: em.ErrorModel) -> pd.DataFrame:
    """The release's labels the model never saw: the unseen GPUs' single-GPU steps, and the multi-GPU steps."""
    idx = ev.build_index()
    out = []
    for name, sub in (("unseen GPUs (release labels)", idx[idx["gpu"].isin(UNSEEN) & idx["option"].isin(["none", "fusion"])]),
                      ("multi-GPU (release labels)", idx[idx["option"].str.match(r"(dp|tp|pp)\d")])):
        sub = sub.reset_index(drop=True)
        reqs = requests_of(sub)
        f, fs = (engine.predict(reqs, recipe, seeds=(seed,), quick=quick, memory_columns=False, error_model=m)
                 for m in (model, shared_only(model)))
        out.append(_points(name, f, sub["label_e2e_ms"], sub["label_e2e_ms"], sub["gpu"], fs))
    return pd.concat(out, ignore_index=True)


def kernel_points(recipe: str, seed: int, quick: bool, model: em.ErrorModel, sample: int = 2000) -> pd.DataFrame:
    """NVIDIA's measured BF16 GEMMs and fused attention of the held-out B200 and GB200 (``sample`` per GPU and kind),
    each kernel an answer of its own: its part's shared and own spread, and the seeds'; their per-tensor FP8 GEMMs
    (``--dtype fp8``) as a set of their own where the recipe has an FP8 network."""
    if mk.unavailable():
        return pd.DataFrame(columns=POINT_COLUMNS)
    from neusight_core.predictors import tensor_core as tc
    parts_of = [mk.gemm_rows("held_out"), mk.attention_rows("held_out")]
    if "GEMM_fp8" in (P.create(recipe, seed).config.get("tensor_core") or {}).get("networks", ()):
        parts_of.append(mk.gemm_rows("held_out", Precision.FP8.value))
    rows = pd.concat(parts_of, ignore_index=True)
    rows = pd.concat([_sample(d, sample, seed) for _, d in rows.groupby(["device", tc.network_of(rows)])],
                     ignore_index=True)
    p = P.get(recipe, quick=quick, seed=seed)
    est = p.predict(rows, None)
    parts = p.answered_by(rows)
    outside = {d: em.outside_range(d) for d in rows["device"].unique()}
    sig, shared = (np.array([em.spread(m, {a: t}, {a: t * t}, t, 0.0, d, outside[d]).sigma
                             for a, t, d in zip(parts, est, rows["device"])]) for m in (model, shared_only(model)))
    y = rows["latency_ms"].to_numpy(float)
    kind = np.where(rows["precision"].to_numpy() == Precision.FP8, "held-out B200 / GB200 FP8 GEMMs (NVIDIA)",
                    "held-out B200 / GB200 kernels (NVIDIA)")
    return pd.DataFrame({"set": kind, "measured_lo": y, "measured_hi": y, "estimate": est, "sigma": sig,
                         "widest": parts, "gpu": rows["device"].to_numpy(object), "sigma_shared": shared})


def recorded_points(recipe: str, seed: int, quick: bool, model: em.ErrorModel) -> pd.DataFrame:
    """The recorded GPU steps (docs/tier2): per GPU kind and step measured in two or more runs, the range of their
    kernel sums (graph execution) and of their eager wall times, beside the answer."""
    from neusight_core import paths
    from neusight_core.question.schema import Execution
    from neusight_core.studies import live_modern
    by_gpu: dict = {}
    for name, (gpu, folder) in recorded_runs().items():
        f = paths.REPO_ROOT / folder / "modern_steps.csv"
        if f.exists():
            s = pd.read_csv(f)
            by_gpu.setdefault(gpu, []).append(s[s["status"] == "OK"].assign(run=name))
    out = []
    for gpu, runs in by_gpu.items():
        d = pd.concat(runs, ignore_index=True)
        for col, execution in (("kernel_ms", Execution.GRAPH), ("wall_ms", Execution.EAGER)):
            g = d.groupby(live_modern.STEP_KEY, dropna=False)[col].agg(["min", "max", "count"]).reset_index()
            g = g[g["count"] >= 2].reset_index(drop=True)
            if g.empty:
                continue
            reqs = [dict(live_modern.request_of(r, gpu, execution), coverage=0.8) for r in g.to_dict("records")]
            f, fs = (engine.predict(parse(reqs), recipe, seeds=(seed,), quick=quick, memory_columns=False,
                                    error_model=m) for m in (model, shared_only(model)))
            out.append(_points(f"recorded {gpu} steps ({execution}, docs/tier2)", f, g["min"], g["max"], [gpu] * len(g),
                               fs))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=POINT_COLUMNS)


def covered(points: pd.DataFrame, model: em.ErrorModel, coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """Per point: whether its interval at ``coverage`` overlaps the measured range, and its relative half-width."""
    q_lo, q_hi = model.quantiles(coverage)
    lo = points["estimate"] * np.exp(q_lo * points["sigma"])
    hi = points["estimate"] * np.exp(q_hi * points["sigma"])
    hit = (lo <= points["measured_hi"]) & (hi >= points["measured_lo"])
    return hit.to_numpy(bool), ((hi - lo) / 2 / points["estimate"]).to_numpy(float)


#: how many sets of draws ``calibrated_range`` simulates, and the share of them its range holds
DRAWS, RANGE = 2000, 0.9


def calibrated_range(points: pd.DataFrame, coverage: float = 0.8, draws: int = DRAWS, seed: int = 0) -> tuple:
    """The coverage (%) a calibrated error model would show on these points, as the range holding ``RANGE`` of
    ``draws`` simulated sets. Each GPU's points share one draw of the shared spread (``sigma_shared``) and each point
    adds its own (the rest of ``sigma``); a point is covered when its error is within the interval. A set of many
    points on few GPUs holds few draws of the shared bias, so its coverage can lie far from nominal however many points
    it has: this says how far. (Measured ranges, as the recorded steps have, are not simulated: a little narrow.)"""
    s = points["sigma"].to_numpy(float)
    r = np.clip(np.divide(points["sigma_shared"].to_numpy(float), s, out=np.zeros_like(s), where=s > 0), 0.0, 1.0)
    own = np.sqrt(1.0 - r**2)
    gpu = pd.factorize(points["gpu"])[0]
    q = em.normal_quantile((1 + coverage) / 2)
    rng = np.random.default_rng(seed)
    seen = []
    for start in range(0, draws, 100):        # in blocks: a set of 12,000 kernels at 2,000 draws is 190 MB at once
        n = min(100, draws - start)
        e = r * rng.standard_normal((n, gpu.max() + 1))[:, gpu] + own * rng.standard_normal((n, len(s)))
        seen.append((np.abs(e) <= q).mean(axis=1))
    lo, hi = np.quantile(np.concatenate(seen), [(1 - RANGE) / 2, (1 + RANGE) / 2])
    return 100 * float(lo), 100 * float(hi)


#: the columns ``coverage_table`` gives the range of a calibrated model's coverage at 80 % in
CALIBRATED_FROM, CALIBRATED_TO = "calibrated model at 80 %: from", "to"


def coverage_table(points: pd.DataFrame, model: em.ErrorModel, levels=LEVELS, by: str = "set") -> pd.DataFrame:
    """Per check set (``by``: or per widest part, ``widest``): points, the observed coverage at each level (%), the
    median relative half-width of the 80 % interval (%), and the median APE of the estimate (%), beside each other:
    covering by width is not the goal. Per check set also its GPUs (the independent draws of a GPU's shared bias it
    holds) and the range of coverage at 80 % a calibrated model would show on them (``calibrated_range``)."""
    rows = []
    for name, g in points.groupby(by, sort=False):
        r = {"check set" if by == "set" else "widest part": name, "points": len(g)}
        if by == "set":
            r["GPUs"] = g["gpu"].nunique()
        for c in levels:
            hit, half = covered(g, model, c)
            r[f"covered at {c:.0%}"] = round(100 * hit.mean(), 1)
            if c == 0.8:
                r["median half-width at 80 % (%)"] = round(100 * float(np.median(half)), 1)
        mid = (g["measured_lo"] + g["measured_hi"]) / 2
        r["median APE of the estimate (%)"] = round(100 * float(np.median(np.abs(g["estimate"] / mid - 1))), 1)
        if by == "set":
            r[CALIBRATED_FROM], r[CALIBRATED_TO] = (round(x, 1) for x in calibrated_range(g))
        rows.append(r)
    return pd.DataFrame(rows)


def reliability(points: pd.DataFrame, model: em.ErrorModel, levels=None) -> pd.DataFrame:
    """Nominal against observed coverage per check set (the reliability figure's lines)."""
    levels = np.round(np.arange(0.5, 0.96, 0.05), 2) if levels is None else levels
    return pd.DataFrame([{"set": name, "nominal": c, "observed": float(covered(g, model, c)[0].mean())}
                         for name, g in points.groupby("set", sort=False) for c in levels])


#: the issue's targets: at 80 % within these (sets of at least MIN_POINTS), 50 / 95 % within SLACK points of nominal,
#: no set below FLOOR at 80 %, the unseen GPUs' median half-width at 80 % at most SHARP
TARGET_80, SLACK, FLOOR, SHARP, MIN_POINTS = (72.0, 88.0), 10.0, 65.0, 15.0, 30


def consistency(coverage: pd.DataFrame) -> pd.DataFrame:
    """Per check set of a coverage table: its coverage at 80 % beside the range a calibrated model would show on its
    GPUs (``calibrated_range``), and whether it lies inside: a miss of the targets that a calibrated model would
    show as often is no evidence against the model; one outside is."""
    c = coverage["covered at 80%"]
    return coverage[["check set", "points", "GPUs", "covered at 80%", CALIBRATED_FROM, CALIBRATED_TO]].assign(
        inside=(c >= coverage[CALIBRATED_FROM]) & (c <= coverage[CALIBRATED_TO]))


def targets(coverage: pd.DataFrame) -> pd.DataFrame:
    """Each target of a coverage table (``coverage_table``'s columns, means over seeds): target, value, met."""
    rows = []
    for _, r in coverage.iterrows():
        name, n = r["check set"], int(r["points"])
        if n < MIN_POINTS:
            rows.append({"target": f"{name}: too few points to judge ({n} < {MIN_POINTS})", "value": "", "met": True})
            continue
        c80 = float(r["covered at 80%"])
        rows.append({"target": f"{name}: 80 % interval covers {TARGET_80[0]:.0f}-{TARGET_80[1]:.0f} %",
                     "value": f"{c80:.1f} %", "met": TARGET_80[0] <= c80 <= TARGET_80[1]})
        for level in (50, 95):
            c = float(r[f"covered at {level}%"])
            rows.append({"target": f"{name}: {level} % interval within {SLACK:.0f} points", "value": f"{c:.1f} %",
                         "met": abs(c - level) <= SLACK})
    judged = coverage[coverage["points"] >= MIN_POINTS]
    low = float(judged["covered at 80%"].min()) if len(judged) else float("nan")
    rows.append({"target": f"no set below {FLOOR:.0f} % at 80 %", "value": f"{low:.1f} %", "met": not low < FLOOR})
    unseen = coverage[coverage["check set"].str.startswith("unseen")]
    if len(unseen):
        w = float(unseen["median half-width at 80 % (%)"].iloc[0])
        rows.append({"target": f"unseen GPUs: median half-width at 80 % at most {SHARP:.0f} %", "value": f"{w:.1f} %",
                     "met": w <= SHARP})
    return pd.DataFrame(rows)


def check(recipe: str = "neusight", seed: int = 0, quick: bool = True, model: em.ErrorModel | None = None,
          kernel_sample: int = 2000) -> pd.DataFrame:
    """Every check set's points for the recipe's weights (``quick`` or full) and their error model."""
    model = model or em.load(recipe, seed, quick)
    if model is None:
        raise ValueError(f"no error model for {recipe} seed {seed} ({'quick' if quick else 'full'} weights): "
                         "run calibration.fit first")
    return pd.concat([labelled_points(recipe, seed, quick, model),
                      kernel_points(recipe, seed, quick, model, kernel_sample),
                      recorded_points(recipe, seed, quick, model)], ignore_index=True)


def main(argv=None) -> int:
    """``python -m neusight_core.studies.calibration [--predictor neusight] [--seed 0] [--full]``: make the error
    model of those weights (about a minute: five quick folds and their predictions)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m neusight_core.studies.calibration", description=main.__doc__)
    ap.add_argument("--predictor", default="neusight", choices=[n for n in P.names() if n.startswith("neusight")])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="for the full weights (default: the quick ones)")
    ap.add_argument("--folds", choices=list(FOLDS), default="quick",
                    help="how the folds train (subset: 5 x about 3 min, full: 5 x about 12 min; neither adopted, "
                         "docs/error_bars.md)")
    ap.add_argument("--leave-two-out", action="store_true",
                    help="print the held-out bias per part with one and with two training GPUs left out (quick folds: "
                         "about 3 min) instead of making the model")
    a = ap.parse_args(argv)
    if a.leave_two_out:
        print((100 * bias_by_training_gpus(a.predictor, a.seed, a.folds)).round(1)
              .rename(columns=lambda n: f"{n} training GPUs: RMS bias (% in log)").to_string())
        return 0
    model = fit(a.predictor, a.seed, quick=not a.full, folds=a.folds)
    print(f"saved {em.path_of(model.predictor, model.seed, model.quick)}: scale {model.scale:.3f} from "
          f"{model.rows['calibration_steps']} held-out steps of {len(model.rows['calibration_gpus'])} GPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
