"""Runs the artifact: every notebook in order with papermill, then SUMMARY.md, env capture, tarball.

``./run_all.sh`` is a thin wrapper (set-up, then ``python -m neusight_core.runner``).
Layout of one run, ``results/<timestamp>/``:
  <NN_name>.ipynb, <NN_name>.html     executed notebook (kept when it fails: it is the evidence)
  <NN_name>/                          the notebook's own outputs: tables/, figures/, metrics.json
  SUMMARY.md, run.json, environment.json
and ``results/neusight_results_<timestamp>.tar.gz`` holding the run folder.

A notebook is OK when it ran and its metrics.json says OK, SKIPPED when metrics.json says so
(e.g. no GPU), FAILED when it raised or wrote no metrics.json. A failure never stops the run; the
exit code is 1 when any notebook failed.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from . import paths, release

NOTEBOOKS_DIR = paths.REPO_ROOT / "notebooks"


@dataclass
class NotebookResult:
    name: str
    status: str          # OK | SKIPPED | FAILED
    seconds: float
    reason: str = ""


def discover(folder: Path, only: list[str] | None = None) -> list[Path]:
    """Notebooks named NN_*.ipynb in order; ``only`` filters by name, with or without NN_ / .ipynb."""
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        want = {o.removesuffix(".ipynb") for o in only}
        chosen = [p for p in found if p.stem in want or p.stem[3:] in want or p.stem[:2] in want]
        missing = want - {p.stem for p in chosen} - {p.stem[3:] for p in chosen} - {p.stem[:2] for p in chosen}
        if missing:
            names = ", ".join(p.stem for p in found)
            raise SystemExit(f"error: unknown notebook(s) {', '.join(sorted(missing))}; known: {names}")
        return chosen
    return found


def _export_html(ipynb: Path) -> None:
    try:
        from nbconvert import HTMLExporter
        import nbformat

        body, _ = HTMLExporter().from_notebook_node(nbformat.read(ipynb, as_version=4))
        ipynb.with_suffix(".html").write_text(body)
    except Exception as e:  # an export problem must not turn an OK notebook into a failure
        print(f"    (HTML export of {ipynb.name} failed: {e})", flush=True)


def _last_error_line(exc: BaseException) -> str:
    text = str(getattr(exc, "evalue", "") or exc).strip().splitlines()
    ename = getattr(exc, "ename", type(exc).__name__)
    return f"{ename}: {text[-1] if text else ''}"[:300]


def run_notebook(nb: Path, run_dir: Path, quick: bool, extra: dict | None = None) -> NotebookResult:
    import papermill as pm

    out_dir = run_dir / nb.stem
    params = {"output_dir": str(out_dir), "quick": bool(quick), **(extra or {})}
    t0 = time.time()
    status, reason = "OK", ""
    try:
        pm.execute_notebook(str(nb), str(run_dir / nb.name), parameters=params, cwd=str(paths.REPO_ROOT),
                            kernel_name="python3", progress_bar=sys.stdout.isatty(), log_output=False)
    except Exception as e:  # papermill raises PapermillExecutionError; keep going either way
        status, reason = "FAILED", _last_error_line(e)
    secs = time.time() - t0
    if status == "OK":
        metrics = out_dir / "metrics.json"
        if not metrics.is_file():
            status, reason = "FAILED", "the notebook wrote no metrics.json"
        else:
            try:
                m = json.loads(metrics.read_text())
                status = m.get("status", "OK")
                reason = m.get("reason", "") if status == "SKIPPED" else ""
            except json.JSONDecodeError as e:
                status, reason = "FAILED", f"malformed metrics.json: {e}"
    if (run_dir / nb.name).is_file():
        _export_html(run_dir / nb.name)
    return NotebookResult(nb.stem, status, secs, reason)


# ----------------------------------------------------------------------------- environment
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


# ----------------------------------------------------------------------------- summary
def write_summary(run_dir: Path, results: list[NotebookResult], env: dict, quick: bool, total: float) -> Path:
    icon = {"OK": "OK", "SKIPPED": "SKIPPED", "FAILED": "**FAILED**"}
    lines = [f"# NeuSight artifact run {run_dir.name}", "",
             f"- mode: {'quick' if quick else 'full'}; total wall time {total / 60:.1f} min",
             f"- artifact commit {env['artifact_commit'][:12] or '?'}{' (uncommitted changes)' if env['artifact_dirty'] else ''}; "
             f"release commit {env['release'].get('commit', '?')[:7]}; checksums: {env['release'].get('checksums', '?')}",
             f"- Python {env['python']} on {env['platform']}; GPU: "
             + (", ".join(env['gpu']['names']) if env['gpu'].get('available') else f"none ({env['gpu'].get('reason', '')})"),
             "", "| notebook | status | wall time (s) | reason |", "|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {r.name} | {icon[r.status] if r.status in icon else r.status} | {r.seconds:.1f} | {r.reason} |")
    for r in results:
        part = run_dir / r.name / "summary.md"
        if part.is_file():
            lines += ["", f"## {r.name}", "", part.read_text().strip()]
    p = run_dir / "SUMMARY.md"
    p.write_text("\n".join(lines) + "\n")
    return p


def make_tarball(run_dir: Path) -> Path:
    tar_path = run_dir.parent / f"neusight_results_{run_dir.name}.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name)
    return tar_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./run_all.sh", description=(
        "Run every notebook of the NeuSight artifact with papermill into results/<timestamp>/, "
        "write SUMMARY.md and an environment capture, and tar the run."))
    ap.add_argument("--quick", action="store_true", help="small subsets and quick training (minutes, not an hour)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only this notebook (e.g. 05_live_gpu or 05); repeatable")
    ap.add_argument("--out", metavar="DIR", help="run folder (default results/<timestamp>)")
    ap.add_argument("--notebooks-dir", metavar="DIR", default=str(NOTEBOOKS_DIR), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    notebooks = discover(Path(a.notebooks_dir), a.only)
    if not notebooks:
        print(f"error: no notebooks NN_*.ipynb in {a.notebooks_dir}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(a.out).resolve() if a.out else paths.REPO_ROOT / "results" / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"NeuSight artifact: {len(notebooks)} notebook(s), {'quick' if a.quick else 'full'} mode -> {run_dir}", flush=True)

    t_start = time.time()
    results: list[NotebookResult] = []
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb.stem} ... (started at +{time.time() - t_start:.0f} s)", flush=True)
        try:
            r = run_notebook(nb, run_dir, a.quick)
        except Exception as e:  # the runner itself must survive anything a notebook does
            traceback.print_exc()
            r = NotebookResult(nb.stem, "FAILED", 0.0, f"runner error: {e}")
        results.append(r)
        extra = f": {r.reason}" if r.reason else ""
        print(f"[{i}/{len(notebooks)}] {nb.stem} {r.status} in {r.seconds:.1f} s "
              f"(elapsed {time.time() - t_start:.0f} s){extra}", flush=True)

    env = environment()
    (run_dir / "environment.json").write_text(json.dumps(env, indent=2))
    total = time.time() - t_start
    (run_dir / "run.json").write_text(json.dumps(
        {"quick": a.quick, "seconds": total, "notebooks": [asdict(r) for r in results]}, indent=2))
    summary = write_summary(run_dir, results, env, a.quick, total)
    tar = make_tarball(run_dir)
    n_failed = sum(r.status == "FAILED" for r in results)
    print(f"done in {total / 60:.1f} min: " + ", ".join(f"{s} {sum(r.status == s for r in results)}"
                                                         for s in ("OK", "SKIPPED", "FAILED")))
    print(f"summary: {summary}\ntarball: {tar}")
    return 1 if n_failed else 0


if __name__ == "__main__":
    sys.exit(main())
