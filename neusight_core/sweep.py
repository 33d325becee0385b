"""Sweeps: many configurations predicted together (docs/interfaces.md, "Sweeps").

    from neusight_core import sweep
    df = sweep.sweep(["gpt2_large", "bert_large"], ["H100", "A100-40GB"], batches=[1, 2, 4, 8],
                     seqs=[128, 256, 512], modes=["inf", "train"], predictors=["neusight", "roofline"])

How a sweep runs
1. Every configuration (model, device, batch, seq, mode, fusion, parallel plan, gpus, micro-batches,
   link bandwidth, past) is checked; a bad one gets its message in the ``error`` column and the
   sweep goes on. Image models (issue 26) have an ``image_size`` instead of a ``seq`` (the column of
   the other kind is empty); their tables are always traced (no shape derivation across image sizes).
2. Kernel tables are needed per (model, batch, seq, mode, options), not per device. Plain tables of a
   derivable family (``derive.py``) are evaluated for all their (batch, seq) points at once; the rest
   (fusion, parallel plans, short sequences, non-derivable models) come from real traces through the
   trace cache. Each table is reduced to its distinct kernels with launch counts (module and block
   index dropped: the predictors do not read them).
3. Distinct kernels of all tables are pooled; every predictor (and seed) is called once over the
   pool x the devices that need them (the predictor splits the call by device and op class).
4. Per-configuration sums by phase and op class are vectorised; tables with communication rows or
   pipeline stages go through ``latency.aggregate`` (same arithmetic as ``latency.predict_model``).
"""
from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pandas as pd

from neusight_core import derive, latency, network, schema, trace_cache

INPUTS = ["model", "device", "batch", "seq", "image_size", "mode", "fusion", "parallel", "gpus", "micro_batches",
          "link_gbs", "past", "dtype"]
RESULTS = (["predictor", "seed", "e2e_ms", "fw_ms", "bw_ms", "acc_ms", "comm_ms", "comm_exposed_ms"]
           + [f"{c}_ms" for c in schema.OP_CLASSES] + ["kernels", "derived", "error"])
BOOKKEEPING = ("module", "layer", "reads", "writes")
PLACEMENT = ("_tab", "count", "phase", "stage", "overlap")   # not part of a kernel's identity
MIN_FAMILY = 2       # tables of one model / mode / batch class before shape derivation is tried
MIN_BUCKET = 4       # tables in one seq bucket before a per-bucket family is built


class SweepInputError(ValueError):
    pass


def _as_list(x):
    if x is None:
        return [None]
    if isinstance(x, (str, int, float, bool)):
        return [x]
    return list(x)


def _image_model(model) -> bool:
    from neusight_core import configs
    try:
        return configs.is_image_model(model)
    except Exception:  # noqa: BLE001 - an unknown model is a text model here; its row gets the error
        return False


def grid(models, devices, batches, seqs=None, modes=("inf",), fusion=False, parallel=None, gpus=None,
         micro_batches=1, link_gbs=None, past=0, dtype="fp32", image_sizes=None) -> pd.DataFrame:
    """The full product of the arguments (each a value or a list; repeated values count once) as a
    configuration frame. An empty list is an error (it would make an empty sweep). Text models take the
    ``seqs``, image models the ``image_sizes`` (default 224; issue 26); sizes for a kind no model is of,
    or text models without ``seqs``, are an error."""
    lists = dict(models=models, devices=devices, batches=batches, seqs=seqs, modes=modes, fusion=fusion,
                 parallel=parallel, gpus=gpus, micro_batches=micro_batches, link_gbs=link_gbs, past=past,
                 dtype=dtype, image_sizes=image_sizes)
    for name, v in lists.items():
        if not isinstance(v, (str, int, float, bool)) and v is not None and len(list(v)) == 0:
            raise SweepInputError(f"{name}: empty list (give at least one value)")
    dedup = lambda v: list(dict.fromkeys(_as_list(v)))      # noqa: E731 - order kept, duplicates dropped
    models, devices, batches, seqs, modes, fusion, parallel, gpus, micro_batches, link_gbs, past, dtype, sizes = (
        dedup(v) for v in lists.values())
    image = {m: _image_model(m) for m in models}
    if seqs != [None] and all(image.values()):
        raise SweepInputError(f"--seq is for text models: {', '.join(map(str, models))} are image models; "
                              "give --image-size")
    if sizes != [None] and not any(image.values()):
        raise SweepInputError("--image-size is for image models: none of the models is one; give --seq")
    if seqs == [None] and not all(image.values()):
        raise SweepInputError(f"give the sequence length(s) (--seq) of the text model(s) "
                              f"{', '.join(str(m) for m in models if not image[m])}")
    rows = []
    for m in models:
        size = [(None, i) for i in sizes] if image[m] else [(q, None) for q in seqs]    # (seq, image_size)
        for d, b, (q, i), *rest in itertools.product(devices, batches, size, modes, fusion, parallel, gpus,
                                                     micro_batches, link_gbs, past, dtype):
            rows.append((m, d, b, q, i, *rest))
    return pd.DataFrame(rows, columns=INPUTS)


