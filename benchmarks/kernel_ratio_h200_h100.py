"""How much faster the H200 ran each kind of kernel than the H100, in the recorded modern runs (docs/tier2.md).

Each step's 12 kernels of most time (modern_kernels*.json) are matched by name between the two GPUs' runs of the
same day; kernels of 0.3 ms or more on the H100 count. Printed per kind of kernel (by name: GEMM, fused attention,
the KV appends, softmax, reductions and norms, the rest element-wise and copies): how many, and the H200's time as
a share of the H100's (quartiles). The bandwidth ratio, 3.35 / 4.8 = 0.70, is what a memory-bound prediction gives.

    python benchmarks/kernel_ratio_h200_h100.py
"""
from __future__ import annotations

import json

import pandas as pd

from neusight_core import paths
from neusight_core.studies.live_modern import ATTENTION_KERNEL_WORDS

#: (day, H100 file, H200 file) under docs/tier2/
PAIRS = (("2026-11-26", "2026-11-26-h100-modern/modern_kernels_run1.json", "2026-11-26-h200-modern/modern_kernels.json"),
         ("2026-11-27", "2026-11-27-h100-modern/modern_kernels.json", "2026-11-27-h200-modern/modern_kernels.json"))
MIN_MS = 0.3


def kind(name: str) -> str:
    n = name.lower()
    if any(w in n for w in ("nvjet", "gemm", "cutlass", "gemv")):
        return "GEMM"
    if any(w in n for w in ATTENTION_KERNEL_WORDS):
        return "fused attention"
    if "catarray" in n:
        return "KV append (cat)"
    if "softmax" in n:
        return "softmax"
    if "reduce" in n or "norm" in n:
        return "reduction / norm"
    return "element-wise / copy"


def ratios() -> pd.DataFrame:
    rows = []
    for day, f100, f200 in PAIRS:
        a, b = (json.loads((paths.REPO_ROOT / "docs" / "tier2" / f).read_text()) for f in (f100, f200))
        for step in a.keys() & b.keys():
            t200 = {n: t for n, t, _ in b[step]}
            rows += [dict(day=day, kind=kind(n), ratio=t200[n] / t) for n, t, _ in a[step] if n in t200 and t >= MIN_MS]
    return pd.DataFrame(rows)


if __name__ == "__main__":
    d = ratios()
    q = d.groupby(["day", "kind"])["ratio"].describe()[["count", "25%", "50%", "75%"]]
    print(q.round(3).to_string())
