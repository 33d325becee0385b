"""Kernel-level accuracy of the predictors on the release's kernel test sets (notebook 03).

In distribution = the five training GPUs' test rows (shapes not in the training data); out of
distribution = H100, L4 and A100-80GB, whose data are used here for evaluation only.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from neusight_core.data import dataset
from neusight_core import paths
from neusight_core.studies import error_metric
from neusight_core.predictors import registry
from neusight_core.question import schema
from neusight_core import predictors as P
from neusight_core.question.schema import OpClass

PRED_LABEL = {n: e.label for n, e in registry.entries().items()}
ORDER = registry.reported()   # row order of the paper's per-op table: baselines, then NeuSight
DIST = {True: "In Distribution", False: "Out of Distribution"}
#: why some cells of the per-op and per-GPU tables are empty (NaN), said under them in notebook 03
EMPTY_CELLS = ("Empty cells: NeuSight (ours) has no in-distribution score, because its recipe also trains on the training "
               "GPUs' test kernels (recipes/neusight.yaml, extra_training: seen_test), so scoring it there would score it on "
               "its training data; it is scored on the unseen GPUs only. H100 has no layernorm, softmax or element-wise "
               "test kernels in the release, so those cells are empty for every predictor.")


def train_all(quick: bool = False, seed: int = 0, names=ORDER) -> tuple[dict, pd.DataFrame]:
    """Load or train every predictor; table of wall time (this call) and recorded training time."""
    preds, rows = {}, []
    for name in names:
        t0 = time.perf_counter()
        p = P.get(name, quick=quick, seed=seed)
        wall = time.perf_counter() - t0
        preds[name] = p
        rows.append({"predictor": PRED_LABEL[name], "train_seconds": p.info.get("train_seconds", float("nan")),
                     "this_call_seconds": wall, "quick": quick, "seed": seed,
                     "data_checksum": str(p.info.get("data_checksum", ""))[:12]})
    return preds, pd.DataFrame(rows)


def trains_on_test(p) -> bool:
    """The predictor trained on the training GPUs' rows of the test sets (our recipe)."""
    return getattr(p, "config", {}).get("extra_training") == "seen_test"


def predict_all(preds: dict, test: pd.DataFrame | None = None) -> pd.DataFrame:
    """Long frame: one row per (test kernel, predictor) with measured, predicted and APE.

    ``in_training``: the row was training data of that predictor (our recipe trains on the training GPUs'
    test rows): its APE is left empty, so in-distribution cells of such a predictor are blank rather than
    in-sample; ``recipe_studies.shape_holdout_check`` measures it on shapes it never saw."""
    test = dataset.test_kernels() if test is None else test
    parts = []
    for name, p in preds.items():
        pred = p.predict(test, None)
        parts.append(pd.DataFrame({"predictor": name, "device": test["device"].to_numpy(),
                                   "op_class": test["op_class"].to_numpy(), "op": test["op"].to_numpy(),
                                   "seen": test["seen"].to_numpy(), "measured_ms": test["latency_ms"].to_numpy(),
                                   "predicted_ms": pred,
                                   "in_training": test["seen"].to_numpy() & trains_on_test(p)}))
    out = pd.concat(parts, ignore_index=True)
    out["ape"] = error_metric.ape(out["measured_ms"], out["predicted_ms"])
    out.loc[out["in_training"], "ape"] = np.nan
    return out


def perop_table(long: pd.DataFrame) -> pd.DataFrame:
    """MAPE in the layout of the paper's per-op table: predictors x (distribution, op class)."""
    g = long.groupby(["predictor", "seen", "op_class"])["ape"].mean().reset_index()
    g["dist"] = g["seen"].map(DIST)
    g["cls"] = g["op_class"].map(schema.CLASS_LABEL)
    t = g.pivot_table(index="predictor", columns=["dist", "cls"], values="ape")
    cols = [(d, c) for d in DIST.values() for c in schema.CLASS_LABEL.values() if (d, c) in t.columns]
    t = t.reindex(columns=pd.MultiIndex.from_tuples(cols))
    t = t.reindex([n for n in ORDER if n in t.index])
    t.index = [PRED_LABEL[n] for n in t.index]
    return t


def flat(t: pd.DataFrame) -> pd.DataFrame:
    """A two-level column table flattened for CSV/Markdown ("In Distribution BMM", ...)."""
    out = t.copy()
    out.columns = [" ".join(c).replace("In Distribution", "ID").replace("Out of Distribution", "OOD")
                   for c in out.columns]
    return out.rename_axis("predictor").reset_index()


