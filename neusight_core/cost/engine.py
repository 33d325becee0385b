"""The prediction engine: scenarios x predictors x seeds -> one tidy frame (docs/interfaces.md, "engine").

    from neusight_core.cost import engine
    from neusight_core.cost import request, scenario
    sc = scenario.scenario("gpt2_large", "H100", batch=4, seq=512)
    df = engine.predict([sc, scenario.scenario("bert_large", "L4", batch=8, seq=128)], ["neusight", "roofline"])
    df = engine.predict(request.parse([dict(model="bert_large", device="L4", batch=8, seq=128)]), "roofline")

Every entry point that predicts a model's latency is a client of :func:`predict`: ``latency.predict_model`` (one
scenario, its kernel table kept), ``sweep.run`` (a configuration frame), ``reproduce`` / ``recipe_eval`` (the
labelled configurations, trained predictor objects), ``recipe_studies.predict_tables`` (other kernel tables of the
same configurations), the CLI. The stages:

1. **check**: each request is a :class:`scenario.Scenario` (validated when built) or a ``request.Rejected`` (a dict
   that ``request.parse``, the adapter from dicts, could not make one of): that one gets its one-line error in
   ``error`` and the others go on.
2. **tables**: one kernel table per :class:`step.Step` (model, batch, size, mode, past, fusion, plan, GPUs,
   micro-batches, dtype, attention, gradients), not per device. Plain tables of a derivable family (``table_families.py``, several tables of one model) are evaluated
   for all their points at once; the rest are traced through the trace cache (fusion and plans applied, cached
   on disk too). Each table is reduced to its distinct kernels with launch counts (``compact_table``).
3. **one predictor call per predictor x seed** over the distinct kernels of all tables x the devices that need
   them (the predictor splits the call by device and op class); COMM rows are timed by ``network.NetworkModel``;
   in BF16 / FP16 scenarios no kernel takes less than the shortest measured kernel of its kind (``kernel_floor.py``).
4. **aggregate**: sums by phase and op class, vectorised; tables with communication rows or pipeline stages go
   through :func:`aggregate` (exposed communication, the GPipe schedule).
5. **memory**: ``memory.footprint`` of every traced table on its device; a derived table's footprint from its
   family's derived allocation timeline (``family_memory.py``: exact to the byte where checked); a table without
   one says the lower bound (``scenario.lower_bound_verdict``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from neusight_core.tracing import table_families, family_pool, gc_pause
from neusight_core.cost import error_model as error_models
from neusight_core.cost import host, kernel_floor, memory, network
from neusight_core.question import schema
from neusight_core.cost import scenario
from neusight_core.cost.request import jobs, message, requests
from neusight_core.cost.tables import aggregate, compact_codes, compact_table, kernel_table, loaded_predictor
from neusight_core.question.schema import Execution, Grads, KVCache, OpClass, Plan
from neusight_core.question.step import INPUTS, Step

PHASE_COLUMNS = ["e2e_ms", "fw_ms", "bw_ms", "acc_ms", "comm_ms", "comm_exposed_ms"]
CLASS_MS = [f"{c}_ms" for c in schema.OP_CLASSES]
# kernel_ms: the step's kernel sum (what e2e_ms is with execution graph); host_ms: the host's launch time with
# execution eager (host.py; 0 for graph); host_bound: the host, not the GPU, sets the step's time
# sigma: the answer's spread (log; error_model.py); lo_ms / hi_ms: its interval at the request's coverage;
# interval_by: the spread's two largest contributors (NaN / "" where the recipe and seed have no error model yet)
INTERVAL = ["sigma", "lo_ms", "hi_ms", "interval_by"]
RESULTS = (["predictor", "seed"] + PHASE_COLUMNS + CLASS_MS + ["kernels", "kernel_ms", "host_ms", "host_bound"] + INTERVAL
           + ["derived", "error"])
MEMORY = ["memory_weights_gib", "memory_grads_gib", "memory_optimizer_gib", "memory_activations_gib",
          "memory_kv_cache_gib", "memory_total_gib", "memory_fits", "memory_verdict"]
RESULT_COLUMNS = INPUTS + RESULTS[:-1] + MEMORY + ["error"]
PLACEMENT = ("_tab", "count", "phase", "stage", "overlap")   # not part of a kernel's identity
MIN_FAMILY = 2       # tables of one model / mode / batch class before shape derivation is tried
MIN_BUCKET = 4       # tables in one seq bucket before a per-bucket family is built


# ------------------------------------------------------------------------------ the engine
@gc_pause.paused(promote=True)   # a sweep's pandas and numpy work after its traces: a fifth less time (gc_pause.py)
def predict(scenarios, predictors=("neusight",), seeds=(0,), quick: bool | None = None, *, progress: bool = False,
            use_derivation: bool = True, memory_columns: bool = True, optimizer: str = "adamw",
            master_weights: bool = True, efficiency: float = network.DEFAULT_EFFICIENCY,
            keep_kernels: bool = False, raise_errors: bool = False, table_of=None, error_model=None) -> pd.DataFrame:
    """Predict every scenario with every predictor (and seed): one row per scenario x predictor x seed, in that
    order (predictor-major: all scenarios of the first predictor and seed, then the next), columns ``RESULT_COLUMNS``.

    ``scenarios``: :class:`scenario.Scenario` objects, or what ``request.parse`` made of dicts of ``INPUTS``
    fields (Scenarios and ``request.Rejected``; a configuration frame goes through ``sweep.run``). ``predictors``:
    names (trained weights by name x seed from ``seeds``, ``quick`` or full), trained predictor objects, or
    (label, predictor) pairs; an object runs once with its own ``seed``. ``quick``: the quick weights of named
    predictors; None picks them as the CLI does (``predictors.auto_quick``: the full weights when trained, else
    the quick ones with a warning, so that a question never starts half an hour of training unasked).
    ``memory_columns``: the footprint of every traced table too (``optimizer``,
    ``master_weights``: the training state it counts; what it reads of a table is kept, not the table); derived
    tables' footprints cost nothing and are always given. ``keep_kernels``: trace every table (no derivation) and
    keep each row's kernel table with ``pred_ms`` (None for a failed row) and its full ``memory.footprint`` dict in
    the result's :class:`RunInfo` (``kernels``, ``memory``). ``raise_errors``: raise a
    failure (table, predictor, memory) instead of recording it (``latency.predict_model``). ``table_of``: a function
    of a request's validated fields returning its kernel table instead of the trace (``recipe_studies``' graph
    variants: the authors' graph, our trace without the mask ops); such tables are never derived. Wall times and counts
    are in the frame's :class:`RunInfo` (``run_info(frame)``). ``error_model``: the ``error_model.ErrorModel`` of every
    answer's interval (the calibration's); None: each named recipe and seed's saved one (none for predictor objects)."""
    t_start = time.perf_counter()
    if quick is None:
        from neusight_core import predictors as _pred
        quick = _pred.auto_quick([predictors] if isinstance(predictors, str) else list(predictors), seeds)
    given, norm, err = requests(scenarios)
    n = len(given)
    use_derivation = use_derivation and not keep_kernels and table_of is None

    tabs = _tables(norm, use_derivation, keep_kernels, memory_columns, table_of, raise_errors, progress)
    for i in range(n):
        if tabs.tab_of[i] >= 0 and tabs.tab_of[i] in tabs.errors:
            err[i] = tabs.errors[tabs.tab_of[i]]
    ok = np.array([e == "" for e in err], dtype=bool)

    t0 = time.perf_counter()
    pool = _distinct_kernels(tabs, norm, ok)
    mem = _memory(tabs, norm, ok, optimizer, master_weights, raise_errors)

    # ---- one predictor call per job (predictor x seed) over the pool
    out_frames, kept = [], []
    ctx = _Pool(pool.rows, pool.kid, pool.starts, tabs.tab_of, pool.cfg_dev, norm, ok, efficiency, raise_errors)
    todo = jobs(predictors, seeds)
    pbar = _bar(progress, total=len(todo), desc="predicting")
    for job in todo:
        per_launch, p_err, pred = _per_launch(job.predictor, job.seed, job.obj, quick, pool.request, pool.req_k,
                                              pool.req_d, pool.n_kid, pool.dev_names, raise_errors)
        em = error_model if error_model is not None or job.obj is not None else error_models.load(job.predictor, job.seed, bool(quick))
        parts = _parts(em, pred, pool) if em is not None and pred is not None else None
        frame, comm = _aggregate(ctx, given, err, per_launch, p_err, job.predictor, job.seed, tabs.derived, mem, parts)
        out_frames.append(frame)
        if keep_kernels:
            kept += [_kernels_of(ctx, tabs.full, i, per_launch, comm, frame["error"].iloc[i]) for i in range(n)]
        pbar.update()
    pbar.close()
    out = pd.concat(out_frames, ignore_index=True) if out_frames else pd.DataFrame(columns=RESULT_COLUMNS)
    # with keep_kernels, the full footprint (notes, PP stages) of each row too: latency.predict_model returns it
    footprints = tuple(mem.get((ctx.tab_of[i % n], ctx.cfg_dev[i % n]), {}).get("footprint")
                       for i in range(len(out))) if keep_kernels else ()
    out.attrs[RUN_KEY] = RunInfo(tables_s=tabs.seconds, predict_s=time.perf_counter() - t0,
                                 total_s=time.perf_counter() - t_start, tables=tabs.n, distinct_kernels=pool.n_kid,
                                 derived_tables=int(sum(tabs.derived.values())), kernels=tuple(kept),
                                 memory=footprints)
    return out


