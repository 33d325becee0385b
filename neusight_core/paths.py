"""Where things live. Every other module asks here instead of building paths itself.

The data folders can be moved with the environment variable NEUSIGHT_HOME (tests point it at a
temporary folder); by default they sit at the top of the repository.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Upstream commit the whole artifact is pinned to (SPEC section 2).
UPSTREAM_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
UPSTREAM_URL = "https://github.com/sitar-lab/NeuSight"


def home() -> Path:
    """Folder that holds labels/ and artifacts/ (the repository root unless NEUSIGHT_HOME is set)."""
    return Path(os.environ.get("NEUSIGHT_HOME", REPO_ROOT)).resolve()


def labels_dir() -> Path:
    """Measured latencies of the release: labels/<GPU>/<config>.{json,csv}."""
    return home() / "labels"


def release_dir() -> Path:
    """Everything else of the release (data/, results/, summary/, fp16mm.csv, LICENSE)."""
    return home() / "artifacts" / "release"


def trained_dir() -> Path:
    """Trained predictor weights (git-ignored), keyed by config and data checksum. NEUSIGHT_TRAINED moves
    them alone (``predictors.train_parallel`` hands its workers the folder this way)."""
    if os.environ.get("NEUSIGHT_TRAINED"):
        return Path(os.environ["NEUSIGHT_TRAINED"]).resolve()
    return home() / "artifacts" / "trained"


def data_dir() -> Path:
    return release_dir() / "data"


def summary_dir() -> Path:
    return release_dir() / "summary"


def predictions_dir() -> Path:
    return release_dir() / "results" / "prediction"


def opgraph_dir() -> Path:
    return release_dir() / "results" / "opgraph"


def device_configs_dir() -> Path:
    return data_dir() / "device_configs"


def model_configs_dir() -> Path:
    return data_dir() / "DLmodel_configs"


def require_release() -> None:
    """Fail with one clear line when the release has not been provisioned."""
    if not (release_dir() / ".provisioned.json").is_file():
        raise FileNotFoundError(
            f"the authors' release is not provisioned under {home()}: "
            "run `python -m neusight_core.release` (run_all.sh and run_tests.sh do it for you)"
        )
