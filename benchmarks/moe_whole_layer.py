"""What an answer holds for one mixture-of-experts layer, against NVIDIA's measured layer: the two grouped GEMMs alone
(what notebook 07 sections 5d-5e score) and the whole traced MoE block (Hugging Face's routing, permutation,
activation and weighted sum beside them; every row of the block but the router's GEMM, which the database times as
an op of its own), one GPU of a tp or ep group as ``parallel.apply_plan`` splits it.

One layer shape at a time (default: Mixtral 8x7B's, 8 experts of 14,336, top-2, hidden 4,096) on one GPU and
kernel source of the database (default: the H100, TensorRT-LLM's CUTLASS layers); a one-layer Mixtral-type config is
traced at batch = tokens, one new token each (every token count the database measured), then split. Nothing is
trained or tuned; full ``neusight`` weights of the given seed.

    .venv/bin/python benchmarks/moe_whole_layer.py [--device NVIDIA_H100_80GB_HBM3] [--source cutlass] [--seed 0]
        [--max-gpus 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neusight_core.question.step import Step
from neusight_core.plans import parallel  # noqa: E402
from neusight_core import predictors
from neusight_core.question import schema
from neusight_core.tracing import trace
from neusight_core.question.schema import Precision  # noqa: E402
from neusight_core.studies import moe_eval  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="NVIDIA_H100_80GB_HBM3")
    ap.add_argument("--source", default="cutlass", help="a part of the kernel source's name")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gpus", type=int, default=8)
    ap.add_argument("--json", help="write the per-layer rows here")
    a = ap.parse_args(argv)
    r = moe_eval.rows(parallel=True)
    g = r[(r.device == a.device) & (r.hidden_size == a.hidden) & (r.inter_size == a.inter)
          & (r.num_experts == a.experts) & (r.topk == a.top) & r.kernel_source.str.contains(a.source)
          & ((r.moe_tp_size == 1) | (r.moe_ep_size == 1)) & (r.moe_tp_size * r.moe_ep_size <= a.max_gpus)]
    if g.empty:
        raise SystemExit(f"no measured {a.hidden} x {a.inter}, {a.experts} experts top-{a.top} layers of {a.device} "
                         f"({a.source})")
    p = predictors.get("neusight", quick=False, seed=a.seed)
    out = []
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "moe_layer.json"
        cfg.write_text(json.dumps(moe_eval.one_layer_config(a.hidden, a.inter, a.experts, a.top)))
        for T in sorted(g.num_tokens.unique()):
            t = trace.trace_model(Step(model=str(cfg), batch=int(T), seq=1, mode="inf", dtype=Precision.BF16, attention="sdpa"))
            for (tp, ep), m in g[g.num_tokens == T].groupby(["moe_tp_size", "moe_ep_size"]):
                n = int(tp * ep)
                k = moe_eval.block_rows(parallel.apply_plan(t, "ep" if ep > 1 else "tp", n) if n > 1 else t)
                ms = np.asarray(p.predict(k, a.device), float)
                gemms = ms[(k.sub_op == schema.GROUPED_GEMM).to_numpy()].sum()
                out.append({"tokens": int(T), "tp": int(tp), "ep": int(ep), "measured_ms": float(m.latency_ms.median()),
                            "gemms_ms": float(gemms), "block_ms": float(ms.sum())})
    o = pd.DataFrame(out)
    for c in ("gemms", "block"):
        o[f"{c} err %"] = (o[f"{c}_ms"] / o.measured_ms - 1) * 100
    summary = o.groupby(["tp", "ep"]).agg(layers=("tokens", "size"),
                                          **{f"{c} MAPE": (f"{c} err %", lambda x: float(np.mean(np.abs(x))))
                                             for c in ("gemms", "block")},
                                          **{f"{c} bias": (f"{c} err %", "mean") for c in ("gemms", "block")})
    print(summary.round(1).to_markdown())
    one = o[(o.tp == 1) & (o.ep == 1)].set_index("tokens")[["measured_ms", "gemms_ms", "block_ms", "gemms err %",
                                                             "block err %"]]
    print("\none GPU:\n")
    print(one.round(3).to_markdown())
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
