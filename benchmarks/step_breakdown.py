"""Where a recorded step's kernel-sum miss lies: GEMMs, fused attention, and the rest (element-wise, norms, copies).

Per OK step of a recorded modern run (``live_modern.RECORDED``): the measured time of its GEMM and fused-attention
kernels (named in ``modern_kernels.json``, each step's kernels of most time: 12 in the runs up to 2026-11-28, which
miss some steps' smaller GEMM or attention kernels, e.g. a batch-8 prefill's attention; ``live_modern.TOP_KERNELS``
since), the rest as the step's kernel sum less those two, and `neusight`'s prediction of
the same three parts (by op class: LINEAR + BMM, ATTN, the others), with its kernel floor, seed 0 of the full
weights. Validation only: nothing here sets a parameter.

    .venv/bin/python benchmarks/step_breakdown.py ["recorded H100 2026-11-28" ...] [--phase prefill] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from neusight_core.cost import engine  # noqa: E402
from neusight_core.cost import request
from neusight_core.question.schema import OpClass  # noqa: E402
from neusight_core.studies import live_modern  # noqa: E402
from kernel_ratio_h200_h100 import kind  # noqa: E402 - this folder: the one sorting of kernel names by kind

PARTS = ("GEMM", "attention", "rest")


def part_of_kernel(name: str) -> str:
    """The part a measured kernel (by its CUDA name, as ``kernel_ratio_h200_h100.kind`` sorts it) belongs to."""
    return {"GEMM": "GEMM", "fused attention": "attention"}.get(kind(name), "rest")


def part_of_class(op_class: str) -> str:
    """The part a predicted row (by its op class) belongs to."""
    if op_class in (OpClass.LINEAR, OpClass.BMM):
        return "GEMM"
    return "attention" if op_class == OpClass.ATTN else "rest"


def breakdown(run: str, phase: str | None = None, seed: int = 0) -> pd.DataFrame:
    """One row per OK step of ``run`` (graph execution): measured and predicted ms of each part, and the delta."""
    gpu, folder = live_modern.RECORDED[run]
    steps = pd.read_csv(ROOT / folder / "modern_steps.csv")
    steps = steps[(steps["status"] == "OK") & ((steps["phase"] == phase) if phase else True)].reset_index(drop=True)
    top = json.loads((ROOT / folder / "modern_kernels.json").read_text())
    reqs = [live_modern.request_of(r, gpu, "graph") for r in steps.to_dict("records")]
    p = engine.predict(request.parse(reqs), ["neusight"], seeds=(seed,), keep_kernels=True)
    kernels = engine.run_info(p).kernels
    rows = []
    for i, s in steps.iterrows():
        key = f"{s['model']} {s['phase']} b{s['batch']} s{s['seq']} {s['attention']}"
        meas = {q: 0.0 for q in PARTS}
        for name, ms, _count in top.get(key, []):
            meas[part_of_kernel(name)] += ms
        meas["rest"] = float(s["kernel_ms"]) - meas["GEMM"] - meas["attention"]
        k = kernels[i]
        pred = k.groupby(k["op_class"].map(part_of_class))["pred_ms"].sum().reindex(PARTS, fill_value=0.0)
        row = {c: s[c] for c in live_modern.STEP_KEY}
        for q in PARTS:
            row[f"{q} measured"], row[f"{q} predicted"] = round(meas[q], 2), round(float(pred[q]), 2)
            row[f"{q} delta"] = round(float(pred[q]) - meas[q], 2)
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="names in live_modern.RECORDED (default: the contiguous-append runs)")
    ap.add_argument("--phase", choices=("prefill", "decode", "train"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    runs = a.runs or [n for n in live_modern.RECORDED if n not in live_modern.STRIDED_APPENDS]
    unknown = [r for r in runs if r not in live_modern.RECORDED]
    if unknown:
        print(f"unknown run(s) {', '.join(unknown)}; known: {', '.join(live_modern.RECORDED)}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 250)
    for run in runs:
        d = breakdown(run, a.phase, a.seed)
        print(f"\n{run}: ms per step, predicted - measured (`neusight` seed {a.seed}, graph execution)")
        print(d.to_string(index=False))
        tot = d.groupby("phase")[[f"{q} {w}" for q in PARTS for w in ("measured", "delta")]].sum().round(1)
        print("sums by phase:\n" + tot.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
