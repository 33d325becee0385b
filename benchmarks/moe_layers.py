"""Mixture-of-experts layers: the experts' grouped GEMMs as traced (balanced routing) against NVIDIA's measured BF16
MoE layers (``studies/moe_eval.py``, notebook 07 section 5d), with the full weights of ``neusight`` seeds 0-2.

Prints, as markdown: pooled per predictor and GPU role; per token band; per GPU x framework x kernel source. With
--parallel: one GPU of the tensor- and expert-parallel groups the database measured, per role x split x GPUs
(``moe_eval.by_parallel``, notebook 07 section 5e) instead.

    .venv/bin/python benchmarks/moe_layers.py [--seeds 3] [--quick] [--parallel] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neusight_core.studies import moe_eval  # noqa: E402


def pooled(long: pd.DataFrame) -> pd.DataFrame:
    """MAPE and bias (%) per GPU role x predictor, every layer pooled, mean over seeds (and the seed spread)."""
    return moe_eval.over_seeds(long, ["role"]).sort_values(["role", "predictor"]).reset_index(drop=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="quick weights (the full ones otherwise)")
    ap.add_argument("--json", help="write the tables here")
    ap.add_argument("--parallel", action="store_true", help="one GPU of tensor- / expert-parallel groups")
    a = ap.parse_args(argv)
    if a.parallel:
        long = moe_eval.predict(moe_eval.rows(parallel=True), seeds=range(a.seeds), quick=a.quick, before=False)
        tables = {"by parallel split": moe_eval.by_parallel(long)}
    else:
        long = moe_eval.predict(moe_eval.rows(), seeds=range(a.seeds), quick=a.quick)
        tables = {"pooled": pooled(long), "by tokens": moe_eval.bands(long), "by implementation": moe_eval.table(long)}
    for name, t in tables.items():
        print(f"\n### {name}\n")
        print(t.round(1).to_markdown(index=False))
    if a.json:
        Path(a.json).write_text(json.dumps({k: v.astype({c: str for c in v.columns if str(v[c].dtype) == "category"})
                                            .to_dict(orient="records") for k, v in tables.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
