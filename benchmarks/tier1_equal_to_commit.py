"""Tier 1 unchanged: every labelled configuration x 5 predictors (quick weights) predicted by this checkout and by an
earlier commit, compared number by number (issue 33: the paper's reproduction keeps eager attention and the kernel
sum, so its numbers must not move).

    .venv/bin/python benchmarks/tier1_equal_to_commit.py f611183

The earlier commit is checked out into a temporary git worktree and imported from there (PYTHONPATH), with this
checkout's data and trained weights (NEUSIGHT_HOME) and a separate trace cache per side.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREDICTORS = ["roofline", "neusight", "neusight-paper", "habitat", "li"]
CHILD = """
import sys
try:
    from neusight_core.studies import evaluation as ev, reproduce
except ImportError:                 # a commit before the studies/ folder
    from neusight_core import evaluation as ev, reproduce
configs = reproduce.select_configs(ev.build_index(), False)
long = reproduce.sweep_configs(configs, sys.argv[2].split(","), quick=True, progress=False)
long[["gpu", "config", "option", "predictor", "e2e_ms", "error"]].to_csv(sys.argv[1], index=False)
"""


def predictions(src: Path, out: Path, cache: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "NEUSIGHT_HOME": str(ROOT), "NEUSIGHT_TRACE_CACHE": str(cache),
           "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    subprocess.run([sys.executable, "-c", CHILD, str(out), ",".join(PREDICTORS)], env=env, cwd=src, check=True)


def main(argv=None) -> int:
    import numpy as np
    import pandas as pd
    commit = (argv or sys.argv[1:] or ["HEAD"])[0]
    with tempfile.TemporaryDirectory(prefix="neusight-tier1-") as tmp:
        tmp = Path(tmp)
        old = tmp / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), commit], check=True)
        try:
            predictions(old, tmp / "old.csv", tmp / "cache-old")
            predictions(ROOT, tmp / "new.csv", tmp / "cache-new")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
        a, b = pd.read_csv(tmp / "old.csv"), pd.read_csv(tmp / "new.csv")
    keys = ["gpu", "config", "option", "predictor"]
    same_rows = a[keys].fillna("").equals(b[keys].fillna(""))
    rel = (b["e2e_ms"] / a["e2e_ms"] - 1).abs()
    both = a["e2e_ms"].notna() & b["e2e_ms"].notna()
    print(f"{len(a)} predictions ({len(a) // len(PREDICTORS)} configurations x {len(PREDICTORS)} predictors) of {commit} "
          f"and this checkout: same rows {same_rows}; predicted in both {int(both.sum())}, in one only "
          f"{int((a['e2e_ms'].notna() != b['e2e_ms'].notna()).sum())}; largest relative difference "
          f"{np.nanmax(rel[both]) if both.any() else float('nan'):.3g}")
    return 0 if same_rows and (rel[both] <= 1e-9).all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
