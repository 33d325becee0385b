"""FP8 GEMMs on the held-out GPUs (issue 63, item 1): the ``neusight`` recipe's ``GEMM_fp8`` network, trained on the
per-tensor FP8 GEMMs of H100, H200 and L40S, scored on NVIDIA's measured FP8 GEMMs of B200 and GB200 (never trained,
tuned or chosen on), beside the BF16 ``GEMM`` network on the same GPUs' BF16 GEMMs (the same file per GPU,
``measured_kernels.gemm_rows``). Also scored, never trained on: the block-scaled ``fp8_block`` GEMMs through the same
network (a different kernel: an extrapolation) and the training GPUs in sample.

    python benchmarks/fp8_gemm.py [--quick] [--seeds 0,1,2] [--out FILE.csv]

Prints MAPE (%), median and P90 APE and bias per GPU, precision and seed, then the mean over the seeds; numbers are
never written into the code. Full weights train once per seed if not saved (about 8 min per seed on 2 cores);
``--quick`` (1,000 rows per GPU, 4 epochs) takes seconds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's package, not an installed one
from neusight_core import predictors  # noqa: E402
from neusight_core.data import measured_kernels as mk  # noqa: E402
from neusight_core.studies import error_metric  # noqa: E402


def rows() -> pd.DataFrame:
    """Every scored row: BF16 and FP8 (per tensor) GEMMs of the training and held-out GPUs, FP8 block-scaled of the
    held-out GPUs."""
    parts = []
    for gpus in ("training", "held_out"):
        parts.append(mk.gemm_rows(gpus).assign(kind="bf16"))
        parts.append(mk.gemm_rows(gpus, "fp8").assign(kind="fp8"))
    # block-scaled: the held-out GPUs only (L40S's chosen file, SGLang's, has none)
    parts.append(mk.gemm_rows("held_out", mk.FP8_BLOCK).assign(kind=mk.FP8_BLOCK))
    return pd.concat(parts, ignore_index=True)


def score(df: pd.DataFrame, seed: int, quick: bool) -> pd.DataFrame:
    p = predictors.get("neusight", quick=quick, seed=seed)
    pred = p.predict(df, None)
    ape = error_metric.ape(df["latency_ms"].to_numpy(float), pred)
    err = (pred / df["latency_ms"].to_numpy(float) - 1) * 100
    t = df[["device", "role", "kind"]].assign(seed=seed, ape=ape, err=err)
    return (t.groupby(["role", "device", "kind", "seed"])
            .agg(rows=("ape", "size"), mape=("ape", "mean"), median_ape=("ape", "median"),
                 p90_ape=("ape", lambda a: float(np.percentile(a, 90))), bias=("err", "mean")).reset_index())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick weights (1,000 rows per GPU, 4 epochs)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", help="write the per-seed table as CSV")
    a = ap.parse_args(argv)
    df = rows()
    per_seed = pd.concat([score(df, int(s), a.quick) for s in a.seeds.split(",")], ignore_index=True)
    if a.out:
        per_seed.to_csv(a.out, index=False)
    pd.set_option("display.width", 160)
    print(f"weights: {'quick' if a.quick else 'full'}; seeds {a.seeds}")
    print(per_seed.round(2).to_string(index=False))
    mean = per_seed.groupby(["role", "device", "kind"]).agg(rows=("rows", "first"), mape=("mape", "mean"),
                                                            mape_spread=("mape", lambda m: m.max() - m.min()),
                                                            bias=("bias", "mean")).reset_index()
    print("\nmean over the seeds:")
    print(mean.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
