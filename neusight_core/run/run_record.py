"""What a run of ``./run_all.sh`` leaves beside its notebooks: ``environment.json`` (versions, GPU, release and
artifact commits), ``run.json``, ``SUMMARY.md`` (``run_summary``) and the tarball. The runner (``runner.py``) calls it."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from neusight_core import paths
from neusight_core.run.run_summary import NotebookResult, write_atomic, write_summary

#: bookkeeping files of a run that are never tarred: the runner's lock and the space it set aside (runner.py)
LOCK_FILE = ".run.lock"
RESERVE_FILE = ".space-reserve"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(paths.REPO_ROOT), *args], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_info() -> dict:
    try:
        import torch

        if not torch.cuda.is_available():
            return {"available": False, "reason": "torch.cuda.is_available() is False (no CUDA GPU or CPU build of torch)"}
        return {"available": True, "count": torch.cuda.device_count(),
                "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                "cuda": torch.version.cuda}
    except Exception as e:
        return {"available": False, "reason": f"torch could not be queried: {e}"}


def environment() -> dict:
    pkgs = sorted((d.metadata["Name"], d.version) for d in metadata.distributions() if d.metadata["Name"])
    from neusight_core.data import release
    rel = release.status()
    try:
        rel["checksums"] = release.verify_installed().line()
    except release.ReleaseError as e:
        rel["checksums"] = f"FAILED: {e}"
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
        "artifact_commit": _git("rev-parse", "HEAD"), "artifact_dirty": bool(_git("status", "--porcelain")),
        "release": rel, "gpu": gpu_info(),
        "packages": {n: v for n, v in pkgs},
    }


def tarball_path(run_dir: Path) -> Path:
    return run_dir.parent / f"neusight_results_{run_dir.name}.tar.gz"


def make_tarball(run_dir: Path) -> Path:
    tar_path = tarball_path(run_dir)
    tmp = tar_path.with_name(tar_path.name + ".part")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(run_dir, arcname=run_dir.name, filter=lambda t: None if Path(t.name).name in (LOCK_FILE, RESERVE_FILE) else t)
        tmp.replace(tar_path)
    except BaseException:  # a full disk or an interrupt: no part-file left that looks like a result
        tmp.unlink(missing_ok=True)
        raise
    return tar_path


def write_record(run_dir: Path, results: list[NotebookResult], env: dict, quick: bool, total: float,
                 interrupted: str | None, tarball: str | None = None, start: dict | None = None) -> Path:
    """environment.json, run.json and SUMMARY.md, each written whole or not at all. ``start``: how the run started
    (``calibration_s``, ``weights_missing``: what a later run's estimate compares itself with, run_estimate)."""
    write_atomic(run_dir / "environment.json", json.dumps(env, indent=2))
    write_atomic(run_dir / "run.json", json.dumps(
        {"quick": quick, "seconds": total, "interrupted": interrupted, "tarball": tarball, **(start or {}),
         "notebooks": [asdict(r) for r in results]}, indent=2))
    return write_summary(run_dir, results, env, quick, total, interrupted=interrupted, tarball=tarball)
