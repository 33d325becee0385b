"""Issue 36: the MLPs train on a CUDA GPU when there is one, the weights and SUMMARY.md say where, and a run
says at its start how long it will take. Without a GPU the CPU path is exercised (and stays deterministic)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from neusight_core.run import run_estimate, run_summary
from neusight_core import predictors as P
from neusight_core.predictors import nets


def test_training_device_is_the_cpu_here_and_says_so(monkeypatch):
    monkeypatch.delenv("NEUSIGHT_TRAIN_DEVICE", raising=False)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert nets.training_device().type == want
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "cpu")
    assert nets.training_device().type == "cpu"
    assert nets.device_label().startswith("cpu (1 thread, torch ")
    x, w = nets.as_tensors(np.arange(3.0), [1, 2])
    assert x.dtype == torch.float32 and x.device.type == "cpu" and w.tolist() == [1.0, 2.0]


def test_a_bad_training_device_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="NEUSIGHT_TRAIN_DEVICE must be one of auto, cpu, cuda, got 'tpu'"):
        nets.training_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_asked_for_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="NEUSIGHT_TRAIN_DEVICE=cuda but torch sees no CUDA GPU"):
        nets.training_device()


def test_train_loop_keeps_the_best_epoch_before_a_divergence(monkeypatch):
    """A loss that turns non-finite ends training and the best finite epoch's weights are kept (on the CPU the
    epoch stops at once; a GPU reads the flag once per epoch, docs in nets._train_loop)."""
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "cpu")
    torch.manual_seed(0)
    model = nets.MLP(2, 1, 8, 2)
    X, y = nets.as_tensors(np.random.default_rng(0).normal(size=(64, 2)), np.ones(64))
    calls = {"n": 0}

    def ratio(idx):
        calls["n"] += 1
        r = torch.nn.functional.softplus(model(X[idx])[:, 0]) / y[idx] + 1e-6
        # every call after the 12th (epoch 2 of 8 steps + validation) is NaN
        return r * float("nan") if calls["n"] > 12 else r
    out = nets.train_loop(model, ratio, 64, np.arange(8), epochs=5, batch=8, lr=1e-2, loss="ape", seed=0)
    assert out["diverged"] and out["best_epoch"] == 0 and np.isfinite(out["val_mape"])
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fitted_weights_record_where_they_trained(release_root, tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path))
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "cpu")
    p = P.get("habitat", quick=True)
    assert p.info["trained_on"].startswith("cpu (1 thread, torch ")
    meta = json.loads((P.folder("habitat", True, 0) / "meta.json").read_text())
    assert meta["info"]["trained_on"] == p.info["trained_on"]
    assert P.get("li", quick=True).info["trained_on"] == "cpu (numpy)"       # no MLP: numpy on the CPU
    assert " on cpu; " in P.describe_line(P.describe(p, True))


def _meta(folder, trained_on, secs):
    folder.mkdir(parents=True)
    info = {"train_seconds": secs, **({"trained_on": trained_on} if trained_on else {})}
    (folder / "meta.json").write_text(json.dumps({"info": info}))


def test_summary_says_where_each_recipe_trained(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path))
    gpu = "cuda: NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130)"
    _meta(P.folder("neusight-paper", False, 0), gpu, 177.4)
    _meta(P.folder("neusight-paper", False, 1), gpu, 183.6)
    _meta(P.folder("neusight-paper", False, 2), None, 900.0)
    lines = run_summary.weights_lines(quick=False)
    assert lines == ["- neusight-paper (full weights) in 177-900 s per seed: seeds 0, 1 trained on " + gpu
                     + "; seed 2 trained on cpu (not recorded: trained before training devices were recorded)"]
    assert run_summary.weights_lines(quick=True) == []


def _run(results, name, quick, seconds, cpus, status="OK", **start):
    d = results / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"quick": quick, "seconds": seconds, "interrupted": None, **start,
                                            "notebooks": [{"status": status}] * 7}))
    (d / "environment.json").write_text(json.dumps({"cpu_count": cpus}))


def test_the_estimate_takes_this_machines_newest_finished_run_of_the_mode_and_weights(tmp_path):
    import os
    cpus = os.cpu_count()
    _run(tmp_path, "20261101-000000", True, 600, cpus, weights_missing=0, calibration_s=0.5)
    _run(tmp_path, "20261102-000000", True, 240, cpus, weights_missing=0, calibration_s=0.5)
    _run(tmp_path, "20261103-000000", True, 60, cpus, status="FAILED", weights_missing=0)   # a failed run says nothing
    _run(tmp_path, "20261104-000000", True, 30, cpus + 1, weights_missing=0)                # another machine
    _run(tmp_path, "20261105-000000", False, 3000, cpus, weights_missing=0)                 # another mode
    _run(tmp_path, "20261106-000000", True, 900, cpus, weights_missing=4, calibration_s=0.5)  # weights to train
    assert run_estimate.earlier_run(tmp_path, quick=True, missing=0) == (4.0, "20261102-000000", 0.5)
    assert run_estimate.earlier_run(tmp_path, quick=True, missing=4)[1] == "20261106-000000"
    # the same run, on a machine (or at a moment) that does the calibration's work twice as slowly: twice as long
    line = run_estimate.line(tmp_path, True, calibration_s=1.0, missing=0)
    assert line == ("expected: about 8.0 min (this machine's last quick run with 0 weights to train, 20261102-000000: "
                    "4.0 min at calibration 0.50 s, now 1.00 s)")


def test_without_an_earlier_run_the_estimate_scales_the_measured_references_by_the_calibration(tmp_path):
    ref = run_estimate.MEASURED_RUNS
    total = len(run_estimate.FULL_RECIPES) * len(run_estimate.QUICK_SEEDS)
    cal = run_estimate.REFERENCE_CALIBRATION_S
    none, _ = run_estimate.estimate(tmp_path, True, 0, cal)
    every, _ = run_estimate.estimate(tmp_path, True, total, cal)
    # each measured time scaled from its own run's calibration (none recorded: the kind's reference) to this one
    at = {k: m * cal / (c or cal) for k, (m, c, _) in ref.items()}
    assert (none, every) == pytest.approx((at[("quick", "none")], at[("quick", "all")]))
    assert at[("quick", "all")] != ref[("quick", "all")][0]          # that run recorded a calibration of its own
    # half the weights to train, on a machine twice as slow: twice the time half-way between the two measurements
    half, source = run_estimate.estimate(tmp_path, True, total // 2, 2 * cal)
    assert half == pytest.approx(2 * (none + (every - none) * (total // 2) / total))
    assert f"{total // 2} of {total} NeuSight weights to train" in source and "slower 2-core kind" in source
    # an earlier run recorded without its calibration or weights does not stand in for the references
    _run(tmp_path, "20261101-000000", True, 60, __import__("os").cpu_count())
    assert run_estimate.estimate(tmp_path, True, 0, cal)[0] == none


def test_the_calibration_measures_slower_work_as_slower():
    import threading
    quiet = run_estimate.calibrate(reps=1)
    stop = threading.Event()
    busy = [threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)]) for _ in range(2)]
    for t in busy:      # two Python threads competing for the interpreter lock with the calibration's Python part
        t.start()
    try:
        loaded = run_estimate.calibrate(reps=1)
    finally:
        stop.set()
        for t in busy:
            t.join()
    assert 0 < quiet < 5 and loaded > 1.3 * quiet


def test_the_full_estimate_counts_the_weights_still_to_train(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAIN_DEVICE", "cpu")
    monkeypatch.setattr(run_estimate, "missing_weights", lambda quick=False: ["neusight seed 1", "neusight seed 2"])
    line = run_estimate.line(tmp_path, False, run_estimate.REFERENCE_CALIBRATION_S)
    assert line.startswith("expected: about ") and "2 of 6 NeuSight weights to train" in line
    assert run_estimate.line(tmp_path, False, 0.5, missing=0) != line
