"""Leave-one-training-GPU-out search of the BF16 tensor-core networks (issue 25; predictors/tensor_core.py).

Only the training GPUs' measured kernels (A100 SXM, H100 SXM, H200 SXM, L40S) are read: for each network
and candidate config, train on three of them and score the fourth (MAPE, median and P90 APE on all its rows
of that network); the candidate's score is the mean over the four folds. Each result is one line appended
to docs/search_bf16.jsonl. The held-out Blackwell GPUs are never loaded here.

  python benchmarks/bf16_search.py GEMM '{"splits": [1, 2, 4, 8, 16, 32]}' ['{...}' ...] [--seed 0] [--tag s1]
  python benchmarks/bf16_search.py GEMM '{"max_iter": 300}' --model tree --tag t1   # the shape-only tree:
      overrides of trees.TREE, on the rows of the recipe's tensor_core config
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LOG = ROOT / "docs" / "search_bf16.jsonl"


def main(argv=None):
    import torch
    torch.set_num_threads(1)
    from neusight_core.data import measured_kernels
    from neusight_core.predictors import tensor_core as tc, trees
    ap = argparse.ArgumentParser()
    ap.add_argument("network", choices=tc.NETWORKS)
    ap.add_argument("configs", nargs="+", help="JSON overrides of tensor_core.DEFAULTS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--model", choices=("nets", "tree"), default="nets",
                    help="nets: TensorCoreNets (configs override tensor_core.DEFAULTS); tree: ShapeTree "
                         "(configs override trees.TREE, rows as the neusight recipe's tensor_core)")
    ap.add_argument("--peak-fold", action="store_true",
                    help="one fold instead of leave-one-out: train on the training GPUs below the highest dense "
                         "BF16 peak (A100, L40S), score the highest-peak ones (H100, H200): extrapolation in peak, "
                         "what an unseen faster GPU asks, on training GPUs only")
    a = ap.parse_args(argv)
    if a.model == "tree":
        from neusight_core import predictors as P
        recipe = P.create("neusight").config["tensor_core"]
    data = measured_kernels.training_kernels([a.network])
    data = data[tc.network_of(data) == a.network].reset_index(drop=True)
    gpus = sorted(data["device"].unique())
    if a.peak_fold:
        from neusight_core.predictors import common
        peak = common.peak_gflops(data, common.device_arrays(data))
        top = sorted(data.loc[peak >= peak.max() * (1 - 1e-9), "device"].unique())
        gpus = [tuple(top)]
    for text in a.configs:
        cfg = {**json.loads(text), "networks": [a.network]}
        folds = {}
        secs = []
        for g in gpus:
            if a.model == "tree":
                m = trees.ShapeTree({**recipe, "networks": [a.network]}, seed=a.seed, tree=json.loads(text))
            else:
                m = tc.TensorCoreNets(cfg, seed=a.seed)
            info = m.fit(data[~data["device"].isin(g if isinstance(g, tuple) else [g])].reset_index(drop=True))
            secs.append(info["train_seconds"])
            test = data[data["device"].isin(g if isinstance(g, tuple) else [g])].reset_index(drop=True)
            ape = np.abs(m.predict(test) / test["latency_ms"].to_numpy() - 1) * 100
            scope = tc.traced_scope(test)          # the shapes the tracer emits (issue 33 item 6)
            folds[" + ".join(g) if isinstance(g, tuple) else g] = {"mape": round(float(ape.mean()), 2), "median": round(float(np.median(ape)), 2),
                        "p90": round(float(np.percentile(ape, 90)), 2), "rows": int(len(test)),
                        "mape_traced_scope": round(float(ape[scope].mean()), 2), "rows_traced_scope": int(scope.sum())}
        rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tag": a.tag,
               "network": a.network, "model": a.model, "config": json.loads(text), "seed": a.seed,
               "data": "training GPUs' measured BF16 kernels (measured_kernels.training_kernels), "
                       + ("train below the top BF16 peak, score the top-peak GPUs" if a.peak_fold else "leave one GPU out"),
               "score_mape_mean": round(float(np.mean([f["mape"] for f in folds.values()])), 2),
               "score_mape_traced_scope_mean": round(float(np.mean([f["mape_traced_scope"] for f in folds.values()])), 2),
               "folds": folds, "train_seconds_per_fold": round(float(np.mean(secs)), 1)}
        print(json.dumps(rec), flush=True)
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
