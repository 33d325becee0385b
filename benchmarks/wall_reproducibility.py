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

from neusight_core.studies import live_modern  # noqa: E402


def main() -> int:
    print(live_modern.recorded_agreement().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