@dataclass(frozen=True)
class RunInfo:
    """How one ``predict`` call went, on its result frame: wall times (``tables_s``: the tables, ``predict_s``: the
    predictors and sums, ``total_s``), the tables built and derived, the distinct kernels predicted; with
    ``keep_kernels`` each row's kernel table with ``pred_ms`` (None for a failed row) and full footprint (None
    without one). Frozen and shared by the copies pandas makes of the frame, which deep-copies ``attrs`` on every
    operation (kernel tables included)."""
    tables_s: float = 0.0
    predict_s: float = 0.0
    total_s: float = 0.0
    tables: int = 0
    distinct_kernels: int = 0
    derived_tables: int = 0
    kernels: tuple = ()
    memory: tuple = ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


RUN_KEY = "run"          # the ``attrs`` key of a result frame's RunInfo


def run_info(frame: pd.DataFrame) -> RunInfo:
    """The :class:`RunInfo` of a ``predict`` result (an empty one, zero seconds, for a frame without it)."""
    got = frame.attrs.get(RUN_KEY)
    return got if isinstance(got, RunInfo) else RunInfo()


def _bar(progress: bool, **kw):
    """A tqdm bar when ``progress``; else a stand-in, so that a question never imports tqdm (40 ms of a 0.7 s answer)."""
    if not progress:
        return _NoBar()
    from tqdm.auto import tqdm
    return tqdm(leave=False, **kw)


