"""What the recorded decode steps' KV-cache appends cost, and what they would cost on a contiguous cache.

The modern section's decode steps (notebook 05, docs/tier2/<day>-<gpu>-modern) cropped the cache back after every
call, which leaves a strided view: each timed call's torch.cat then appended to a strided cache, which generation
does not (there the cache is the previous append's contiguous output). This script reads, per decode
step of a recorded run, the append kernels' time (``CatArrayBatchedCopy`` in modern_kernels.json, the rotary
halves' small cats included), the bytes the K and V appends move (the tracer's rows of the same step), the rate that gives,
and, for appends of 30 MB or more, the rate a contiguous append of that size reached when timed alone on the same
machine (modern_memory_kernels.csv, log-interpolated; smaller ones are bound by the one-launch timing). The last
column is the step's kernel sum with the appends at that rate: an ESTIMATE from two measurements, not a
measurement of the step.

    python benchmarks/kv_append_estimate.py [docs/tier2/2026-11-27-h100-modern ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.question.step import Step
from neusight_core import paths
from neusight_core.tracing import trace_cache

RUNS = ("docs/tier2/2026-11-27-h100-modern", "docs/tier2/2026-11-27-h200-modern")
MIN_MB = 30.0      # below this a one-launch timing is bound by the launch (about 16 us), not by the bytes


def append_mb(model: str, batch: int, seq: int) -> tuple[float, int]:
    """MB read and written by one K (or V) append of a BF16 decode step on a cache of ``seq`` tokens, and the
    appends per step: the tracer's own rows (its torch.cat rows longer than the cache, not the rotary halves)."""
    t = trace_cache.trace(Step(model=model, batch=batch, seq=1, mode="inf", past=seq, dtype="bf16", attention="sdpa"))
    cat = t[(t["aten_op"] == "aten.cat.default") & (t["B"] > seq)]
    n = int(cat["count"].sum())
    return float(((cat["bytes_read"] + cat["bytes_written"]) * cat["count"]).sum()) / n / 1e6, n


def estimate(run: str | Path) -> pd.DataFrame:
    run = paths.REPO_ROOT / run
    tops = json.loads((run / "modern_kernels.json").read_text())
    steps = pd.read_csv(run / "modern_steps.csv")
    mem = pd.read_csv(run / "modern_memory_kernels.csv")
    contiguous = mem["cache_layout"].eq("contiguous") if "cache_layout" in mem else True
    cat = mem[(mem["aten_op"] == "aten.cat.default") & contiguous & (mem["status"] == "OK")]
    cat = cat.assign(mb=(cat["bytes_read"] + cat["bytes_written"]) / 1e6).sort_values("mb")
    cat = cat[cat["mb"] >= MIN_MB]
    rows = []
    for _, r in steps[(steps["phase"] == "decode") & (steps["status"] == "OK")].iterrows():
        name = f"{r['model']} decode b{r['batch']} s{r['seq']} {r['attention']}"
        cat_ms = sum(t for n, t, _ in tops.get(name, []) if "CatArrayBatchedCopy" in n)
        mb, n = append_mb(r["model"], int(r["batch"]), int(r["seq"]))
        alone = float(np.interp(np.log(mb), np.log(cat["mb"]), cat["achieved_gbs"])) if mb >= MIN_MB and len(cat) else np.nan
        contig_ms = mb * n / alone if alone == alone else np.nan
        rows.append(dict(run=run.name, model=r["model"], batch=r["batch"], seq=r["seq"], attention=r["attention"],
                         kernel_ms=r["kernel_ms"], append_ms=cat_ms, append_share=cat_ms / r["kernel_ms"],
                         append_mb=mb, in_step_gbs=mb * n / cat_ms if cat_ms else np.nan, alone_gbs=alone,
                         append_contiguous_ms=contig_ms, kernel_contiguous_ms=r["kernel_ms"] - cat_ms + contig_ms))
    return pd.DataFrame(rows)


if __name__ == "__main__":
    out = pd.concat([estimate(r) for r in (sys.argv[1:] or RUNS)], ignore_index=True)
    print(out.round({"kernel_ms": 2, "append_ms": 2, "append_share": 2, "append_mb": 1, "in_step_gbs": 0,
                     "alone_gbs": 0, "append_contiguous_ms": 2, "kernel_contiguous_ms": 2}).to_string(index=False))
