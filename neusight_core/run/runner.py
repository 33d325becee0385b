"""Runs the artifact: every notebook in order with papermill, then SUMMARY.md, env capture, tarball.

``./run_all.sh`` is a thin wrapper (set-up, then ``python -m neusight_core.run.runner``).
Layout of one run, ``results/<timestamp>/``:
  <NN_name>.ipynb, <NN_name>.html     executed notebook (kept when it fails: it is the evidence)
  <NN_name>/                          the notebook's own outputs: tables/, figures/, metrics.json
  SUMMARY.md, run.json, environment.json
and ``results/neusight_results_<timestamp>.tar.gz`` holding the run folder.

A notebook is OK when it ran and its metrics.json says OK, SKIPPED when metrics.json says so
(e.g. no GPU), FAILED when it raised, wrote no metrics.json, or its metrics.json says FAILED. A
failure never stops the run; the exit code is 1 when any notebook failed.

SUMMARY.md opens with a verdict block built from the ``verdicts`` key of each notebook's
metrics.json (``run_summary``; contract in docs/interfaces.md, producer ``claims.verdict_block``).

Usage errors (unknown option, ``--only`` naming no notebook, an ``--out`` that is a file, is not
writable, already holds files, or whose name or tarball's name is too long for the file system) end with
one line and exit code 2 before anything runs, leaving no ``.run.lock``; run_all.sh
checks them before set-up too (``--check-args``). A run never mixes with an earlier one: a non-empty
``--out`` is refused. SIGINT / SIGTERM stop the run: SUMMARY.md then says INTERRUPTED and lists what
finished, no tarball is made, and the exit code is 130 / 143.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from neusight_core import paths  # stdlib only: run_all.sh checks the arguments with any python3 before set-up
from neusight_core.run import notebook_kernel
from neusight_core.run.executed_notebook import disk_full_cause, disk_full_reason, export_html, is_disk_full, strip_progress
from neusight_core.run.run_record import LOCK_FILE, RESERVE_FILE, environment, make_tarball, tarball_path, write_record
from neusight_core.run.run_summary import NotebookResult, format_params, verdict_block, write_atomic

__all__ = ["NotebookResult", "claim", "discover", "main", "run_notebook", "verdict_block", "write_atomic",
           "write_record"]   # the record's names are run_record's / run_summary's, named here for the run
NOTEBOOKS_DIR = paths.REPO_ROOT / "notebooks"
KERNEL_GRACE_S = 10.0   # after a signal, the kernel client's own shutdown; then the kernels are killed
REDELIVER_S = 2.0       # then the signal again, this often, until the run has stopped


class UsageError(Exception):
    """Bad command line; one line, exit code 2."""


def discover(folder: Path, only: list[str] | None = None) -> list[Path]:
    """Notebooks named NN_*.ipynb in order; ``only`` filters by name, with or without NN_ / .ipynb."""
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        want = {o.removesuffix(".ipynb") for o in only}
        chosen = [p for p in found if p.stem in want or p.stem[3:] in want or p.stem[:2] in want]
        missing = want - {p.stem for p in chosen} - {p.stem[3:] for p in chosen} - {p.stem[:2] for p in chosen}
        if missing:
            names = ", ".join(p.stem for p in found)
            raise UsageError(f"unknown notebook(s) {', '.join(sorted(missing))}; known: {names}")
        return chosen
    return found


def notebook_parameters(nb: Path) -> list[str]:
    """Names assigned in the notebook's cell tagged ``parameters`` (stdlib only: read as JSON)."""
    cells = json.loads(nb.read_text()).get("cells", [])
    for c in cells:
        if "parameters" in c.get("metadata", {}).get("tags", []):
            src = "".join(c.get("source", []))
            return re.findall(r"^([A-Za-z_]\w*)\s*=", src, flags=re.M)
    return []


RUNNER_PARAMETERS = ("output_dir", "quick")    # set by the runner itself (--out, --quick)