class _NoBar:
    update = close = staticmethod(lambda *a, **k: None)


class _Tables(NamedTuple):
    tab_of: np.ndarray        # request -> table index (-1: the request failed its checks)
    n: int                    # tables
    parts: list               # compact rows of every table (``_tab`` = its index)
    derived: dict             # table -> built from a derived family (no trace)
    families: dict            # derived table -> (family, batch, seq): its footprint (family_memory)
    full: dict                # table -> traced kernel table (kept for keep_kernels)
    footprints: dict          # traced table -> memory.footprint_parts, or the MemoryInputError it raised
    errors: dict              # table -> one-line error
    seconds: float


def _tables(norm, use_derivation: bool, keep_full: bool, footprints: bool, table_of, raise_errors: bool,
            progress: bool) -> _Tables:
    """Stage 2: one kernel table per table key (not per device), each reduced to its distinct kernels."""
    n = len(norm)
    tab_of = np.full(n, -1)
    keys: dict[Step, int] = {}
    fields: dict[Step, dict] = {}        # the validated fields of each table's first request (table_of)
    for i, r in enumerate(norm):
        if r is not None:
            st = Step.of(r)
            tab_of[i] = keys.setdefault(st, len(keys))
            fields.setdefault(st, r)
    tab_err: dict[int, str] = {}
    tab_derived: dict[int, bool] = {}
    full: dict[int, pd.DataFrame] = {}     # traced tables (keep_kernels)
    foot: dict = {}
    parts: list[pd.DataFrame] = []
    fam_points: dict[int, tuple] = {}     # id(family) -> (family, [(tab, b, s)])
    real: list[tuple[int, Step]] = []
    t0 = time.perf_counter()
    bar = _bar(progress, total=len(keys), desc="kernel tables")
    # derivation pays when a family covers several tables (building one costs ~7 traces of a
    # reduced model): at least MIN_FAMILY tables, MIN_BUCKET within a seq bucket
    def family_of(st: Step) -> tuple:      # what a family is built for (fresh gradients: rows dropped after it)
        return (st.model, st.mode, st.past, st.batch == 1, st.dtype, st.attention)
    group, bucket, same_seq = {}, {}, {}
    for st in keys:
        g0 = family_of(st)
        group[g0] = group.get(g0, 0) + 1
        g1 = g0 + (int(st.size).bit_length(),)
        bucket[g1] = bucket.get(g1, 0) + 1
        same_seq[g0 + (st.size,)] = same_seq.get(g0 + (st.size,), 0) + 1

    def derivable(st: Step) -> bool:        # tables of image models are always traced (table_families.py's families are in seq)
        # a paged cache's table is the trace's with its appends rewritten (trace.paged_cache_writes): always traced
        return (not st.fusion and st.parallel is None and not st.image and st.kv_cache == KVCache.APPEND
                and group[family_of(st)] >= MIN_FAMILY)
    if use_derivation:        # the families the loop below will ask for first, built side by side on many cores
        family_pool.build([dict(model=st.model, mode=st.mode, batch_one=st.batch == 1, past=st.past, dtype=st.dtype,
                                attention=st.attention, point=(st.batch, st.size))
                           for st in keys if derivable(st) and st.size >= table_families.MIN_SEQ], progress=progress)
    # batch >= 2 first: a failed check there spares the batch-1 family of the same model (table_families.family_for)
    for st, t in sorted(keys.items(), key=lambda kv: kv[0].batch == 1):
        fam = None
        if use_derivation and derivable(st):
            g0 = family_of(st)
            try:
                fam = table_families.family_for(st.model, st.batch, st.size, st.mode, past=st.past, dtype=st.dtype,
                                        attention=st.attention,
                                        allow_bucket=bucket[g0 + (int(st.size).bit_length(),)] >= MIN_BUCKET,
                                        allow_fixed=same_seq[g0 + (st.size,)] >= MIN_FAMILY)
            except Exception:  # noqa: BLE001 - derivation is an optimisation: trace instead
                fam = None
        if fam is not None:
            fam_points.setdefault(id(fam), (fam, []))[1].append((t, st.batch, st.size))
        else:
            real.append((t, st))
    fresh = {t for st, t in keys.items() if st.grads == Grads.FRESH}     # tables without the accumulation rows
    for fam, pts in fam_points.values():
        c = family_pool.compact(fam, [(b, s) for _, b, s in pts])
        c["_tab"] = np.asarray([t for t, _, _ in pts])[c.pop("_point").to_numpy()]
        parts.append(c[~(c["phase"].eq("acc") & c["_tab"].isin(fresh))] if fresh else c)
        tab_derived.update((t, True) for t, _, _ in pts)
        bar.update(len(pts))
    for t, st in real:
        try:
            k = table_of(fields[st]) if table_of is not None else kernel_table(st)
            kt = k[k["phase"].ne("acc")] if t in fresh and "phase" in k else k   # the footprint reads the whole trace
            parts.append(compact_table(kt).assign(_tab=t))
            tab_derived[t] = False
            full.update({t: kt} if keep_full else {})
            if footprints:
                try:
                    foot[t] = memory.footprint_parts(k)
                except memory.MemoryInputError as e:    # a table without a trace's TableInfo: no memory columns
                    foot[t] = e
        except Exception as e:  # noqa: BLE001 - recorded in the rows of this table
            if raise_errors:
                raise
            tab_err[t] = message(e)
        bar.update()
    bar.close()
    families = {t: (fam, b, s) for fam, pts in fam_points.values() for t, b, s in pts}
    return _Tables(tab_of, len(keys), parts, tab_derived, families, full, foot, tab_err, time.perf_counter() - t0)


