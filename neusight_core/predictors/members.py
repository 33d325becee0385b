"""Training the MLP members of a NeuSight class: in this process, or in a shared pool of processes.

A member is one network of one op class of one seed (``ensemble`` > 1 gives a class several). Each member
draws its initialisation and batch order from its own seed (``seed * 1000 + i``) and trains on one thread
(``nets.train_loop``), so it depends on nothing but its inputs: trained here or in a worker process, its
weights are the same bits (tests/test_members.py). That is what lets a machine with more cores than seeds use
them: ``train_parallel`` gives every (recipe, seed) a thread of its own and the members of all of them one pool
of processes (``pool``), so a 16-core machine trains the ~30 networks of a full run side by side instead of six
seeds one after another class by class. Without a pool (the default, and on a machine with no more cores than
seeds) members train in the calling process, in order, as before.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

# the process pool members go to (``pool``); None: train in the calling process
_POOL = None
# what was submitted to it (cancelled when the block is left by an exception)
_FUTURES: list = []


@dataclass
class Member:
    """Everything one member's training needs, picklable: the net's shape, its data as numpy arrays and the
    loop's settings (``nets.train_loop``'s arguments)."""
    n_in: int
    n_out: int
    hidden: int
    layers: int
    seed: int
    X: np.ndarray            # scaled inputs
    waves: np.ndarray
    ratio: np.ndarray        # roofline time / measured time
    val: np.ndarray          # validation rows
    epochs: int
    batch: int
    lr: float
    loss: str
    form: str
    weight_decay: float
    optimizer: str
    schedule: str
    val_weight: np.ndarray | None
    grad_clip: float | None
    label: str = ""          # for the pool's progress lines: recipe, class, seed, member


def train(m: Member, bar=None) -> tuple[dict, dict]:
    """Train one member; returns (its best state dict, ``train_loop``'s record with its ``seconds``)."""
    import time

    import torch
    t0 = time.perf_counter()

    from neusight_core.predictors.features import utilisation
    from neusight_core.predictors.nets import MLP, as_tensors, train_loop
    Xt, wt, by = as_tensors(m.X, m.waves, m.ratio)
    torch.manual_seed(m.seed)
    net = MLP(m.n_in, m.n_out, m.hidden, m.layers)

    def ratio(idx):
        # the authors' form trains unclamped, as their code does (a clamp at U_MIN gave rows with
        # u <= 0 no gradient: seed 1 of their recipe kept BMM validation MAPE at 148 %)
        return by[idx] / utilisation(net(Xt[idx]), wt[idx], m.form, clamp_u=m.form != "authors")

    rec = train_loop(net, ratio, len(m.X), m.val, m.epochs, m.batch, m.lr, m.loss, m.seed, bar,
                     weight_decay=m.weight_decay, optimizer=m.optimizer, schedule=m.schedule,
                     val_weight=m.val_weight, grad_clip=m.grad_clip)
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return {k: v.detach().cpu() for k, v in net.state_dict().items()}, rec


class _EpochLog:
    """A worker's progress: one line per quarter of its epochs (a pool's members have no bars; a run cut short
    still says how far each member got and at what rate)."""

    def __init__(self, label: str, epochs: int):
        import time
        self.label, self.epochs, self.done, self.t0 = label, epochs, 0, time.perf_counter()
        self.every = max(1, epochs // 4)

    def update(self, n: int = 1) -> None:
        import sys
        import time
        self.done += n
        if self.done % self.every == 0 or self.done >= self.epochs:
            print(f"[member {self.label}] epoch {self.done}/{self.epochs} at {time.perf_counter() - self.t0:.0f} s",
                  file=sys.stderr, flush=True)

    def set_postfix(self, **_) -> None:
        pass


def _train_in_worker(m: Member) -> tuple[dict, dict]:
    return train(m, _EpochLog(m.label, m.epochs))


def start(members: list[Member], bar=None) -> list:
    """Start training ``members``; returns one callable per member that waits for and returns its
    (state, record). With a pool, every member is queued at once (the caller starts all its classes before
    it waits on any); without one, each trains in this process when its callable is called."""
    if _POOL is None:
        return [lambda m=m: train(m, bar) for m in members]
    futures = [_POOL.submit(_train_in_worker, m) for m in members]
    _FUTURES.extend(futures)

    def wait(f, m):
        out = f.result()
        if bar is not None:
            bar.update(m.epochs)
        return out
    return [lambda f=f, m=m: wait(f, m) for f, m in zip(futures, members)]


def pooled() -> bool:
    """Members go to a pool (their progress shows as whole members, not epochs)."""
    return _POOL is not None


@contextlib.contextmanager
def pool(workers: int):
    """Members started inside this block train in ``workers`` spawned processes (one thread each)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    global _POOL
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        _POOL = ex
        try:
            yield ex
        except BaseException:
            # Ctrl-C or a failed job: cancel the members not started yet instead of training them all first
            for f in _FUTURES:
                f.cancel()
            raise
        finally:
            _POOL = None
            _FUTURES.clear()
