"""External validation (notebook 07): BF16 GEMM and fused-attention predictions against NVIDIA's
measured kernels (``measured_kernels``), per GPU x predictor x seed.

Rows: per GPU one GEMM file (``measured_kernels.gemm_rows``) and vLLM's attention files (``attention_rows``), of
the training GPUs (A100 SXM, H100 SXM, H200 SXM, L40S: the networks were trained on them) and of the held-out
Blackwell GPUs (B200, GB200: never trained, tuned or chosen on). Sealed GPUs are refused by the loader.

Predictors (``COMPARED``):

- ``neusight``: ``predictors.get("neusight")``, whose recipe's ``tensor_core`` networks answer the BF16 rows;
- ``neusight FP32-extrapolated``: the same trained predictor without them (``predict_extrapolated``: the
  FP32-trained networks at the BF16 tensor-core peak, what ``--dtype bf16`` did before the tensor-core networks);
- ``roofline``: max(FLOPs / dense BF16 peak, bytes / bandwidth);
- ``structural tree``: the baseline to beat (``trees.SPEC_TREE``): the same kind of tree on the
  dims plus what the datasheet says of the GPU's structure (ridge, SM count, L2, FLOPs per byte, a 128 x 128
  wave count), trained on the same rows and seed;
- ``shape-only tree``: the ablation (``trees.ShapeTree``): a gradient-boosted tree on log2 dims, dense
  BF16 peak and bandwidth alone (no tiles or waves; its target is the ratio to the plain roofline), trained on the same training-GPU rows and seed
  as the tensor-core networks; the reference regression. (It replaced a shape-only MLP of the networks'
  size, which was a much weaker regression: 62-66 % held-out GEMM MAPE, and flattered the tiles and waves.)

Metrics per (GPU, kind, predictor, seed): MAPE, median APE, 90th-percentile APE and bias (mean signed
error, %: > 0 = predicted slower than measured); then mean and spread (max - min) over seeds.
``miss_breakdown``: where a predictor's GEMM error comes from (by m, arithmetic intensity, chosen tile,
split-K and waves, per GPU).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import measured_kernels as mk
from neusight_core.studies import error_metric, targets as targets_file
from neusight_core.predictors import tensor_core as tc
from neusight_core.question.schema import OpClass, Precision

COMPARED = ("neusight", "neusight FP32-extrapolated", "roofline", "shape-only tree", "structural tree")
BASELINE = "structural tree"     # the reference regression the tile/wave networks have to beat on each held-out GPU
KINDS = {"GEMM": "GEMM", "ATTN_prefill": "attention prefill", "ATTN_decode": "attention decode"}


def rows(per_gpu: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The evaluation rows of the training and held-out GPUs, column ``kind`` (GEMM / ATTN_prefill /
    ATTN_decode); ``per_gpu``: a random subsample of that many rows per GPU and kind (quick mode)."""
    gpus = list(mk.TRAINING + mk.HELD_OUT)
    df = pd.concat([mk.gemm_rows(gpus), mk.attention_rows(gpus)], ignore_index=True)
    df["kind"] = tc.network_of(df)        # the subsample below draws per kind
    return _annotate(subsample(df, ["device", "kind"], per_gpu, seed))


def subsample(df: pd.DataFrame, keys: list, n: int | None, seed: int = 0) -> pd.DataFrame:
    """At most ``n`` rows drawn at random per group of ``keys`` (``n`` None: all rows), in their order:
    ``tensor_core.subsample`` with this module's seed offset (the rows notebook 07 always drew)."""
    return df.reset_index(drop=True) if not n else tc.subsample(df, int(n), seed, keys=keys, offset=7)


