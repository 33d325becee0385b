"""The host calibration against the host time the recorded GPU runs measured.

Notebook 05's modern section records, per run, the machine's calibration (``modern_host.json``: ``hf_launch_us``,
a tiny Llama's decode step on CPU tensors plus the measured CUDA launch; from the eighth session also the same step
run on the GPU, ``hf_gpu_decode_us``) and, per step, its host time and kernel count (``modern_steps.csv``). The host
time per kernel of the host-bound steps (host time above 1.5x the kernel sum) is what the calibration stands for.
Then the eager steps' wall times predicted with the default per-launch cost and with the run's own calibration
(``live_modern.predict_steps``, eager variant). Validation only: nothing here sets a parameter. The last column is
an oracle, labelled so: the per-launch cost set to the run's own measured decode host time per kernel, i.e. what
the max(kernel sum, launches x h) form reaches with a calibration that is exactly right on decode.

    .venv/bin/python benchmarks/host_calibration_check.py [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from neusight_core.cost import host  # noqa: E402
from neusight_core.studies import live_modern  # noqa: E402

BOUND = 1.5     # a step is host-bound here when its host time exceeds its kernel sum this many times


def host_per_kernel(steps: pd.DataFrame) -> pd.Series:
    """Host us per kernel of the host-bound OK steps, by phase."""
    s = steps[(steps["status"] == "OK") & (steps["host_ms"] > BOUND * steps["kernel_ms"])]
    return (s["host_ms"] / s["kernels"] * 1e3).groupby(s["phase"]).median()


def eager_mape(steps: pd.DataFrame, gpu: str, seeds, launch_us: float | None) -> pd.Series:
    old = os.environ.pop("NEUSIGHT_HOST_LAUNCH_US", None)
    try:
        if launch_us is not None:
            os.environ["NEUSIGHT_HOST_LAUNCH_US"] = f"{launch_us:.4f}"
        p = live_modern.predict_steps(steps, gpu, ("neusight",), seeds, False)
    finally:
        os.environ.pop("NEUSIGHT_HOST_LAUNCH_US", None)
        if old is not None:
            os.environ["NEUSIGHT_HOST_LAUNCH_US"] = old
    e = p[p["variant"] == "eager"]
    out = live_modern.step_mape(e).iloc[0]          # mean / min / max over seeds, by phase and pooled
    out["signed"] = e["error_pct"].mean()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args(argv)
    seeds = tuple(int(x) for x in a.seeds.split(","))
    rows = []
    for name, (gpu, folder) in live_modern.RECORDED.items():
        steps = pd.read_csv(ROOT / folder / "modern_steps.csv")
        cal_path = ROOT / folder / "modern_host.json"
        cal = json.loads(cal_path.read_text()) if cal_path.is_file() else {}
        measured = host_per_kernel(steps)
        row = {"run": name, "calibration (CPU + launch) us": cal.get("hf_launch_us"),
               "calibration (GPU) us": cal.get("hf_gpu_decode_us"),
               **{f"measured {ph} us/kernel": round(v, 1) for ph, v in measured.items()}}
        for label, h in (("default", None), ("own calibration", cal.get("hf_gpu_decode_us") or cal.get("hf_launch_us")),
                         ("oracle (measured decode host)", measured.get("decode"))):
            if label != "default" and h is None:
                continue
            m = eager_mape(steps, gpu, seeds, h)
            row[f"eager MAPE, {label}"] = (f"{m['mean pooled']:.1f} ({m['min pooled']:.1f}-{m['max pooled']:.1f}); "
                                           + " / ".join(f"{ph} {m[f'mean {ph}']:.1f}" for ph in ("decode", "prefill", "train")
                                                        if f"mean {ph}" in m) + f"; signed {m['signed']:+.1f}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\ndefault per-launch cost {host.DEFAULT_LAUNCH_US} us; host-bound: host time > {BOUND}x the kernel sum; "
          f"neusight seeds {list(seeds)}")
    print(pd.DataFrame(rows).set_index("run").T.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