def per_gpu_table(long: pd.DataFrame) -> pd.DataFrame:
    """MAPE per GPU x op class for every predictor (rows: predictor, GPU)."""
    t = long.groupby(["predictor", "device", "op_class"])["ape"].mean().unstack("op_class")
    t = t.rename(columns=schema.CLASS_LABEL)
    t = t.reset_index()
    t["seen"] = t["device"].isin(long.loc[long["seen"], "device"].unique())
    t["predictor"] = t["predictor"].map(PRED_LABEL)
    return t


def paper_perop() -> pd.DataFrame | None:
    """The authors' per-op table from the release (``summary/perop.csv``), same layout, or None.
    Parsed by ``authors_tables.read_authors_table`` (the one reader of the authors' summary tables)."""
    if not (paths.summary_dir() / "perop.csv").is_file():
        return None
    from neusight_core.studies import authors_tables
    t = authors_tables.read_authors_table("perop")
    t.index.name = None
    t.columns.names = [None, None]
    return t.astype(float)


def seed_study(seeds, quick: bool = False, test: pd.DataFrame | None = None,
               recipes=("neusight-paper", "neusight")) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each NeuSight recipe trained with each seed: per-seed per-op MAPE (one row per recipe and seed)
    and mean / std / min / max over seeds per recipe and column."""
    test = dataset.test_kernels() if test is None else test
    rows = []
    P.train_parallel([(name, quick, int(s), None, None) for name in recipes for s in seeds])
    for name in recipes:
        for s in seeds:
            p = P.get(name, quick=quick, seed=int(s))
            t = perop_table(predict_all({name: p}, test))
            row = flat(t).iloc[0].drop("predictor")
            rows.append({"recipe": name, "seed": int(s), "train_seconds": p.info.get("train_seconds"), **row.to_dict()})
    per_seed = pd.DataFrame(rows)
    parts = []
    for name, g in per_seed.groupby("recipe", sort=False):
        vals = g.drop(columns=["recipe", "seed", "train_seconds"])
        parts.append(pd.DataFrame({"recipe": name, "mean": vals.mean(),
                                   "std": vals.std(ddof=1) if len(vals) > 1 else np.nan,
                                   "min": vals.min(), "max": vals.max()}).rename_axis("column").reset_index())
    return per_seed, pd.concat(parts, ignore_index=True)


def tile_lookup_accuracy(neusight, test: pd.DataFrame | None = None) -> pd.DataFrame:
    """Share of GEMM test kernels whose looked-up tile equals the tile in the measured kernel's name
    (evaluation only: the lookup never sees the test sets)."""
    test = dataset.test_kernels() if test is None else test
    rows = []
    g = test[test["op_class"].isin(schema.GEMM_CLASSES)]
    for dev, d in g.groupby("device"):
        d = d.reset_index(drop=True)
        tm, tk, _ = neusight.tiles.lookup(d, dev)
        ok = (tm == d["tile_m"].to_numpy()) & (tk == d["tile_k"].to_numpy())
        rows.append({"device": dev, "seen": bool(d["seen"].iloc[0]), "reference_gpu": neusight.tiles.reference_device(dev),
                     "gemm_kernels": len(d), "tile_match_%": 100 * ok.mean()})
    return pd.DataFrame(rows)


def summary_markdown(perop: pd.DataFrame, times: pd.DataFrame, spread: pd.DataFrame | None) -> str:
    lines = ["Kernel-level MAPE (%) on the release's kernel test sets, our re-implementation "
             "(ID = the 5 training GPUs, OOD = H100, L4, A100-80GB):", "",
             flat(perop).to_markdown(index=False, floatfmt=".1f"), "",
             "Training wall time (s): " + ", ".join(f"{r.predictor} {r.train_seconds:.1f}" for r in times.itertuples())]
    if spread is not None and len(spread):
        ood = spread[spread["column"].isin(["OOD BMM", "OOD FC"])]
        for name, g in ood.groupby("recipe", sort=False):
            lines.append(f"{PRED_LABEL.get(name, name)} over seeds (mean, min-max): " + ", ".join(
                f"{r.column} {r.mean:.1f} ({r.min:.1f}-{r.max:.1f})" for r in g.itertuples()))
    return "\n".join(lines)


# ---------------------------------------------------------------- GEMMs inside a model vs alone
_LINEAR_MODULE = "torch.nn.modules.linear.Linear'>)])}"    # last entry of the node's nn_module_stack


def _gemm_nodes(per_node: pd.DataFrame) -> pd.DataFrame:
    """(node, M, N, K, in_model_ms) of the FP32 GEMM nodes of one per-node label CSV: nn.Linear modules
    (M = tokens, N = in features, K = out features, the test sets' convention) and addmm calls (GPT-2's
    Conv1D: bias [K], input [M, N], weight [N, K])."""
    import ast

    rows = []
    for op, target, meta, shapes, out, ms in per_node[["op", "target", "meta", "input_shapes", "output_shape",
                                                        "fw_latency"]].itertuples(index=False):
        try:
            ins = ast.literal_eval(str(shapes))
            outs = ast.literal_eval(str(out))
        except (ValueError, SyntaxError):
            continue
        if op == "call_module" and str(meta).endswith(_LINEAR_MODULE) and len(ins) == 1 and len(ins[0]) >= 2:
            x = ins[0]
            m, n, k = int(np.prod(x[:-1])), int(x[-1]), int(outs[-1])
        elif op == "call_function" and "addmm" in str(target) and len(ins) == 3 and len(ins[1]) == 2:
            (m, n), k = ins[1], ins[2][1]
        else:
            continue
        rows.append({"node": str(target), "M": m, "N": n, "K": k, "in_model_ms": float(ms)})
    return pd.DataFrame(rows, columns=["node", "M", "N", "K", "in_model_ms"])


def gemms_in_model_vs_alone(labels_dir=None, test: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every GEMM node of the labelled single-GPU inference runs whose shape the release also measured
    alone on that GPU (its kernel test set), with both latencies.

    The release measures each GPU twice: kernels one at a time (``data/dataset/test``: the shapes of
    the paper's models) and whole models node by node (the per-node label CSVs). A kernel predictor can
    only learn the first; where the two disagree for the same shape, the end-to-end error of every
    kernel-level predictor on that GPU follows. Columns: gpu, config, node, M, N, K, in_model_ms,
    alone_ms, ratio (in model / alone).
    """
    labels = paths.labels_dir() if labels_dir is None else labels_dir
    test = dataset.test_kernels() if test is None else test
    lin = test[test["op_class"].eq(OpClass.LINEAR) & test["B"].eq(1)]
    alone = lin.groupby(["device", "M", "N", "K"])["latency_ms"].median()
    parts = []
    for gdir in sorted(p for p in labels.iterdir() if p.is_dir()):
        for f in sorted(gdir.glob("*-inf-*.csv")):
            if f.stem.count("-") != 3:           # single-GPU runs only (no dp/tp/pp suffix)
                continue
            nodes = _gemm_nodes(pd.read_csv(f, usecols=["op", "target", "meta", "input_shapes",
                                                           "output_shape", "fw_latency"]))
            if nodes.empty:
                continue
            key = pd.MultiIndex.from_arrays([[gdir.name] * len(nodes), nodes["M"].astype(float),
                                             nodes["N"].astype(float), nodes["K"].astype(float)])
            nodes["alone_ms"] = alone.reindex(key).to_numpy()
            nodes = nodes[nodes["alone_ms"].notna()]
            parts.append(nodes.assign(gpu=gdir.name, config=f.stem))
    cols = ["gpu", "config", "node", "M", "N", "K", "in_model_ms", "alone_ms", "ratio"]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True)
    out["ratio"] = out["in_model_ms"] / out["alone_ms"]
    return out[cols]


