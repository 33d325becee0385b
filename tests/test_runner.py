"""run_all.sh: keeps going past a failing notebook, records it, exits non-zero, tars the run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from neusight_core import paths
from neusight_core.run import runner

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
    # the record names the tarball it sits in (it said null before, issue 36)
    assert os.path.samefile(run["tarball"], tmp_path / "neusight_results_run1.tar.gz")
    assert "expected: about" in proc.stdout          # a whole run says at its start how long it will take


def test_only_selects_and_unknown_is_an_error(tmp_path):
    assert [p.stem for p in runner.discover(FIXTURES, ["03"])] == ["03_skips"]
    assert [p.stem for p in runner.discover(FIXTURES, ["ok"])] == ["01_ok"]
    proc = subprocess.run([str(paths.REPO_ROOT / ".venv/bin/python"), "-m", "neusight_core.run.runner",
                           "--only", "nope", "--notebooks-dir", str(FIXTURES), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, cwd=paths.REPO_ROOT)
    assert proc.returncode != 0 and "unknown notebook(s) nope" in proc.stderr


def test_help_lists_options():
    proc = subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for opt in ("--quick", "--only", "--out"):
        assert opt in proc.stdout


# ----------------------------------------------------------------------------- full disk, lock
DISK_FIXTURES = paths.REPO_ROOT / "tests" / "fixtures" / "disk_notebooks"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs made for the test (root only); skipped with the reason where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or proc.returncode}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _run(out, env_extra, *more):
    env = dict(os.environ, **env_extra)
    return subprocess.run([str(paths.REPO_ROOT / ".venv/bin/python"), "-m", "neusight_core.run.runner", "--quick",
                           "--out", str(out), "--notebooks-dir", str(DISK_FIXTURES), *more],
                          capture_output=True, text=True, timeout=600, cwd=paths.REPO_ROOT, env=env)


def _no_finished_looking_partials(folder):
    names = [p.name for p in folder.rglob("*")]
    assert not [n for n in names if n.endswith((".part", ".tmp"))], names
    for p in folder.rglob("*"):   # every file under a finished name is whole
        if p.is_file() and p.suffix in (".json", ".ipynb"):
            json.loads(p.read_text())


def test_disk_full_in_a_notebook_keeps_the_run_record(small_disk):
    out = small_disk / "run"
    proc = _run(out, {"NEUSIGHT_TEST_FILL": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    run = json.loads((out / "run.json").read_text())
    status = {n["name"]: (n["status"], n["reason"]) for n in run["notebooks"]}
    assert status["01_noise"][0] == "OK"
    assert status["02_fills"][0] == "FAILED" and status["02_fills"][1].startswith("disk full while writing")
    summary = (out / "SUMMARY.md").read_text()
    assert "| 02_fills | **FAILED** | " in summary and "disk full" in summary
    assert "tarball: FAILED: disk full" in summary       # the disk is still full: said, not half-made
    assert json.loads((out / "environment.json").read_text())["python"].startswith("3.11")
    assert not (out / "02_fills.ipynb").exists()         # a cut notebook never keeps the finished name
    assert not list(small_disk.glob("*.tar.gz*"))
    _no_finished_looking_partials(small_disk)


def test_disk_full_at_the_tarball_is_said_and_leaves_no_part_file(small_disk):
    # 700 kB of noise: both notebooks and their HTML exports fit on the 2 MiB disk, the tarball does not
    out = small_disk / "run"
    proc = _run(out, {"NEUSIGHT_TEST_NOISE_BYTES": str(700_000)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert [n["status"] for n in run["notebooks"]] == ["OK", "OK"]
    assert run["tarball"].startswith("FAILED: disk full")
    assert "tarball: FAILED: disk full" in (out / "SUMMARY.md").read_text()
    assert "tarball: FAILED: disk full" in proc.stdout
    assert not list(small_disk.glob("*.tar.gz*"))
    _no_finished_looking_partials(small_disk)


def test_two_runs_on_one_folder_never_both_run(tmp_path):
    out = tmp_path / "run"
    first = runner.claim(out, default=False)
    assert first == out and (out / runner.LOCK_FILE).is_file()
    with pytest.raises(runner.UsageError, match="another run is using this folder"):
        runner.claim(out, default=False)
    # the default folder of two runs started in the same second: two folders
    a = runner.claim(tmp_path / "20260101-000000", default=True)
    b = runner.claim(tmp_path / "20260101-000000", default=True)
    assert a != b and a.is_dir() and b.is_dir()


def test_a_finished_run_leaves_no_lock_and_its_tarball_holds_no_bookkeeping(tmp_path):
    out = tmp_path / "run"
    proc = _run(out, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (out / runner.LOCK_FILE).exists() and not (out / runner.RESERVE_FILE).exists()
    with tarfile.open(tmp_path / "neusight_results_run.tar.gz") as tar:
        names = tar.getnames()
    assert "run/SUMMARY.md" in names and not [n for n in names if n.endswith((runner.LOCK_FILE, runner.RESERVE_FILE))]


def test_a_second_run_started_on_the_same_folder_stops_at_once(tmp_path):
    import signal
    import time
    out = tmp_path / "run"
    cmd = [str(paths.REPO_ROOT / ".venv/bin/python"), "-m", "neusight_core.run.runner", "--quick", "--out", str(out),
           "--notebooks-dir", str(paths.REPO_ROOT / "tests" / "fixtures" / "slow_notebooks")]
    first = subprocess.Popen(cmd, cwd=paths.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (out / runner.LOCK_FILE).exists():
                break
            time.sleep(0.1)
        second = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and ("another run is using this folder" in err[0] or "already holds files" in err[0])
        assert first.poll() is None          # the first run goes on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    assert "INTERRUPTED" in (out / "SUMMARY.md").read_text()   # the first run's record, not the second's


def test_a_signal_whose_exception_is_swallowed_still_stops_the_run(tmp_path, monkeypatch):
    """asyncio stores an exception raised in a task's step on that task; a background task loses it.
    The runner remembers the signal and stops after that notebook, never starting the next one."""
    import signal
    started = []

    def fake_run(nb, run_dir, quick, extra=None):
        started.append(nb.stem)
        try:
            os.kill(os.getpid(), signal.SIGTERM)      # the handler raises here ...
        except BaseException:                          # noqa: BLE001 ... and the kernel client swallows it
            pass
        return runner.NotebookResult(nb.stem, "FAILED", 0.1, "DeadKernelError: kernel died")

    monkeypatch.setattr(runner, "run_notebook", fake_run)
    old = signal.getsignal(signal.SIGTERM)
    try:
        code = runner.main(["--quick", "--out", str(tmp_path / "run"),
                            "--notebooks-dir", str(paths.REPO_ROOT / "tests" / "fixtures" / "slow_notebooks")])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert code == 128 + signal.SIGTERM and started == ["01_ok"]
    summary = (tmp_path / "run" / "SUMMARY.md").read_text()
    assert "| 01_ok | **INTERRUPTED** |" in summary and not (tmp_path / "run" / runner.LOCK_FILE).exists()


def test_a_signal_right_after_the_claim_leaves_no_lock(tmp_path):
    """A SIGTERM between taking the folder's lock and the start of the notebooks is remembered: the run writes
    its INTERRUPTED record and removes the lock (it was killed with the lock left, and the folder refused)."""
    import signal
    out = tmp_path / "run"
    code = ("import os, signal, sys\n"
            "from neusight_core.run import runner\n"
            "def reserve(run_dir):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "runner.reserve_space = reserve\n"
            f"sys.exit(runner.main(['--quick', '--out', {str(out)!r}, '--notebooks-dir', "
            f"{str(paths.REPO_ROOT / 'tests' / 'fixtures' / 'slow_notebooks')!r}]))\n")
    proc = subprocess.run([str(paths.REPO_ROOT / ".venv/bin/python"), "-c", code], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout + proc.stderr
    assert not (out / runner.LOCK_FILE).exists() and "INTERRUPTED" in (out / "SUMMARY.md").read_text()


def test_stop_all_kills_the_kernels_the_run_started(tmp_path):
    """An interrupted run kills its kernels (with their process group): none outlives the runner
    holding its console, and a notebook waiting on one ends at once."""
    import asyncio

    from neusight_core.run import notebook_kernel
    km = notebook_kernel.manager_class(tmp_path / "k.log")(kernel_name="python3")
    asyncio.run(km.start_kernel())
    process = km.provisioner.process
    try:
        assert process.poll() is None and process in notebook_kernel._STARTED
        assert notebook_kernel.stop_all() == 1
        process.wait(timeout=30)
        assert process.returncode == -9 and notebook_kernel.stop_all() == 0
    finally:
        if process.poll() is None:
            process.kill()


_LOST_IN_A_CALLBACK = """
import asyncio, os, signal, sys, time
from neusight_core.run import runner
runner.KERNEL_GRACE_S, runner.REDELIVER_S = 0.3, 0.3
signals = runner._Signals()
async def step():
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    def resolve():
        os.kill(os.getpid(), signal.SIGTERM)   # raised here, inside asyncio's callback: logged and dropped
        fut.set_result(None)                   # so this future is never resolved
    loop.call_later(0.1, resolve)
    await fut
