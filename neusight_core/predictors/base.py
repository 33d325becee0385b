"""The predictor interface (docs/interfaces.md) and what all predictors share: dispatch by op class,
saving/loading with the config and data checksum, and the small MLP training loop."""
from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from neusight_core.predictors import common

VERSION = 1          # bump when a change of code makes saved weights stale
HPARAMS_FILE = Path(__file__).with_name("hparams.yaml")
RECIPES_DIR = Path(__file__).with_name("recipes")


def hparams(name: str) -> dict:
    """The chosen hyper-parameters of predictor ``name``: ``predictors/recipes/<name>.yaml`` when it
    exists (the NeuSight recipes), else its section of ``predictors/hparams.yaml`` (the baselines).
    A fresh copy each call (callers may change it); the files are parsed once per process and version."""
    import copy
    recipe = RECIPES_DIR / f"{name}.yaml"
    if recipe.is_file():
        return dict(copy.deepcopy(_yaml(str(recipe), recipe.stat().st_mtime_ns)) or {})
    whole = _yaml(str(HPARAMS_FILE), HPARAMS_FILE.stat().st_mtime_ns) or {}
    return dict(copy.deepcopy(whole.get(name, {})))


@functools.lru_cache(maxsize=16)
def _yaml(path: str, mtime_ns: int):
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)     # the C parser: hparams.yaml has a long search log
    return yaml.load(Path(path).read_text(), Loader=loader)


class PredictorLoadError(RuntimeError):
    """Saved weights that cannot be used (one line naming the folder and the problem)."""