def in_model_vs_alone_summary(nodes: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: matched GEMM nodes, configs, total in-model and alone time, their ratio, and the median
    and range of the per-node ratios."""
    g = nodes.groupby("gpu")
    out = pd.DataFrame({"nodes": g.size(), "configs": g["config"].nunique(),
                        "in_model_ms": g["in_model_ms"].sum(), "alone_ms": g["alone_ms"].sum(),
                        "median_ratio": g["ratio"].median(), "min_ratio": g["ratio"].min(),
                        "max_ratio": g["ratio"].max()})
    out.insert(4, "time_ratio", out["in_model_ms"] / out["alone_ms"])
    return out.reset_index()


# ---------------------------------------------------------------- convolutions, leave one GPU out
CONV_PREDICTORS = ("roofline", "habitat", "li", "neusight")
# what NeuSight trains in the check: the CONV network only, on the conv records alone (the recipe's other
# classes and its extra training sets do not touch CONV, and would cost minutes per fold)
CONV_ONLY = {"classes": [OpClass.CONV], "extra_training": None}


def conv_training_data(quick: bool = False, seed: int = 0, drop_gpu: str | None = None) -> dataset.TrainingData:
    """The release's convolution records of every GPU that has them (P4, P100, V100, T4 and the A100-80GB,
    which ``dataset.training_data`` leaves out as an unseen GPU) as training data of the leave-one-GPU-out
    check, without ``drop_gpu``'s rows when it is given; the quick subset as ``dataset.training_data``'s."""
    conv = dataset.load_conv()
    if quick:
        conv = dataset.quick_conv(conv, seed)
    if drop_gpu is not None:
        if drop_gpu not in set(conv["device"]):
            raise ValueError(f"no convolution records of GPU {drop_gpu!r}; these have them: "
                             f"{', '.join(sorted(conv['device'].unique()))}")
        conv = conv[conv["device"] != drop_gpu]
    k = dataset.to_kernels(conv.reset_index(drop=True))
    return dataset.TrainingData(k, dataset.training_checksum(quick, seed), tuple(sorted(k["device"].unique())),
                                4000 if quick else None)


def _conv_fold(job: tuple):
    """Train (or load) NeuSight's CONV network of one fold and save it: job = (name, quick, seed, config, held)."""
    name, quick, seed, cfg, held = job
    f = P.folder(name, quick, seed, cfg)
    if P.is_trained(name, quick, seed, cfg):
        return P.load(name, f)
    p = P.create(name, seed, cfg)
    p.fit(P.data_for(p, conv_training_data(quick, drop_gpu=held)), quick=quick)
    p.save(f)
    return p