def parse_params(items: list[str] | None, notebooks: list[Path]) -> dict[str, dict]:
    """``--param KEY=VALUE`` items -> {notebook stem: {key: value}} for the selected notebooks that have the
    parameter. VALUE is read as JSON (numbers, true/false, null, lists in brackets), else kept as text."""
    out: dict[str, dict] = {nb.stem: {} for nb in notebooks}
    have = {nb.stem: notebook_parameters(nb) for nb in notebooks}
    for item in items or []:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise UsageError(f"--param {item!r}: give KEY=VALUE, e.g. --param time_budget_s=600")
        if key in RUNNER_PARAMETERS:
            raise UsageError(f"--param {key}: set by the runner (use --out / --quick)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        takers = [stem for stem, names in have.items() if key in names]
        if not takers:
            known = "; ".join(f"{stem}: {', '.join(n for n in names if n not in RUNNER_PARAMETERS) or '-'}"
                              for stem, names in have.items())
            raise UsageError(f"--param {key}: no selected notebook has this parameter ({known})")
        for stem in takers:
            out[stem][key] = value
    return out


# Space set aside when a run starts and given back before its record (SUMMARY.md, run.json,
# environment.json) is written, so that a disk filled by a notebook still leaves room to say so.
RESERVE_BYTES = 512 * 1024


def reserve_space(run_dir: Path) -> None:
    with open(run_dir / RESERVE_FILE, "wb") as f:
        f.write(b"\0" * RESERVE_BYTES)
        f.flush()
        os.fsync(f.fileno())


def _last_error_line(exc: BaseException) -> str:
    text = str(getattr(exc, "evalue", "") or exc).strip().splitlines()
    ename = getattr(exc, "ename", type(exc).__name__)
    return f"{ename}: {text[-1] if text else ''}"  # whole: a cut sentence explains nothing


def run_notebook(nb: Path, run_dir: Path, quick: bool, extra: dict | None = None) -> NotebookResult:
    import papermill as pm

    out_dir = run_dir / nb.stem
    params = {"output_dir": str(out_dir), "quick": bool(quick), **(extra or {})}
    t0 = time.time()
    status, reason = "OK", ""
    try:
        pm.execute_notebook(str(nb), str(run_dir / nb.name), parameters=params, cwd=str(paths.REPO_ROOT),
                            kernel_name="python3", progress_bar=sys.stdout.isatty(), log_output=False,
                            kernel_manager_class=notebook_kernel.manager_class(run_dir / f".{nb.stem}.kernel.log"))
    except Exception as e:  # papermill raises PapermillExecutionError; keep going either way
        status, reason = "FAILED", _last_error_line(e)
        full = disk_full_cause(e)
        if full is not None:
            reason = disk_full_reason(full, f"the outputs of {nb.stem} or its executed notebook")
            # the executed notebook may be cut anywhere: keep it, under a name no one takes for finished
            if (run_dir / nb.name).exists():
                (run_dir / nb.name).replace(run_dir / f"{nb.name}.incomplete")
            return NotebookResult(nb.stem, status, time.time() - t0, reason)
    secs = time.time() - t0
    if status == "OK":
        metrics = out_dir / "metrics.json"
        if not metrics.is_file():
            status, reason = "FAILED", "the notebook wrote no metrics.json"
        else:
            try:
                m = json.loads(metrics.read_text())
                status = m.get("status", "OK")
                reason = m.get("reason", "") if status in ("SKIPPED", "FAILED") else ""
            except json.JSONDecodeError as e:
                status, reason = "FAILED", f"malformed metrics.json: {e}"
    if (run_dir / nb.name).is_file():
        strip_progress(run_dir / nb.name)
        html = export_html(run_dir / nb.name)
        if html and html.startswith("disk full"):
            # reported OK before, with the HTML missing
            status, reason = "FAILED", html + ("" if not reason else f"; {reason}")
        elif html:
            reason = f"{reason}; {html}" if reason else html
    return NotebookResult(nb.stem, status, secs, reason)


# ----------------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage otherwise)
        raise UsageError(f"{message} (see ./run_all.sh --help)")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="./run_all.sh", description=(
        "Run every notebook of the NeuSight artifact with papermill into results/<timestamp>/, "
        "write SUMMARY.md and an environment capture, and tar the run. Exit codes: 0 all OK or "
        "SKIPPED, 1 a notebook failed, 2 usage error, 130/143 interrupted."))
    ap.add_argument("--quick", action="store_true", help="small subsets and quick training (minutes, not an hour)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only this notebook (e.g. 05_live_gpu or 05); repeatable")
    ap.add_argument("--out", metavar="DIR",
                    help="run folder (default results/<timestamp>); must not exist yet or be empty")
    ap.add_argument("--param", action="append", metavar="KEY=VALUE",
                    help="set a parameter of the selected notebooks (their parameters cell), e.g. "
                         "--only 05 --param time_budget_s=600 --param 'models=[\"gpt2_large\"]'; repeatable")
    ap.add_argument("--lab", nargs="?", const="", metavar="RESULTS_DIR",
                    help="open JupyterLab on notebooks/ (and on RESULTS_DIR, e.g. a finished run) instead of running")
    ap.add_argument("--notebooks-dir", metavar="DIR", default=str(NOTEBOOKS_DIR), help=argparse.SUPPRESS)
    ap.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)
    return ap


