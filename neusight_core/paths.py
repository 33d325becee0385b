"""Where things live. Every other module asks here instead of building paths itself.

The data folders can be moved with the environment variable NEUSIGHT_HOME (tests point it at a
temporary folder); by default they sit at the top of the repository. That default needs the package
to run from its checkout (as `pip install -e .` and the set-up install it); a copy installed into
site-packages (`pip install .`) has no repository around it and needs NEUSIGHT_HOME.
"""
from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# True when the package was copied into an environment (`pip install .`, not `-e`): REPO_ROOT is then
# site-packages, which holds none of the data folders.
INSTALLED_WITHOUT_CHECKOUT = REPO_ROOT.name in ("site-packages", "dist-packages")

# Upstream commit the whole artifact is pinned to (SPEC section 2).
UPSTREAM_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
UPSTREAM_URL = "https://github.com/sitar-lab/NeuSight"


def python_command() -> str:
    """How to start this Python in a hint a user copies: the interpreter running now, relative to the working folder
    when it is under it (``.venv/bin/python``): a bare ``python`` outside the venv lacks the packages."""
    exe = Path(sys.executable or "python")
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def home() -> Path:
    """Folder that holds labels/ and artifacts/ (the repository root unless NEUSIGHT_HOME is set)."""
    env = os.environ.get("NEUSIGHT_HOME")
    if env is None and INSTALLED_WITHOUT_CHECKOUT:
        raise FileNotFoundError(
            f"neusight_core is installed without its checkout (in {REPO_ROOT}): set NEUSIGHT_HOME to the "
            "artifact's checkout (the folder with labels/ and artifacts/), or install it with `pip install -e <checkout>`")
    return _resolved(str(REPO_ROOT if env is None else env))


@functools.lru_cache(maxsize=16)
def _absolute_resolved(p: str) -> Path:
    return Path(p).resolve()


def _resolved(p: str) -> Path:
    """``Path(p).resolve()``, remembered for absolute paths: resolving costs system calls per path part, and home() is
    asked for on every device look-up (thousands in a sweep). A relative path depends on the working folder, so it is
    resolved each time."""
    return _absolute_resolved(p) if os.path.isabs(p) else Path(p).resolve()


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
        return _resolved(os.environ["NEUSIGHT_TRAINED"])
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
            "run `python -m neusight_core.data.release` (run_all.sh and run_tests.sh do it for you)"
        )


def not_a_regular_file(path) -> str | None:
    """Why ``path`` cannot be read as a settings file (``cannot read (...)``, ``is a FIFO, not a regular file``), or
    None. Asked before opening: reading a FIFO blocks until someone writes to it, which hangs every command."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot read ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "a special file"
    return f"is {kind}, not a regular file"


def out_dir(output_dir: str | Path) -> Path:
    """The notebook's output folder (created); a relative path is taken from the repository root, so a
    notebook writes to the same place whether it runs from notebooks/ (JupyterLab) or from the root."""
    p = Path(output_dir)
    if not p.is_absolute():
        p = REPO_ROOT / p
    (p / "tables").mkdir(parents=True, exist_ok=True)
    (p / "figures").mkdir(parents=True, exist_ok=True)
    return p


def load_yaml(text: str):
    """``yaml.safe_load`` with libyaml's parser where installed (the same values, about 5x faster: every new process
    reads the device catalogue, the predictor registry and the attention list)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
