"""How well one recorded GPU run predicts another of the same GPU: the floor under any wall-time target.

Notebook 05's modern section ran the same BF16 steps on two machines of each GPU kind, a day apart
(``live_modern.RECORDED``). Taking one day's measurement as the prediction of the other's, on the steps both
measured, gives the MAPE that no predictor can be expected to beat for that quantity: for kernel sums (the GPU's
work) and for eager wall times (the host's as much as the GPU's). Both directions are shown; by phase and pooled.

    .venv/bin/python benchmarks/wall_reproducibility.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from neusight_core.studies import live_modern  # noqa: E402

KEY = ["model", "phase", "batch", "seq", "attention"]


def runs_by_gpu() -> dict[str, list[tuple[str, pd.DataFrame]]]:
    out: dict[str, list] = {}
    for name, (gpu, folder) in live_modern.RECORDED.items():
        s = pd.read_csv(ROOT / folder / "modern_steps.csv")
        out.setdefault(gpu, []).append((name, s[s["status"] == "OK"]))
    return out


def agreement(a: pd.DataFrame, b: pd.DataFrame, column: str) -> pd.Series:
    """MAPE (%) of ``a``'s ``column`` taken as the prediction of ``b``'s, by phase and pooled, on common steps."""
    m = a[KEY + [column]].merge(b[KEY + [column]], on=KEY, suffixes=("_a", "_b")).dropna()
    ape = ((m[f"{column}_a"] / m[f"{column}_b"] - 1).abs() * 100).rename("ape")
    out = ape.groupby(m["phase"]).mean()
    out["pooled"], out["steps"] = ape.mean(), float(len(m))
    return out


def main() -> int:
    rows = []
    for gpu, runs in runs_by_gpu().items():
        for i, (na, a) in enumerate(runs):
            for nb, b in runs[i + 1:] + runs[:i]:
                for col, what in (("kernel_ms", "kernel sums"), ("wall_ms", "eager walls")):
                    s = agreement(a, b, col)
                    rows.append({"GPU": gpu, "measured": what, "taken as prediction": na, "of": nb, **s.round(1)})
    t = pd.DataFrame(rows)
    t["steps"] = t["steps"].astype(int)
    print(t.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