def _writable_parent(p: Path) -> Path | None:
    """The nearest existing ancestor of ``p`` if we may create ``p`` there, else None."""
    q = p
    while not q.exists():
        if q.parent == q:
            return None
        q = q.parent
    return q if q.is_dir() and os.access(q, os.W_OK | os.X_OK) else None


def check_args(argv: list[str] | None = None):
    """Parse and validate; returns (args, notebooks, run_dir). Raises UsageError (one line)."""
    a = parser().parse_args(argv)
    if a.lab is not None:
        if a.lab and not Path(a.lab).is_dir():
            raise UsageError(f"--lab: {a.lab} is not a folder (give a results folder, e.g. results/<timestamp>)")
        return a, [], None
    nb_dir = Path(a.notebooks_dir)
    if not nb_dir.is_dir():
        raise UsageError(f"--notebooks-dir: {nb_dir} is not a folder")
    notebooks = discover(nb_dir, a.only)
    if not notebooks:
        raise UsageError(f"no notebooks NN_*.ipynb in {nb_dir}")
    a.params = parse_params(a.param, notebooks)
    if a.out is not None and not a.out.strip():
        raise UsageError("--out: empty folder name (give a folder, or leave --out out for results/<timestamp>)")
    if a.out:
        try:    # a name too long for the file system (ENAMETOOLONG) fails the first look at it: a usage error too
            run_dir = Path(a.out).expanduser().resolve()
            if run_dir.exists() and not run_dir.is_dir():
                raise UsageError(f"--out {a.out}: exists and is not a folder")
            if run_dir.is_dir() and any(run_dir.iterdir()):
                raise UsageError(f"--out {a.out}: already holds files (an earlier run?); a run never mixes with "
                                 "another: remove the folder or choose a new one")
            if _writable_parent(run_dir) is None:
                raise UsageError(f"--out {a.out}: cannot create or write there (permission denied or not a folder)")
            tar_parent = run_dir.parent
            if tar_parent.exists() and not os.access(tar_parent, os.W_OK):
                raise UsageError(f"--out {a.out}: the tarball goes to {tar_parent}, which is not writable")
            tarball_path(run_dir).exists()      # its name is 24 characters longer: it may be the one too long
        except OSError as e:
            raise UsageError(_cannot_use(a.out, e)) from None
    else:
        run_dir = paths.REPO_ROOT / "results" / time.strftime("%Y%m%d-%H%M%S")
        while run_dir.exists():  # two runs started in the same second
            run_dir = run_dir.with_name(run_dir.name + "b")
        if _writable_parent(run_dir) is None:
            raise UsageError(f"cannot create {run_dir} (permission denied); use --out DIR")
    return a, notebooks, run_dir


