"""How long a run of ``./run_all.sh`` will take here, said when it starts.

Two sources, the better first: this machine's own last finished run of the same mode (its ``run.json`` under
``results/``, from a machine with the same CPU count), else the times docs/evaluators.md documents for the 2-core
machine. A full run's time is mostly the training of the two NeuSight recipes' seeds (docs/recipes.md): the line
says how many of those weights are missing now, since a run with them trained takes minutes, not most of an hour.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from neusight_core.predictors import registry

#: documented wall times (docs/evaluators.md "Run times", the 2-core machine): quick run; full run from scratch; full run with
#: every weight trained
DOCUMENTED_MIN = {"quick": 3.2, "full": 46.3, "full, weights trained": 3.1}
#: the full run's NeuSight weights: the reported recipes (the registry's), seeds 0-2 (notebooks 03, 04, 07)
FULL_RECIPES = registry.reported("recipe")
FULL_SEEDS = (0, 1, 2)


def earlier_run(results: Path, quick: bool, cpu_count: int | None = None) -> tuple[float, str] | None:
    """(minutes, run folder name) of the newest finished run of this mode under ``results`` whose machine had
    ``cpu_count`` CPUs (default: this one's) and no failed notebook, or None."""
    cpu_count = os.cpu_count() if cpu_count is None else cpu_count
    best = None
    for rj in sorted(Path(results).glob("*/run.json")):
        try:
            run = json.loads(rj.read_text())
            env = json.loads((rj.parent / "environment.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(run, dict) or not isinstance(env, dict):
            continue
        done = run.get("interrupted") is None and all(n.get("status") in ("OK", "SKIPPED")
                                                      for n in run.get("notebooks") or [{}])
        if (bool(run.get("quick")) == quick and done and env.get("cpu_count") == cpu_count
                and isinstance(run.get("seconds"), (int, float)) and len(run.get("notebooks") or []) >= 7):
            best = (float(run["seconds"]) / 60, rj.parent.name)     # sorted by name: timestamps, newest last
    return best


def missing_weights() -> list[str]:
    """The full run's NeuSight weights not trained here (``recipe seed N``); reads meta.json files only."""
    from neusight_core import predictors as P
    return [f"{n} seed {s}" for n in FULL_RECIPES for s in FULL_SEEDS if not P.is_trained(n, False, s)]


def line(results: Path, quick: bool) -> str:
    """One line: the expected wall time of this run and where the figure comes from."""
    seen = earlier_run(results, quick)
    if quick:
        if seen:
            return f"expected: about {seen[0]:.0f} min (this machine's last quick run, {seen[1]})"
        return f"expected: about {DOCUMENTED_MIN['quick']:.0f} min (docs/evaluators.md, 2-core machine)"
    try:
        missing = missing_weights()
    except Exception as e:          # the estimate must never stop a run
        return f"expected: unknown ({type(e).__name__}: {e})"
    where = f"this machine's last full run, {seen[1]}: {seen[0]:.0f} min; " if seen else ""
    if not missing:
        return (f"expected: about {DOCUMENTED_MIN['full, weights trained']:.0f}-10 min: every NeuSight weight is "
                f"trained ({where}docs/evaluators.md: {DOCUMENTED_MIN['full, weights trained']} min on 2 cores)")
    gpu = _cuda_name()
    train = ("on the GPU " + gpu + ": about 3 min per neusight-paper seed, longer for neusight (six at a time, "
             "docs/tier2/2026-11-26-h100-training)") if gpu else \
        "on the CPU: 8-30 min per seed, one process per core (docs/recipes.md)"
    return (f"expected: {where or ''}{len(missing)} of {len(FULL_RECIPES) * len(FULL_SEEDS)} NeuSight weights to "
            f"train first, {train}; docs/evaluators.md: {DOCUMENTED_MIN['full']} min from scratch on 2 cores")


def _cuda_name() -> str | None:
    """The GPU the weights would train on (``nets.training_device``), or None; without importing torch when
    ``NEUSIGHT_TRAIN_DEVICE=cpu``."""
    if os.environ.get("NEUSIGHT_TRAIN_DEVICE", "auto").strip().lower() == "cpu":
        return None
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None
