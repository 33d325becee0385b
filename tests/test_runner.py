"""run_all.sh: keeps going past a failing notebook, records it, exits non-zero, tars the run."""
from __future__ import annotations

import json
import subprocess
import tarfile

from neusight_core import paths, runner

FIXTURES = paths.REPO_ROOT / "tests" / "fixtures" / "notebooks"


def test_run_all_continues_past_failure(tmp_path):
    out = tmp_path / "run1"
    proc = subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--quick", "--out", str(out),
                           "--notebooks-dir", str(FIXTURES)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = json.loads((out / "run.json").read_text())
    status = {n["name"]: n["status"] for n in run["notebooks"]}
    assert status == {"01_ok": "OK", "02_fails": "FAILED", "03_skips": "SKIPPED"}
    summary = (out / "SUMMARY.md").read_text()
    assert "| 02_fails | **FAILED** |" in summary and "deliberate failure" in summary
    assert "| 03_skips | SKIPPED |" in summary and "no CUDA GPU here" in summary
    assert "fixture summary line" in summary
    # the failed notebook is kept as evidence, with its HTML export
    assert (out / "02_fails.ipynb").is_file() and (out / "02_fails.html").is_file()
    assert json.loads((out / "environment.json").read_text())["python"].startswith("3.11")
    with tarfile.open(tmp_path / "neusight_results_run1.tar.gz") as tar:
        names = tar.getnames()
    assert "run1/SUMMARY.md" in names and "run1/01_ok/metrics.json" in names
    assert "[2/3] 02_fails FAILED" in proc.stdout


def test_only_selects_and_unknown_is_an_error(tmp_path):
    assert [p.stem for p in runner.discover(FIXTURES, ["03"])] == ["03_skips"]
    assert [p.stem for p in runner.discover(FIXTURES, ["ok"])] == ["01_ok"]
    proc = subprocess.run([str(paths.REPO_ROOT / ".venv/bin/python"), "-m", "neusight_core.runner",
                           "--only", "nope", "--notebooks-dir", str(FIXTURES), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, cwd=paths.REPO_ROOT)
    assert proc.returncode != 0 and "unknown notebook(s) nope" in proc.stderr


def test_help_lists_options():
    proc = subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for opt in ("--quick", "--only", "--out"):
        assert opt in proc.stdout
