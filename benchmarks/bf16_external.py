"""The held-out evaluation of issue 25 without training the full FP32 recipe: the BF16 networks exactly as
the `neusight` recipe trains them (full settings, seeds 0..n-1: the same config, data and seeds as
``predictors.get("neusight", seed=s)``), placed into the quick-trained `neusight` predictor of the same seed,
whose FP32 networks then give the `neusight FP32-extrapolated` baseline (quick weights: say so when quoting it).
Notebook 07 in full mode does the same with the full weights. Writes CSV + Markdown tables to --out.

  python benchmarks/bf16_external.py --seeds 0 1 2 --out results/bf16_external
  python benchmarks/bf16_external.py --networks ATTN_prefill ATTN_decode --config '{"traced_scope": []}' ...

Also writes ``metrics_traced_scope``: the same metrics on the rows of shapes the tracer emits
(``tensor_core.traced_scope``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    import pandas as pd
    import torch
    torch.set_num_threads(1)
    from neusight_core.data import measured_kernels
    from neusight_core.studies import external_eval as xe
    from neusight_core import paths
    from neusight_core.reports import report
    from neusight_core import predictors as P
    from neusight_core.predictors import tensor_core as tc
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--per-gpu", type=int, default=None)
    ap.add_argument("--out", default="results/bf16_external")
    ap.add_argument("--networks", nargs="+", choices=tc.NETWORKS, default=None,
                    help="train and score these networks only (e.g. the attention ones: minutes less than the GEMM "
                         "ensemble)")
    ap.add_argument("--config", default=None, help="JSON overrides of the recipe's tensor_core section")
    ap.add_argument("--by-framework", action="store_true",
                    help="also score the GEMMs on every framework's file of each GPU (metrics_by_framework) and say "
                         "how far those files are from the scored one on the same shapes (framework_agreement)")
    a = ap.parse_args(argv)
    out = paths.out_dir(a.out)
    df = xe.rows(a.per_gpu)
    if a.networks:
        df = df[df["kind"].isin(a.networks)].reset_index(drop=True)
    report.save_table(xe.provenance(df), out, "provenance")
    per_seed, scoped, times, held, by_fw = [], [], {}, [], []
    every = None
    if a.by_framework:
        every = xe.framework_gemms()
        every = xe.subsample(every, ["device", "framework"], a.per_gpu)
        agree = xe.framework_agreement(every)
        report.save_table(agree, out, "framework_agreement")
        print(report.markdown_table(agree, ".2f"), flush=True)
    for s in a.seeds:
        p = P.get("neusight", quick=True, seed=s)
        cfg = {**p.config["tensor_core"], **json.loads(a.config or "{}")}
        if a.networks:
            cfg["networks"] = list(a.networks)
        nets = tc.TensorCoreNets(cfg, seed=s)
        t0 = time.perf_counter()
        nets.fit(measured_kernels.training_kernels(cfg["networks"]), quick=False)
        times[s] = {"train_seconds": nets.info["train_seconds"], "wall": time.perf_counter() - t0,
                    "networks": nets.info["networks"]}
        p.tc = nets
        long = xe.predict_all(df, seed=s, quick=False, neusight=p)
        per_seed.append(xe.metrics(long))
        # the shapes the tracer emits (tensor_core.traced_scope: no sliding window, head dim <= 256; issue 33 item 6)
        scoped.append(xe.metrics(long[tc.traced_scope(long)]))
        held.append(long[(long["role"] == "held_out") & (long["kind"] == "GEMM")])
        if every is not None:       # one GPU at a time: every file of six GPUs x five predictors is 3 M rows
            for _, part in every.groupby("device", sort=True):
                lp = xe.predict_all(part.reset_index(drop=True), seed=s, quick=False, neusight=p)
                by_fw.append(xe.metrics(lp, by=("framework",)))
        print(f"seed {s}: BF16 networks trained in {nets.info['train_seconds']:.1f} s", flush=True)
    per_seed = pd.concat(per_seed, ignore_index=True)
    table = xe.over_seeds(per_seed)
    report.save_table(per_seed, out, "metrics_per_seed")
    report.save_table(table, out, "metrics")
    scoped_table = xe.over_seeds(pd.concat(scoped, ignore_index=True))
    report.save_table(scoped_table, out, "metrics_traced_scope")
    if not a.networks or "GEMM" in a.networks:
        report.save_table(xe.miss_breakdown(pd.concat(held, ignore_index=True)), out, "gemm_miss_breakdown")
    if by_fw:
        fw_table = xe.over_seeds(pd.concat(by_fw, ignore_index=True), by=("framework",))
        report.save_table(fw_table, out, "metrics_by_framework")
        print("\nGEMMs on every framework's file:")
        print(report.markdown_table(fw_table[fw_table["predictor"].isin(["neusight", "structural tree"])], ".1f"))
    h = xe.headline(table)
    (out / "summary.json").write_text(json.dumps({"headline": h, "line": xe.summary_line(h), "train": times},
                                                 indent=2, default=str))
    print(report.markdown_table(table, ".1f"))
    print("\non the shapes the tracer emits (no sliding window, head dim <= 256):")
    print(report.markdown_table(scoped_table[scoped_table["kind"].str.startswith("ATTN")], ".1f"))
    print(xe.summary_line(h))


if __name__ == "__main__":
    main()
