"""Kernel latency predictors: NeuSight and the paper's three baselines, one interface.

NeuSight names: ``neusight`` (ours: the authors' recipe on seeds 0-2, latencies averaged;
``ensemble.py``), ``neusight-paper`` (the authors' recipe) and ``neusight-logo`` (our earlier
leave-one-GPU-out recipe, kept for the ablation); each a config in ``recipes/``.

``get(name, quick=False, seed=0)`` returns a trained predictor: the saved weights under
``paths.trained_dir()/<name>[-quick]-seed<seed>/`` when their config and training-data checksum match,
otherwise it trains on the five training GPUs' kernels and saves (``meta.json`` records the config,
the data checksum, the training wall time and the validation errors).
"""
from __future__ import annotations

import json
from pathlib import Path

from neusight_core import paths
from neusight_core.predictors.base import KernelPredictor, PredictorLoadError, config_hash
from neusight_core.predictors.common import PredictorInputError
from neusight_core.predictors.ensemble import SeedEnsemblePredictor
from neusight_core.predictors.habitat import HabitatPredictor
from neusight_core.predictors.li import LiPredictor
from neusight_core.predictors.neusight import NeuSightPaperPredictor, NeuSightPredictor
from neusight_core.predictors.roofline import RooflinePredictor

NAMES = ("neusight", "neusight-paper", "neusight-logo", "roofline", "habitat", "li")
REGISTRY = {"neusight": SeedEnsemblePredictor, "neusight-paper": NeuSightPaperPredictor,
            "neusight-logo": NeuSightPredictor, "roofline": RooflinePredictor,
            "habitat": HabitatPredictor, "li": LiPredictor}


class UnknownPredictorError(KeyError):
    def __str__(self):
        return self.args[0]


def create(name: str, seed: int = 0, config: dict | None = None) -> KernelPredictor:
    if name not in REGISTRY:
        raise UnknownPredictorError(f"unknown predictor {name!r}; choose one of {', '.join(NAMES)}")
    return REGISTRY[name](config, seed=seed)


def folder(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
           rows: int | None = None) -> Path:
    """Where trained weights live; a config override (ablation variants) or a training subset of
    ``rows`` records per class gets its own folder."""
    tag = f"-{config_hash(name, config)[:10]}" if config else ""
    sub = f"-rows{int(rows)}" if rows else ""
    return paths.trained_dir() / f"{name}{tag}{sub}{'-quick' if quick else ''}-seed{seed}"


def get(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
        retrain: bool = False, rows: int | None = None) -> KernelPredictor:
    """Load trained weights if config + data checksum are unchanged, else train and save.

    ``rows``: train on a fixed random subset of that many records per op class (the ablation's CPU
    budget), with the recipe's own epochs, or with the quick epochs when ``quick``; ``quick`` alone uses
    the quick subset (4,000 records per class) and the quick epochs."""
    from neusight_core import dataset
    p = create(name, seed, config)
    if isinstance(p, SeedEnsemblePredictor):
        # built from its members' trained weights (trained here if absent), never saved itself
        if rows:
            raise ValueError("the seed ensemble 'neusight' has no training subset of its own")
        members = [get(p.config["ensemble_of"], quick=quick, seed=int(s), retrain=retrain) for s in p.config["seeds"]]
        return SeedEnsemblePredictor.from_members(members, p.config)
    subset = dict(quick=True, quick_rows=int(rows)) if rows else dict(quick=quick)
    f = folder(name, quick, seed, config, rows)
    want = config_hash(name, {**p.config, "seed": seed})
    meta_file = f / "meta.json"
    if not retrain and meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
            # the checksum alone (no loading of the training records) decides whether the weights are current
            if meta.get("config_hash") == want and meta.get("info", {}).get("data_checksum") == dataset.training_checksum(**subset):
                loaded = REGISTRY[name].load(f)
                if getattr(loaded, "needs_calibration", lambda: False)():
                    loaded.calibrate(dataset.training_data(**subset))    # saved before u_floor existed
                    loaded.save(f)
                return loaded
        except (PredictorLoadError, json.JSONDecodeError, KeyError):
            pass        # stale or damaged: retrain below
    train = dataset.training_data(**subset)
    p.fit(train, quick=quick)
    p.save(f)
    return p


__all__ = ["NAMES", "REGISTRY", "get", "create", "folder", "KernelPredictor", "PredictorInputError",
           "PredictorLoadError", "UnknownPredictorError"]