def open_lab(results: str) -> int:
    """JupyterLab on the repository (notebooks/ importable), opened on ``results`` or notebooks/."""
    target = Path(results).resolve() if results else NOTEBOOKS_DIR
    root = Path(os.path.commonpath([str(paths.REPO_ROOT), str(target)]))
    url = "/lab/tree/" + str(target.relative_to(root))
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={root}",
           f"--ServerApp.default_url={url}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # containers often run as root, where JupyterLab refuses to start without this flag
        print("running as root (a container?): starting JupyterLab with --allow-root", flush=True)
        cmd.append("--allow-root")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(paths.REPO_ROOT), os.environ.get("PYTHONPATH")])))
    print("opening JupyterLab: " + " ".join(cmd), flush=True)
    if os.environ.get("NEUSIGHT_LAB_DRY_RUN"):
        return 0
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached




def _cannot_use(out, e: OSError) -> str:
    """The one line of an OSError met while looking at or making the run folder, its lock or its tarball's name."""
    if e.errno == errno.ENAMETOOLONG:
        return (f"--out {out}: {e.strerror} for this file system ({e.filename}); choose a shorter name "
                "(the tarball's is the folder's + 24 characters)")
    return f"--out {out}: cannot create it ({e.strerror or e}; a read-only place?)"