try:
    signals.arm()
    asyncio.run(step())
    print("never interrupted")
except runner._Interrupted as e:
    signals.disarm()
    print("interrupted by", e.signame)
finally:
    signals.ignore()
    signals.restore()
"""


def test_a_signal_lost_inside_an_asyncio_callback_still_stops_the_run():
    """A CI run hung 120 s: the SIGTERM's exception was raised inside asyncio's ``_set_result_unless_cancelled``,
    which logs and drops it, and the future it was to resolve never was. The fallback sends the signal again
    until the exception arrives where it propagates (the old code waited here until the timeout)."""
    proc = subprocess.run([sys.executable, "-c", _LOST_IN_A_CALLBACK], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "interrupted by SIGTERM", proc.stdout + proc.stderr
    assert "Exception in callback" in proc.stderr     # the first delivery was indeed lost


_UNRETRIEVED = """
import asyncio, gc, subprocess, sys
from nbclient.exceptions import DeadKernelError
from neusight_core.run import notebook_kernel
if sys.argv[1] == "kill":
    notebook_kernel._STARTED.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
    assert notebook_kernel.stop_all() == 1
async def watch():
    raise DeadKernelError("Kernel died")
async def main():
    asyncio.get_running_loop().create_task(watch())      # nobody awaits it, as nbclient's watcher
    await asyncio.sleep(0.05)
