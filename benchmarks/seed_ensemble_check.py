"""The kernel-data evidence for our recipe `neusight` (docs/recipes.md): on the training GPUs' records
that every seed of the authors' recipe held out, each seed's MAPE and the MAPE of the seeds' mean.

    .venv/bin/python benchmarks/seed_ensemble_check.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick predictors (trained for tests)")
    a = ap.parse_args(argv)
    from neusight_core import recipe_eval as R
    print(R.held_out_ensemble_check(quick=a.quick).round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
