"""NeuSight (SPEC 3.1): tiles and waves, a roofline bound, and an MLP-predicted utilisation per op class.

For every kernel of a modelled class (BMM, LINEAR, VEC, SOFTMAX, LAYERNORM):

    latency = waves x tile FLOPs / (per-SM roofline throughput x u),   u in (0, 1]

(computed as ``common.wave_roofline_ms / u``), so no prediction is ever faster than the roofline.
The utilisation is u = sigmoid(g) * (1 - sigmoid(a) / waves) from a 2-output MLP: like the paper's
alpha - beta / waves it saturates as waves grow, and unlike the authors' sigmoid(g) - sigmoid(a)/waves
it can never be zero or negative. Each class has its own MLP, trained with a relative-error loss.

MLP inputs (log2, then z-scored with the training statistics), per SM as in SPEC 3.1:
tile FLOPs / (peak / SM), tile bytes / (bandwidth / SM), waves x tile bytes / (L2 / SM),
waves x tile bytes / (memory / SM), tile intensity / ridge point, waves, and waves x tile bytes /
(bandwidth / SM) (the kernel's roofline memory time). Each class uses the subset chosen by
leave-one-training-GPU-out validation (docs/search_log_logo.yaml). Element-wise kernels use only the roofline memory
time: their tile is 512 elements in almost every training record, so the per-tile inputs are constants
per GPU that merely identify it, and they sent GPUs with a higher per-SM FP32 peak (H100, L4) into the
region of the few tiny-tile records (u ~ 0.3); the roofline time is comparable across GPUs because the
launch / tail costs it competes with are absolute times (search g10 in docs/search_log_logo.yaml).

Tiles: the training records' own tiles in training; for prediction the tile of the nearest training
record (``tiles.TileLookup``), so unseen GPUs never contribute a tile. MEM / UNCLASSIFIED kernels:
bytes / bandwidth; COMM: 0 (the network model times them).

Recipes. Everything above is one *recipe* (``predictors/recipes/neusight-logo.yaml``); the class also runs
the authors' recipe (``recipes/neusight-paper.yaml``, documented with file and line of their code in
``docs/recipes.md``). A recipe is a config file; the switches it sets are:

| key | values | meaning |
|---|---|---|
| ``filter`` | {class: [B, H]} | keep a vector training record only if B > b and H > h (the authors' small-kernel filter) |
| ``inputs`` | list or {class: list} | MLP inputs, names of ``FEATURE_NAMES`` or ``SHAPE_FEATURES`` |
| ``input_units`` | ours / authors | per-SM features in bytes, FLOPs, s (ours) or the authors' GFLOP, TFLOPS, MB, KB units (constant log2 offsets) |
| ``normalise`` | bool or {class: bool} | z-score the log2 inputs with the training statistics (a class not listed: true) |
| ``clip_inputs`` | bool or {class: bool} | hold inputs inside the training range at prediction (a class not listed: false) |
| ``output_form`` | ours / authors | u = sig(g)(1 - sig(a)/waves) from 2 outputs, or sig(g) - sig(a)/waves from 3 outputs |
| ``bandwidth_gib`` | bool | the authors' roofline counts bytes in GiB against GB/s (x 1.074 bandwidth) |
| ``hidden``, ``layers`` | int or {class: int} | MLP width and number of linear layers |
| ``lr``, ``batch``, ``epochs`` | number or {class: number} | training length and step |
| ``optimizer``, ``schedule``, ``weight_decay`` | adam/adamw, onecycle/constant, float | optimiser |
| ``loss`` | ape / smape / smape_authors / logratio, or {class: loss} | relative loss on predicted / measured |
| ``val_fraction``, ``val_weight`` | float, none / time | held-out share for the best epoch; APE weighted by measured time |
| ``ensemble`` | int or {class: int} | MLPs per class (different initialisation and batch order), u averaged |
| ``ensemble_cut`` | float | drop a member whose validation MAPE is above this multiple of its class's best member's (a member that failed to train) |
| ``tile_lookup`` | scaled / authors | tile of an unseen kernel (``tiles.TileLookup``) |
| ``tile_lookup_memory`` | true (default) / false | whether that look-up's GPU features include the memory capacity |
| ``classes`` | list | op classes trained (default the paper's five: BMM, LINEAR, VEC, SOFTMAX, LAYERNORM); others: roofline |
| ``conv_tile`` | [tile_m, tile_k] | CONV: the one implicit-GEMM tile of every convolution (default ``CONV_TILE``) |
| ``conv_winograd`` | float | CONV: FLOPs of a 3 x 3 stride-1 conv's bound divided by this (Winograd; 1 = none) |
| ``conv_wgrad_split_k`` | bool | CONV weight-gradient rows: the long reduction split across the SMs (``split_k_wgrad``; prediction only) |
| ``conv_1x1_network`` | a class or absent | CONV rows of a 1 x 1, stride-1, unpadded, ungrouped convolution (forward and backward): predicted by this class's network as the plain GEMMs they are (prediction only: not part of the weights' key) |
| ``tensor_core`` | {key: value} or absent | BF16 / FP16 GEMM and fused-attention networks trained on NVIDIA's measured kernels of the training GPUs (``tensor_core.TensorCoreNets``), and with them BF16 / FP16 memory-bound rows by ``memory_law``; absent: such rows go through the FP32 networks at the tensor-core peak (an extrapolation) |

Convolutions (CONV) are predicted the same way over their implicit GEMM (``common.geometry``:
M = batch x output pixels, N = C_in k^2 the reduction, K = C_out for a forward conv). The release measures
forward convolutions only; a backward row (``sub_op`` dgrad / wgrad) gets the same network through its own
implicit-GEMM dims, an extrapolation.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

import neusight_core.predictors.common as common
import neusight_core.predictors.members as members
import neusight_core.predictors.memory_law as memory_law
from neusight_core.data import devices
from neusight_core.question import schema
from neusight_core.predictors.base import (ANSWER_LAW, ANSWER_OUTSIDE, ANSWER_ROOFLINE, ANSWER_TENSOR_CORE,
                                           KernelPredictor, NumpyMLP, Timer, handed, split_validation)
from neusight_core.predictors.features import (CONV_TILE, FEATURE_NAMES, U_MIN, features,
                                               utilisation)
from neusight_core.predictors.tensor_core import TensorCoreNets, attention_backward, network_of
from neusight_core.predictors.tiles import TileLookup
from neusight_core.question.schema import OpClass

_REQUIRED = object()


def per_class(value, cls: str, default=_REQUIRED):
    """A recipe value that is either one value for every class or a {class: value} dict. With ``default``,
    a class the dict does not list gets it; without, every class must be listed (KeyError)."""
    if not isinstance(value, dict):
        return value
    return value[cls] if default is _REQUIRED else value.get(cls, default)



def split_k_wgrad(df: pd.DataFrame, dev: dict, geo: dict, tile_m, tile_k) -> dict:
    """A weight-gradient convolution's implicit GEMM (``aten_ops.conv_rows``: M = C_out, N = batch x output
    pixels the reduction, K = C_in k^2) has a small output and a long reduction: the stem of ResNet-50 at
    batch 112 makes 3 tiles of 128 x 64, each reducing over 1.4 M elements. With one tile per SM, 3 of a
    V100's 80 SMs would work, and the wave bound counted exactly that (652 ms of a 1,431 ms predicted training
    step). cuDNN and cuBLAS split such a reduction across thread blocks (split-K) and sum the parts. Here a
    wgrad row's reduction is cut into s = min(floor(num_SM / tiles), ceil(N / tile_k)) parts (at least 1):
    s x tiles tiles of N / s each, waves and per-tile work recomputed; the sum of the parts (s x M x K
    partial results) is not counted. A structural rule with no fitted number; forward and dgrad rows, and
    every training record (the release measures forward convolutions only), are unchanged."""
    if "sub_op" not in df:
        return geo
    wg = df["sub_op"].to_numpy() == "wgrad"
    if not wg.any():
        return geo
    tiles = geo["tiles"]
    N = np.maximum(df["N"].fillna(1).to_numpy(float), 1.0)
    tile_m, tile_k = np.asarray(tile_m, float), np.asarray(tile_k, float)
    s = np.where(wg, np.maximum(1.0, np.minimum(np.floor(dev["num_sm"] / tiles), np.ceil(N / tile_k))), 1.0)
    n_part = N / s
    eb = common.row_element_bytes(df)
    tile_flops = np.where(wg, geo["tile_flops"] / s, geo["tile_flops"])      # keeps ``_winograd``'s factor
    tile_bytes = np.where(wg, eb * (tile_m * n_part + n_part * tile_k + tile_m * tile_k), geo["tile_bytes"])
    tiles = tiles * s
    return {**geo, "tiles": tiles, "waves": np.ceil(tiles / dev["num_sm"]), "tile_flops": tile_flops,
            "tile_bytes": tile_bytes, "padded_flops": tiles * tile_flops}

class NeuSightPredictor(KernelPredictor):
    """Runs a NeuSight recipe: each registry entry of this class names its recipe file (``neusight``: ours,
    ``neusight-paper``: the authors' as their code runs it, ``neusight-logo``: our earlier leave-one-GPU-out
    recipe; docs/recipes.md), and ``registry.create`` passes the entry's name and recipe."""
    trains_mlps = True
    calibrated = True

    def __init__(self, config=None, seed=0, name=None):
        super().__init__(config, seed, name)
        self.nets: dict = {}
        self.norm: dict = {}
        self.range: dict = {}       # per class: min and max of every MLP input in the training data
        self.u_floor: dict = {}     # authors' output form: per class, the lowest u on its training records
        self.tiles = TileLookup(self.config["tile_lookup"], self.config.get("tile_lookup_memory", True))
        # BF16 tensor-core networks (recipe key ``tensor_core``): trained after, and seeded apart from, the FP32
        # classes, so that adding them changes no FP32 weight
        tc_config = self.config.get("tensor_core")
        self.tc = TensorCoreNets(tc_config, seed=self.seed) if tc_config else None
        self.use_tensor_core = True     # False: predict_extrapolated (the FP32 networks on BF16 rows)
        # () -> the memory law's numbers (``memory_law.fit`` on measured kernels), handed over by the trainer
        # (``training.memory_law_params``) with the tensor-core networks: a predictor reads no data file itself
        self.memory_law = None

    @property
    def _form(self) -> str:
        return self.config.get("output_form", "ours")

    def filter_training(self, k: pd.DataFrame) -> pd.DataFrame:
        """The recipe's small-kernel filter: a vector record of a filtered class is kept only if its
        B and H both exceed the thresholds (the authors' ``neusight/Dataset/collect.py`` 263-313)."""
        flt = self.config.get("filter") or {}
        keep = np.ones(len(k), bool)
        for cls, (b, h) in flt.items():
            sel = (k["op_class"] == cls).to_numpy()
            keep &= ~sel | ((k["B"] > b) & (k["H"] > h)).to_numpy()
        return k[keep]

    def training_records(self, train) -> pd.DataFrame:
        """The kernel records this recipe trains on: the training GPUs' raw measurements (``train``) and,
        with ``extra_training: seen_test``, the same GPUs' rows of the release's kernel test sets
        (transformer-derived shapes; ``extra_holdout`` holds a share of their shapes out, for validation).
        Never a row of an unseen GPU. The quick subset adds a quarter of its size per class (CI time)."""
        k = train.kernels
        drop = self.config.get("drop_gpu")      # validation only (shape_holdout_check, calibration): a GPU or a list
        drop = [drop] if isinstance(drop, str) else list(drop or [])
        if drop:
            k = k[~k["device"].isin(drop)]
        if self.config.get("extra_training") != "seen_test":
            return k
        extra = handed(train, "seen_test", self.name)
        extra = extra[extra["op_class"].isin(common.MODEL_CLASSES)]
        if getattr(train, "quick_rows", None):
            rng = np.random.default_rng(self.seed)
            n = max(1, int(train.quick_rows) // 4)
            keep = [rng.choice(idx, size=min(len(idx), n), replace=False)
                    for _, idx in sorted(extra.groupby("op_class").indices.items())]
            extra = extra.iloc[np.sort(np.concatenate(keep))]
        if drop:
            extra = extra[~extra["device"].isin(drop)]
        return pd.concat([k, extra[[c for c in k.columns if c in extra.columns]]], ignore_index=True)

    def data_wanted(self) -> dict:
        """The measured kernels of the tensor-core networks (when the recipe has them) and, with
        ``extra_training: seen_test``, the release's test-set rows of the training GPUs."""
        want = {}
        if self.tc is not None:
            want["measured"] = tuple(self.tc.config["networks"])
        if self.config.get("extra_training") == "seen_test":
            want["seen_test"] = float(self.config.get("extra_holdout", 0.0))
        return want

    def classes(self) -> tuple:
        """The op classes this recipe trains a network for (``classes``; default the paper's five). A
        class it does not train is predicted by the roofline."""
        return tuple(self.config.get("classes") or common.MODEL_CLASSES)

    def _input_names(self, cls: str):
        names = self.config.get("inputs") or FEATURE_NAMES
        if isinstance(names, dict):
            names = names[cls]
        return tuple(n for n in names if n != "waves" or self.config["waves_input"])

    # ------------------------------------------------------------ training
    def fit(self, train, quick: bool = False) -> None:
        import torch
        from tqdm.auto import tqdm    # here, not at import: a question that only predicts never loads it (40 ms)
        torch.manual_seed(self.seed)
        k = self.filter_training(self.training_records(train))
        self.tiles.fit(k)
        classes = [c for c in self.classes() if (k["op_class"] == c).any()]
        epochs = {c: (self.config["quick_epochs"] if quick else per_class(self.config["epochs"], c)) for c in classes}
        self.info = {"data_checksum": train.checksum, "quick": quick, "classes": {},
                     "rows_before_filter": int(len(train.kernels)), "rows_after_filter": int(len(k))}
        with Timer() as t, tqdm(total=sum(epochs[c] * self._members(c) for c in classes), desc=f"train {self.name} (seed {self.seed})",
                                unit="epoch", disable=members.pooled()) as bar:
            # every class's members are started before any is waited for: with a pool of processes
            # (members.pool) they all train side by side; without one, each trains when its class finishes
            # (longest first, in optimiser steps x hidden width squared, so that a pool ends its queue together)
            rows = k["op_class"].value_counts()
            cost = {c: epochs[c] * rows[c] / int(per_class(self.config["batch"], c))
                    * int(per_class(self.config["hidden"], c)) ** 2 for c in classes}
            started = {c: self._start_class(k[k["op_class"] == c].reset_index(drop=True), c, epochs[c], bar)
                       for c in sorted(classes, key=lambda c: -cost[c])}
            # the saved state keeps the classes' order (its arrays are stored in dict order)
            self.norm = {c: self.norm[c] for c in classes}
            self.range = {c: self.range[c] for c in classes}
            for c in classes:
                bar.set_description(f"train {self.name} {c} (seed {self.seed})")
                self.info["classes"][c] = self._finish_class(c, *started[c])
            if self.tc is not None:
                bar.set_description(f"train {self.name} BF16 tensor-core networks (seed {self.seed})")
                self.info["tensor_core"] = self.tc.fit(handed(train, "measured", self.name), quick=quick,
                                                       law=self.law_numbers())
        self.info["train_seconds"] = t.seconds
        self.fitted = True

    def _inputs(self, df: pd.DataFrame, dev: dict, tile_m, tile_k, tile):
        cls = str(df["op_class"].iloc[0])      # callers pass the rows of one class
        if cls in common.CONV_CLASSES:
            # one fixed implicit-GEMM tile for every convolution (``conv_tile``): cuDNN picks implicit GEMM,
            # Winograd or FFT kernels by its own heuristics, and their names' AxB is not a tiling of M x K
            tile_m, tile_k = (np.full(len(df), float(t)) for t in self.config.get("conv_tile", CONV_TILE))
        geo = common.geometry(df, dev, tile_m, tile_k, tile)
        if cls in common.CONV_CLASSES:
            geo = self._winograd(df, geo)
            if self.config.get("conv_wgrad_split_k"):
                geo = split_k_wgrad(df, dev, geo, tile_m, tile_k)
        if self.config.get("bandwidth_gib", False):
            # the authors' roofline: bytes in GiB over GB/s (mlp_wave_mm.py 20, mlp_wave_vec.py 16)
            base = common.wave_roofline_ms(df, {**dev, "mem_bw_gbs": dev["mem_bw_gbs"] * 2**30 / 1e9}, geo)
        else:
            base = common.wave_roofline_ms(df, dev, geo)
        X = features(df, self._feature_device(dev), geo, self._input_names(cls), self.config.get("input_units", "ours"))
        return X, geo["waves"], base

    def _feature_device(self, dev: dict) -> dict:
        """``dev`` as the MLP inputs see it. With ``memory_cap_training`` the memory capacity (it enters the authors'
        input wave_bytes_per_sm_mem, and cannot change a kernel's speed) is capped at the largest training GPU's:
        beyond the training range it would only extrapolate (the H200's 141 GB made it slower than the H100, issue
        34). The training GPUs are at or under the cap, so training is unchanged; the roofline bound never sees it."""
        if not self.config.get("memory_cap_training"):
            return dev
        cap = max(d.mem_gb for d in devices.training_devices("NVIDIA"))
        return {**dev, "mem_gb": np.minimum(np.asarray(dev["mem_gb"], float), cap)}

    def _winograd(self, df: pd.DataFrame, geo: dict) -> dict:
        """The bound of a 3 x 3 stride-1 convolution counts the multiplies of the fastest algorithm cuDNN has
        for it, Winograd F(4x4, 3x3) (36 per 4 x 4 output tile instead of 144): its FLOPs divided by
        ``conv_winograd`` (4). Without it 15 % of the release's conv records run faster than the FP32
        roofline and 44 % faster than the wave roofline of 128 x 64 tiles (u would have to exceed 1); with it
        none do (docs/search_conv.jsonl, c0: training GPUs' records). Other convolutions keep their FLOPs."""
        red = float(self.config.get("conv_winograd", 1.0) or 1.0)
        if red == 1.0:
            return geo
        k = df["conv_k"].to_numpy(float) if "conv_k" in df else np.full(len(df), np.nan)
        s = df["conv_stride"].to_numpy(float) if "conv_stride" in df else np.full(len(df), np.nan)
        f = np.where((k == 3) & (s == 1), 1.0 / red, 1.0)
        return {**geo, "tile_flops": geo["tile_flops"] * f, "padded_flops": geo["padded_flops"] * f,
                "flops": geo["flops"] * f}

    def _scale(self, cls: str, X: np.ndarray) -> np.ndarray:
        if not per_class(self.config.get("normalise", True), cls, True):
            return X
        mu, sd = self.norm[cls]
        return (X - mu) / sd

    def _start_class(self, df: pd.DataFrame, cls: str, epochs: int, bar) -> tuple:
        """Inputs of ``cls`` and its members started (``members.start``); ``_finish_class`` waits for them."""
        dev = common.device_arrays(df)
        X, waves, base = self._inputs(df, dev, df["tile_m"], df["tile_k"], df["tile"])
        y = df["latency_ms"].to_numpy(float)
        mu, sd = X.mean(0), X.std(0) + 1e-6
        self.norm[cls] = (mu, sd)
        self.range[cls] = (X.min(0), X.max(0))
        val = split_validation(len(df), self.config["val_fraction"], self.seed)
        # "time": validation APE weighted by the measured time, so the best epoch is the one that is
        # right about the kernels that dominate a model's run time, not about the many tiny ones
        vw = y if self.config.get("val_weight", "none") == "time" else None
        # every ensemble member has its own initialisation and batch order (seed * 1000 + i); the loss
        # sees base / y, the roofline's ratio to the measurement, so it works with ratios only
        n_out = 3 if self._form == "authors" else 2
        Xs, w32, r32 = (np.asarray(a, np.float32) for a in (self._scale(cls, X), waves, base / y))   # shared
        todo = [members.Member(
            n_in=len(self._input_names(cls)), n_out=n_out, hidden=int(per_class(self.config["hidden"], cls)),
            layers=int(per_class(self.config["layers"], cls)), seed=self.seed * 1000 + i,
            X=Xs, waves=w32, ratio=r32, val=val, epochs=epochs,
            batch=int(per_class(self.config["batch"], cls)), lr=float(per_class(self.config["lr"], cls)),
            loss=per_class(self.config["loss"], cls), form=self._form,
            weight_decay=float(self.config.get("weight_decay", 0.0)), optimizer=self.config.get("optimizer", "adam"),
            schedule=self.config.get("schedule", "onecycle"), val_weight=vw, grad_clip=self._grad_clip(cls),
            label=f"{self.name} {cls} seed {self.seed} #{i}")
            for i in range(self._members(cls))]
        return members.start(todo, bar), X, waves, base, y, val, epochs

    def _finish_class(self, cls: str, pending: list, X, waves, base, y, val, epochs: int) -> dict:
        trained = [wait() for wait in pending]
        results = [rec for _, rec in trained]
        kept = self._kept_members([r["val_mape"] if len(val) else None for r in results])
        # from here on the members are evaluated with numpy, as every prediction is
        self.nets[cls] = [NumpyMLP(trained[i][0]) for i in kept]
        Xs = self._scale(cls, X)
        if self._form == "authors":
            self.u_floor[cls] = self._training_floor(cls, Xs, waves)
        # validation MAPE as a prediction computes it (numpy, floor included)
        ape = np.abs(base[val] / y[val] / self._u(cls, Xs[val], waves[val]) - 1) * 100 if len(val) else None
        ens = float(ape.mean()) if ape is not None else None
        # the same, weighted by measured time (the large kernels that dominate a model's run time)
        ens_w = float((ape * y[val]).sum() / y[val].sum()) if ape is not None else None
        return {"rows": len(y), "val_mape_members": [r["val_mape"] for r in results], "members_kept": kept,
                "member_seconds": [r["seconds"] for r in results],
                "val_mape": ens,
                "val_wmape": ens_w,
                "best_epochs": [r["best_epoch"] for r in results], "epochs": epochs,
                "diverged": [r["diverged"] for r in results],
                # validation MAPE after every epoch (member 0): with a constant learning rate the first
                # E epochs of a run are exactly a run of E epochs, so this shows what a cut would cost
                "val_history": [round(v, 3) for v in results[0]["history"]] if results else []}

    def _clip(self, cls: str, X: np.ndarray) -> np.ndarray:
        """With ``clip_inputs``, hold MLP inputs inside the training range: an unseen GPU far outside
        it (e.g. the L4's ridge point) then gets the utilisation of the nearest edge instead of an
        arbitrary extrapolation. The roofline/wave part of the model still sees the true values."""
        if not per_class(self.config.get("clip_inputs", False), cls, False) or cls not in self.range:
            return X
        lo, hi = self.range[cls]
        return np.clip(X, lo, hi)

    def _grad_clip(self, cls: str):
        """The recipe's cap on the gradient norm for ``cls`` (``grad_clip``: one value, or per class;
        absent or a class not listed: no cap)."""
        g = per_class(self.config.get("grad_clip"), cls, None)
        return float(g) if g else None

    def _kept_members(self, val_mapes) -> list[int]:
        """Indices of the ensemble members to keep. With ``ensemble_cut`` = c, a member whose validation
        MAPE is above c times the best member's is dropped: a member that failed to train (seed 2's fifth
        LINEAR network in the g16 run stopped at epoch 0 with 38 % against 13.9-14.3 % for the other four)
        would otherwise pull the average u of every kernel. Without the key, or without a validation
        split, every member is kept; the best member always is."""
        cut = self.config.get("ensemble_cut")
        if not cut or len(val_mapes) < 2 or any(v is None for v in val_mapes):
            return list(range(len(val_mapes)))
        best = min(val_mapes)
        return [i for i, v in enumerate(val_mapes) if v <= float(cut) * best]

    def _members(self, cls: str | None = None) -> int:
        e = self.config.get("ensemble", 1)
        if isinstance(e, dict):
            return int(e.get(cls, 1)) if cls else max(int(v) for v in e.values())
        return int(e)

    def _u(self, cls: str, X: np.ndarray, waves: np.ndarray) -> np.ndarray:
        """Ensemble utilisation: the mean of the members' u (each in (0, 1], so the mean is too).

        The authors' form u = sigmoid(o2) - sigmoid(o0) / waves reaches zero or below for kernels with
        fewer waves than any training record (the small-kernel filter keeps only large ones, and their
        one-layer graph has no tiny kernels such as attention-mask ops, so their code never meets them).
        It is held at the lowest u the network gives on its own training records of that class, instead
        of at 1e-6 (which turned a 10-microsecond kernel into 10 ms)."""
        X, waves = np.asarray(X, dtype=float), np.asarray(waves, dtype=float)
        u = np.mean([utilisation(net(X), waves, self._form) for net in self.nets[cls]], axis=0)
        if self._form == "authors" and cls in self.u_floor:
            u = np.maximum(u, float(self.u_floor[cls]))
        return u

    def _training_floor(self, cls: str, X: np.ndarray, waves: np.ndarray) -> float:
        """The lowest positive u on the training records. Trained unclamped, as the authors train, a few
        records can end with u <= 0 (seed 1's BMM: 1 of 87,623); a floor at or below zero would leave such a
        kernel at 1e-6 (a million times the roofline), so those records do not set it."""
        X, waves = np.asarray(X, dtype=float), np.asarray(waves, dtype=float)
        u = np.mean([utilisation(net(X), waves, self._form, clamp_u=False) for net in self.nets[cls]], axis=0)
        pos = u[u > 0]
        return float(max(pos.min(), U_MIN)) if pos.size else U_MIN

    # ------------------------------------------------------------ prediction
    def utilisation(self, kernels: pd.DataFrame, device) -> np.ndarray:
        """Predicted u per row of the modelled classes (NaN elsewhere): for tests and plots."""
        out = np.full(len(kernels), np.nan)
        kernels = self.as_gemm(kernels.reset_index(drop=True))
        dev = common.device_arrays(kernels, device)
        tm, tk, t = self.tiles.lookup(kernels, device)
        for cls in self.nets:
            rows = np.flatnonzero(kernels["op_class"].to_numpy() == cls)
            if rows.size == 0:
                continue
            d = {k: v[rows] for k, v in dev.items()}
            X, waves, _ = self._inputs(kernels.iloc[rows], d, tm[rows], tk[rows], t[rows])
            X = self._clip(cls, X)
            out[rows] = self._u(cls, self._scale(cls, X), waves)
        return out

    def as_gemm(self, kernels: pd.DataFrame) -> pd.DataFrame:
        """``kernels`` with the 1 x 1 convolutions relabelled to the class of ``conv_1x1_network`` (LINEAR).
        Such a convolution, stride 1, no padding, one group, is a plain GEMM in the trace's convention
        (forward [B o^2 x Cin] @ [Cin x Cout]; dgrad and wgrad likewise, ``aten_ops.conv_rows``), with no
        im2col and no halo. The release measures only 3 x 3 stride-1 convolutions (collect/conv), so the
        CONV network has never seen a 1 x 1 one, while the LINEAR network was trained on GEMMs. Their B
        becomes 1: the implicit GEMM's M already counts the batch."""
        cls = self.config.get("conv_1x1_network")
        if not cls or "conv_k" not in kernels or "op_class" not in kernels:
            return kernels
        f = {c: kernels[c].to_numpy(float) for c in ("conv_k", "conv_stride", "conv_pad", "conv_groups")}
        rows = ((kernels["op_class"].to_numpy() == OpClass.CONV) & (f["conv_k"] == 1) & (f["conv_stride"] == 1)
                & (f["conv_pad"] == 0) & (f["conv_groups"] == 1))
        if not rows.any():
            return kernels
        out = kernels.copy()
        out.loc[rows, "op_class"] = cls
        out.loc[rows, "B"] = 1.0
        return out

    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        kernels = kernels.reset_index(drop=True)
        tm, tk, t = self.tiles.lookup(kernels, device)
        out = np.empty(len(kernels))
        cls_col = kernels["op_class"].to_numpy()
        for cls in np.unique(cls_col):
            rows = np.flatnonzero(cls_col == cls)
            d = {k: v[rows] for k, v in dev.items()}
            sub = kernels.iloc[rows]
            if cls not in self.nets:     # a class the training data did not have: roofline
                out[rows] = common.roofline_ms(sub, d)
                continue
            X, waves, base = self._inputs(sub, d, tm[rows], tk[rows], t[rows])
            X = self._clip(cls, X)
            out[rows] = base / self._u(cls, self._scale(cls, X), waves)
        return out

    def measured_rows(self, kernels: pd.DataFrame) -> np.ndarray:
        """The rows the tensor-core networks answer (BF16 / FP16 GEMMs and fused-attention forwards), less the
        attention backwards (their forward's network times a stated FLOP ratio) and the grouped GEMMs of
        mixture-of-experts layers (dense GEMMs over stacked tokens, balanced routing): neither is a measured kernel."""
        if self.tc is None or not self.use_tensor_core or not self.tc.nets:
            return super().measured_rows(kernels)
        k = self.as_gemm(kernels).reset_index(drop=True)
        grouped = k["sub_op"].eq(schema.GROUPED_GEMM).to_numpy() if "sub_op" in k else False
        return self.tc.handles(k) & ~attention_backward(k) & ~grouped

    def law_rows(self, kernels: pd.DataFrame) -> np.ndarray:
        """The BF16 / FP16 memory-bound rows the memory law answers (with the tensor-core networks, as ``predict``)."""
        if self.tc is None or not self.use_tensor_core or not self.tc.nets:
            return super().law_rows(kernels)
        k = kernels.reset_index(drop=True)
        return memory_law.answers(k) & ~self.measured_rows(k)

    def answered_by(self, kernels: pd.DataFrame) -> np.ndarray:
        """As ``KernelPredictor.answered_by``, with this recipe's other models: a class it trained no network for is the
        roofline's; with the tensor-core networks, ``BF16 network <NET>`` (``tensor_core.NETWORKS``) on the rows they
        were trained for, ``BF16 network outside its data`` on those they answer through another (attention backwards,
        grouped GEMMs), ``memory law`` on the half-precision memory-bound rows; 1 x 1 convolutions as ``as_gemm``."""
        k = self.as_gemm(kernels).reset_index(drop=True)
        out = super().answered_by(k)
        cls = k["op_class"].astype(str).to_numpy()
        out[np.isin(cls, common.PREDICTED_CLASSES) & ~np.isin(cls, list(self.nets))] = ANSWER_ROOFLINE
        if self.tc is None or not self.use_tensor_core or not self.tc.nets:
            return out
        handles, measured = self.tc.handles(k), self.measured_rows(k)
        nets = network_of(k).astype(object)
        out[handles & measured] = ANSWER_TENSOR_CORE + " " + nets[handles & measured]
        out[handles & ~measured] = ANSWER_TENSOR_CORE + ANSWER_OUTSIDE
        out[memory_law.answers(k)] = ANSWER_LAW
        return out

    def law_numbers(self) -> dict | None:
        """The memory law's numbers handed over (``training.hand_over``), or None before: the tensor-core networks
        time an FP8 GEMM's activation quantisation with them (``TensorCoreNets.quantiser_ms``)."""
        return None if self.memory_law is None else self.memory_law()

    def predict(self, kernels: pd.DataFrame, device) -> np.ndarray:
        """As ``KernelPredictor.predict``; BF16 / FP16 GEMM (LINEAR, BMM) and fused-attention (ATTN) rows go
        through the tensor-core networks when the recipe has them (``tensor_core.network_of``), and with them the
        BF16 / FP16 memory-bound rows through the memory law (``memory_law.answers``); 1 x 1 convolutions as GEMMs
        when the recipe says so (``as_gemm``)."""
        if device is None:      # a table of several GPUs: each GPU's rows through this method, as given (split
            return super().predict(kernels, None)   # before half_as_fp32, whose FP32 rows the law would not answer)
        kernels = self.as_gemm(kernels)
        out = super().predict(common.half_as_fp32(kernels), device)
        if self.tc is None or not self.use_tensor_core or not self.tc.nets:
            return out
        kernels = kernels.reset_index(drop=True)
        rows = np.flatnonzero(self.tc.handles(kernels))
        if rows.size:
            out[rows] = self.tc.predict(kernels.iloc[rows], device, law=self.law_numbers())
        rows = np.flatnonzero(memory_law.answers(kernels))
        if rows.size:        # BF16 / FP16 element-wise, normalisation, softmax and copy rows: the memory law
            if self.memory_law is None:
                raise ValueError(f"{self.name}: no memory law was handed over with its tensor-core networks: load "
                                 "or train it with predictors.get")
            out[rows] = memory_law.time_ms(kernels.iloc[rows], device, self.memory_law())
        return out

    def predict_extrapolated(self, kernels: pd.DataFrame, device) -> np.ndarray:
        """The prediction without the tensor-core networks: BF16 rows through the FP32-trained networks at
        the tensor-core peak, what ``--dtype bf16`` did before the tensor-core networks (their baseline); ATTN rows: roofline."""
        self.use_tensor_core = False
        try:
            return self.predict(kernels, device)
        finally:
            self.use_tensor_core = True

    # ------------------------------------------------------------ state
    def get_state(self) -> dict:
        out = {"nets": {c: [n.state_dict() for n in nets] for c, nets in self.nets.items()},
               "norm": {c: {"mu": m, "sd": s} for c, (m, s) in self.norm.items()},
               "range": {c: {"lo": lo, "hi": hi} for c, (lo, hi) in self.range.items()},
               "u_floor": dict(self.u_floor), "tiles": self.tiles.state()}
        if self.tc is not None:
            out["tensor_core"] = self.tc.get_state()
        return out

    def set_state(self, state: dict) -> None:
        self.nets = {}
        for c, sds in state["nets"].items():
            self.nets[c] = []
            for sd in sds:
                self.nets[c].append(NumpyMLP(sd))
        self.norm = {c: (np.asarray(v["mu"]), np.asarray(v["sd"])) for c, v in state["norm"].items()}
        self.range = {c: (np.asarray(v["lo"]), np.asarray(v["hi"])) for c, v in state.get("range", {}).items()}
        self.u_floor = {c: float(v) for c, v in (state.get("u_floor") or {}).items()}
        self.tiles = TileLookup.from_state(state["tiles"])
        if self.tc is not None and "tensor_core" in state:
            self.tc.set_state(state["tensor_core"])