asyncio.run(main())
gc.collect()
print("end")
"""


def test_a_killed_kernels_unawaited_task_prints_no_traceback():
    """After the runner kills the kernels, the client's task that watched one ends with DeadKernelError; asyncio
    printed "Task exception was never retrieved" and its traceback after the run's summary. Not after a kill."""
    got = {how: subprocess.run([sys.executable, "-c", _UNRETRIEVED, how], capture_output=True, text=True, timeout=120,
                               cwd=paths.REPO_ROOT) for how in ("kill", "none")}
    assert got["none"].returncode == 0 and "never retrieved" in got["none"].stderr     # the message exists
    assert got["kill"].returncode == 0 and got["kill"].stdout.strip() == "end"
    assert "never retrieved" not in got["kill"].stderr and "DeadKernelError" not in got["kill"].stderr


# ----------------------------------------------------------------------------- --param
def test_param_reaches_the_notebook_that_has_it(tmp_path):
    out = tmp_path / "p"
    proc = subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--quick", "--only", "01", "--out", str(out),
                           "--param", "answer=7", "--notebooks-dir", str(FIXTURES)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((out / "01_ok" / "metrics.json").read_text())["answer"] == 7
    assert "01_ok parameters: answer=7" in proc.stdout
    # the run's record says what was changed: run.json per notebook and a line of SUMMARY.md
    assert json.loads((out / "run.json").read_text())["notebooks"][0]["parameters"] == {"answer": 7}
    assert "- 01_ok ran with --param answer=7" in (out / "SUMMARY.md").read_text()


@pytest.mark.parametrize("item, message", [
    ("nope=1", "--param nope: no selected notebook has this parameter (05_live_gpu: models, batches"),
    ("quick=true", "--param quick: set by the runner"),
    ("time_budget_s", "give KEY=VALUE"),
    ("=3", "give KEY=VALUE"),
])
def test_bad_param_is_a_one_line_usage_error(item, message):
    nbs = runner.discover(runner.NOTEBOOKS_DIR, ["05"])
    with pytest.raises(runner.UsageError, match=None) as e:
        runner.parse_params([item], nbs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_param_values_are_read_as_json_else_text():
    nbs = runner.discover(runner.NOTEBOOKS_DIR, ["05", "06"])
    got = runner.parse_params(["time_budget_s=600", 'models=["gpt2_large"]', "target_gpu=NVIDIA_L4"], nbs)
    assert got["05_live_gpu"] == {"time_budget_s": 600, "models": ["gpt2_large"], "target_gpu": "NVIDIA_L4"}
    assert "time_budget_s" not in got["06_what_if"]      # only the notebooks that have the parameter get it


# ----------------------------------------------------------------------------- NEUSIGHT_PYTHON
def _run_all_with(python: str, out, *extra):
    env = {**os.environ, "NEUSIGHT_PYTHON": python}
    return subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--quick", "--only", "01", "--out", str(out),
                           "--notebooks-dir", str(FIXTURES), *extra], capture_output=True, text=True, timeout=600,
                          env=env)


def test_neusight_python_runs_with_that_interpreter_as_it_is(tmp_path):
    """A GPU container's Python (here: this venv's, given by path) is used without a venv or pip."""
    proc = _run_all_with(str(paths.REPO_ROOT / ".venv" / "bin" / "python"), tmp_path / "r")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "as it is (NEUSIGHT_PYTHON)" in proc.stdout and "pins are not applied" in proc.stdout
    assert "creating virtualenv" not in proc.stdout
    assert json.loads((tmp_path / "r" / "01_ok" / "metrics.json").read_text())["answer"] == 42


