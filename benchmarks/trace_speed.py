"""Wall time of tracing the issue-3 benchmark workloads (target: < 10 s each on 2 CPU cores).

    .venv/bin/python benchmarks/trace_speed.py [--repeat 3] [--no-memo] [--json out.json]

Each workload is traced once cold (first use of its model code in this process) and then
``--repeat`` times; the table reports the cold time and the min / median of the warm runs. ``--no-memo``
turns the tracer's meta memo off (``shape_memo.ENABLED``), to measure what it saves.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neusight_core.question.step import Step
from neusight_core.tracing import shape_memo, trace  # noqa: E402

WORKLOADS = [("gpt3_27", 1, 2048, "train"), ("llama2_70b", 1, 4096, "inf")]
TARGET_S = 10.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-memo", action="store_true", help="run every meta op (shape_memo.ENABLED = False)")
    a = ap.parse_args(argv)
    shape_memo.ENABLED = not a.no_memo
    t0 = time.perf_counter()
    import transformers  # noqa: F401  (import cost reported separately, not per workload)
    import_s = time.perf_counter() - t0
    rows = []
    for name, b, s, mode in WORKLOADS:
        t0 = time.perf_counter()
        k = trace.trace_model(Step(model=name, batch=b, seq=s, mode=mode))
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            trace.trace_model(Step(model=name, batch=b, seq=s, mode=mode))
            warm.append(time.perf_counter() - t0)
        rows.append({"workload": f"{name} {mode} b{b} s{s}", "kernels": len(k), "cold_s": cold,
                     "warm_min_s": min(warm), "warm_median_s": statistics.median(warm),
                     "ok": max(cold, *warm) < TARGET_S})
    print(f"import transformers: {import_s:.2f} s; meta memo {'off' if a.no_memo else 'on'}")
    print(f"{'workload':32s} {'kernels':>8s} {'cold s':>8s} {'min s':>8s} {'median s':>9s}  < {TARGET_S:.0f} s")
    for r in rows:
        print(f"{r['workload']:32s} {r['kernels']:8d} {r['cold_s']:8.2f} {r['warm_min_s']:8.2f} "
              f"{r['warm_median_s']:9.2f}  {'yes' if r['ok'] else 'NO'}")
    if a.json:
        a.json.write_text(json.dumps({"import_transformers_s": import_s, "runs": rows}, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
