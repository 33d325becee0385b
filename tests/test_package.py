"""The package (pyproject.toml): the README's Python example, the `neusight` command, `pip install -e .` into a
fresh venv, and a copy installed without its checkout (`pip install .`)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neusight_core import paths

ROOT = paths.REPO_ROOT
PREDICT = ["predict", "--model", "gpt2_large", "--device", "H100", "--batch", "1", "--seq", "128",
           "--predictor", "roofline"]
PIP = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--no-deps",
       "--no-build-isolation"]


def readme_example() -> str:
    """The code block of the README's "Use it from Python" section."""
    text = (ROOT / "README.md").read_text()
    assert "\n## Use it from Python\n" in text
    section = text.split("\n## Use it from Python\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "no ```python block in the README's 'Use it from Python'"
    return m.group(1)


def _env(pythonpath: bool) -> dict:
    """The environment of a child: with this checkout first on PYTHONPATH (as pytest.ini does for the tests)
    or with no PYTHONPATH at all (the package found through the venv's install alone)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEUSIGHT_HOME")}
    if pythonpath:
        env["PYTHONPATH"] = str(ROOT)
    env["TQDM_DISABLE"] = "1"
    return env


def _run(cmd, cwd, env, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _answer(out: str) -> str:
    """A prediction's text without its wall times (trace/predict seconds differ from call to call)."""
    return re.sub(r"\d+(\.\d+)? s\b", "<t> s", out)


def _python_m_answer(tmp_path) -> str:
    """`python -m neusight_core predict ...` of this checkout (the reference the installed commands must equal)."""
    return _answer(_run([sys.executable, "-m", "neusight_core", *PREDICT], tmp_path, _env(True)).stdout)


def _check_readme_example(python, cwd, env):
    out = _run([python, "-c", readme_example()], cwd, env).stdout.strip()
    m = re.fullmatch(r"(\d+\.\d+) ms", out.splitlines()[-1] if out else "")
    assert m and float(m.group(1)) > 0, out


def _fresh_venv(where: Path) -> Path:
    """A new venv that sees the running venv's packages (the pins, pip, setuptools) through a .pth file, so
    that installing into it downloads nothing. (`--system-site-packages` would show the base interpreter's
    packages, not the venv's.) Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], where, _env(False))
                .stdout.strip())
    # the running venv's site-packages and any it adds itself through .pth files
    seen = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (site / "_the_project_venv.pth").write_text("".join(f"{p}\n" for p in seen))
    return py


def _repo_entries() -> set[str]:
    return {p.name for p in ROOT.iterdir()} | {str(p.relative_to(ROOT)) for p in ROOT.glob("**/*.egg-info")}


def test_readme_python_example_runs(tmp_path):
    """The README's three lines, as a researcher would run them (a neutral folder, this checkout importable)."""
    _check_readme_example(sys.executable, tmp_path, _env(True))
    readme = (ROOT / "README.md").read_text()
    assert "`neusight`" in readme and "pip install -e ." in readme and "NEUSIGHT_HOME" in readme


def test_console_script_equals_python_m(tmp_path):
    venv = ROOT / ".venv"
    if venv.is_symlink():
        pytest.skip(".venv is a symlink to another checkout's venv (a worktree): its `neusight` runs that "
                    "checkout; test_pip_install_editable_into_a_fresh_venv checks the command instead")
    exe = venv / "bin" / "neusight"
    if not (venv / "bin" / "python").exists():
        pytest.skip("no .venv (the tests run in another environment): scripts/bootstrap.sh makes it")
    assert exe.is_file(), f"{exe} missing: scripts/bootstrap.sh installs this checkout into .venv"
    want = _python_m_answer(tmp_path)
    # from a neutral folder and with no PYTHONPATH: the editable install alone finds this checkout
    assert _answer(_run([exe, *PREDICT], tmp_path, _env(False)).stdout) == want
    where = _run([venv / "bin" / "python", "-c", "import neusight_core; print(neusight_core.__file__)"],
                 tmp_path, _env(False)).stdout.strip()
    assert Path(where).resolve() == (ROOT / "neusight_core" / "__init__.py").resolve()


def test_pip_install_editable_into_a_fresh_venv(tmp_path):
    """`pip install -e .` into a new venv (its packages: the pins of the running venv, nothing downloaded),
    then, from a neutral folder with no PYTHONPATH: the import finds this checkout, `neusight --help`,
    `neusight predict` equal to `python -m neusight_core predict`, and the README's Python example."""
    before = _repo_entries()
    py = _fresh_venv(tmp_path / "venv")
    _run([py, *PIP, "-e", ROOT], tmp_path, _env(False))
    assert _repo_entries() == before, "pip install -e . left files in the checkout"
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _env(False)
    where = _run([py, "-c", "import neusight_core; print(neusight_core.__file__)"], work, env).stdout.strip()
    assert Path(where).resolve() == (ROOT / "neusight_core" / "__init__.py").resolve()
    exe = tmp_path / "venv" / "bin" / "neusight"
    assert _run([exe, "--help"], work, env).stdout.startswith("usage: neusight ")
    assert _answer(_run([exe, *PREDICT], work, env).stdout) == _python_m_answer(tmp_path)
    _check_readme_example(py, work, env)


def test_pip_install_without_the_checkout_needs_neusight_home(tmp_path):
    """`pip install .` (a copy in site-packages, built from a copy of the checkout so that no build/ or
    egg-info lands here): every data file the package reads is in it (the prediction equals this checkout's
    with NEUSIGHT_HOME pointing here), and without NEUSIGHT_HOME a command says so in one line."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "requirements.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "neusight_core", src / "neusight_core",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    py = _fresh_venv(tmp_path / "venv")
    _run([py, *PIP, src], tmp_path, _env(False))
    exe = tmp_path / "venv" / "bin" / "neusight"
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _run([exe, "devices"], work, _env(False), ok=False)
    assert r.returncode == 2 and r.stdout == "", r
    assert len(r.stderr.splitlines()) == 1 and "NEUSIGHT_HOME" in r.stderr and "pip install -e" in r.stderr, r.stderr
    env = dict(_env(False), NEUSIGHT_HOME=str(ROOT))
    assert _answer(_run([exe, *PREDICT], work, env).stdout) == _python_m_answer(tmp_path)


def test_no_import_cycle_in_the_package():
    """Issue 23: arrows only point down. The shared tool counts every import, also those inside functions
    (it exits 1 and names the modules of each cycle)."""
    tool = paths.REPO_ROOT.parent / "shared" / "tools" / "import_cycles.py"
    if not tool.is_file():
        pytest.skip(f"{tool} not here (../shared is beside the checkout in CI)")
    r = subprocess.run([sys.executable, str(tool), str(paths.REPO_ROOT / "neusight_core")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 cycle(s)" in r.stdout


def test_home_follows_neusight_home_and_a_relative_one_the_working_folder(tmp_path, monkeypatch):
    """home() is remembered per absolute path (it is asked on every device look-up), never across a relative one."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "x").mkdir(parents=True)
    (b / "x").mkdir(parents=True)
    monkeypatch.setenv("NEUSIGHT_HOME", str(a))
    assert paths.home() == a.resolve()
    monkeypatch.setenv("NEUSIGHT_HOME", str(b))
    assert paths.home() == b.resolve()
    monkeypatch.setenv("NEUSIGHT_HOME", "x")
    monkeypatch.chdir(a)
    assert paths.home() == (a / "x").resolve()
    monkeypatch.chdir(b)
    assert paths.home() == (b / "x").resolve()