def chunks(configs: pd.DataFrame, size: int = 5000):
    """``configs`` in consecutive pieces of at most ``size`` rows, ordered so that the configurations of
    one model / mode / past / dtype stay together (their kernel tables and shape families are shared):
    a sweep of any length runs in bounded memory (``run`` per piece; the shape families and the trace
    cache carry over between pieces)."""
    if size < 1:
        raise SweepInputError(f"chunk size must be >= 1, got {size}")
    keys = [c for c in ("model", "mode", "past", "dtype", "batch", "seq") if c in configs]
    order = configs.astype({c: str for c in keys}).sort_values(keys, kind="stable").index if keys else configs.index
    ordered = configs.loc[order]
    for a in range(0, len(ordered), size):
        yield ordered.iloc[a:a + size]


def sweep(models, devices, batches, seqs=None, modes=("inf",), predictors=("neusight",), seeds=(0,),
          quick: bool = False, progress: bool = True, use_derivation: bool = True, **options) -> pd.DataFrame:
    """Predict the product of models x devices x batches x seqs (image models: ``image_sizes=``, default
    224) x modes (x options); see ``run``."""
    return run(grid(models, devices, batches, seqs, modes, **options), predictors, seeds, quick=quick,
               progress=progress, use_derivation=use_derivation)


# ------------------------------------------------------------------------------ checking
def _int(v, what, minimum=1):
    if isinstance(v, bool) or v is None or (isinstance(v, float) and (math.isnan(v) or v != int(v))):
        raise SweepInputError(f"{what} must be an integer >= {minimum}, got {v!r}")
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise SweepInputError(f"{what} must be an integer >= {minimum}, got {v!r}") from None
    if iv < minimum:
        raise SweepInputError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return iv