class _Distinct(NamedTuple):
    rows: pd.DataFrame        # every table's compact rows, sorted by table
    kid: np.ndarray           # row -> distinct-kernel id
    n_kid: int
    starts: np.ndarray        # table t's rows are rows[starts[t]:starts[t + 1]]
    dev_names: list
    cfg_dev: np.ndarray       # request -> device index (-1: failed)
    request: pd.DataFrame     # the distinct kernels x the devices that need them: what the predictors are asked
    req_k: np.ndarray
    req_d: np.ndarray


def _distinct_kernels(tabs: _Tables, norm, ok) -> _Distinct:
    """Stage 3's input: the distinct kernels of all tables, and which devices need each."""
    parts, tab_of, n = tabs.parts, tabs.tab_of, len(norm)
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["_tab", "count"])
    rows = rows.sort_values("_tab", kind="stable").reset_index(drop=True)
    # conv columns NaN throughout (no image model among the scenarios) tell no kernels apart: not grouped on
    rows = rows.drop(columns=[c for c in schema.CONV_COLUMNS + schema.ATTN_COLUMNS if c in rows and rows[c].isna().all()])
    ident = [c for c in rows.columns if c not in PLACEMENT]
    kid = rows.groupby(ident, dropna=False, sort=False, observed=True).ngroup().to_numpy() if len(rows) else np.zeros(0, int)
    n_kid = int(kid.max()) + 1 if len(kid) else 0
    first_row = np.full(n_kid, -1)
    first_row[kid[::-1]] = np.arange(len(kid))[::-1]
    pool = rows.iloc[first_row][ident].reset_index(drop=True) if n_kid else rows[ident]
    tab_col = rows["_tab"].to_numpy()
    n_tab = tabs.n
    starts = np.searchsorted(tab_col, np.arange(n_tab + 1))

    dev_names = sorted({norm[i]["device"] for i in range(n) if ok[i]})
    dev_idx = {d: j for j, d in enumerate(dev_names)}
    cfg_dev = np.array([dev_idx[norm[i]["device"]] if ok[i] else -1 for i in range(n)], dtype=int)
    # which kernels each device needs
    need = np.zeros((n_kid, len(dev_names)), dtype=bool)
    for i in np.flatnonzero(ok):
        t = tab_of[i]
        need[kid[starts[t]:starts[t + 1]], cfg_dev[i]] = True
    req_k, req_d = np.nonzero(need)
    request = pool.iloc[req_k].reset_index(drop=True)
    request["device"] = np.asarray(dev_names, dtype=object)[req_d] if len(req_d) else pd.Series(dtype=object)
    return _Distinct(rows, kid, n_kid, starts, dev_names, cfg_dev, request, req_k, req_d)


