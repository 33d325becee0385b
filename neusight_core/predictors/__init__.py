"""Kernel latency predictors: NeuSight and the paper's three baselines, one interface.

The registry (``predictors/registry.yaml``, ``neusight_core/predictors/registry.py``) says which exist and makes them
(``registry.create``); ``base.KernelPredictor`` is the interface each implements; ``training`` trains, saves and
loads them, reading the data each needs (``data_for``: a predictor reads no file itself). NeuSight names: ``neusight`` (ours: the authors' recipe trained also on the training GPUs'
transformer-shaped kernels), ``neusight-paper`` (the authors' recipe) and ``neusight-logo`` (our earlier
leave-one-GPU-out recipe, kept for the ablation); each a recipe file in ``recipes/``.

This package's names are the API the CLI, the studies and the notebooks use: ``get(name, quick, seed)`` a trained
predictor, ``create`` an untrained one, ``choose_quick`` which weights answer a question, ``describe`` what answered.
"""
from __future__ import annotations

from neusight_core.predictors.base import KernelPredictor, PredictorLoadError
from neusight_core.predictors.common import PredictorInputError
from neusight_core.predictors.training import (WEIGHTS, auto_quick, choose_quick, data_for, describe, describe_line,
                                               folder, full_training_estimate, full_weights_damage, get, is_trained,
                                               load, memory_law_params, quick_note, train_parallel, training_cost, training_lock,
                                               trains_long, worker_environment)
from neusight_core.predictors.registry import UnknownPredictorError, create, names

__all__ = ["KernelPredictor", "PredictorInputError", "PredictorLoadError", "UnknownPredictorError", "WEIGHTS",
           "auto_quick", "choose_quick", "create", "data_for", "describe", "describe_line", "folder", "full_training_estimate",
           "quick_note", "full_weights_damage", "get", "is_trained", "load", "memory_law_params", "names", "train_parallel", "training_cost",
           "training_lock", "trains_long", "worker_environment"]
