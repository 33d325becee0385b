"""The predictor interface (docs/interfaces.md) and what all predictors share: dispatch by op class,
saving/loading with the config and data checksum, and the small MLP training loop."""
from __future__ import annotations

import abc
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.data import datafile
import neusight_core.predictors.common as common
from neusight_core.question import schema
from neusight_core.question.schema import OpClass

VERSION = 3          # bump when a change of code makes saved weights stale (2: the authors' form trains unclamped;
                     # 3: fused Adam/AdamW, the same update with other float rounding)
class PredictorLoadError(RuntimeError):
    """Saved weights that cannot be used (one line naming the folder and the problem)."""


# ---------------------------------------------------------------- (de)serialisation
# A predictor's state (nested dicts and lists of arrays, numbers and strings) is saved as one
# ``state.npz``: every array under a key "a<i>", and the nesting as JSON in "__skeleton__", where an
# array is {"__npz__": "a<i>"}. Loading needs numpy only (no pickle, no torch: nothing read
# from disk can run code). A state.npz that cannot be read (truncated, not a zip, a member missing or
# damaged) raises PredictorLoadError; ``predictors.get`` then warns once and retrains. Weights saved by
# earlier versions as ``state.pt`` (torch) are not read any more (torch.load unpickles): they retrain.
STATE_FILE, LEGACY_STATE_FILE = "state.npz", "state.pt"