class _Pool:
    """What the aggregation of every predictor shares: the compact rows of all tables (``rows``, grouped by
    table from ``starts``), their distinct-kernel ids (``kid``) and each scenario's table and device."""

    def __init__(self, rows, kid, starts, tab_of, cfg_dev, norm, ok, efficiency, raise_errors):
        self.rows, self.kid, self.starts, self.tab_of, self.cfg_dev = rows, kid, starts, tab_of, cfg_dev
        self.norm, self.ok, self.efficiency, self.raise_errors = norm, ok, efficiency, raise_errors
        self.phase = rows["phase"].to_numpy() if "phase" in rows else np.full(len(rows), "fw")
        # no scenario produced a table (every one failed): an empty table with the kernel columns
        self.cls = rows["op_class"].to_numpy() if "op_class" in rows else np.full(len(rows), "", dtype=object)
        self.count = rows["count"].to_numpy(float)
        comm_row = self.cls == OpClass.COMM
        stage = rows["stage"].fillna(0).to_numpy() if "stage" in rows else np.zeros(len(rows))
        # tables that need the full aggregation (communication or pipeline stages)
        self.slow_tab = {t for t in range(len(starts) - 1)
                         if comm_row[starts[t]:starts[t + 1]].any() or len(np.unique(stage[starts[t]:starts[t + 1]])) > 1}
        # the shortest a row's kernel can take: its class's floor in BF16 / FP16 scenarios (kernel_floor.py), else 0
        self.half = np.array([ok[i] and r["dtype"] in schema.HALF_ACTIVATIONS for i, r in enumerate(norm)], bool)
        self.row_floor = kernel_floor.row_floor_ms(self.cls) if self.half.any() else np.zeros(len(rows))


