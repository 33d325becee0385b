"""Issue 36, a full run that uses the machine: a NeuSight member trains to the same bits in this process and in a
pool of processes, so ``train_parallel`` may spread the members of all its jobs over the cores
(predictors/members.py) without changing a weight."""
from __future__ import annotations

import os

import numpy as np
import pytest

from neusight_core.predictors import members, training


def _member(seed: int = 7, epochs: int = 3) -> members.Member:
    rng = np.random.default_rng(0)
    n = 300
    X = rng.normal(size=(n, 4)).astype(np.float32)
    return members.Member(n_in=4, n_out=2, hidden=16, layers=3, seed=seed, X=X,
                          waves=rng.uniform(1, 8, n).astype(np.float32),
                          ratio=rng.uniform(0.2, 0.9, n).astype(np.float32), val=np.arange(0, n, 5), epochs=epochs,
                          batch=32, lr=1e-3, loss="ape", form="ours", weight_decay=0.0, optimizer="adam",
                          schedule="onecycle", val_weight=None, grad_clip=None, label="toy")


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def test_a_member_trains_to_the_same_bits_here_and_in_a_pool():
    here = [w() for w in members.start([_member(7), _member(8)])]
    assert not members.pooled()
    with members.pool(2):
        assert members.pooled()
        pooled = [w() for w in members.start([_member(7), _member(8)])]
    assert not members.pooled()
    for (s1, r1), (s2, r2) in zip(here, pooled):
        assert _same(s1, s2)
        assert r1["val_mape"] == r2["val_mape"] and r1["history"] == r2["history"]
        assert r2["seconds"] > 0
    # and the seed matters: two members of one class are not the same network
    assert not _same(here[0][0], here[1][0])


def test_pooled_jobs_save_the_weights_one_process_saves(tmp_path, monkeypatch):
    """Two small jobs of the authors' recipe (300 records per class, quick epochs) through the pooled path of
    train_parallel, against the same jobs trained one after the other in this process."""
    jobs = [("neusight-paper", True, s, None, 300) for s in (0, 1)]
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path / "pooled"))
    monkeypatch.delenv("NEUSIGHT_TRAIN_DEVICE", raising=False)
    done = dict(training._train_members_pooled(jobs, 2))
    assert set(done) == set(jobs) and all(t > 0 for t in done.values())
    assert "NEUSIGHT_TRAIN_DEVICE" not in os.environ        # the pool's CPU choice does not leak out
    pooled = {j: np.load(training.folder(*j) / "state.npz") for j in jobs}
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path / "here"))
    for j in jobs:
        training.get(j[0], quick=j[1], seed=j[2], rows=j[4])
        here = np.load(training.folder(*j) / "state.npz")
        assert sorted(here.files) == sorted(pooled[j].files)
        assert all(np.array_equal(here[k], pooled[j][k]) for k in here.files), j


def test_train_workers_must_be_positive(capsys):
    from neusight_core.__main__ import main
    assert main(["train", "--predictor", "roofline", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "--workers must be at least 1, got 0" in err and "Traceback" not in err


def test_a_threads_torch_settings_are_its_own():
    """Jobs train in threads of one process (the pooled path): each sets one torch thread and flush-to-zero for
    itself (nets.one_thread / flush_denormals), so a thread that finishes cannot switch them back under another.
    That holds because both are per-thread state (OpenMP's thread count, the CPU's MXCSR flags)."""
    import threading

    import torch

    from neusight_core.predictors import nets
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    inside, release, seen = threading.Event(), threading.Event(), []

    def job():
        with nets.one_thread():
            inside.set()
            release.wait(10)
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=job)
    t.start()
    inside.wait(10)
    seen.append(torch.get_num_threads())       # this thread's count, while the other is inside one_thread
    with nets.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    release.set()
    t.join(10)
    assert seen == [2, 1]
    assert torch.get_num_threads() == 2
    torch.set_num_threads(before)


def test_an_interrupted_pool_drops_its_queued_members():
    """Ctrl-C during a pooled training stops it: the members still queued are cancelled, not trained first."""
    from concurrent.futures import CancelledError
    waits = []
    with pytest.raises(KeyboardInterrupt):
        with members.pool(1):
            waits += members.start([_member(s, epochs=200) for s in range(6)])
            raise KeyboardInterrupt
    with pytest.raises(CancelledError):
        waits[-1]()