def _conv_fold_worker(job: tuple) -> None:
    import torch
    torch.set_num_threads(1)
    _conv_fold(job)


def conv_logo(names=CONV_PREDICTORS, seeds=(0, 1, 2), quick: bool = False, folds=None,
              config: dict | None = None, workers: int = 1) -> pd.DataFrame:
    """Leave one GPU out on the convolution records: for each GPU that has them, every predictor is trained
    on the other GPUs' records and predicts the held-out GPU's as an unseen GPU.

    Every predictor trains on ``conv_training_data(quick, drop_gpu=held)``. NeuSight recipes train with
    ``CONV_ONLY`` plus ``config`` as overrides, their weights saved in a folder of their own per fold and seed
    (``predictors.folder``; ``workers`` > 1: that many processes, one thread each), so a second call loads
    them; the baselines train in seconds. Seedless predictors (roofline, Li et al.) run once (seed 0).
    One row per (predictor, seed, held-out GPU): ``rows``, ``mape``, ``wmape`` (APE weighted by measured
    time), ``bias`` (mean signed error, %), ``train_s``."""
    from neusight_core.studies import recipe_eval
    everything = conv_training_data(quick)
    folds = list(folds or everything.devices)

    def cfg(held):
        # ``conv_records`` marks this training set (all conv GPUs but one) in the folder's config
        return {**CONV_ONLY, **(config or {}), "drop_gpu": held, "conv_records": "all conv GPUs"}
    jobs = [(n, quick, int(s), cfg(h), h) for h in folds for n in names if P.trains_long(n) for s in seeds]
    todo = [j for j in jobs if not P.is_trained(*j[:4])]
    if workers > 1 and len(todo) > 1:
        _parallel(_conv_fold_worker, todo, workers)
    rows = []
    for held in folds:
        val = everything.kernels[everything.kernels["device"] == held].reset_index(drop=True)
        subset = None
        for name in names:
            for seed in (seeds if name in recipe_eval.SEEDED else (0,)):
                t0 = time.perf_counter()
                if P.trains_long(name):
                    p = _conv_fold((name, quick, int(seed), cfg(held), held))
                else:
                    subset = subset or conv_training_data(quick, drop_gpu=held)
                    p = P.create(name, int(seed))
                    p.fit(P.data_for(p, subset), quick=quick)
                secs = p.info.get("train_seconds", time.perf_counter() - t0)
                pred = p.predict(val.drop(columns=["tile_m", "tile_k", "tile"]), held)
                y = val["latency_ms"].to_numpy(float)
                ape = error_metric.ape(y, pred)
                rows.append({"predictor": name, "seed": int(seed), "held_out": held, "rows": len(val),
                             "mape": float(ape.mean()), "wmape": float((ape * y).sum() / y.sum()),
                             "bias": float(np.mean(pred / y - 1) * 100), "train_s": float(secs)})
    return pd.DataFrame(rows)


#: the conv's shape as the release records it (batch, input / output channels, image size); kernel 3, stride 1 and
#: padding 1 in every record, so they carry nothing
CONV_SHAPE = ["B", "conv_cin", "conv_cout", "conv_in"]