# ---------------------------------------------------------------- (de)serialisation
def _pack(x):
    """numpy arrays -> tensors so that torch.load(weights_only=True) can read the state back."""
    if isinstance(x, np.ndarray):
        return {"__np__": torch.from_numpy(np.ascontiguousarray(x))}
    if isinstance(x, dict):
        return {k: _pack(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_pack(v) for v in x]
    return x


def _unpack(x):
    if isinstance(x, dict):
        if set(x) == {"__np__"}:
            return x["__np__"].numpy()
        return {k: _unpack(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unpack(v) for v in x]
    return x


def config_hash(name: str, config: dict) -> str:
    body = json.dumps({"name": name, "version": VERSION, "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


class KernelPredictor:
    """One per method. ``predict`` returns ms per launch (not times ``count``), > 0; COMM rows 0."""
    name = "base"

    def __init__(self, config: dict | None = None, seed: int = 0):
        self.config = {**self.default_config(), **(config or {})}
        self.seed = int(seed)
        self.fitted = False
        self.info: dict = {}            # data checksum, wall time, validation numbers

    @classmethod
    def default_config(cls) -> dict:
        return {}

    # ------------------------------------------------------------ to implement
    def fit(self, train, quick: bool = False) -> None:
        raise NotImplementedError

    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        """ms for rows of the modelled classes (BMM, LINEAR, VEC, SOFTMAX, LAYERNORM)."""
        raise NotImplementedError

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass

    # ------------------------------------------------------------ shared
    def predict(self, kernels: pd.DataFrame, device) -> np.ndarray:
        common.check_kernels(kernels)
        if not self.fitted:
            raise RuntimeError(f"predictor {self.name!r} is not trained: call fit() or predictors.get()")
        n = len(kernels)
        out = np.zeros(n)
        if n == 0:
            return out
        kernels = kernels.reset_index(drop=True)
        if device is None:
            # a table spanning several GPUs (the evaluation sets): predict each GPU's rows on their own
            if "device" not in kernels:
                raise common.PredictorInputError("no device given and the kernel table has no 'device' column")
            for name, idx in kernels.groupby("device").indices.items():
                out[idx] = self.predict(kernels.iloc[idx], name)
            return out
        dev = common.device_arrays(kernels, device)
        cls = kernels["op_class"].to_numpy()
        modelled = np.isin(cls, common.MODEL_CLASSES)
        # a modelled kernel without its dims (a malformed row) falls back to the roofline
        gemm_ok = kernels[["B", "M", "N", "K"]].notna().all(axis=1).to_numpy()
        vec_ok = kernels[["B", "H"]].notna().all(axis=1).to_numpy()
        usable = modelled & np.where(np.isin(cls, common.GEMM_CLASSES), gemm_ok, vec_ok)
        if usable.any():
            sub = kernels[usable]
            out[usable] = self._predict_model(sub, device, {k: v[usable] for k, v in dev.items()})
        other = ~usable & (cls != "COMM")
        out[other] = np.where(modelled[other], common.roofline_ms(kernels[other], {k: v[other] for k, v in dev.items()}),
                              common.memory_ms(kernels[other], {k: v[other] for k, v in dev.items()}))
        bad = (cls != "COMM") & ~(np.isfinite(out) & (out > 0))
        if bad.any():
            raise FloatingPointError(f"{self.name}: {int(bad.sum())} non-positive or non-finite predictions "
                                     f"(first row: {kernels[bad].iloc[0].to_dict()})")
        return out

    def save(self, folder) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(_pack({"state": self.get_state()}), folder / "state.pt")
        meta = {"name": self.name, "version": VERSION, "seed": self.seed, "config": self.config,
                "config_hash": config_hash(self.name, {**self.config, "seed": self.seed}), "info": self.info}
        (folder / "meta.json").write_text(json.dumps(meta, indent=2, default=_json_default))
        return folder

    @classmethod
    def load(cls, folder) -> "KernelPredictor":
        from neusight_core.predictors import REGISTRY
        folder = Path(folder)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            blob = torch.load(folder / "state.pt", weights_only=True)
        except (OSError, json.JSONDecodeError, RuntimeError) as e:
            raise PredictorLoadError(f"{folder}: cannot load saved predictor ({str(e).splitlines()[0]})") from None
        klass = REGISTRY.get(meta.get("name")) if cls is KernelPredictor else cls
        if klass is None or meta.get("name") != klass.name:
            raise PredictorLoadError(f"{folder}: holds predictor {meta.get('name')!r}, not {cls.name!r}")
        p = klass(meta["config"], seed=meta.get("seed", 0))
        p.set_state(_unpack(blob["state"]))
        p.info = meta.get("info", {})
        p.fitted = True
        return p


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return None if math.isnan(float(x)) else float(x)
    return str(x)


# ---------------------------------------------------------------- MLP and its training loop
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
        # the authors' "SMAPE": mean |t - p| / (t + p) = |r - 1| / (r + 1) (neusight/Model/trainer.py 42-43)
        return ((r - 1).abs() / (r + 1)).mean()
    if kind == "logratio":
        return torch.log(r).abs().mean()
    raise ValueError(f"unknown loss {kind!r}")


def train_loop(model: nn.Module, ratio_fn, n: int, val_idx: np.ndarray, epochs: int, batch: int, lr: float,
               loss: str, seed: int, bar=None, weight_decay: float = 0.0, optimizer: str = "adam",
               schedule: str = "onecycle", val_weight: np.ndarray | None = None) -> dict:
    """Minimise ``loss`` of ``ratio_fn(idx)`` (predicted / measured for rows idx) over the rows not in
    ``val_idx``; keep the weights of the epoch with the lowest validation MAPE (training GPUs only).

    ``optimizer`` adam | adamw (torch's AdamW, default decay 0.01 unless ``weight_decay`` is given),
    ``schedule`` onecycle | constant; ``val_weight`` weights the validation APEs (e.g. by kernel
    time). An epoch whose loss is not finite ends training; the best earlier epoch is kept."""
    g = torch.Generator().manual_seed(seed)
    mask = np.ones(n, bool)
    mask[val_idx] = False
    train_idx = torch.from_numpy(np.flatnonzero(mask))
    val_t = torch.from_numpy(np.asarray(val_idx, dtype=np.int64))
    vw = None if val_weight is None else torch.as_tensor(np.asarray(val_weight, float)[val_idx], dtype=torch.float32)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, **({"weight_decay": weight_decay} if weight_decay else {}))
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
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
    for ep in range(epochs):
        model.train()
        perm = train_idx[torch.randperm(len(train_idx), generator=g)]
        for s in range(steps_per_epoch):
            idx = perm[s * batch:(s + 1) * batch]
            opt.zero_grad()
            lv = relative_loss(ratio_fn(idx), loss)
            if not torch.isfinite(lv):
                diverged = True
                break
            lv.backward()
            opt.step()
            if sched is not None:
                sched.step()
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
                ape = (ratio_fn(val_t) - 1).abs()
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


def split_validation(n: int, fraction: float, seed: int) -> np.ndarray:
    """Random held-out rows of the training GPUs' kernels (hyper-parameters and early stopping)."""
    rng = np.random.default_rng(seed + 12345)
    k = int(round(n * fraction))
    return np.sort(rng.choice(n, size=k, replace=False)) if k else np.zeros(0, np.int64)


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *a):
        self.seconds = time.perf_counter() - self.t0