def _per_launch(p, seed, obj, quick, request, req_k, req_d, n_kid, dev_names, raise_errors=False):
    """Per-launch times of every distinct kernel x device (NaN where not needed), one error per device, and the
    predictor (None when it could not be had)."""
    per_launch = np.full((n_kid, len(dev_names)), np.nan)
    p_err = [""] * len(dev_names)
    pred = None
    try:
        pred = obj if obj is not None else loaded_predictor(p, bool(quick), int(seed))
        if len(request):
            per_launch[req_k, req_d] = np.asarray(pred.predict(request, None), dtype=float)
    except Exception as e:  # noqa: BLE001 - isolate the failing device(s)
        if raise_errors:
            raise
        msg = message(e)
        pred = None
        try:
            pred = obj if obj is not None else loaded_predictor(p, bool(quick), int(seed))
        except Exception:  # noqa: BLE001
            p_err = [f"{p}: {msg}"] * len(dev_names)
        if pred is not None:
            for j in range(len(dev_names)):
                sel = req_d == j
                try:
                    per_launch[req_k[sel], j] = pred.predict(request[sel], None)
                except Exception as e2:  # noqa: BLE001
                    p_err[j] = f"{p}: {message(e2)}"
    return per_launch, p_err, pred


def _comm_per_launch(ctx: _Pool, i: int, per: np.ndarray) -> np.ndarray:
    """``per`` (scenario ``i``'s compact rows) with its COMM rows timed by the network model."""
    t = ctx.tab_of[i]
    sub = ctx.rows.iloc[ctx.starts[t]:ctx.starts[t + 1]]
    c = (sub["op_class"] == OpClass.COMM).to_numpy()
    if not c.any():
        return per
    r = ctx.norm[i]
    net = network.for_request(r, ctx.efficiency)
    return np.where(c, net.time_ms(sub), per)


