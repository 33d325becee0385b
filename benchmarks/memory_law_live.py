"""The memory law (``predictors/memory_law.py``) against the memory kernels our own GPU sessions timed.

Notebook 05's modern section times BF16 memory kernels one launch at a time (``live_kernels.memory_kernel_sweep``):
KV-cache appends and copies, and, from the seventh session's sweep on, element-wise products (contiguous and
rotary-style broadcast) and FP32 upcasts. These are validation: the law was fitted on NVIDIA's database only.
Per recorded run and kind, for kernels moving at least ``MIN_MB`` (a one-launch timing of a smaller one is bound
by the launch, 16-23 us on the lent H100 and H200): the measured time against the law and against the roofline,
which is what ``neusight`` answered for BF16 copies before the law.

    .venv/bin/python benchmarks/memory_law_live.py [docs/tier2/<run>=<GPU> ...]   (default: the recorded runs)
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from neusight_core.predictors import common, memory_law  # noqa: E402
from neusight_core.predictors.training import memory_law_params  # noqa: E402
from neusight_core.studies import live_modern  # noqa: E402

#: the recorded runs that have memory kernels, and their GPU (live_modern.RECORDED: the runs notebook 05 predicts)
RUNS = {folder: gpu for gpu, folder in live_modern.RECORDED.values()
        if (ROOT / folder / "modern_memory_kernels.csv").is_file()}
MIN_MB = 30.0


def compare(run: str, gpu: str) -> pd.DataFrame:
    run = ROOT / run
    m = pd.read_csv(run / "modern_memory_kernels.csv")
    m = m[m["status"] == "OK"].reset_index(drop=True)
    if "memory_kind" not in m:        # sweeps before the element-wise rows: appends and copies only
        kind = np.where(m["aten_op"] == "aten.cat.default", "kv_append", "copy")
        m["memory_kind"] = kind
    if "cache_layout" in m:
        m["memory_kind"] = np.where(m["cache_layout"].eq("strided"), m["memory_kind"] + " (strided)", m["memory_kind"])
    moved = common.total_bytes(m)
    m = m[moved >= MIN_MB * 1e6].reset_index(drop=True)
    meas = m["measured_ms"].to_numpy(float)
    law = memory_law.time_ms(m, gpu, memory_law_params())
    roof = common.roofline_ms(m, common.device_arrays(m, gpu))
    return pd.DataFrame({"run": run.name, "kind": m["memory_kind"], "MB": common.total_bytes(m) / 1e6,
                         "measured_us": meas * 1e3, "law_us": law * 1e3, "roofline_us": roof * 1e3,
                         "law_ape": np.abs(law / meas - 1) * 100, "roofline_ape": np.abs(roof / meas - 1) * 100})


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    runs = {a.split("=")[0]: a.split("=")[1] for a in args} if args else RUNS
    rows = pd.concat([compare(r, gpu) for r, gpu in runs.items()], ignore_index=True)
    pd.set_option("display.width", 200)
    print(rows.round(1).to_string(index=False))
    g = rows.groupby(["run", "kind"])
    print(f"\nMAPE % per run and kind (kernels moving >= {MIN_MB:g} MB)")
    print(pd.DataFrame({"kernels": g.size(), "law": g["law_ape"].mean(), "roofline": g["roofline_ape"].mean()})
          .round(1).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