def _annotate(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["kind"] = tc.network_of(df)
    df["arith_intensity"] = df["flops"] / (df["bytes_read"] + df["bytes_written"])
    seq_q = df["seq_q"] if "seq_q" in df else np.nan
    df["tokens"] = np.where(df["kind"] == "GEMM", df["M"], df["B"] * seq_q)
    return df


# ---------------------------------------------------------------- the local GPU as one more held-out row
LOCAL_ROLE = "local GPU"
LOCAL_FILE = "local_gpu_bf16_gemm"        # notebook 05's table of the measured rows (tables/<name>.csv)


def local_gemm_shapes(n: int = 200, seed: int = 0, max_bytes: float = 4e9) -> pd.DataFrame:
    """``n`` BF16 GEMM shapes of the database (H100 SXM's file: every GPU's file holds the same vLLM shape
    grid), drawn by ``seed``, as raw rows (m, n, k: y[m, n] = x[m, k] W[n, k]^T) without latency; shapes whose
    operands exceed ``max_bytes`` are left out so that a 16-24 GB GPU holds every one."""
    g = mk.gemm_rows(["h100_sxm"])
    g = g[(g["bytes_read"] + g["bytes_written"]) <= max_bytes]
    rng = np.random.default_rng(seed + 11)
    g = g.iloc[np.sort(rng.choice(len(g), size=min(int(n), len(g)), replace=False))]
    return pd.DataFrame({"kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16",
                         "m": g["M"].to_numpy(int), "n": g["K"].to_numpy(int), "k": g["N"].to_numpy(int)})


def measure_local_gemms(shapes: pd.DataFrame, device_name: str, timer=None, budget=None,
                        device: str = "cuda") -> pd.DataFrame:
    """The ``shapes`` (``local_gemm_shapes``) timed on the local GPU with notebook 05's protocol
    (``live_harness.measure``: warm-up, 25 runs, mean of the 5 fastest; ``F.linear`` in BF16 without bias, as the
    database), as evaluation rows of ``device_name`` with role ``LOCAL_ROLE``; ``timer``: a fake for tests.
    Rows that ran out of memory or time keep latency NaN and say why in ``status``."""
    import torch

    from neusight_core.studies import live_harness, live_kernels
    rows = mk.gemm_kernels(shapes.assign(latency=np.nan), device_name, framework=f"local torch {torch.__version__}")
    rows["role"] = LOCAL_ROLE
    cfg = live_harness.HarnessConfig(precision=Precision.BF16)
    lat, status = [], []
    for _, r in rows.iterrows():
        try:
            m = live_harness.measure(live_kernels.kernel_callable(r, device, torch.bfloat16, bias=False), timer, cfg, budget)
        except Exception as e:  # noqa: BLE001 - an OOM while allocating is recorded, anything else raised
            if not live_harness.is_oom(e):
                raise
            m = live_harness.Measurement("OOM", reason=str(e).splitlines()[0][:200])
        lat.append(m.mean_ms if m.status == "OK" else np.nan)
        status.append(m.status if m.status == "OK" else f"{m.status}: {m.reason}")
    rows["latency_ms"] = lat
    rows["status"] = status
    return _annotate(rows)


def local_skip_reason(head: dict) -> str | None:
    """Why notebook 05 cannot measure the BF16 GEMMs here (``live.run_live``'s ``head``), or None."""
    if head.get("skipped_reason"):
        return head["skipped_reason"]
    try:
        mk.data_root()          # the measured-kernel database (aiconfigurator-core); a Python without it skips
    except mk.MeasuredDataError as e:
        return str(e)
    d = head.get("device") or {}
    if not d.get("known"):
        return f"the local GPU {d.get('display_name')!r} is not in the catalogue (no dense BF16 peak to predict with)"
    return None


def local_gpu_check(device_name: str, n: int = 200, seed: int = 0, quick: bool = False, timer=None, budget=None,
                    device: str = "cuda", neusight=None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Notebook 05's check of the BF16 GEMMs: ``n`` of the database's BF16 GEMM shapes measured here
    (``measure_local_gemms``) and every predictor of ``COMPARED`` on them (``predict_all``, ``seed``): (rows,
    per-predictor metrics with role ``LOCAL_ROLE``; None when nothing could be measured)."""
    rows = measure_local_gemms(local_gemm_shapes(n, seed), device_name, timer, budget, device)
    ok = rows[np.isfinite(rows["latency_ms"].to_numpy(float))].reset_index(drop=True)
    if ok.empty:
        return rows, None
    return rows, over_seeds(metrics(predict_all(ok, seed=seed, quick=quick, neusight=neusight)))


def local_rows_from(folder) -> pd.DataFrame | None:
    """The local GPU's measured rows notebook 05 wrote under ``folder`` (its output folder), or None."""
    from pathlib import Path
    f = Path(folder) / "tables" / f"{LOCAL_FILE}.csv"
    if not f.is_file():
        return None
    df = pd.read_csv(f)
    df = df[np.isfinite(df["latency_ms"])] if "latency_ms" in df else df.iloc[:0]
    return _annotate(df) if len(df) else None


def predict_all(df: pd.DataFrame, seed: int = 0, quick: bool = False, neusight=None,
                names: tuple = COMPARED) -> pd.DataFrame:
    """Long frame: one row per (evaluation row, predictor of ``names``, default all of ``COMPARED``) with
    ``pred_ms``. ``neusight``: a trained ``neusight`` predictor (default ``predictors.get("neusight", quick, seed)``)."""
    from neusight_core import predictors
    unknown = set(names) - set(COMPARED)
    if unknown:
        raise ValueError(f"predict_all: no predictor {sorted(unknown)}; known: {', '.join(COMPARED)}")
    p = neusight if neusight is not None else predictors.get("neusight", quick=quick, seed=seed)
    if p.tc is None or not p.tc.nets:
        raise ValueError("the neusight recipe has no trained tensor_core networks (recipe key tensor_core)")
    # the registered tree baselines (predictors/trees.py TreeBaseline): trained once on the rows of this recipe's
    # tensor-core networks, saved, and loaded like every predictor
    # (a ``neusight`` given explicitly, e.g. a searched config: the trees train on its networks' rows)
    rows = None if neusight is None else {"tensor_core": p.tc.config}
    trees = {"shape-only tree": "tree-shape", "structural tree": "tree-structural"}
    made = {n: predictors.get(key, quick=quick, seed=seed, config=rows) for n, key in trees.items() if n in names}
    run = {"neusight": lambda: p.predict(df, None), "neusight FP32-extrapolated": lambda: p.predict_extrapolated(df, None),
           "roofline": lambda: predictors.get("roofline").predict(df, None),
           **{n: (lambda t=t: t.predict(df, None)) for n, t in made.items()}}
    preds = {n: run[n]() for n in COMPARED if n in names}
    keep = ["device", "role", "kind", "framework", "version", "kernel_source", "M", "N", "K", "B", "seq_q",
            "seq_kv", "heads", "head_dim", "window", "tokens", "arith_intensity", "flops", "latency_ms"]
    # the GEMM tile, split-K and waves neusight's networks chose per row (miss_breakdown groups by them)
    base = pd.concat([df[[c for c in keep if c in df.columns]].reset_index(drop=True),
                      p.tc.gemm_choice(df)], axis=1)
    # the tensor-core networks' training time: theirs when trained in this process, else the saved meta.json's
    tc_secs = (p.tc.info or (p.info or {}).get("tensor_core") or {}).get("train_seconds")
    secs = {"neusight": tc_secs, **{n: t.info.get("train_seconds") for n, t in made.items()}}
    out = []
    for name, pred in preds.items():
        t = secs.get(name)
        out.append(base.assign(predictor=name, seed=seed, pred_ms=pred, train_seconds=np.nan if t is None else float(t)))
    long = pd.concat(out, ignore_index=True)
    long["ape"] = error_metric.ape(long["latency_ms"], long["pred_ms"])
    long["err"] = (long["pred_ms"] / long["latency_ms"] - 1) * 100
    return long


def metrics(long: pd.DataFrame, by: tuple = ()) -> pd.DataFrame:
    """Per (device, role, kind, predictor, seed, and the columns ``by``): rows, MAPE, median APE, P90 APE,
    bias (%)."""
    g = long.groupby(["role", "device", "kind", *by, "predictor", "seed"], sort=False)
    out = g.agg(rows=("ape", "size"), mape=("ape", "mean"), median_ape=("ape", "median"),
                p90_ape=("ape", lambda a: float(np.percentile(a, 90))), bias=("err", "mean"))
    return out.reset_index()


def over_seeds(per_seed: pd.DataFrame, by: tuple = ()) -> pd.DataFrame:
    """Mean over seeds of each metric, and the seed spread (max - min) of the MAPE; ``rows`` stays a count (every seed
    scores the same rows), not a float mean."""
    keys = ["role", "device", "kind", *by, "predictor"]
    g = per_seed.groupby(keys, sort=False)
    out = g[["mape", "median_ape", "p90_ape", "bias"]].mean()
    out.insert(0, "rows", g["rows"].max().astype(int))
    out["mape_spread"] = g["mape"].max() - g["mape"].min()
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def provenance(df: pd.DataFrame) -> pd.DataFrame:
    """Which data each number comes from: per GPU and kind, the role, framework, version, kernel sources and rows."""
    g = df.groupby(["device", "kind"], sort=False)
    return g.agg(role=("role", "first"), framework=("framework", lambda s: ", ".join(sorted(set(s)))),
                 version=("version", lambda s: ", ".join(sorted(set(map(str, s))))),
                 kernel_source=("kernel_source", lambda s: ", ".join(sorted(set(s)))),
                 rows=("latency_ms", "size")).reset_index()


def framework_gemms(gpus=None) -> pd.DataFrame:
    """Every framework's newest BF16 GEMM file of ``gpus`` (default: the training and held-out GPUs), annotated as
    ``rows`` is; ``scored`` marks the file ``measured_kernels.gemm_rows`` chose, the one the networks train on and the
    metrics score. The database measured the same shape grid through each framework's linear layer (cuBLAS)."""
    gpus = list(mk.TRAINING + mk.HELD_OUT) if gpus is None else gpus
    every = pd.concat([mk.load_gemm(s, frameworks=mk.GEMM_FRAMEWORKS) for s in mk.system_names(gpus, False)],
                      ignore_index=True)
    chosen = mk.gemm_rows(gpus).groupby("device")["framework"].first()
    every["scored"] = every["framework"].to_numpy() == every["device"].map(chosen).to_numpy()
    return _annotate(every)


def framework_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """How far two measurements of the same GEMM on the same GPU model are apart (``framework_gemms`` rows): per
    GPU and framework, on the shapes it shares with the scored file, the MAPE, median APE and bias (%) of its
    latency taken as a prediction of the scored file's. A predictor that sees only the shape and the GPU cannot be
    judged much below this: it is how well the data agrees with itself. Also each file's median fraction of the
    dense BF16 datasheet peak on its GEMMs with m, n, k >= 4,096 (``big_gemm_peak_pct``, %)."""
    from neusight_core.predictors import common
    key = ["device", "B", "M", "N", "K"]
    d = df.assign(B=df["B"].fillna(1))
    ref = d[d["scored"]].groupby(key)["latency_ms"].first().rename("scored_ms")
    big = (d["M"] >= 4096) & (d["N"] >= 4096) & (d["K"] >= 4096)
    x = d[big].reset_index(drop=True)
    frac = x["flops"].to_numpy(float) / x["latency_ms"].to_numpy(float) / (
        common.peak_gflops(x, common.device_arrays(x)) * 1e6)
    peak = x.assign(f=frac).groupby(["device", "framework"])["f"].median()
    out = []
    for (dev, fw), g in d.groupby(["device", "framework"], sort=True):
        m = g.join(ref, on=key, how="inner")
        ape = error_metric.ape(m["scored_ms"], m["latency_ms"])
        out.append({"device": dev, "role": g["role"].iloc[0], "framework": fw, "version": g["version"].iloc[0],
                    "kernel_source": ", ".join(sorted(set(g["kernel_source"]))), "scored": bool(g["scored"].iloc[0]),
                    "shapes_shared": int(len(m)), "mape_vs_scored": float(np.mean(ape)),
                    "median_ape_vs_scored": float(np.median(ape)),
                    "bias_vs_scored": float(np.mean(m["latency_ms"] / m["scored_ms"] - 1) * 100),
                    "big_gemm_peak_pct": 100 * float(peak.get((dev, fw), np.nan))})
    return pd.DataFrame(out)


def held_out_files(table: pd.DataFrame, by_file: pd.DataFrame, agree: pd.DataFrame) -> pd.DataFrame:
    """Per held-out GPU and GEMM file: how far that file is from the scored one (``agree``: ``framework_agreement``)
    and each predictor's MAPE on it, mean over seeds: the scored file's from ``table`` (``over_seeds``), the
    other files' from ``by_file`` (``over_seeds(..., by=("framework",))``). One column per predictor of ``by_file``."""
    files = agree.loc[agree["role"] == "held_out", ["device", "framework", "scored", "mape_vs_scored"]]
    other = by_file[(by_file["role"] == "held_out") & by_file["kind"].isin(["GEMM", KINDS["GEMM"]])]
    gemm = table[(table["role"] == "held_out") & table["kind"].isin(["GEMM", KINDS["GEMM"]])
                 & table["predictor"].isin(set(other["predictor"]))]        # the predictors scored on every file
    scored = gemm.merge(files.loc[files["scored"], ["device", "framework"]], on="device")
    both = pd.concat([scored, other.merge(files.loc[~files["scored"], ["device", "framework"]],
                                          on=["device", "framework"])], ignore_index=True)
    wide = both.pivot_table(index=["device", "framework"], columns="predictor", values="mape").reset_index()
    wide.columns.name = None
    return files.merge(wide, on=["device", "framework"], how="left").sort_values(
        ["device", "scored", "framework"], ascending=[True, False, True]).reset_index(drop=True)


def binned(long: pd.DataFrame, column: str, bins: int = 12) -> pd.DataFrame:
    """Median APE per predictor and log2 bin of ``column`` (tokens m, arithmetic intensity)."""
    x = np.log2(np.maximum(long[column].to_numpy(float), 1e-9))
    edges = np.linspace(np.nanmin(x), np.nanmax(x) + 1e-9, bins + 1)
    b = np.clip(np.digitize(x, edges) - 1, 0, bins - 1)
    centre = 2 ** ((edges[:-1] + edges[1:]) / 2)
    t = long.assign(_bin=centre[b])
    return t.groupby(["predictor", "_bin"])["ape"].agg(["median", "size"]).reset_index().rename(
        columns={"_bin": column, "median": "median_ape", "size": "rows"})


#: buckets of ``miss_breakdown`` (upper edges, inclusive; the last bucket is open): GEMM m (tokens), FLOPs per
#: byte (B200's BF16 ridge is about 280, H100's 295: the first three buckets are memory-bound on every GPU
#: here) and waves of the chosen tile
MISS_BUCKETS = {"m (tokens)": ("M", (16, 128, 1024, 8192)),
                "FLOPs / byte": ("arith_intensity", (16, 64, 256, 1024)),
                "waves": ("waves", (1, 4, 16, 64))}


def _bucket_labels(x: np.ndarray, edges) -> np.ndarray:
    """'<= e0', 'e0-e1', ..., '> e_last' (edges inclusive on the right)."""
    names = [f"<= {edges[0]:g}"] + [f"{a:g}-{b:g}" for a, b in zip(edges[:-1], edges[1:])] + [f"> {edges[-1]:g}"]
    return np.asarray(names, dtype=object)[np.searchsorted(np.asarray(edges, float), x, side="left")]


def miss_breakdown(long: pd.DataFrame, predictor: str = "neusight", against: str = BASELINE,
                   role: str = "held_out") -> pd.DataFrame:
    """Where ``predictor``'s GEMM error on the ``role`` GPUs comes from: per device and per bucket of m,
    arithmetic intensity (``MISS_BUCKETS``), chosen tile (tile_m x tile_k), split-K and waves (the columns
    ``predict_all`` records): rows, share of the rows (%), MAPE, median and P90 APE, bias, ``error_share`` (%
    of the device's summed APE: where the MAPE comes from) and ``against``'s MAPE on the same rows.
    Rows of several seeds are pooled (the same shapes each seed)."""
    t = long[(long["kind"] == "GEMM") & (long["role"] == role)]
    if t.empty:
        raise ValueError(f"miss_breakdown: no GEMM rows of role {role!r}")
    for need in ("tile_m", "tile_k", "split", "waves"):
        if need not in t.columns:
            raise ValueError(f"miss_breakdown: column {need!r} missing (rows of predict_all record it)")
    mine = t[t["predictor"] == predictor].reset_index(drop=True)
    other = t[t["predictor"] == against].reset_index(drop=True)
    if mine.empty:
        raise ValueError(f"miss_breakdown: no rows of predictor {predictor!r}")
    keys = ["device", "seed", "M", "N", "K"]
    if len(other):
        mine = mine.merge(other[keys + ["ape"]].rename(columns={"ape": "_against"}), on=keys, how="left",
                          validate="one_to_one")
    else:
        mine["_against"] = np.nan
    dims = {name: _bucket_labels(mine[col].to_numpy(float), edges) for name, (col, edges) in MISS_BUCKETS.items()}
    dims["tile (m x k)"] = (mine["tile_m"].astype(int).astype(str) + " x " + mine["tile_k"].astype(int).astype(str)).to_numpy()
    dims["split-K"] = mine["split"].astype(int).astype(str).to_numpy()
    total = mine.groupby("device")["ape"].sum()
    n_dev = mine.groupby("device").size()
    out = []
    for name, labels in dims.items():
        g = mine.assign(_bucket=labels).groupby(["device", "_bucket"], sort=False)
        a = g.agg(rows=("ape", "size"), mape=("ape", "mean"), median_ape=("ape", "median"),
                  p90_ape=("ape", lambda x: float(np.percentile(x, 90))), bias=("err", "mean"),
                  _sum=("ape", "sum"), against_mape=("_against", "mean")).reset_index()
        a["share_rows"] = 100 * a["rows"] / a["device"].map(n_dev)
        a["error_share"] = 100 * a["_sum"] / a["device"].map(total)
        out.append(a.drop(columns="_sum").rename(columns={"_bucket": "bucket"}).assign(dimension=name))
    res = pd.concat(out, ignore_index=True)
    # buckets in their natural order: by the smallest value each holds
    order = {b: i for i, b in enumerate(_bucket_order(res))}
    res["_o"] = res["bucket"].map(order)
    res = res.sort_values(["device", "dimension", "_o"], kind="stable").drop(columns="_o")
    res = res.rename(columns={"against_mape": f"{against} mape"})
    return res[["device", "dimension", "bucket", "rows", "share_rows", "mape", "median_ape", "p90_ape", "bias",
                "error_share", f"{against} mape"]].reset_index(drop=True)


def _bucket_order(res: pd.DataFrame) -> list:
    """Bucket labels sorted by the first number in them ('<= 16' before '16-128' before '> 8192')."""
    import re

    def key(b):
        nums = re.findall(r"[\d.]+", str(b))
        first = float(nums[0]) if nums else 0.0
        return (first + (0.5 if str(b).startswith(">") else 0.0) - (0.5 if str(b).startswith("<") else 0.0), str(b))
    return sorted(res["bucket"].unique(), key=key)


def headline(table: pd.DataFrame, predictor: str = "neusight") -> dict:
    """MAPE (mean over seeds) of ``predictor`` on the held-out GPUs: GEMM and attention (prefill and decode
    rows pooled as the mean of the two kinds), and the per-GPU GEMM numbers."""
    t = table[(table["role"] == "held_out") & (table["predictor"] == predictor)]
    gemm = t[t["kind"] == "GEMM"]
    attn = t[t["kind"].isin([k for k in KINDS if k.startswith(OpClass.ATTN)] + [v for k, v in KINDS.items()
                                                                          if k.startswith(OpClass.ATTN)])]
    return {"gemm_mape": float(gemm["mape"].mean()) if len(gemm) else None,
            "attention_mape": float(attn["mape"].mean()) if len(attn) else None,
            "gemm_per_gpu": {r.device: round(float(r.mape), 2) for r in gemm.itertuples()},
            "gemm_p90_per_gpu": {r.device: round(float(r.p90_ape), 2) for r in gemm.itertuples()},
            "attention_per_gpu": {f"{r.device} {r.kind}": round(float(r.mape), 2) for r in attn.itertuples()}}


#: The GEMM targets for ``neusight`` (MAPE mean over seeds, %; ``targets.yaml``, section gemm); the attention
#: targets come from the search log's ``frozen`` record (set from the training GPUs before the held-out GPUs were
#: looked at).
GEMM_TARGETS = targets_file.section("gemm")


#: What each of notebook 07's saved tables holds, the line above its Markdown (``report.save_table``'s ``title``):
#: the metric and its unit where the columns do not say it, and over which seeds (``{seeds}``, ``table_title``).
TABLE_TITLES = {
    "metrics_per_seed": "BF16 kernels per GPU x kind x predictor and seed: rows scored; MAPE, median APE, P90 APE and "
                        "bias (signed), all in %; {seeds}.",
    "metrics": "BF16 kernels per GPU x kind x predictor: rows scored (a count); MAPE, median APE, P90 APE and bias "
               "(signed), in %, mean over {seeds}; mape_spread: max - min of the MAPE over the seeds (points).",
    "mape_pivot": "MAPE (%) of the BF16 kernels per kind x GPU (rows) and predictor (columns), mean over {seeds}.",
    "error_vs": "Held-out GPUs (B200, GB200), {seeds} pooled: median APE (%) per predictor and bin (the bin's "
                "centre), rows = kernels in the bin.",
    "gemm_miss_breakdown": "neusight on the held-out GEMMs, {seeds} pooled, per bucket: rows (a count), share_rows and "
                           "error_share (% of the GPU's rows and of its summed APE); MAPE, median APE, P90 APE and bias "
                           "in %; structural tree mape: the baseline on the same rows (%).",
    "held_out_files": "GEMM MAPE (%) per held-out GPU and framework file: mape_vs_scored = the file's latencies taken "
                      "as predictions of the scored file's; neusight and structural tree: mean over {seeds}.",
    "memory_law": "BF16 memory-bound kernels: MAPE (%) per GPU and predictor, mean over {seeds}; FP32 networks spread: "
                  "max - min over the seeds (points).",
    "moe_layers": "MoE layers per GPU, framework and kernel implementation: layers scored (a count); MAPE and bias "
                  "(signed) in %, mean over {seeds} (the roofline has none); mape_spread: max - min (points); measured "
                  "TFLOPS: the layers' median at 4,096 tokens and more.",
    "moe_layers_by_tokens": "MoE layers per band of tokens per layer call, every GPU and implementation pooled: layers "
                            "(a count), MAPE and bias (signed) in %, mean over {seeds}.",
    "moe_layers_parallel": "One GPU of a split MoE layer per GPU role, split and GPUs in the group: layers (a count), "
                           "MAPE and bias (signed) of the two grouped GEMMs in %, mean over {seeds}; mape_spread: "
                           "max - min (points).",
    "targets": "neusight's targets: value = the worst over the GPUs a target covers (%; the tree gap and the spread "
               "in points), MAPE as the mean over {seeds}.",
}


def table_title(name: str, seeds, quick: bool = False) -> str:
    """The title line of notebook 07's table ``name`` (``TABLE_TITLES``; ``error_vs_<column>_<kind>`` tables share one),
    with the seeds it is over and, in quick mode, that the weights and rows are the quick ones; "" for a table whose
    columns say what they are (provenance, framework_agreement)."""
    key = "error_vs" if name.startswith("error_vs_") else name
    seeds = [int(x) for x in seeds]
    over = (f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}") + (
        " (quick weights, quick rows)" if quick else "")
    return TABLE_TITLES[key].format(seeds=over) if key in TABLE_TITLES else ""


#: Why a target has no value (``report.save_table``'s ``na``): only the seed spread can lack one, from one seed.
TARGETS_NA = {"value": "n/a: one seed (a spread needs two or more)", "met": "n/a: not measurable"}


def targets(table: pd.DataFrame, seeds: int, frozen: dict | None = None) -> pd.DataFrame:
    """One row per target: the worst value over the GPUs it covers and whether it is met (None: not measurable,
    e.g. a seed spread from one seed)."""
    T = GEMM_TARGETS
    n = table[(table["predictor"] == "neusight")]
    gt = n[n["kind"] == "GEMM"]
    held, train = gt[gt["role"] == "held_out"], gt[gt["role"] == "training"]
    rows = [("GEMM MAPE <= {held_out_mape:g} % on each held-out GPU", held["mape"].max(), T["held_out_mape"]),
            ("GEMM P90 APE <= {held_out_p90:g} % on each held-out GPU", held["p90_ape"].max(), T["held_out_p90"]),
            ("GEMM MAPE <= {training_mape:g} % on each training GPU", train["mape"].max(), T["training_mape"]),
            ("GEMM seed spread <= {seed_spread:g} points (held out)", held["mape_spread"].max() if seeds > 1 else np.nan,
             T["seed_spread"])]
    out = [{"target": text.format(**T), "value": v, "met": None if not np.isfinite(v) else bool(v <= lim)}
           for text, v, lim in rows]
    base = table[(table["predictor"] == BASELINE) & (table["kind"] == "GEMM") & (table["role"] == "held_out")]
    if len(base) and len(held):
        gap = (held.set_index("device")["mape"] - base.set_index("device")["mape"]).max()
        out.append({"target": f"GEMM MAPE below the {BASELINE}'s on each held-out GPU (value: worst neusight - tree, points)",
                    "value": gap, "met": bool(gap < 0)})
    for k, v in (frozen or {}).get("attention_targets", {}).items():
        a = n[(n["kind"] == KINDS[k]) & (n["role"] == "held_out")]["mape"].max()
        out.append({"target": f"{KINDS[k]} MAPE <= {v} % on each held-out GPU (set before, from leave-one-GPU-out)",
                    "value": a, "met": bool(a <= v)})
    return pd.DataFrame(out)


def summary_line(h: dict) -> str:
    g = "n/a" if h["gemm_mape"] is None else f"{h['gemm_mape']:.1f} %"
    a = "n/a" if h["attention_mape"] is None else f"{h['attention_mape']:.1f} %"
    return f"BF16 on unseen Blackwell GPUs, measured by others: GEMM {g}, attention {a}"


def _records(log=None) -> list:
    import json

    from neusight_core import paths
    f = paths.REPO_ROOT / "docs" / "search_bf16.jsonl" if log is None else log
    try:
        return [json.loads(x) for x in open(f) if x.strip()]
    except OSError:
        return []


def held_out_record(log=None) -> dict | None:
    """The last ``held-out-evaluated`` record of the BF16 search log (docs/search_bf16.jsonl): ``neusight``'s
    held-out MAPE (mean over seeds) per GPU and kind as benchmarks/bf16_external.py measured it; the one source
    notebook 06 quotes the validated BF16 kernels from. A record may evaluate the GEMMs only (``--networks GEMM``,
    the attention networks unchanged): its ``neusight_held_out_mape_mean_over_seeds`` then takes the attention
    keys (``attention_*``) from the last record that evaluated attention, and says which (``attention_from``)."""
    recs = [r for r in _records(log) if r.get("tag") == "held-out-evaluated"]
    if not recs:
        return None
    last = dict(recs[-1])
    h = dict(last.get("neusight_held_out_mape_mean_over_seeds") or {})
    if "attention_per_gpu" not in h:
        older = [r for r in recs if "attention_per_gpu" in (r.get("neusight_held_out_mape_mean_over_seeds") or {})]
        if older:
            h.update({k: v for k, v in older[-1]["neusight_held_out_mape_mean_over_seeds"].items()
                      if k.startswith("attention")},
                     attention_from=str(older[-1].get("date") or "")[:10] or "an undated record")
    last["neusight_held_out_mape_mean_over_seeds"] = h
    return last


def frozen_record(log=None) -> dict | None:
    """The last ``"frozen": true`` record of the BF16 search log (docs/search_bf16.jsonl): the recipe and the
    attention targets fixed from the training GPUs' leave-one-out error before the held-out GPUs were looked at."""
    frozen = [r for r in _records(log) if r.get("frozen")]
    return frozen[-1] if frozen else None
