"""The torch side of the predictors: the MLP and its training loop. Imported only to train; a
prediction runs the trained weights with numpy (``base.NumpyMLP``), so answering a question does
not import torch."""
from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import torch
from torch import nn

#: NEUSIGHT_TRAIN_DEVICE: where the MLPs train. ``auto`` (the default): the first CUDA GPU when torch sees
#: one (the authors trained on GPUs), else the CPU; ``cpu`` / ``cuda`` force one.
TRAIN_DEVICES = ("auto", "cpu", "cuda")


def training_device() -> torch.device:
    """The device the MLPs train on (``NEUSIGHT_TRAIN_DEVICE``, see ``TRAIN_DEVICES``)."""
    want = os.environ.get("NEUSIGHT_TRAIN_DEVICE", "auto").strip().lower() or "auto"
    if want not in TRAIN_DEVICES:
        raise ValueError(f"NEUSIGHT_TRAIN_DEVICE must be one of {', '.join(TRAIN_DEVICES)}, got {want!r}")
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("NEUSIGHT_TRAIN_DEVICE=cuda but torch sees no CUDA GPU "
                           f"(torch {torch.__version__}, {'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU build'})")
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def device_label(dev: torch.device | None = None) -> str:
    """Where weights were trained, for their metadata and SUMMARY.md: ``cpu (1 thread, torch 2.13.0)`` or
    ``cuda: NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130)``."""
    dev = training_device() if dev is None else dev
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)} (torch {torch.__version__})"
    return f"cpu (1 thread, torch {torch.__version__})"


def as_tensors(*arrays) -> list[torch.Tensor]:
    """float32 tensors of ``arrays`` on the training device (the data a ``ratio_fn`` closes over)."""
    dev = training_device()
    return [torch.as_tensor(np.asarray(a, dtype=np.float32), device=dev) for a in arrays]


class MLP(nn.Module):
    def __init__(self, n_in: int, n_out: int, hidden: int, layers: int):
        super().__init__()
        dims = [n_in] + [hidden] * (layers - 1)
        mods = []
        for a, b in zip(dims[:-1], dims[1:]):
            mods += [nn.Linear(a, b), nn.ReLU()]
        mods.append(nn.Linear(dims[-1], n_out))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


def relative_loss(pred_over_y: torch.Tensor, kind: str) -> torch.Tensor:
    """Relative-error losses on the ratio predicted / measured."""
    r = pred_over_y
    if kind == "ape":
        return (r - 1).abs().mean()
    if kind == "smape":
        return (2 * (r - 1).abs() / (r + 1)).mean()
    if kind == "smape_authors":
        # the authors' "SMAPE": mean |(t - p) / (t + p)| = |(r - 1) / (r + 1)| (neusight/Model/trainer.py
        # 42-43); the absolute value of the whole fraction keeps it positive when p < 0 (unclamped u)
        return ((r - 1) / (r + 1)).abs().mean()
    if kind == "logratio":
        return torch.log(r).abs().mean()
    raise ValueError(f"unknown loss {kind!r}")


@contextlib.contextmanager
def flush_denormals():
    """Treat denormal floats as zero while training (the CPU's flush-to-zero mode). Adam's second moments
    and the gradients of the small-learning-rate classes decay into the denormal range (below 1.2e-38),
    where every multiply takes a slow microcode path: on one core of this 2-core Xeon, the authors' LINEAR
    recipe trained 6 epochs in 26.8 s without and 16.3 s with it, BMM 3 epochs in 34.1 s and 29.5 s, with the
    same validation MAPE after every epoch (benchmarks/train_speed.py). A whole seed in the full run (two
    processes on the 2 cores): `neusight-paper` 362-369 s instead of 776-828 s, `neusight` 334-345 s instead
    of 731-741 s, and the saved weights of seed 0 are bit for bit the same as without it (a denormal next to
    Adam's eps, 1e-8, or next to a weight changes nothing at float32 precision). Switched back off
    afterwards, so predictions made in the same process are unaffected."""
    on = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if on:
            torch.set_flush_denormal(False)