def claim(run_dir: Path, default: bool) -> Path:
    """Make ``run_dir`` this run's own: a lock file created exclusively, so that two runs started together
    on one folder never both run (the second stops with a usage error). A default folder is created
    exclusively too (two runs in the same second get different folders). Raises UsageError; then neither
    the lock nor a folder made here is left."""
    if default:
        while True:
            try:
                run_dir.mkdir(parents=True)
                break
            except FileExistsError:
                run_dir = run_dir.with_name(run_dir.name + "b")
    made = default
    try:
        try:
            run_dir.mkdir(parents=True)
            made = True
        except FileExistsError:
            pass
        fd = os.open(run_dir / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(f"--out {run_dir}: another run is using this folder ({LOCK_FILE}); choose another") from None
    except OSError as e:        # no lock was made; the folder goes if it was
        if made:
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise UsageError(_cannot_use(run_dir, e)) from None
    try:
        tar = tarball_path(run_dir)
        if tar.exists():   # (too long a name raises here: the folder's name fits, the tarball's does not)
            # the folder is new but an earlier run of the same name left its tarball beside it: never overwritten
            raise UsageError(f"--out {run_dir}: {tar} of an earlier run of that name is there and would be "
                             "overwritten; move it or choose another --out")
        with os.fdopen(fd, "w") as f:
            fd = None
            f.write(f"{os.getpid()}\n")
        others = [p.name for p in run_dir.iterdir() if p.name != LOCK_FILE]
        if others:   # an earlier run's files arrived between the check and the claim
            raise UsageError(f"--out {run_dir}: already holds files (an earlier run?); a run never mixes with "
                             "another: remove the folder or choose a new one")
    except (UsageError, OSError) as e:
        _unmake(run_dir, made, fd)
        if isinstance(e, UsageError):
            raise
        raise UsageError(_cannot_use(run_dir, e)) from None
    return run_dir


def _unmake(run_dir: Path, made: bool, fd: int | None) -> None:
    """A claim refused after its lock was made: the lock (and its open descriptor) gone, and the folder too when this
    claim made it (empty)."""
    if fd is not None:
        os.close(fd)
    (run_dir / LOCK_FILE).unlink(missing_ok=True)
    if made:
        with contextlib.suppress(OSError):
            run_dir.rmdir()


class _Interrupted(BaseException):
    def __init__(self, signame: str, code: int):
        super().__init__(signame)
        self.signame, self.code = signame, code


class _Fallback(threading.Thread):
    """What an armed signal leaves behind in case its exception is lost: after ``KERNEL_GRACE_S`` the run's
    kernels are killed, then the signal is sent again to the main thread every ``REDELIVER_S`` until
    ``cancel``. Killing the kernels is not enough: raised inside an asyncio callback (a CI run caught it in
    ``_set_result_unless_cancelled``), the exception is logged and dropped, the future that callback was to
    resolve never is, and the run waits on it for ever, dead kernel or not. A later delivery lands where the
    loop idles (its ``select``), from where it propagates."""

    def __init__(self, signum: int):
        super().__init__(daemon=True, name="neusight-signal-fallback")
        self.signum, self.main_ident, self.stopped = signum, threading.main_thread().ident, threading.Event()

    def run(self) -> None:
        if self.stopped.wait(KERNEL_GRACE_S):
            return
        notebook_kernel.stop_all()
        while not self.stopped.wait(REDELIVER_S):
            signal.pthread_kill(self.main_ident, self.signum)

    def cancel(self) -> None:
        self.stopped.set()


class _Signals:
    """SIGINT / SIGTERM of one run. Before ``arm`` a signal is only remembered; after it, it is raised as
    ``_Interrupted`` and starts a ``_Fallback``, since asyncio may swallow the exception (notebook_kernel);
    ``check`` raises a remembered one. The first signal is the one reported."""

    def __init__(self):
        self.got: _Interrupted | None = None
        self.armed = False
        self.fallback: _Fallback | None = None
        self.old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum, frame):
        self.got = self.got or _Interrupted(signal.Signals(signum).name, 128 + signum)
        if self.armed:
            if self.fallback is None:
                self.fallback = _Fallback(signum)
                self.fallback.start()
            raise self.got

    def arm(self) -> None:
        self.armed = True
        self.check()

    def check(self) -> None:
        if self.got is not None:
            raise self.got

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)

    def disarm(self) -> None:
        """The exception has arrived: no further raise (a re-delivered signal is only remembered)."""
        self.armed = False
        if self.fallback is not None:
            self.fallback.cancel()

    def ignore(self) -> None:
        self.disarm()
        for s in self.old:
            signal.signal(s, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    try:
        a, notebooks, run_dir = check_args(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.check_args:
        return 0
    if a.lab is not None:
        return open_lab(a.lab)
    # Signal handlers go in before the claim: a signal from here on is remembered (and raised once the
    # run is under way), so the run always ends with its record and never leaves its lock behind.
    signals = _Signals()
    try:
        try:
            run_dir = claim(run_dir, default=not a.out)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        try:
            reserve_space(run_dir)
        except OSError as e:
            (run_dir / RESERVE_FILE).unlink(missing_ok=True)
            (run_dir / LOCK_FILE).unlink(missing_ok=True)
            print(f"error: {run_dir}: not even {RESERVE_BYTES // 1024} KiB free for the run's record "
                  f"({e.strerror or e})", file=sys.stderr)
            return 2
        # Executed notebooks keep their outputs in the HTML: progress bars there are noise.
        os.environ.setdefault("TQDM_DISABLE", "1")
        # What the run's record imports (yaml, pandas, ...), imported while a signal is only remembered: a signal
        # raised inside an import leaves a half-initialised module that the record could then not import (0.5 s).
        from neusight_core import predictors  # noqa: F401
        from neusight_core.predictors import registry
        from neusight_core.data import release
        from neusight_core.run import run_estimate

        t_start = time.time()
        start: dict = {}     # how the run started (its calibration, weights to train), for later runs' estimates
        results: list[NotebookResult] = []
        interrupted: _Interrupted | None = None
        try:
            signals.arm()
            print(f"NeuSight artifact: {len(notebooks)} notebook(s), {'quick' if a.quick else 'full'} mode "
                  f"-> {run_dir}", flush=True)
            if not a.only:       # a whole run (the figures are for whole runs)
                try:    # recorded in run.json for the next run's estimate
                    start = {"calibration_s": round(run_estimate.calibrate(), 4),
                             "weights_missing": len(run_estimate.missing_weights(a.quick))}
                except Exception as e:      # the estimate must never stop a run
                    print(f"  expected: unknown ({type(e).__name__}: {e})", flush=True)
                else:
                    print(f"  {run_estimate.line(run_dir.parent, a.quick, start['calibration_s'], start['weights_missing'])}",
                          flush=True)
            for stem, given in a.params.items():
                if given:
                    print(f"  {stem} parameters: {format_params(given)}", flush=True)
            for i, nb in enumerate(notebooks, 1):
                print(f"[{i}/{len(notebooks)}] {nb.stem} ... (started at +{time.time() - t_start:.0f} s)", flush=True)
                t_nb = time.time()
                given = dict(a.params.get(nb.stem) or {})
                try:
                    r = run_notebook(nb, run_dir, a.quick, given)
                    signals.check()   # the signal's exception may have been lost inside the kernel client
                except _Interrupted:
                    signals.disarm()
                    results.append(NotebookResult(nb.stem, "INTERRUPTED", time.time() - t_nb,
                                                  "interrupted while running", given))
                    raise
                except Exception as e:  # the runner itself must survive anything a notebook does
                    full = disk_full_cause(e)
                    if full is None:
                        traceback.print_exc()
                    r = NotebookResult(nb.stem, "FAILED", time.time() - t_nb,
                                       disk_full_reason(full, run_dir) if full else f"runner error: {e}")
                r.parameters = given
                results.append(r)
                extra = f": {r.reason}" if r.reason else ""
                print(f"[{i}/{len(notebooks)}] {nb.stem} {r.status} in {r.seconds:.1f} s "
                      f"(elapsed {time.time() - t_start:.0f} s){extra}", flush=True)
        except _Interrupted as e:
            signals.disarm()
            interrupted = e
        interrupted = signals.got or interrupted    # also a signal between the last notebook's end and here
        # From here on the run is written out whole: further signals wait until it is.
        signals.ignore()
        notebook_kernel.stop_all()   # none outlives the run, whatever papermill left behind
        total = time.time() - t_start
        (run_dir / RESERVE_FILE).unlink(missing_ok=True)   # the room kept for the record below
        try:
            env = environment()
        except Exception as e:  # an incomplete capture must not lose the summary
            env = {"error": f"environment capture failed: {e}"}
        sig = interrupted.signame if interrupted else None
        try:
            # the tarball is made after the record, which already names it (run.json said null before);
            # if making it fails, the record is written again with why
            summary = write_record(run_dir, results, env, a.quick, total, sig,
                                   tarball=None if interrupted else str(tarball_path(run_dir)), start=start)
        except OSError as e:
            (run_dir / LOCK_FILE).unlink(missing_ok=True)
            what = disk_full_reason(e, run_dir) if is_disk_full(e) else f"{e.strerror or e} ({e.filename or run_dir})"
            print(f"FAILED: {what}: the run's record could not be written", file=sys.stderr, flush=True)
            return 1
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
        if interrupted:
            print(f"INTERRUPTED by {interrupted.signame}: {sum(r.status != 'INTERRUPTED' for r in results)} "
                  f"notebook(s) finished; no tarball.\nsummary: {summary}", flush=True)
            return interrupted.code
        n_failed = sum(r.status == "FAILED" for r in results)
        counts = ", ".join(f"{s} {sum(r.status == s for r in results)}" for s in ("OK", "SKIPPED", "FAILED"))
        try:
            tar = make_tarball(run_dir)
        except OSError as e:
            tar_name = tarball_path(run_dir)
            why = disk_full_reason(e, tar_name) if is_disk_full(e) else f"{e.strerror or e}"
            note = (f"FAILED: {why}; no tarball was made (the run folder is complete: "
                    f"`tar czf neusight_results_{run_dir.name}.tar.gz {run_dir.name}` where there is room)")
            try:
                write_record(run_dir, results, env, a.quick, total, None, tarball=note, start=start)
            except OSError:
                pass    # SUMMARY.md of the first write stands; the console says the rest
            print(f"done in {total / 60:.1f} min: {counts}\nsummary: {summary}\ntarball: {note}", flush=True)
            return 1
        print(f"done in {total / 60:.1f} min: {counts}")
        print(f"summary: {summary}\ntarball: {tar}")
        return 1 if n_failed else 0
    finally:
        # the caller's handlers back: ignored SIGINT / SIGTERM would outlive the run in a process that called
        # main() (a test, a notebook) and pass to every process it starts (an ignored signal survives exec)
        signals.restore()


if __name__ == "__main__":
    sys.exit(main())