def _aggregate(ctx: _Pool, given, err, per_launch, p_err, p, seed, tab_derived, mem, parts=None) -> tuple[pd.DataFrame, dict]:
    """One predictor's rows; also the per-launch times (COMM included) of the scenarios aggregated in full."""
    n = len(given)
    rows, kid, starts, tab_of, cfg_dev, norm, ok = (ctx.rows, ctx.kid, ctx.starts, ctx.tab_of, ctx.cfg_dev,
                                                    ctx.norm, ctx.ok)
    phase, cls, count = ctx.phase, ctx.cls, ctx.count
    res = {c: np.full(n, np.nan) for c in PHASE_COLUMNS + CLASS_MS}
    kernels = np.full(n, np.nan)
    # per scenario and part of the error model: its kernels' time and the sum of (count x time)^2 (``_interval``)
    n_parts = len(parts.names) if parts is not None else 0
    part_ms, part_sq = np.zeros((n, n_parts)), np.zeros((n, n_parts))
    errors = list(err)
    for i in range(n):
        if ok[i] and p_err[cfg_dev[i]]:
            errors[i] = p_err[cfg_dev[i]]
    good = np.array([ok[i] and not p_err[cfg_dev[i]] for i in range(n)], dtype=bool)
    fast = [i for i in np.flatnonzero(good) if tab_of[i] not in ctx.slow_tab]
    if fast:
        fast = np.asarray(fast)
        lens = starts[tab_of[fast] + 1] - starts[tab_of[fast]]
        cfg_of_row = np.repeat(np.arange(len(fast)), lens)
        offs = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        r = np.repeat(starts[tab_of[fast]], lens) + offs
        floor = ctx.row_floor[r] * ctx.half[fast][cfg_of_row]
        val = np.maximum(per_launch[kid[r], cfg_dev[fast][cfg_of_row]], floor) * count[r]
        m = len(fast)
        for ph, col in (("fw", "fw_ms"), ("bw", "bw_ms"), ("acc", "acc_ms")):
            res[col][fast] = np.bincount(cfg_of_row, weights=np.where(phase[r] == ph, val, 0.0), minlength=m)
        for c in schema.OP_CLASSES:
            res[f"{c}_ms"][fast] = np.bincount(cfg_of_row, weights=np.where(cls[r] == c, val, 0.0), minlength=m)
        res["comm_ms"][fast] = res["comm_exposed_ms"][fast] = 0.0
        res["e2e_ms"][fast] = res["fw_ms"][fast] + res["bw_ms"][fast] + res["acc_ms"][fast]
        kernels[fast] = np.bincount(cfg_of_row, weights=count[r], minlength=m)
        if n_parts:
            cell = cfg_of_row * n_parts + parts.code[kid[r]]
            part_ms[fast] = np.bincount(cell, weights=val, minlength=m * n_parts).reshape(m, n_parts)
            part_sq[fast] = np.bincount(cell, weights=val**2, minlength=m * n_parts).reshape(m, n_parts)
    comm = {}
    for i in np.flatnonzero(good):
        t = tab_of[i]
        if t not in ctx.slow_tab:
            continue
        r, a, b = norm[i], starts[t], starts[t + 1]
        sub = rows.iloc[a:b]
        try:
            per = _comm_per_launch(ctx, i, np.maximum(per_launch[kid[a:b], cfg_dev[i]], ctx.row_floor[a:b] * ctx.half[i]))
            comm[i] = per
            agg = aggregate(sub.assign(pred_ms=per * sub["count"].to_numpy(float)),
                            r["micro_batches"] if r["parallel"] == Plan.PP else 1)
        except Exception as e:  # noqa: BLE001
            if ctx.raise_errors:
                raise
            errors[i] = message(e)
            continue
        for k in PHASE_COLUMNS:
            res[k][i] = agg[k]
        for cl in schema.OP_CLASSES:
            res[f"{cl}_ms"][i] = agg["breakdown"].get(cl, 0.0)
        kernels[i] = float(sub["count"].sum())
        if n_parts:
            val = per * sub["count"].to_numpy(float)
            # the parts' shares of the kernel time, applied to the step's time (exposed communication, the schedule)
            scale = res["e2e_ms"][i] / val.sum() if val.sum() > 0 else 0.0
            part_ms[i] = np.bincount(parts.code[kid[a:b]], weights=val * scale, minlength=n_parts)
            part_sq[i] = np.bincount(parts.code[kid[a:b]], weights=(val * scale)**2, minlength=n_parts)
    out = pd.DataFrame({c: [r[c] if r is not None else g.get(c) for r, g in zip(norm, given)] for c in INPUTS})
    for c in ("batch", "seq", "image_size", "gpus", "micro_batches", "past"):
        try:
            out[c] = out[c].astype("Int64")
        except (TypeError, ValueError, OverflowError):
            pass                       # a bad input kept as given (its row has the error)
    out["parallel"] = out["parallel"].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    out["predictor"] = p
    out["seed"] = int(seed)
    for c in PHASE_COLUMNS + CLASS_MS:
        out[c] = res[c]
    out["kernels"] = kernels
    # the step as it is executed (host.py): graph = the kernel sum; eager = at least the host's launch time
    out["kernel_ms"] = res["e2e_ms"]
    execution = np.array([r["execution"] if r is not None else Execution.GRAPH for r in norm], dtype=object)
    step, host_ms, bound = host.step_ms(res["e2e_ms"], np.nan_to_num(kernels), execution)
    ran = np.isfinite(res["e2e_ms"])
    out["e2e_ms"] = np.where(ran, step, np.nan)
    out["host_ms"] = np.where(ran, host_ms, np.nan)
    out["host_bound"] = pd.array(np.where(ran, bound, False), dtype="boolean")
    out.loc[~ran, "host_bound"] = pd.NA
    _interval(out, parts, part_ms, part_sq, res["e2e_ms"], np.where(execution == Execution.EAGER, host_ms, 0.0), norm,
              cfg_dev)
    out["derived"] = [bool(tab_derived.get(tab_of[i], False)) if tab_of[i] >= 0 else False for i in range(n)]
    for c in MEMORY:
        col = [mem.get((tab_of[i], cfg_dev[i]), {}).get(c) if good[i] else None for i in range(n)]
        out[c] = pd.Series(col, dtype=object if c in ("memory_fits", "memory_verdict") else float)
    out["memory_verdict"] = out["memory_verdict"].fillna("")
    # a row without a footprint (a derived table, or memory_columns=False) still says whether it can fit: the lower
    # bound of scenario.check_request (weights + one activation + KV cache) against the GPU's memory
    for i in np.flatnonzero(good & (out["memory_verdict"] == "").to_numpy()):
        out.loc[i, ["memory_fits", "memory_verdict"]] = scenario.lower_bound_verdict(norm[i])
    out["error"] = errors
    return out[RESULT_COLUMNS], comm


class _Parts(NamedTuple):
    """One job's error model and what answered each distinct kernel (``KernelPredictor.answered_by``)."""
    model: error_models.ErrorModel
    names: list               # the parts' names
    code: np.ndarray          # distinct kernel -> index in ``names``
    outside: np.ndarray       # device index -> the GPU lies outside the tensor-core networks' training GPUs
    devices: list             # device index -> its catalogue name


