"""A request's kernel table and its times: the trace (cached on disk and per process) with fusion and the parallel
plan applied, its reduction to distinct kernels, the per-launch prediction of a table, and the sum into phases
(docs/interfaces.md, "The engine"). ``engine.predict`` runs these for many scenarios at once; ``latency`` names
them for its callers.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from neusight_core.cost import network
from neusight_core.tracing import trace_cache
from neusight_core.cost.scenario import LatencyInputError, device_of
from neusight_core.question.schema import OpClass
from neusight_core.question.step import Step

BOOKKEEPING = ("module", "layer", "reads", "writes")   # not read by any predictor: dropped when compacting


@functools.lru_cache(maxsize=64)
def trace_memo(step: Step) -> pd.DataFrame:
    # on disk across processes (trace_cache: keyed by config content, the trace's arguments and versions; a hit
    # does not import transformers), and in memory within the process
    return trace_cache.trace(step)


def trace(step: Step) -> pd.DataFrame:
    """The traced kernel table of a step (its model, batch, size, mode, past, dtype and attention; fusion and a plan
    are :func:`kernel_table`'s), cached on disk and per process; a copy the caller may change."""
    return trace_memo(step).copy()


@functools.lru_cache(maxsize=32)
def loaded_predictor(name: str, quick: bool, seed: int = 0):
    """Trained predictors by name, once per process."""
    from neusight_core import predictors
    return predictors.get(name, quick=quick, seed=seed)


def kernel_table(step: Step) -> pd.DataFrame:
    """A step's full kernel table (trace -> fusion -> plan), a real trace: plain tables from :func:`trace`, fused and
    planned ones cached on disk as well (a plan costs seconds on a large model). Its rows are the traced step's, whose
    gradients accumulate: a step with fresh gradients leaves out the ``acc`` phase (``engine.predict`` does, after
    reading the footprint, which needs the whole trace)."""
    if not step.fusion and step.parallel is None:
        return trace(step)
    # "writes" is kept: memory.footprint scales each buffer by the bytes its kernel writes after a TP split
    key = trace_cache.make_key("table-w", step.model, **trace_cache.trace_kwargs(step), **trace_cache.table_fields(step))

    def build():
        k = trace(step)
        if step.fusion:
            from neusight_core.plans import fusion as _fusion
            k = _fusion.fuse(k)
        if step.parallel is not None:
            from neusight_core.plans import parallel as _parallel
            k = _parallel.apply_plan(k, step.parallel, step.gpus, micro_batches=step.micro_batches)
        return k.drop(columns=[c for c in ("reads",) if c in k.columns])   # only fuse() needs them

    return trace_cache.cached(key, build)


def compact_table(k: pd.DataFrame) -> pd.DataFrame:
    """A kernel table reduced to distinct kernels with summed launch counts (order and module dropped)."""
    cols = [c for c in k.columns if c not in BOOKKEEPING and c != "count"]
    if len(k) == 0:
        return k[cols].assign(count=pd.Series(dtype=float))
    cnt = k["count"].fillna(1).astype(float) if "count" in k else pd.Series(1.0, index=k.index)
    return (k[cols].assign(count=cnt.to_numpy()).groupby(cols, dropna=False, sort=False, observed=True)["count"]
            .sum().reset_index())


def compact_codes(k: pd.DataFrame) -> np.ndarray:
    """Row of ``compact_table(k)`` each row of ``k`` was summed into (same grouping, first-appearance order)."""
    cols = [c for c in k.columns if c not in BOOKKEEPING and c != "count"]
    if len(k) == 0:
        return np.zeros(0, int)
    return k[cols].groupby(cols, dropna=False, sort=False, observed=True).ngroup().to_numpy()


def predict_kernels(kernels: pd.DataFrame, device, predictor="neusight", quick: bool = False,
                    net: network.NetworkModel | None = None) -> pd.DataFrame:
    """Return ``kernels`` with ``pred_ms`` = predicted per-launch time x ``count`` (COMM by ``net``)."""
    dev = device_of(device)
    pred = loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    per_launch = np.asarray(pred.predict(kernels, dev), dtype=float)
    comm = (kernels["op_class"] == OpClass.COMM).to_numpy()
    if comm.any():
        if net is None:
            raise LatencyInputError("the kernel table has communication rows but no network model was given")
        per_launch = np.where(comm, net.time_ms(kernels), per_launch)
    count = kernels["count"].fillna(1).to_numpy(float) if "count" in kernels else 1.0
    return kernels.assign(pred_ms=per_launch * count)


# ------------------------------------------------------------------------------ aggregation
def aggregate(kernels: pd.DataFrame, micro_batches: int = 1) -> dict:
    """Sum a kernel table that already has ``pred_ms`` (per row, times ``count``) into phase totals
    (the rules: ``latency``'s module docstring)."""
    k = kernels
    comm = (k["op_class"] == OpClass.COMM).to_numpy()
    phase = k["phase"].to_numpy()
    pred = k["pred_ms"].to_numpy(float)
    fw = float(pred[(phase == "fw") & ~comm].sum())
    bw = float(pred[(phase == "bw") & ~comm].sum())
    acc = float(pred[(phase == "acc") & ~comm].sum())
    overlap = comm & k.get("overlap", pd.Series(False, index=k.index)).fillna(False).astype(bool).to_numpy()
    comm_total = float(pred[comm].sum())
    comm_overlap = float(pred[overlap].sum())
    exposed = max(0.0, comm_overlap - (bw + acc)) + (comm_total - comm_overlap)
    stages = k["stage"].fillna(0).astype(int) if "stage" in k else pd.Series(0, index=k.index)
    if stages.nunique() > 1:
        per_stage = k.assign(_s=stages.to_numpy()).groupby("_s")["pred_ms"].sum()
        e2e = float(per_stage.sum() + (micro_batches - 1) * per_stage.max())
    else:
        per_stage = None
        e2e = fw + bw + acc + exposed
    breakdown = (k.groupby("op_class")["pred_ms"].sum().sort_values(ascending=False))
    out = {"e2e_ms": e2e, "fw_ms": fw, "bw_ms": bw, "acc_ms": acc, "comm_ms": comm_total,
           "comm_exposed_ms": exposed, "breakdown": {c: float(v) for c, v in breakdown.items()}}
    if per_stage is not None:
        out["stage_ms"] = {int(s): float(v) for s, v in per_stage.items()}
    return out