def _flatten(x, arrays: dict):
    if hasattr(x, "detach"):                       # a torch tensor (a state dict of a net in training)
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = np.ascontiguousarray(x)
        return {"__npz__": key}
    if isinstance(x, dict):
        return {str(k): _flatten(v, arrays) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_flatten(v, arrays) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _inflate(x, arrays):
    if isinstance(x, dict):
        if set(x) == {"__npz__"}:
            return arrays[x["__npz__"]]
        return {k: _inflate(v, arrays) for k, v in x.items()}
    if isinstance(x, list):
        return [_inflate(v, arrays) for v in x]
    return x


def write_state(state: dict, path: Path) -> None:
    """Save ``state`` as ``path`` (a state.npz), atomically: a half-written file is never read as weights."""
    arrays: dict = {}
    skeleton = _flatten(state, arrays)
    datafile.atomic_savez(Path(path), {"__skeleton__": np.array(json.dumps(skeleton, default=_json_default)), **arrays})


_KEPT: dict = {}     # (file, size, mtime) -> the state one ``read_state(..., keep=True)`` read, for the next reader


def read_state(folder: Path, keep: bool = False) -> dict:
    """The state saved by ``write_state`` in ``folder``; PredictorLoadError (one line naming the file) if
    it is missing or cannot be read. ``keep``: the next ``read_state`` of the unchanged file gets this one
    state instead of reading it again (a check that reads the weights before they are loaded, 0.15 s of a
    question's 1.5 s); it is handed out once, so no two readers share arrays."""
    f = Path(folder) / STATE_FILE
    if not f.is_file():
        old = " (state.pt of an earlier version is not read)" if (f.parent / LEGACY_STATE_FILE).is_file() else ""
        raise PredictorLoadError(f"{f}: missing{old}")
    st = f.stat()
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
    if key in _KEPT:
        state = _KEPT.pop(key)
        if keep:
            _KEPT[key] = state
        return state
    try:
        with open(f, "rb") as fh:                       # closed also when reading fails
            arrays = datafile.load_npz(fh)
        state = _inflate(json.loads(str(arrays.pop("__skeleton__"))), arrays)
        _KEPT.clear()                  # one kept state at most
        if keep:
            _KEPT[key] = state
        return state
    except Exception as e:  # noqa: BLE001 - any damage of the file (BadZipFile, EOFError, zlib.error, ...)
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        raise PredictorLoadError(f"{f}: cannot read ({type(e).__name__}{': ' + msg if msg else ''})") from None


#: recipe keys that change how trained networks are used, not what they learn: left out of the weights' key, so
#: that adding or changing one does not retrain (neusight.py ``as_gemm``)
PREDICTION_ONLY_KEYS = ("conv_1x1_network", "conv_wgrad_split_k", "memory_cap_training", "tile_lookup_memory")


def config_hash(name: str, config: dict) -> str:
    config = {k: v for k, v in config.items() if k not in PREDICTION_ONLY_KEYS}
    body = json.dumps({"name": name, "version": VERSION, "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


#: the names of what answers a kernel row (``KernelPredictor.answered_by``): the error model keys its parts by them
ANSWER_NETWORK = "network"
ANSWER_HALF = " at half precision"
ANSWER_ROOFLINE = "roofline"
ANSWER_COMM = "communication"
ANSWER_LAW = "memory law"
ANSWER_TENSOR_CORE = "BF16 network"
ANSWER_OUTSIDE = " outside its data"


def handed(train, what: str, name: str):
    """``train``'s frame ``what`` (``measured`` or ``seen_test``: ``KernelPredictor.data_wanted``); ValueError in one
    line when the caller built ``train`` without it."""
    frame = getattr(train, what, None)
    if frame is None:
        raise ValueError(f"{name}: its training data lacks {what!r}, which its recipe trains on: build it with "
                         "predictors.data_for(predictor, train)")
    return frame


class KernelPredictor(abc.ABC):
    """One per method. ``predict`` returns ms per launch (not times ``count``), > 0; COMM rows 0.

    The plug-in contract (docs/architecture.md, "A predictor"): a subclass implements ``fit`` and
    ``_predict_model`` (and ``get_state`` / ``set_state`` when it learns anything); ``registry.create`` makes it,
    with its registry key as ``name`` and the entry's recipe or config as ``config`` (over ``default_config``,
    the class's own defaults); ``predictors.get`` trains or loads it, records the training data's checksum in
    ``info`` and saves it."""
    #: the name of a predictor made without the registry (the registry's key wins)
    name: str | None = None
    #: whether ``fit`` trains torch MLPs (``nets.train_loop``: on the GPU when there is one); the others fit
    #: with numpy on the CPU
    trains_mlps = False
    #: whether ``fit`` learns anything (the roofline has nothing to train: its answers name no weights)
    has_weights = True
    #: whether its answers get an interval: ``studies/calibration.py`` makes error models for it (it trains without one
    #: GPU through the recipe key ``drop_gpu``); the baselines' answers carry none
    calibrated = False

    def __init__(self, config: dict | None = None, seed: int = 0, name: str | None = None):
        self.name = name or type(self).name
        if not self.name:
            raise TypeError(f"{type(self).__name__} has no name: make it with registry.create(<its registry key>)")
        self.config = {**self.default_config(), **(config or {})}
        self.seed = int(seed)
        self.fitted = False
        self.info: dict = {}            # data checksum, wall time, validation numbers
        # why this predictor's BF16 tensor-core networks are absent (one line; ``predictors.training``), or None
        self.missing_networks: str | None = None

    @classmethod
    def default_config(cls) -> dict:
        """The class's own defaults, under the registry entry's recipe or config."""
        return {}

    # ------------------------------------------------------------ to implement
    @abc.abstractmethod
    def fit(self, train, quick: bool = False) -> None:
        """Learn from ``train`` (``dataset.TrainingData``: ``kernels``, ``checksum``, and what ``data_wanted``
        asked for) and set ``fitted``."""

    def data_wanted(self) -> dict:
        """What ``fit`` needs beyond the release's training kernels, for the trainer to read and hand over in
        ``TrainingData`` (``training.data_for``): ``{"measured": networks}`` NVIDIA's measured kernels of the training
        GPUs for those tensor-core networks, ``{"seen_test": share}`` the training GPUs' rows of the release's kernel
        test sets with that share of their shapes held out. A predictor reads no data file itself."""
        return {}

    @abc.abstractmethod
    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        """ms for rows of the modelled classes (BMM, LINEAR, VEC, SOFTMAX, LAYERNORM)."""

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass

    # ------------------------------------------------------------ shared
    def measured_rows(self, kernels: pd.DataFrame) -> np.ndarray:
        """Which rows of a table this predictor answers with a model trained on measured kernels of the row's own
        half precision (bf16 / fp16), so that notebook 07 checked it against held-out GPUs; every other
        half-precision row is an extrapolation (``law_rows``, or FP32-trained models). None here: a predictor with such
        models says so."""
        return np.zeros(len(kernels), bool)

    def law_rows(self, kernels: pd.DataFrame) -> np.ndarray:
        """Which half-precision rows this predictor answers by a stated law fitted on measured kernels of that
        precision (``memory_law``) rather than by FP32-trained models: still an extrapolation for every kernel
        other than the measured kind. None here."""
        return np.zeros(len(kernels), bool)

    def modelled_rows(self, kernels: pd.DataFrame) -> np.ndarray:
        """The rows ``_predict_model`` answers: those of a modelled class with their dims (a malformed row falls back
        to the roofline)."""
        cls = kernels["op_class"].to_numpy()
        gemm_ok = kernels[["B", "M", "N", "K"]].notna().all(axis=1).to_numpy()
        vec_ok = kernels[["B", "H"]].notna().all(axis=1).to_numpy()
        return np.isin(cls, common.PREDICTED_CLASSES) & np.where(np.isin(cls, schema.IGEMM_CLASSES), gemm_ok, vec_ok)

    def answered_by(self, kernels: pd.DataFrame) -> np.ndarray:
        """What answers each row, as the error model (``cost/error_model.py``) names its parts: ``network <CLASS>``
        (this predictor's model of the class, trained on FP32 kernels), ``network <CLASS> at half precision`` (the same
        model on a BF16 / FP16 row: an extrapolation), ``roofline`` (no model covers the row), ``communication``
        (COMM rows: the network model). A predictor with other models names them (``NeuSightPredictor``)."""
        k = kernels.reset_index(drop=True)
        cls = k["op_class"].astype(str).to_numpy()
        half = k["precision"].isin(schema.HALF_PRECISIONS).to_numpy() if "precision" in k else np.zeros(len(k), bool)
        out = np.where(half, ANSWER_NETWORK + " " + cls.astype(object) + ANSWER_HALF,
                       ANSWER_NETWORK + " " + cls.astype(object)).astype(object)
        out[~self.modelled_rows(k)] = ANSWER_ROOFLINE
        out[cls == OpClass.COMM] = ANSWER_COMM
        return out

    def predict(self, kernels: pd.DataFrame, device) -> np.ndarray:
        common.check_kernels(kernels)
        if self.missing_networks and getattr(self, "use_tensor_core", True):
            # weights trained without the measured-kernel database: their BF16 rows would silently go through the
            # FP32 networks; ``predict_extrapolated`` (use_tensor_core False) asks for exactly that
            # the rows tensor_core.network_of gives a network (not imported: tensor_core imports this module)
            half = kernels["precision"].isin(schema.HALF_PRECISIONS) if "precision" in kernels else False
            if (half & kernels["op_class"].isin((OpClass.LINEAR, OpClass.BMM, OpClass.ATTN))).any():
                raise common.PredictorInputError(self.missing_networks)
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
        modelled = np.isin(cls, common.PREDICTED_CLASSES)
        usable = self.modelled_rows(kernels)
        if usable.any():
            sub = kernels[usable]
            out[usable] = self._predict_model(sub, device, {k: v[usable] for k, v in dev.items()})
        other = ~usable & (cls != OpClass.COMM)
        # CONV and fused attention (ATTN) rows no model of this predictor covers: their FLOPs
        # run on the GEMM / tensor-core units, so the roofline, not bytes / bandwidth
        roof = modelled[other] | np.isin(cls[other], (OpClass.CONV, OpClass.ATTN))
        out[other] = np.where(roof, common.roofline_ms(kernels[other], {k: v[other] for k, v in dev.items()}),
                              common.memory_ms(kernels[other], {k: v[other] for k, v in dev.items()}))
        bad = (cls != OpClass.COMM) & ~(np.isfinite(out) & (out > 0))
        if bad.any():
            raise FloatingPointError(f"{self.name}: {int(bad.sum())} non-positive or non-finite predictions "
                                     f"(first row: {kernels[bad].iloc[0].to_dict()})")
        return out

    def save(self, folder) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_state(self.get_state(), folder / STATE_FILE)
        meta = {"name": self.name, "version": VERSION, "seed": self.seed, "config": self.config,
                "config_hash": config_hash(self.name, {**self.config, "seed": self.seed}), "info": self.info}
        (folder / "meta.json").write_text(json.dumps(meta, indent=2, default=_json_default))
        return folder


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return None if math.isnan(float(x)) else float(x)
    return str(x)


# ---------------------------------------------------------------- prediction with trained weights
class NumpyMLP:
    """A trained ``nets.MLP`` evaluated with numpy: Linear, ReLU, ..., Linear.

    Built from its state dict (``net.<i>.weight`` / ``net.<i>.bias``, tensors or arrays), so that
    loading weights and predicting need no torch. The float32 weights are evaluated in float64: a
    kernel's prediction then does not depend on which other kernels share the matrix product (BLAS
    blocking changes float32 rounding by ~1e-7), so a sweep and a single question agree to 1e-12."""

    def __init__(self, state: dict):
        def own(v):       # a tensor's values now (a model may train on); arrays as given, cast when first used
            return v.detach().cpu().numpy().copy() if hasattr(v, "detach") else v
        idx = sorted({int(k.split(".")[1]) for k in state if k.endswith(".weight")})
        self._given = [(own(state[f"net.{i}.weight"]), own(state[f"net.{i}.bias"])) for i in idx]
        self._layers = None
        self.keys = idx

    @property
    def layers(self) -> list:
        """(W^T, b) per layer in float64, cast on first use: a question loads every network of a predictor but
        runs only those of its op classes (the cast of all of them was 30 ms of a 0.7 s answer)."""
        if self._layers is None:
            self._layers = [(np.asarray(w, dtype=np.float64).T, np.asarray(b, dtype=np.float64))   # W^T: a view
                            for w, b in self._given]
            self._given = None
        return self._layers

    def __call__(self, X: np.ndarray) -> np.ndarray:
        h = np.asarray(X, dtype=np.float64)
        if h.ndim == 2 and len(h) > 64:
            # each distinct input once: a sweep's kernels repeat their features across tables and GPUs (40-60 % of
            # the rows of the 1,200-configuration sweep's calls were repeats), and the products are BLAS-bound
            u, inv = np.unique(h, axis=0, return_inverse=True)
            if len(u) < 0.9 * len(h):
                return self._forward(u)[inv.reshape(-1)]
        return self._forward(h)

    def _forward(self, h: np.ndarray) -> np.ndarray:
        for n, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if n < len(self.layers) - 1:
                np.maximum(h, 0, out=h)
        return h

    def state_dict(self) -> dict:
        out = {}
        for i, (w, b) in zip(self.keys, self.layers):
            out[f"net.{i}.weight"], out[f"net.{i}.bias"] = w.T.astype(np.float32), b.astype(np.float32)
        return out


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