def test_neusight_python_without_the_modules_is_a_one_line_error(tmp_path):
    import sys
    bare = tmp_path / "bare"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = _run_all_with(str(bare / "bin" / "python"), tmp_path / "r")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, proc.stdout + proc.stderr
    assert "lacks: torch transformers numpy pandas" in err and "papermill" in err
    proc = _run_all_with(str(tmp_path / "no-such-python"), tmp_path / "r2")
    assert proc.returncode == 2 and "no such interpreter" in proc.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "r2").exists()


def test_disk_full_in_the_html_export_fails_that_notebook(small_disk):
    """Issue 36 item 8: 1.2 MB of noise leaves no room for the second notebook's HTML export; that notebook was
    reported OK without its HTML, now it is FAILED with the file named."""
    out = small_disk / "run"
    proc = _run(out, {"NEUSIGHT_TEST_NOISE_BYTES": str(1_200_000)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert [n["status"] for n in run["notebooks"]] == ["OK", "FAILED"]
    assert run["notebooks"][1]["reason"] == f"disk full while writing {out / '02_fills.html'}"
    _no_finished_looking_partials(small_disk)


def test_a_run_called_in_process_gives_the_callers_signal_handlers_back(tmp_path):
    """main() ignores SIGINT / SIGTERM while it writes the run's record; a caller (a test, a notebook) gets its own
    handlers back, whatever the run's end: an ignored signal would also pass to every process the caller starts
    (it survives exec), which made a background loop of benchmarks/gpu_session.sh unkillable in the test suite."""
    import signal

    def child_ignores() -> int | None:
        """The signals a child of this process ignores (a bit mask; None off Linux)."""
        r = subprocess.run(["bash", "-c", "grep SigIgn /proc/self/status"], capture_output=True, text=True)
        return int(r.stdout.split()[1], 16) if r.returncode == 0 else None

    # what a child ignores before the run: a suite started in the background (nohup, `&`) already ignores SIGINT
    # and SIGHUP, and passes that on whatever the run does
    inherited = child_ignores()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert runner.main(["--quick", "--only", "01", "--out", str(tmp_path / "run"),
                        "--notebooks-dir", str(FIXTURES)]) == 0
    assert {s: signal.getsignal(s) for s in before} == before
    ignored = child_ignores()
    if ignored is not None:                  # Linux: the run added neither signal to what the child ignores
        added = ignored & ~inherited
        assert not added & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)), (hex(inherited), hex(ignored))


@pytest.mark.parametrize("length", [240, 300])   # the tarball's name (+24) too long / the folder's own too long
def test_an_out_name_too_long_is_a_usage_error_and_leaves_no_lock(tmp_path, capsys, length):
    out = tmp_path / ("r" * length)
    for check in (["--check-args"], []):        # run_all.sh's check before set-up, then the run itself
        assert runner.main([*check, "--quick", "--out", str(out), "--notebooks-dir", str(FIXTURES)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {out}") and "File name too long" in err[0], err
    assert list(tmp_path.iterdir()) == []       # no run folder, no .run.lock
    # claim alone (a name that passed the checks): refused, and what it made is gone again
    with pytest.raises(runner.UsageError, match="File name too long"):
        runner.claim(out, default=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("notebook, key, title, quick, line", [
    ("07_external_validation", "external", "External validation", False,
     "BF16 on unseen Blackwell GPUs, measured by others: GEMM 20.2 %, attention 32.0 %"),
    ("08_error_bars", "error_bars", "Each answer's interval", True,
     "80 % intervals of neusight (full weights, 3 seed(s)) cover unseen GPUs (release labels) 81 % (half-width 12 %)"),
    ("09_serving", "serving", "Serving", False,
     "serving model on 177 of 553 development rows (full weights): TPOT 8.4 %, TTFT 56.5 % MAPE")])
def test_an_extensions_verdict_gets_its_line_in_the_verdict_block(tmp_path, notebook, key, title, quick, line):
    """Notebooks 07, 08 and 09 report beyond the paper: each gets one line, titled by ``run_summary.EXTENSIONS``."""
    import json

    from neusight_core.run import runner
    d = tmp_path / notebook
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"status": "OK", "verdicts": {key: True, "quick": quick, "summary": line}}))
    lines = runner.verdict_block(tmp_path, [runner.NotebookResult(notebook, "OK", 1.0)])
    tag = " [quick mode: subset, quick predictors]" if quick else ""
    assert [x for x in lines if notebook in x] == [f"- **{title}** ({notebook}, OK){tag}: {line}"]