def _given(v):
    """None for a missing value of a configuration frame (None, NaN, pandas' NA), else the value."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else v


def _normalise(r: dict) -> dict:
    """One configuration row -> its validated inputs. The frame's cells are read here (NaN = not given,
    integers from floats); the request is then checked by ``scenario.scenario``, exactly as ``predict``
    checks it (issue 23: device plausibility, the absurd-memory guard, image/text sizes, plan limits)."""
    from neusight_core import scenario

    def opt_int(key, what, minimum=1):
        v = _given(r.get(key))
        return None if v is None else _int(v, what, minimum)

    plan = _given(r.get("parallel"))
    plan = None if plan in ("", "none") else plan
    dt = _given(r.get("dtype"))
    fusion = _given(r.get("fusion"))
    link = _given(r.get("link_gbs"))
    sc = scenario.scenario(
        r.get("model"), str(r.get("device")), _int(r.get("batch"), "batch"), opt_int("seq", "seq"),
        _given(r.get("mode")) or "inf", image_size=opt_int("image_size", "image_size"),
        past=opt_int("past", "past", 0) or 0, dtype=dt if dt not in (None, "") else "fp32", fusion=bool(fusion),
        parallel=plan, gpus=opt_int("gpus", "gpus"), micro_batches=opt_int("micro_batches", "micro_batches") or 1,
        link_gbs=None if link is None else float(link))
    out = dict(r)
    out.update(sc.as_dict())
    del out["image"]
    out["seq"], out["image_size"] = sc.seq_len, sc.image_size
    return out


def _msg(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0] if s else ''}"[:300]


# ------------------------------------------------------------------------------ tables
def compact_table(k: pd.DataFrame) -> pd.DataFrame:
    """A kernel table reduced to distinct kernels with summed launch counts (order and module dropped)."""
    cols = [c for c in k.columns if c not in BOOKKEEPING and c != "count"]
    if len(k) == 0:
        return k[cols].assign(count=pd.Series(dtype=float))
    cnt = k["count"].fillna(1).astype(float) if "count" in k else pd.Series(1.0, index=k.index)
    out = (k[cols].assign(count=cnt.to_numpy()).groupby(cols, dropna=False, sort=False, observed=True)["count"]
           .sum().reset_index())
    return out


def table_key(r: dict) -> tuple:
    # the tracer's size argument: the sequence length, or an image model's side
    size = r["seq"] if r.get("image_size") is None else r["image_size"]
    return (str(r["model"]), r["batch"], size, r["mode"], r["past"], r["fusion"], r["parallel"],
            r["gpus"] if r["parallel"] else 1, r["micro_batches"] if r["parallel"] == "pp" else 1, r["dtype"])


def kernel_table(model, batch: int, seq: int, mode: str, past: int = 0, fusion: bool = False,
                 parallel: str | None = None, gpus: int = 1, micro_batches: int = 1,
                 dtype: str = "fp32") -> pd.DataFrame:
    """A full kernel table (trace -> fusion -> plan) through the trace cache (real traces only)."""
    if not fusion and parallel is None:
        return trace_cache.trace(model, batch, seq, mode, past=past, dtype=dtype)
    args = trace_cache.trace_kwargs(batch, seq, mode, past=past, dtype=dtype)
    key = trace_cache.make_key("table", model, **args, fusion=bool(fusion), parallel=parallel,
                               gpus=int(gpus), micro_batches=int(micro_batches))

    def build():
        k = trace_cache.trace(model, batch, seq, mode, past=past, dtype=dtype)
        if fusion:
            from neusight_core import fusion as _fusion
            k = _fusion.fuse(k)
        if parallel is not None:
            from neusight_core import parallel as _parallel
            k = _parallel.apply_plan(k, parallel, gpus, micro_batches=micro_batches)
        attrs = dict(k.attrs)
        k = k.drop(columns=[c for c in ("reads", "writes") if c in k.columns])   # only fuse() needs them
        k.attrs.update(attrs)
        return k

    return trace_cache.cached(key, build)




# ------------------------------------------------------------------------------ the sweep
def run(configs: pd.DataFrame, predictors=("neusight",), seeds=(0,), quick: bool = False,
        progress: bool = True, use_derivation: bool = True) -> pd.DataFrame:
    """Predict every row of ``configs`` (columns ``INPUTS``; missing ones take defaults) with every
    predictor and seed. Returns one row per configuration x predictor x seed: the inputs (device as
    its catalogue name), ``predictor``, ``seed``, ``e2e_ms``, ``fw_ms``, ``bw_ms``, ``acc_ms``,
    ``comm_ms``, ``comm_exposed_ms``, ``<CLASS>_ms`` per op class, ``kernels`` (launches),
    ``derived`` (table from shape derivation, not a trace) and ``error`` ('' when predicted).
    Wall times are in ``attrs`` (``tables_s``, ``predict_s``, ``total_s``)."""
    from tqdm.auto import tqdm
    t_start = time.perf_counter()
    predictors = [predictors] if isinstance(predictors, str) else list(predictors)
    seeds = [int(seeds)] if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
    cfg = configs.reset_index(drop=True).copy()
    for c in INPUTS:
        if c not in cfg:
            cfg[c] = None
    n = len(cfg)
    norm: list[dict | None] = [None] * n
    err = [""] * n
    for i, r in enumerate(cfg[INPUTS].to_dict("records")):
        try:
            norm[i] = _normalise(r)
        except Exception as e:  # noqa: BLE001 - recorded in the row
            err[i] = _msg(e)

    # ---- kernel tables: one per table key
    tab_of = np.full(n, -1)
    keys: dict[tuple, int] = {}
    image_keys = set()        # tables of image models: always traced (derive.py's families are in seq)
    for i, r in enumerate(norm):
        if r is not None:
            tab_of[i] = keys.setdefault(table_key(r), len(keys))
            if r["image_size"] is not None:
                image_keys.add(table_key(r))
    tab_err: dict[int, str] = {}
    tab_derived: dict[int, bool] = {}
    parts: list[pd.DataFrame] = []
    fam_points: dict[int, tuple] = {}     # id(family) -> (family, [(tab, b, s)])
    real: list[tuple[int, tuple]] = []
    t0 = time.perf_counter()
    bar = tqdm(total=len(keys), desc="kernel tables", disable=not progress, leave=False)
    # derivation pays when a family covers several tables (building one costs ~7 traces of a
    # reduced model): at least MIN_FAMILY tables, MIN_BUCKET within a seq bucket
    group, bucket, same_seq = {}, {}, {}
    for key in keys:
        model, b, s, mode, past = key[:5]
        g0 = (model, mode, past, b == 1, key[-1])
        group[g0] = group.get(g0, 0) + 1
        g1 = g0 + (int(s).bit_length(),)
        bucket[g1] = bucket.get(g1, 0) + 1
        same_seq[g0 + (s,)] = same_seq.get(g0 + (s,), 0) + 1
    # batch >= 2 first: a failed check there spares the batch-1 family of the same model (derive.family_for)
    for key, t in sorted(keys.items(), key=lambda kv: kv[0][1] == 1):
        model, b, s, mode, past, fusion, plan, g, mb, dt = key
        fam = None
        g0 = (model, mode, past, b == 1, dt)
        if use_derivation and not fusion and plan is None and group[g0] >= MIN_FAMILY and key not in image_keys:
            try:
                fam = derive.family_for(model, b, s, mode, past=past, dtype=dt,
                                        allow_bucket=bucket[g0 + (int(s).bit_length(),)] >= MIN_BUCKET,
                                        allow_fixed=same_seq[g0 + (s,)] >= MIN_FAMILY)
            except Exception:  # noqa: BLE001 - derivation is an optimisation: trace instead
                fam = None
        if fam is not None:
            fam_points.setdefault(id(fam), (fam, []))[1].append((t, b, s))
        else:
            real.append((t, key))
    for fam, pts in fam_points.values():
        c = fam.compact([(b, s) for _, b, s in pts])
        c["_tab"] = np.asarray([t for t, _, _ in pts])[c.pop("_point").to_numpy()]
        parts.append(c)
        for t, _, _ in pts:
            tab_derived[t] = True
        bar.update(len(pts))
    for t, key in real:
        model, b, s, mode, past, fusion, plan, g, mb, dt = key
        try:
            k = kernel_table(model, b, s, mode, past=past, fusion=fusion, parallel=plan, gpus=g, micro_batches=mb,
                             dtype=dt)
            parts.append(compact_table(k).assign(_tab=t))
            tab_derived[t] = False
        except Exception as e:  # noqa: BLE001 - recorded in the rows of this table
            tab_err[t] = _msg(e)
        bar.update()
    bar.close()
    tables_s = time.perf_counter() - t0
    for i in range(n):
        if tab_of[i] >= 0 and tab_of[i] in tab_err:
            err[i] = tab_err[tab_of[i]]
    ok = np.array([e == "" for e in err])

    # ---- pool of distinct kernels
    t0 = time.perf_counter()
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["_tab", "count"])
    rows = rows.sort_values("_tab", kind="stable").reset_index(drop=True)
    # conv columns NaN throughout (no image model in the sweep) tell no kernels apart: not grouped on
    rows = rows.drop(columns=[c for c in schema.CONV_COLUMNS if c in rows and rows[c].isna().all()])
    ident = [c for c in rows.columns if c not in PLACEMENT]
    kid = rows.groupby(ident, dropna=False, sort=False, observed=True).ngroup().to_numpy() if len(rows) else np.zeros(0, int)
    n_kid = int(kid.max()) + 1 if len(kid) else 0
    first_row = np.full(n_kid, -1)
    first_row[kid[::-1]] = np.arange(len(kid))[::-1]
    pool = rows.iloc[first_row][ident].reset_index(drop=True) if n_kid else rows[ident]
    tab_col = rows["_tab"].to_numpy()
    n_tab = len(keys)
    starts = np.searchsorted(tab_col, np.arange(n_tab + 1))

    dev_names = sorted({norm[i]["device"] for i in range(n) if ok[i]})
    dev_idx = {d: j for j, d in enumerate(dev_names)}
    cfg_dev = np.array([dev_idx[norm[i]["device"]] if ok[i] else -1 for i in range(n)])
    # which kernels each device needs
    need = np.zeros((n_kid, len(dev_names)), dtype=bool)
    for i in np.flatnonzero(ok):
        t = tab_of[i]
        need[kid[starts[t]:starts[t + 1]], cfg_dev[i]] = True
    req_k, req_d = np.nonzero(need)
    request = pool.iloc[req_k].reset_index(drop=True)
    request["device"] = np.asarray(dev_names, dtype=object)[req_d] if len(req_d) else pd.Series(dtype=object)

    # ---- one predictor call per predictor x seed over the pool
    out_frames = []
    # a predictor is a name (trained weights by name x seed) or a (label, trained predictor) pair (the
    # ablation's variants), which runs once with its own seed
    jobs = [(p, seed, None) for p in predictors if isinstance(p, str) for seed in seeds]
    jobs += [(p[0], int(getattr(p[1], "seed", 0)), p[1]) for p in predictors if not isinstance(p, str)]
    pbar = tqdm(total=len(jobs), desc="predicting", disable=not progress, leave=False)
    for p, seed, obj in jobs:
        per_launch = np.full((n_kid, len(dev_names)), np.nan)
        p_err = [""] * len(dev_names)
        try:
            pred = obj if obj is not None else latency.loaded_predictor(p, bool(quick), int(seed))
            if len(request):
                per_launch[req_k, req_d] = np.asarray(pred.predict(request, None), dtype=float)
        except Exception as e:  # noqa: BLE001 - isolate the failing device(s)
            msg = _msg(e)
            pred = None
            try:
                pred = obj if obj is not None else latency.loaded_predictor(p, bool(quick), int(seed))
            except Exception:  # noqa: BLE001
                p_err = [f"{p}: {msg}"] * len(dev_names)
            if pred is not None:
                for j, d in enumerate(dev_names):
                    sel = req_d == j
                    try:
                        per_launch[req_k[sel], j] = pred.predict(request[sel], None)
                    except Exception as e2:  # noqa: BLE001
                        p_err[j] = f"{p}: {_msg(e2)}"
        out_frames.append(_aggregate(cfg, norm, err, ok, tab_of, cfg_dev, rows, kid, starts, per_launch,
                                     p_err, p, seed, tab_derived))
        pbar.update()
    pbar.close()
    out = pd.concat(out_frames, ignore_index=True) if out_frames else pd.DataFrame(columns=INPUTS + RESULTS)
    out.attrs.update(tables_s=tables_s, predict_s=time.perf_counter() - t0,
                     total_s=time.perf_counter() - t_start, tables=n_tab, distinct_kernels=n_kid,
                     derived_tables=int(sum(tab_derived.values())))
    return out


def _aggregate(cfg, norm, err, ok, tab_of, cfg_dev, rows, kid, starts, per_launch, p_err, p, seed,
               tab_derived) -> pd.DataFrame:
    n = len(cfg)
    res = {c: np.full(n, np.nan) for c in RESULTS if c.endswith("_ms")}
    kernels = np.full(n, np.nan)
    errors = list(err)
    for i in range(n):
        if ok[i] and p_err[cfg_dev[i]]:
            errors[i] = p_err[cfg_dev[i]]
    good = np.array([ok[i] and not p_err[cfg_dev[i]] for i in range(n)]) if n else np.zeros(0, bool)
    phase = rows["phase"].to_numpy() if "phase" in rows else np.full(len(rows), "fw")
    # no configuration produced a table (every one failed): an empty table with the kernel columns
    cls = rows["op_class"].to_numpy() if "op_class" in rows else np.full(len(rows), "", dtype=object)
    count = rows["count"].to_numpy(float)
    comm_row = cls == "COMM"
    stage = rows["stage"].fillna(0).to_numpy() if "stage" in rows else np.zeros(len(rows))
    # tables that need the full aggregation (communication or pipeline stages)
    slow_tab = set()
    for t in range(len(starts) - 1):
        a, b = starts[t], starts[t + 1]
        if comm_row[a:b].any() or len(np.unique(stage[a:b])) > 1:
            slow_tab.add(t)
    fast = [i for i in np.flatnonzero(good) if tab_of[i] not in slow_tab]
    if fast:
        fast = np.asarray(fast)
        lens = starts[tab_of[fast] + 1] - starts[tab_of[fast]]
        cfg_of_row = np.repeat(np.arange(len(fast)), lens)
        offs = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        r = np.repeat(starts[tab_of[fast]], lens) + offs
        val = per_launch[kid[r], cfg_dev[fast][cfg_of_row]] * count[r]
        m = len(fast)
        for ph, col in (("fw", "fw_ms"), ("bw", "bw_ms"), ("acc", "acc_ms")):
            res[col][fast] = np.bincount(cfg_of_row, weights=np.where(phase[r] == ph, val, 0.0), minlength=m)
        for c in schema.OP_CLASSES:
            res[f"{c}_ms"][fast] = np.bincount(cfg_of_row, weights=np.where(cls[r] == c, val, 0.0), minlength=m)
        res["comm_ms"][fast] = 0.0
        res["comm_exposed_ms"][fast] = 0.0
        res["e2e_ms"][fast] = res["fw_ms"][fast] + res["bw_ms"][fast] + res["acc_ms"][fast]
        kernels[fast] = np.bincount(cfg_of_row, weights=count[r], minlength=m)
    for i in np.flatnonzero(good):
        t = tab_of[i]
        if t not in slow_tab:
            continue
        r = norm[i]
        sub = rows.iloc[starts[t]:starts[t + 1]]
        per = per_launch[kid[starts[t]:starts[t + 1]], cfg_dev[i]].copy()
        c = (sub["op_class"] == "COMM").to_numpy()
        try:
            if c.any():
                net = network.NetworkModel(link_gbs=r["link_gbs"] or 1.0, gpus=r["gpus"])
                per = np.where(c, net.time_ms(sub), per)
            agg = latency.aggregate(sub.assign(pred_ms=per * sub["count"].to_numpy(float)),
                                    r["micro_batches"] if r["parallel"] == "pp" else 1)
        except Exception as e:  # noqa: BLE001
            errors[i] = _msg(e)
            continue
        for k in ("e2e_ms", "fw_ms", "bw_ms", "acc_ms", "comm_ms", "comm_exposed_ms"):
            res[k][i] = agg[k]
        for cl in schema.OP_CLASSES:
            res[f"{cl}_ms"][i] = agg["breakdown"].get(cl, 0.0)
        kernels[i] = float(sub["count"].sum())
    out = pd.DataFrame({c: [r[c] if r is not None else v for r, v in zip(norm, cfg[c])] for c in INPUTS})
    for c in ("batch", "seq", "image_size", "gpus", "micro_batches", "past"):
        try:
            out[c] = out[c].astype("Int64")
        except (TypeError, ValueError):
            pass                       # a bad input kept as given (its row has the error)
    out["parallel"] = out["parallel"].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    out["predictor"] = p
    out["seed"] = int(seed)
    for c in RESULTS:
        if c in res:
            out[c] = res[c]
    out["kernels"] = kernels
    out["derived"] = [bool(tab_derived.get(tab_of[i], False)) if tab_of[i] >= 0 else False for i in range(n)]
    out["error"] = errors
    return out[INPUTS + RESULTS]
