"""How long a run of ``./run_all.sh`` will take here, said when it starts, with what the figure rests on.

The figure comes from this machine's measured speed. The better source: this machine's newest finished run of the
same mode that started with as many NeuSight weights left to train (its ``run.json`` under ``results/``, same CPU
count). Otherwise the run times measured on the slower 2-core machine kind (``MEASURED_RUNS``, docs/evaluators.md "Run
times"), interpolated by how many of the mode's NeuSight weights are left to train, since training is most of a run
that has them to train and almost nothing of one that has not. Either way the time is scaled by a short calibration
(``calibrate``: a fixed piece of the run's kind of work, about 1.5 s): a machine, or a moment with other work beside
it, that does that work slower runs the notebooks slower by about as much. Each run records its calibration and its
count of weights left to train in run.json, for the next run's estimate.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from neusight_core.predictors import registry

#: the mode's NeuSight weights: the reported recipes (the registry's), seeds 0-2 in a full run (notebooks 03, 04, 07),
#: 0-1 in a quick run (notebook 03 cuts its seeds to two)
FULL_RECIPES = registry.reported("recipe")
FULL_SEEDS = (0, 1, 2)
QUICK_SEEDS = (0, 1)

#: calibration (``calibrate``, median seconds of one repetition) of the slower 2-core kind (AMD EPYC), calm: 0.384-0.397 s
#: in three calls and 0.397 s at the start of a quick run, 2026-12-07 (0.46-0.56 s measured right after a run, still busy)
REFERENCE_CALIBRATION_S = 0.39
#: measured wall times on the slower 2-core kind: (mode, every weight to train / none) -> (minutes, the calibration
#: measured at that run's start in seconds (None: not recorded, taken as the kind's reference), source)
MEASURED_RUNS = {
    ("quick", "all"): (6.8, 0.37, "quick run in a fresh clone, 6832073, 2026-12-07"),
    ("quick", "none"): (2.2, None, "quick run with its weights trained, f065380, 2026-12-07"),
    ("full", "all"): (86.6, 0.43, "full run in a fresh clone, c51d246, 2026-12-07, other work beside it"),
    ("full", "none"): (15.6, None, "full run with its weights trained, 2026-11-24, the tests beside it"),
}


def seeds(quick: bool) -> tuple[int, ...]:
    return QUICK_SEEDS if quick else FULL_SEEDS


def calibrate(reps: int = 3) -> float:
    """Median seconds of ``reps`` repetitions of a fixed piece of work like the run's: 150 Adam steps of a small MLP
    on one torch thread (the training, one thread per process) and 300,000 dictionary updates (the tracing and the
    tables, pure Python). Larger means slower; about 0.39 s on the slower 2-core kind when calm."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(512, 16, generator=gen), torch.randn(512, 1, generator=gen)
        layers = [torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                  torch.nn.Linear(256, 1)]
        net = torch.nn.Sequential(*layers)
        opt = torch.optim.Adam(net.parameters(), 1e-3)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(150):
                opt.zero_grad()
                ((net(x) - y) ** 2).mean().backward()
                opt.step()
            d: dict[int, int] = {}
            for i in range(300_000):
                d[i % 1000] = d.get(i % 1000, 0) + i
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def earlier_run(results: Path, quick: bool, missing: int | None = None,
                cpu_count: int | None = None) -> tuple[float, str, float | None] | None:
    """(minutes, run folder name, its calibration or None) of the newest finished run of this mode under ``results``
    whose machine had ``cpu_count`` CPUs (default: this one's), no failed notebook and, when ``missing`` is given, that
    many NeuSight weights left to train at its start (runs that did not record it do not match); or None."""
    cpu_count = os.cpu_count() if cpu_count is None else cpu_count
    best = None
    for rj in sorted(Path(results).glob("*/run.json")):
        try:
            run = json.loads(rj.read_text())
            env = json.loads((rj.parent / "environment.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(run, dict) or not isinstance(env, dict):
            continue
        done = run.get("interrupted") is None and all(n.get("status") in ("OK", "SKIPPED")
                                                      for n in run.get("notebooks") or [{}])
        same = missing is None or run.get("weights_missing") == missing
        if (bool(run.get("quick")) == quick and done and same and env.get("cpu_count") == cpu_count
                and isinstance(run.get("seconds"), (int, float)) and len(run.get("notebooks") or []) >= 7):
            cal = run.get("calibration_s")
            best = (float(run["seconds"]) / 60, rj.parent.name,
                    float(cal) if isinstance(cal, (int, float)) and cal > 0 else None)   # names sort by time
    return best


def missing_weights(quick: bool = False) -> list[str]:
    """The mode's NeuSight weights not trained here (``recipe seed N``); reads meta.json files only."""
    from neusight_core import predictors as P
    return [f"{n} seed {s}" for n in FULL_RECIPES for s in seeds(quick) if not P.is_trained(n, quick, s)]


def estimate(results: Path, quick: bool, missing: int, calibration_s: float) -> tuple[float, str]:
    """(minutes, what they rest on) for a run of this mode starting with ``missing`` NeuSight weights to train, on a
    machine whose ``calibrate()`` took ``calibration_s`` now."""
    mode = "quick" if quick else "full"
    seen = earlier_run(results, quick, missing)
    if seen:
        minutes, name, cal = seen
        if cal is None:
            return minutes, f"this machine's last {mode} run with {missing} weights to train, {name}: {minutes:.1f} min"
        return (minutes * calibration_s / cal,
                f"this machine's last {mode} run with {missing} weights to train, {name}: {minutes:.1f} min at "
                f"calibration {cal:.2f} s, now {calibration_s:.2f} s")
    total = len(FULL_RECIPES) * len(seeds(quick))
    (hi, hi_cal, hi_src), (lo, lo_cal, lo_src) = MEASURED_RUNS[(mode, "all")], MEASURED_RUNS[(mode, "none")]
    share = min(max(missing / total, 0.0), 1.0) if total else 0.0
    # each measured time at its own run's calibration, so that a busy reference run does not read as a slow kind
    hi_now, lo_now = (m * calibration_s / (cal or REFERENCE_CALIBRATION_S) for m, cal in ((hi, hi_cal), (lo, lo_cal)))
    said = [f"{m:g} min with {what} to train ({src}{f', calibration {cal:.2f} s' if cal else ''})"
            for m, cal, src, what in ((hi, hi_cal, hi_src, "all"), (lo, lo_cal, lo_src, "none"))]
    return (lo_now + share * (hi_now - lo_now),
            f"{missing} of {total} NeuSight weights to train; measured on the slower 2-core kind: {said[0]}, {said[1]}; "
            f"scaled by this machine's calibration {calibration_s:.2f} s against each run's (else that kind's "
            f"{REFERENCE_CALIBRATION_S:.2f} s)")


def line(results: Path, quick: bool, calibration_s: float, missing: int | None = None) -> str:
    """One line: the expected wall time of this run and what it rests on."""
    try:
        missing = len(missing_weights(quick)) if missing is None else missing
        minutes, source = estimate(results, quick, missing, calibration_s)
    except Exception as e:          # the estimate must never stop a run
        return f"expected: unknown ({type(e).__name__}: {e})"
    gpu = None if quick or not missing else _cuda_name()
    note = f"; the weights train on the GPU {gpu} here, so probably less" if gpu else ""
    shown = f"{minutes:.1f}" if minutes < 10 else f"{minutes:.0f}"
    return f"expected: about {shown} min ({source}){note}"


def _cuda_name() -> str | None:
    """The GPU the weights would train on (``nets.training_device``), or None; without importing torch when
    ``NEUSIGHT_TRAIN_DEVICE=cpu``."""
    if os.environ.get("NEUSIGHT_TRAIN_DEVICE", "auto").strip().lower() == "cpu":
        return None
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None
