"""Shared fixtures: the provisioned release and a papermill runner for the notebooks."""
from __future__ import annotations

import json

import pytest

from neusight_core import paths

NOTEBOOKS = paths.REPO_ROOT / "notebooks"


@pytest.fixture(scope="session")
def release_root():
    """The provisioned release (run_tests.sh provisions it before pytest starts)."""
    paths.require_release()
    return paths.release_dir()


@pytest.fixture
def fresh_catalogue(monkeypatch):
    """The device catalogue without a user's device files, rebuilt before and after the test."""
    from neusight_core.data import devices
    monkeypatch.delenv(devices.ENV_USER_DEVICES, raising=False)
    devices.reload()
    yield
    devices.reload()


@pytest.fixture
def run_notebook(tmp_path):
    """Execute notebooks/<name>.ipynb with papermill in quick mode; return (output_dir, metrics)."""
    import papermill as pm

    def _run(name: str, **params):
        out = tmp_path / name
        params = {"output_dir": str(out), "quick": True, **params}
        pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(tmp_path / f"{name}.out.ipynb"),
                            parameters=params, cwd=str(paths.REPO_ROOT), progress_bar=False,
                            kernel_name="python3")
        metrics = json.loads((out / "metrics.json").read_text())
        return out, metrics

    return _run
