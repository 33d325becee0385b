"""The all-reduce's fixed cost (network.NCCL_LATENCY_US) against NVIDIA's measured NCCL all-reduces.

Fitted on the training GPUs with NVLink (A100 SXM, H100 SXM, H200 SXM: ``network.fit_latency``), checked leaving
one of them out and on the held-out B200 and GB200 (never fitted on). Per GPU and message size class, MAPE and bias
of the authors' bandwidth-only model (``comm bandwidth``) and of it plus the fixed cost (``comm nccl``).

    .venv/bin/python benchmarks/allreduce_fit.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neusight_core.data import measured_kernels as mk  # noqa: E402
from neusight_core.cost import network
from neusight_core.studies import error_metric  # noqa: E402

SIZES = {"all": (0, np.inf), "<= 64 KB": (0, 65536), "64 KB - 8 MB": (65536, 8e6), "> 8 MB": (8e6, np.inf)}


def predict(rows: pd.DataFrame, fit: dict | None) -> np.ndarray:
    """ms of each measured all-reduce: the bandwidth term, plus ``fit``'s fixed cost when given."""
    bw = network.ring_ms(rows["bytes"], rows["gpus"], rows["link_gbs"])
    return bw if fit is None else bw + network.fixed_us(rows["gpus"], fit) / 1e3


def table(rows: pd.DataFrame, fit: dict, how: str) -> list[dict]:
    out = []
    y = rows["latency_ms"].to_numpy(float)
    b = rows["bytes"].to_numpy(float)
    for label, (lo, hi) in SIZES.items():
        m = (b > lo) & (b <= hi)
        r = {"gpu": rows["device"].iloc[0], "how": how, "messages": label, "rows": int(m.sum())}
        for name, p in (("bandwidth", predict(rows, None)), ("nccl", predict(rows, fit))):
            r[f"{name}_mape"] = round(error_metric.mape(y[m], p[m]), 1)
            r[f"{name}_bias"] = round(float(np.mean(p[m] / y[m] - 1) * 100), 1)
        out.append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    train, held = mk.load_allreduce("training"), mk.load_allreduce("held_out")
    fit = network.fit_latency(train)
    print(f"fit on {', '.join(sorted(set(train['device'])))}: {fit['base']:.2f} + {fit['per_gpu']:.3f} x (N - 1) us "
          f"(in use: {network.NCCL_LATENCY_US})")
    rows = []
    for dev in sorted(set(train["device"])):
        rows += table(train[train["device"] == dev], network.fit_latency(train[train["device"] != dev]), "left out")
    for dev in sorted(set(held["device"])):
        rows += table(held[held["device"] == dev], fit, "held out")
    t = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(t.to_string(index=False))
    if a.json:
        a.json.write_text(json.dumps({"fit": fit, "in_use": network.NCCL_LATENCY_US, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