@contextlib.contextmanager
def one_thread():
    """Train on one thread, whatever the process has. The thread count changes the order of torch's float
    reductions, and so the weights: Habitat's conv network for the A100-80GB fold (seed 2) gave 194.3 % MAPE trained
    on one thread and 211.9 % on two. ``train_parallel``'s workers always had one thread each, while a predictor
    trained in the calling process (``neusight train``, a first ``predict``, notebook 03's conv baselines) had all
    the cores': the same recipe and seed then gave other weights by the path that trained them. With this, a seed's
    weights do not depend on that path (nor on the number of cores). The cost: one training alone in a process runs
    on one core (an 8 x 512 MLP step at batch 128: 8.8 ms on one thread, 5.3 ms on two, this 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def train_loop(model: nn.Module, ratio_fn, n: int, val_idx: np.ndarray, epochs: int, batch: int, lr: float,
               loss: str, seed: int, bar=None, weight_decay: float = 0.0, optimizer: str = "adam",
               schedule: str = "onecycle", val_weight: np.ndarray | None = None,
               grad_clip: float | None = None) -> dict:
    """Minimise ``loss`` of ``ratio_fn(idx)`` (predicted / measured for rows idx) over the rows not in
    ``val_idx``; keep the weights of the epoch with the lowest validation MAPE (training GPUs only).

    ``optimizer`` adam | adamw (torch's AdamW, default decay 0.01 unless ``weight_decay`` is given),
    ``schedule`` onecycle | constant; ``val_weight`` weights the validation APEs (e.g. by kernel
    time). ``grad_clip`` caps the global norm of each step's gradient (None: no cap, as the authors
    train). An epoch whose loss is not finite ends training; the best earlier epoch is kept.

    The model moves to ``training_device()``; ``ratio_fn``'s tensors must live there (``as_tensors``). The
    batch order comes from a CPU generator on every device, so a seed draws the same batches on a GPU; the
    GPU's float reductions differ from the CPU's, so its weights are another draw of the seed, not the same
    bits (the CPU path is deterministic and unchanged)."""
    model.to(training_device())
    with flush_denormals(), one_thread():
        return _train_loop(model, ratio_fn, n, val_idx, epochs, batch, lr, loss, seed, bar, weight_decay, optimizer,
                           schedule, val_weight, grad_clip)


def _train_loop(model, ratio_fn, n, val_idx, epochs, batch, lr, loss, seed, bar, weight_decay, optimizer, schedule,
                val_weight, grad_clip=None) -> dict:
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    mask = np.ones(n, bool)
    mask[val_idx] = False
    train_idx = torch.from_numpy(np.flatnonzero(mask))
    val_t = torch.from_numpy(np.asarray(val_idx, dtype=np.int64)).to(dev)
    vw = None if val_weight is None else torch.as_tensor(np.asarray(val_weight, float)[val_idx], dtype=torch.float32,
                                                         device=dev)
    # fused=True: the same update in one kernel per step. On one CPU core the unfused AdamW step of the
    # 8 x 512 MLP took 5.1 ms of a 13.3 ms step (batch 128), the fused one 1.0 ms (torch 2.13, AVX-512)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True,
                                **({"weight_decay": weight_decay} if weight_decay else {}))
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    steps_per_epoch = max(1, math.ceil(len(train_idx) / batch))
    if schedule == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch)
    elif schedule == "constant":
        sched = None
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    best = (float("inf"), None, -1)
    history = []
    diverged = False
    # On the CPU a non-finite loss stops the epoch at once. On a GPU that test would wait for every step's
    # kernels (a host-device sync per step, the launches no longer run ahead); there the steps' flags are
    # collected and read once per epoch. Either way the weights kept are those of the best finite epoch before.
    on_cpu = dev.type == "cpu"
    for ep in range(epochs):
        model.train()
        # drawn on the CPU (the same order on every device), then one copy per epoch to the device
        perm = train_idx[torch.randperm(len(train_idx), generator=g)].to(dev)
        nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        for s in range(steps_per_epoch):
            idx = perm[s * batch:(s + 1) * batch]
            opt.zero_grad()
            lv = relative_loss(ratio_fn(idx), loss)
            if on_cpu:
                if not torch.isfinite(lv):
                    diverged = True
                    break
            else:
                nonfinite |= ~torch.isfinite(lv)
            lv.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            if sched is not None:
                sched.step()
        if not on_cpu and bool(nonfinite):
            diverged = True
        if diverged:
            history.append(float("nan"))
            if bar is not None:
                bar.update(epochs - ep)
            break
        model.eval()
        with torch.no_grad():
            if not len(val_t):
                vm = float(lv)
            else:
                # a negative prediction counts as 0 (100 % error), as the authors' validation does
                # (trainer.py 114: np.maximum(pred, 0))
                ape = (ratio_fn(val_t).clamp(min=0) - 1).abs()
                vm = float((ape * vw).sum() / vw.sum() * 100) if vw is not None else float(ape.mean() * 100)
        vm = vm if math.isfinite(vm) else float("inf")
        history.append(vm)
        if vm < best[0]:
            best = (vm, {k: v.detach().clone() for k, v in model.state_dict().items()}, ep)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(val_mape=f"{vm:.1f}")
    if best[1] is not None:
        model.load_state_dict(best[1])
    return {"val_mape": best[0], "best_epoch": best[2], "history": history, "diverged": diverged}
