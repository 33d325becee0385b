"""Leave-one-training-GPU-out search of the FP8 GEMM network (predictors/tensor_core.py, GEMM_fp8).

Only the training GPUs with FP8 tensor cores are read (H100 SXM, H200 SXM, L40S; their per-tensor FP8 GEMMs from the
same files as the BF16 GEMMs, ``measured_kernels.training_kernels(("GEMM_fp8",))``): for each candidate, train the
GEMM_fp8 network on two of them and score the third (MAPE, median, P90 APE and bias on all its FP8 GEMM rows); the
candidate's score is the mean over the three folds. A candidate is a JSON object of overrides of the ``neusight``
recipe's ``tensor_core`` section (``networks`` is always ``[GEMM_fp8]``). Each result is one line appended to
docs/search_fp8.jsonl. The held-out Blackwell GPUs (B200, GB200) are never loaded here.

    python benchmarks/fp8_search.py '{"fp8_quantiser": "none"}' '{"fp8_quantiser": "static"}' [--seed 0] [--tag f1]
        [--block]   # train and score on the block-scaled rows (fp8_block: H100 and H200, vLLM's files) instead
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
LOG = ROOT / "docs" / "search_fp8.jsonl"


def main(argv=None):
    import torch
    torch.set_num_threads(1)
    from neusight_core import predictors as P
    from neusight_core.data import measured_kernels as mk
    from neusight_core.predictors import tensor_core as tc
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="JSON overrides of the neusight recipe's tensor_core section")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--block", action="store_true", help="the block-scaled (fp8_block) rows instead of per-tensor")
    a = ap.parse_args(argv)
    recipe = P.create("neusight").config["tensor_core"]
    data = mk.gemm_rows("training", mk.FP8_BLOCK) if a.block else mk.training_kernels(("GEMM_fp8",))
    data = data[tc.network_of(data) == "GEMM_fp8"].reset_index(drop=True)
    gpus = sorted(data["device"].unique())
    law = P.memory_law_params()
    for text in a.configs:
        cfg = {**recipe, **json.loads(text), "networks": ["GEMM_fp8"]}
        folds, secs = {}, []
        for g in gpus:
            m = tc.TensorCoreNets(cfg, seed=a.seed)
            info = m.fit(data[data["device"] != g].reset_index(drop=True), law=law)
            secs.append(info["train_seconds"])
            test = data[data["device"] == g].reset_index(drop=True)
            ratio = m.predict(test, law=law) / test["latency_ms"].to_numpy()
            ape = np.abs(ratio - 1) * 100
            folds[g] = {"mape": round(float(ape.mean()), 2), "median": round(float(np.median(ape)), 2),
                        "p90": round(float(np.percentile(ape, 90)), 2), "bias": round(float((ratio - 1).mean() * 100), 2),
                        "rows": int(len(test))}
        rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "tag": a.tag,
               "network": "GEMM_fp8", "config": json.loads(text), "seed": a.seed,
               "data": ("training GPUs' measured block-scaled FP8 GEMMs (vLLM files of H100, H200)" if a.block else
                        "training GPUs' measured per-tensor FP8 GEMMs (measured_kernels.training_kernels)")
                       + ", leave one GPU out",
               "score_mape_mean": round(float(np.mean([f["mape"] for f in folds.values()])), 2),
               "folds": folds, "train_seconds_per_fold": round(float(np.mean(secs)), 1)}
        print(json.dumps(rec), flush=True)
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
