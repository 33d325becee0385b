"""Leave-one-training-GPU-out search of the BF16 tensor-core networks (issue 25; predictors/tensor_core.py).

Only the training GPUs' measured kernels (A100 SXM, H100 SXM, H200 SXM, L40S) are read: for each network
and candidate config, train on three of them and score the fourth (MAPE, median and P90 APE on all its rows
of that network); the candidate's score is the mean over the four folds. Each result is one line appended
to docs/search_bf16.jsonl. The held-out Blackwell GPUs are never loaded here.

  python benchmarks/bf16_search.py GEMM '{"splits": [1, 2, 4, 8, 16, 32]}' ['{...}' ...] [--seed 0] [--tag s1]
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
    from neusight_core.predictors import tensor_core as tc
    ap = argparse.ArgumentParser()
    ap.add_argument("network", choices=tc.NETWORKS)
    ap.add_argument("configs", nargs="+", help="JSON overrides of tensor_core.DEFAULTS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    data = tc.training_kernels([a.network])
    data = data[tc.network_of(data) == a.network].reset_index(drop=True)
    gpus = sorted(data["device"].unique())
    for text in a.configs:
        cfg = {**json.loads(text), "networks": [a.network]}
        folds = {}
        secs = []
        for g in gpus:
            m = tc.TensorCoreNets(cfg, seed=a.seed)
            info = m.fit(data[data["device"] != g].reset_index(drop=True))
            secs.append(info["train_seconds"])
            test = data[data["device"] == g].reset_index(drop=True)
            ape = np.abs(m.predict(test) / test["latency_ms"].to_numpy() - 1) * 100
            folds[g] = {"mape": round(float(ape.mean()), 2), "median": round(float(np.median(ape)), 2),
                        "p90": round(float(np.percentile(ape, 90)), 2), "rows": int(len(test))}
        rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tag": a.tag,
               "network": a.network, "config": json.loads(text), "seed": a.seed,
               "data": "training GPUs' measured BF16 kernels (tensor_core.training_kernels), leave one GPU out",
               "score_mape_mean": round(float(np.mean([f["mape"] for f in folds.values()])), 2),
               "folds": folds, "train_seconds_per_fold": round(float(np.mean(secs)), 1)}
        print(json.dumps(rec), flush=True)
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
