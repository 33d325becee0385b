"""What the structural tree's GPU inputs are worth on held-out Blackwell (issue 34's baseline to beat).

Issue 34 reports its structural tree (a gradient-boosted tree on dims, peak, bandwidth, ridge, SM count, L2 and a
128 x 128 wave count) at 11.8 / 12.8 % on B200 / GB200, and names the SM count, the L2 and the wave count as what it
has that our networks lack. Ours (``trees.SPEC_TREE`` on ``trees.spec_inputs``) is at 22.5 / 22.7 %. This script
fits the same tree (``trees.regressor(SPEC_TREE)``, target log(latency / roofline), the rows ``ShapeTree`` trains on:
the GEMM network's rows of the four training GPUs) with input columns left out, and scores it on every held-out
BF16 GEMM of B200 and GB200. Nothing is chosen from it: it says which inputs move the held-out error.

    .venv/bin/python benchmarks/spec_tree_inputs.py [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

#: spec_inputs' GEMM columns, in order: shape_inputs (log2 B, M, N, K, peak, bandwidth), then log2 of the ridge,
#: SM count, L2, FLOPs per byte and 1 + 128 x 128 output tiles per SM
COLUMNS = ["B", "M", "N", "K", "peak", "bandwidth", "ridge", "SMs", "L2", "FLOPs per byte", "waves"]
LEFT_OUT = {"none (the structural tree)": [], "SMs": ["SMs"], "L2": ["L2"], "SMs and L2": ["SMs", "L2"],
            "SMs, L2 and waves": ["SMs", "L2", "waves"], "every GPU figure but peak and bandwidth":
            ["ridge", "SMs", "L2", "waves"]}


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits
    from neusight_core.predictors import registry
    from neusight_core.predictors import common, trees
    from neusight_core.data import measured_kernels
    from neusight_core.predictors import tensor_core as tc
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    config = {**tc.DEFAULTS, **(registry.hparams("neusight").get("tensor_core") or {})}
    held = measured_kernels.gemm_rows("held_out").reset_index(drop=True)
    dev_h = common.device_arrays(held)
    x_h, unit_h = trees.spec_inputs(held, dev_h, "GEMM"), common.roofline_ms(held, dev_h)
    y_h = held["latency_ms"].to_numpy(float)
    kernels = measured_kernels.training_kernels(("GEMM",))
    print(f"held out: {held.groupby('device').size().to_dict()} BF16 GEMMs; MAPE % (bias %), mean over seeds {seeds}")
    for name, drop in LEFT_OUT.items():
        keep = [i for i, c in enumerate(COLUMNS) if c not in drop]
        per = {d: [] for d in held["device"].unique()}
        for seed in seeds:
            df = tc.training_rows(kernels, "GEMM", config, False, seed)
            dev = common.device_arrays(df)
            x = trees.spec_inputs(df, dev, "GEMM")[:, keep]
            y = np.log(df["latency_ms"].to_numpy(float) / common.roofline_ms(df, dev))
            with threadpool_limits(1):
                m = trees.regressor(trees.SPEC_TREE, seed).fit(x, y)
            e = np.exp(m.predict(x_h[:, keep])) * unit_h / y_h - 1
            for d in per:
                sel = (held["device"] == d).to_numpy()
                per[d].append((100 * np.abs(e[sel]).mean(), 100 * e[sel].mean()))
        cells = "  ".join(f"{d}: {np.mean([p[0] for p in v]):.1f} ({np.mean([p[1] for p in v]):+.1f})"
                          for d, v in per.items())
        print(f"left out: {name:42s} {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