#: the within-GPU floor's row label in ``conv_logo_table``
FLOOR = "within one GPU (5-fold tree)"


def conv_within_gpu_floor(quick: bool = False, folds: int = 5, seeds=(0,),
                          kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """How well a convolution's shape predicts its latency on the SAME GPU: per conv GPU, ``folds``-fold
    cross-validation of a gradient-boosted tree (``trees.TREE``'s settings) trained and scored on that GPU's
    own records only. Inputs: the log2 shape ``CONV_SHAPE`` with log2 FLOPs and bytes; target: log(latency /
    FLOPs), so a latency that is a smooth law of the shape is fitted to within a few per cent (a tree alone is
    piecewise constant over a range of 10^13 in FLOPs). No GPU is unseen here, so this is a floor that leave one
    GPU out can hardly beat: the shapes it scores were never measured, and cuDNN picks implicit-GEMM, Winograd or
    FFT kernels for them by its own rules. A seed draws the folds and the tree's randomness (the records are
    ``conv_training_data(quick)``'s, the same for every seed). One row per (GPU, seed): ``device``, ``seed``,
    ``rows``, ``mape`` (every record scored once, by the tree that did not see it), ``median_ape``,
    ``train_mape`` (the trees on their own training folds: how much they can fit); with ``held_out`` = ``device``
    and ``predictor`` = ``FLOOR`` it is a frame ``conv_logo_table`` takes. ``kernels``: kernel rows (``device``,
    ``latency_ms``, ``flops``, ``bytes_read``, ``bytes_written``, ``CONV_SHAPE``) instead of the release's."""
    from sklearn.model_selection import KFold
    from threadpoolctl import threadpool_limits
    from neusight_core.predictors.trees import TREE, regressor
    conv = conv_training_data(quick).kernels if kernels is None else kernels
    rows = []
    with threadpool_limits(1):
        for dev, d in conv.groupby("device", sort=True):
            flops = np.log2(d["flops"].to_numpy(float))
            x = np.c_[np.log2(d[CONV_SHAPE].to_numpy(float)), flops,
                      np.log2((d["bytes_read"] + d["bytes_written"]).to_numpy(float))]
            y = np.log(d["latency_ms"].to_numpy(float)) - flops * np.log(2)
            for seed in seeds:
                ape, fit = np.empty(len(d)), []
                for tr, te in KFold(folds, shuffle=True, random_state=int(seed)).split(x):
                    m = regressor(TREE, seed)
                    m.fit(x[tr], y[tr])
                    ape[te] = np.abs(np.exp(m.predict(x[te]) - y[te]) - 1) * 100
                    fit.append(float(np.mean(np.abs(np.exp(m.predict(x[tr]) - y[tr]) - 1)) * 100))
                rows.append({"device": dev, "seed": int(seed), "rows": len(d), "mape": float(ape.mean()),
                             "median_ape": float(np.median(ape)), "train_mape": float(np.mean(fit)),
                             "held_out": dev, "predictor": FLOOR})
    return pd.DataFrame(rows)


def _parallel(fn, jobs, workers: int) -> None:
    """``fn(job)`` for every job in ``workers`` spawned processes (no progress bars, this trained_dir)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    with P.worker_environment(), ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(fn, jobs))


def conv_logo_table(per: pd.DataFrame, value: str = "mape") -> pd.DataFrame:
    """Predictor x held-out GPU: ``value`` as "mean (min-max)" over seeds, and a numeric frame of the means
    (``attrs["mean"]``) for plots; rows in ``ORDER``, the column ``mean of GPUs`` last."""
    g = per.groupby(["predictor", "held_out"], sort=False)[value].agg(["mean", "min", "max", "count"])
    per_seed_mean = per.groupby(["predictor", "seed"])[value].mean().groupby("predictor").agg(["mean", "min", "max"])

    def cell(r):
        return f"{r['mean']:.1f}" if r["min"] == r["max"] else f"{r['mean']:.1f} ({r['min']:.1f}-{r['max']:.1f})"
    t = g.apply(cell, axis=1).unstack("held_out")
    t["mean of GPUs"] = per_seed_mean.apply(cell, axis=1)
    order = [n for n in ORDER + tuple(per["predictor"].unique()) if n in t.index]
    t = t.reindex(list(dict.fromkeys(order)))
    means = g["mean"].unstack("held_out").reindex(t.index)
    t.index = [PRED_LABEL.get(n, n) for n in t.index]
    means.index = t.index
    t.attrs["mean"] = means
    return t