def _parts(em, pred, pool: _Distinct) -> _Parts:
    answers = pred.answered_by(pool.request) if len(pool.request) else np.zeros(0, dtype=object)
    names, codes = np.unique(np.asarray(answers, dtype=str), return_inverse=True)
    code = np.zeros(pool.n_kid, dtype=int)
    code[pool.req_k] = codes
    outside = np.array([error_models.outside_range(d) for d in pool.dev_names], dtype=bool)
    return _Parts(em, list(names), code, outside, list(pool.dev_names))


def _interval(out: pd.DataFrame, parts, part_ms, part_sq, kernel_ms, host_ms, norm, cfg_dev) -> None:
    """The interval columns (``INTERVAL``) of one predictor's rows."""
    n = len(out)
    sigma, lo, hi, by = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), [""] * n
    if parts is not None:
        e2e = out["e2e_ms"].to_numpy(float)
        for i in np.flatnonzero(np.isfinite(e2e)):
            used = np.flatnonzero(part_ms[i] > 0)
            sp = error_models.spread(parts.model, {parts.names[c]: part_ms[i, c] for c in used},
                                     {parts.names[c]: part_sq[i, c] for c in used}, kernel_ms[i], host_ms[i],
                                     parts.devices[cfg_dev[i]], bool(parts.outside[cfg_dev[i]]))
            if not math.isfinite(sp.sigma):
                continue
            sigma[i] = sp.sigma
            lo[i], hi[i] = error_models.interval(e2e[i], sp.sigma, float(norm[i]["coverage"]), parts.model)
            by[i] = sp.top(2)
    out["sigma"], out["lo_ms"], out["hi_ms"], out["interval_by"] = sigma, lo, hi, by


def _memory(tabs: _Tables, norm, ok, optimizer, master_weights, raise_errors=False) -> dict:
    """(table, device index) -> memory columns, for the traced tables (``memory_columns``) and the derived ones whose
    family derives its memory; a footprint that cannot be computed (a table without a trace's TableInfo) leaves them
    empty."""
    tab_of = tabs.tab_of
    devs = sorted({norm[i]["device"] for i in range(len(norm)) if ok[i]})
    parts_of: dict = dict(tabs.footprints)
    out = {}
    for i in np.flatnonzero(ok):
        t, d = tab_of[i], devs.index(norm[i]["device"])
        if (t, d) in out:
            continue
        if t not in parts_of and t in tabs.families and tabs.families[t][0].memory is not None:
            f, b, s = tabs.families[t]
            got = f.memory.summary(f, b, s)
            parts_of[t] = dict(params=[got["params"]], acts=[got["activation_peak_bytes"]], kv=got["kv_cache_bytes"],
                               dtype=norm[i]["dtype"], mode=norm[i]["mode"],
                               notes=["derived from the reduced model's traces (family_memory.py)"])
        parts = parts_of.get(t)
        if parts is None:
            continue
        try:
            if isinstance(parts, memory.MemoryInputError):
                raise parts
            m = memory.footprint_of(**parts, device=norm[i]["device"], optimizer=optimizer, master_weights=master_weights)
        except memory.MemoryInputError:
            if raise_errors:
                raise
            continue
        out[(t, d)] = {f"memory_{k}_gib": m[f"{k}_gib"]
                       for k in ("weights", "grads", "optimizer", "activations", "kv_cache", "total")}
        out[(t, d)].update(memory_fits=m["fits"], memory_verdict=m["verdict"], footprint=m)
    return out


def _kernels_of(ctx: _Pool, full, i, per_launch, comm, error) -> pd.DataFrame | None:
    """Scenario ``i``'s full kernel table with ``pred_ms`` (per-launch time of its distinct kernel x ``count``)."""
    t = ctx.tab_of[i]
    if error or t < 0 or t not in full:
        return None
    k = full[t]
    a, b = ctx.starts[t], ctx.starts[t + 1]
    per = comm[i] if i in comm else np.maximum(per_launch[ctx.kid[a:b], ctx.cfg_dev[i]], ctx.row_floor[a:b] * ctx.half[i])
    count = k["count"].fillna(1).to_numpy(float) if "count" in k else 1.0
    return k.assign(pred_ms=per[compact_codes(k)] * count)
