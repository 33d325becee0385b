"""Leave one GPU out on the release's convolution records (issue 26): NeuSight's CONV network and the
baselines trained on four of the five conv GPUs (P4, P100, V100, T4, A100-80GB) and scored on the fifth.

Prints one JSON line per (candidate, predictor, seed): MAPE / time-weighted MAPE per held-out GPU and their
mean, the training seconds; with ``--log`` the lines are appended to docs/search_conv.jsonl (the CONV search
log: what was tried, on which data). Only conv records of these five GPUs are read: no end-to-end label.

    .venv/bin/python benchmarks/conv_logo.py --seeds 0 --label c1-default --log
    .venv/bin/python benchmarks/conv_logo.py --seeds 0,1,2 --workers 2 --label c-final --log
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from neusight_core.studies import kernel_eval

LOG = Path(__file__).resolve().parents[1] / "docs" / "search_conv.jsonl"


def bound_check(tiles=((128, 128), (128, 64), (64, 64), (32, 32)), winograd=(1.0, 2.25, 4.0)) -> list[dict]:
    """Share of the training GPUs' conv records (P4, P100, V100, T4) whose measured time is below the bound NeuSight divides by
    u <= 1 (the wave roofline of a fixed tile, 3 x 3 stride-1 FLOPs divided by ``winograd``), and below the
    plain FP32 roofline: records no utilisation in (0, 1] can fit."""
    import numpy as np

    from neusight_core.data import dataset, devices
    from neusight_core import predictors as P
    from neusight_core.predictors import common
    conv = dataset.load_conv()
    train_gpus = {d.name for d in devices.training_devices("NVIDIA")}
    k = dataset.to_kernels(conv[conv["device"].isin(train_gpus)].reset_index(drop=True))   # not the A100-80GB
    y = k["latency_ms"].to_numpy(float)
    dev = common.device_arrays(k)
    out = [{"candidate": "c0-bound", "bound": "plain FP32 roofline", "share_faster": round(float((common.roofline_ms(k, dev) > y).mean()), 3)}]
    for tm, tk in tiles:
        for red in winograd:
            p = P.create("neusight", 0, {"conv_tile": [tm, tk], "conv_winograd": red})
            _, _, base = p._inputs(k, dev, None, None, np.full(len(k), np.nan))
            r = base / y
            out.append({"candidate": "c0-bound", "bound": f"wave roofline, tile {tm}x{tk}, winograd {red}",
                        "share_faster": round(float((r > 1).mean()), 3),
                        "base_over_measured_q05_q50_q95": [round(float(q), 2) for q in np.quantile(r, [0.05, 0.5, 0.95])]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--predictors", default=",".join(kernel_eval.CONV_PREDICTORS))
    ap.add_argument("--over", default="{}", help="JSON config overrides of the NeuSight recipe")
    ap.add_argument("--label", default="default")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help="processes training NeuSight's folds")
    ap.add_argument("--log", action="store_true", help=f"append the lines to {LOG.name}")
    ap.add_argument("--bound-check", action="store_true", help="only the share of records faster than each bound")
    a = ap.parse_args(argv)
    if a.bound_check:
        lines = bound_check()
        for line in lines:
            print(json.dumps(line))
        if a.log:
            with LOG.open("a") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
        return
    import torch
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    per = kernel_eval.conv_logo([n for n in a.predictors.split(",") if n], [int(s) for s in a.seeds.split(",")],
                                quick=a.quick, config=json.loads(a.over), workers=a.workers)
    lines = []
    for (name, seed), g in per.groupby(["predictor", "seed"], sort=False):
        lines.append({"candidate": a.label, "predictor": name, "over": json.loads(a.over) if name.startswith("neusight") else {},
                      "seed": int(seed), "quick": a.quick, "data": "collect/conv, leave one of 5 GPUs out",
                      "mape_mean": round(g["mape"].mean(), 2), "wmape_mean": round(g["wmape"].mean(), 2),
                      "mape": {r.held_out: round(r.mape, 2) for r in g.itertuples()},
                      "wmape": {r.held_out: round(r.wmape, 2) for r in g.itertuples()},
                      "bias": {r.held_out: round(r.bias, 1) for r in g.itertuples()},
                      "train_s": {r.held_out: round(r.train_s, 1) for r in g.itertuples()}})
    for line in lines:
        print(json.dumps(line))
    if a.log:
        with LOG.open("a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    print(f"# {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
