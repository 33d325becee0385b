"""A saved tree baseline (predictors/trees.py: ``tree_arrays`` / ``predict_arrays``) against the scikit-learn model it
came from: the same predictions to the bit, and the time of each on one thread, in this new process.

    .venv/bin/python benchmarks/tree_predict_speed.py [--rows 2000,72000]

The model is issue 34's structural tree settings (``trees.SPEC_TREE``: 600 iterations of 63 leaves) fitted on
5,000 random rows of 12 inputs with 3 % missing values; notebook 07's full run predicts 502,777 rows per tree.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from neusight_core.predictors import trees  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2000,72000")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 12))
    X[rng.random(X.shape) < 0.03] = np.nan
    y = np.sin(np.nan_to_num(X[:, 0])) + np.nan_to_num(X[:, 1]) ** 2
    model = trees.regressor(trees.SPEC_TREE, 0).fit(X, y)
    arrays = trees.tree_arrays(model)
    for n in (int(r) for r in a.rows.split(",")):
        Xt = rng.normal(size=(n, 12))
        Xt[rng.random(Xt.shape) < 0.03] = np.nan
        t0 = time.perf_counter()
        mine = trees.predict_arrays(arrays, Xt)
        t1 = time.perf_counter()
        theirs = model.predict(Xt)
        t2 = time.perf_counter()
        print(f"{n:>8} rows: saved tree {t1 - t0:.2f} s, sklearn model {t2 - t1:.2f} s, "
              f"identical: {np.array_equal(mine, theirs)}")


if __name__ == "__main__":
    main()
