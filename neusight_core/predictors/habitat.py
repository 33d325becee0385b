"""Habitat-style baseline (Yu et al., ATC'21; SPEC 3.2).

GEMMs (BMM, LINEAR): an MLP per class on (B, M, N, K, bandwidth, memory, SMs, FP32 peak), z-scored,
predicting the latency directly (softplus output, ms), trained with a MAPE loss.
Convolutions (CONV): the same on the conv parameters (B, C_in, C_out, k, image size, stride,
padding) and the GPU features, as Habitat's conv2d MLP; backward rows scaled from the forward conv by FLOPs.
Vector ops (VEC, SOFTMAX, LAYERNORM): Habitat's wave scaling -- the latency the same op has on a
reference training GPU (V100, interpolated in log-log over its measured records of that op by bytes
moved) times the ratio of memory bandwidths reference / target.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.question import schema
import neusight_core.predictors.common as common
from neusight_core.predictors.base import KernelPredictor, NumpyMLP, Timer, split_validation
from neusight_core.question.schema import OpClass

FEATURES = ("B", "M", "N", "K")
# Habitat's conv2d MLP takes the layer's parameters (batch, channels, kernel, image size, stride, padding)
CONV_FEATURES = ("B", "conv_cin", "conv_cout", "conv_k", "conv_in", "conv_stride", "conv_pad")
HW_INPUTS = ("mem_bw_gbs", "mem_gb", "num_sm", "fp32_gflops")
REFERENCE = "Tesla_V100-PCIE-32GB"


def _gemm_x(kernels: pd.DataFrame, dev: dict, features=FEATURES) -> np.ndarray:
    dims = [kernels[c].fillna(1).to_numpy(float) for c in features]
    return np.stack(dims + [dev[h] for h in HW_INPUTS], 1)


def _features(cls: str):
    return CONV_FEATURES if cls in common.CONV_CLASSES else FEATURES


def _conv_backward_scale(kernels: pd.DataFrame) -> np.ndarray:
    """A convolution row's FLOPs over those of the forward conv with the same parameters: the release
    measures forward convolutions only, so a dgrad / wgrad row is predicted as the forward conv scaled by
    its FLOPs (1 for fwd and wgrad; (in / out)^2 for dgrad). A stated stand-in, not Habitat's own."""
    from neusight_core.data.dataset import conv_gemm
    g = conv_gemm(kernels["B"], kernels["conv_cin"], kernels["conv_cout"], kernels["conv_k"], kernels["conv_in"],
                  kernels["conv_stride"], kernels["conv_pad"], kernels["conv_groups"].fillna(1),
                  np.full(len(kernels), "fwd", dtype=object))
    return kernels["flops"].to_numpy(float) / g["flops"]


class HabitatPredictor(KernelPredictor):
    name = "habitat"
    trains_mlps = True

    @classmethod
    def default_config(cls) -> dict:
        return {"reference": REFERENCE}

    def __init__(self, config=None, seed=0, name=None):
        super().__init__(config, seed, name)
        self.nets: dict = {}
        self.norm: dict = {}
        self.curves: dict = {}      # key (sub_op or class) -> (log bytes, log ms) of the reference GPU

    def _net(self, n_features: int = len(FEATURES)):
        from neusight_core.predictors.nets import MLP
        return MLP(n_features + len(HW_INPUTS), 1, self.config["hidden"], self.config["layers"])

    def fit(self, train, quick: bool = False) -> None:
        import torch
        from tqdm.auto import tqdm

        from neusight_core.predictors.nets import as_tensors, train_loop
        torch.manual_seed(self.seed)
        k = train.kernels
        ep = self.config["quick_epochs"] if quick else self.config["epochs"]
        # convolutions last: the GEMM networks draw their initialisation first, as before CONV existed
        gemm_classes = [c for c in schema.IGEMM_CLASSES if (k["op_class"] == c).any()]
        self.info = {"data_checksum": train.checksum, "quick": quick, "classes": {}}
        with Timer() as t, tqdm(total=ep * len(gemm_classes), desc=f"train {self.name}", unit="epoch") as bar:
            for cls in gemm_classes:
                df = k[k["op_class"] == cls].reset_index(drop=True)
                dev = common.device_arrays(df)
                X = _gemm_x(df, dev, _features(cls))
                mu, sd = X.mean(0), X.std(0) + 1e-9
                self.norm[cls] = (mu, sd)
                Xt, y = as_tensors((X - mu) / sd, df["latency_ms"].to_numpy(float))
                net = self._net(len(_features(cls)))
                self.nets[cls] = net

                def ratio(idx, net=net, Xt=Xt, y=y):
                    return torch.nn.functional.softplus(net(Xt[idx])[:, 0]) / y[idx] + 1e-9

                val = split_validation(len(df), self.config["val_fraction"], self.seed)
                res = train_loop(net, ratio, len(df), val, ep, self.config["batch"], self.config["lr"], "ape",
                                 self.seed, bar)
                self.info["classes"][cls] = {"rows": len(df), "val_mape": res["val_mape"]}
                self.nets[cls] = NumpyMLP(net.state_dict())     # predictions run with numpy
            ref = k[k["device"] == self.config["reference"]]
            for cls in common.VECTOR_CLASSES:
                rc = ref[ref["op_class"] == cls]
                if rc.empty:
                    continue
                self.curves[cls] = self._curve(rc)
                if cls == OpClass.VEC:
                    for sub, g in rc.groupby("sub_op"):
                        self.curves[f"VEC:{sub}"] = self._curve(g)
        self.info["train_seconds"] = t.seconds
        self.fitted = True

    @staticmethod
    def _curve(df: pd.DataFrame) -> np.ndarray:
        lb = np.log(common.total_bytes(df))
        lm = np.log(df["latency_ms"].to_numpy(float))
        s = pd.Series(lm).groupby(np.round(lb, 2)).median()
        return np.stack([s.index.to_numpy(float), s.to_numpy(float)])

    def _reference_ms(self, kernels: pd.DataFrame) -> np.ndarray:
        out = np.empty(len(kernels))
        lb = np.log(common.total_bytes(kernels))
        keys = np.where(kernels["op_class"].eq(OpClass.VEC), "VEC:" + kernels["sub_op"].fillna("").astype(str),
                        kernels["op_class"].astype(str))
        for key in np.unique(keys):
            rows = keys == key
            curve = self.curves.get(key, self.curves.get(key.split(":")[0]))
            xb, ym = curve
            v = np.interp(lb[rows], xb, ym)
            # beyond the largest measured size the time grows with the bytes moved
            v = np.where(lb[rows] > xb[-1], ym[-1] + lb[rows] - xb[-1], v)
            out[rows] = np.exp(v)
        return out

    def _predict_model(self, kernels: pd.DataFrame, device, dev: dict) -> np.ndarray:
        out = common.roofline_ms(kernels, dev)
        cls_col = kernels["op_class"].to_numpy()
        for cls, net in self.nets.items():
            rows = cls_col == cls
            if rows.any():
                mu, sd = self.norm[cls]
                X = (_gemm_x(kernels[rows], {k: v[rows] for k, v in dev.items()}, _features(cls)) - mu) / sd
                z = net(X)[:, 0].astype(float)
                out[rows] = np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))   # softplus, as torch's
                if cls in common.CONV_CLASSES:
                    out[rows] *= _conv_backward_scale(kernels[rows])
        vec = np.isin(cls_col, list(common.VECTOR_CLASSES)) & np.isin(cls_col, [c for c in self.curves if ":" not in c])
        if vec.any():
            ref_bw = devices.get_device(self.config["reference"]).mem_bw_gbs
            out[vec] = self._reference_ms(kernels[vec]) * ref_bw / dev["mem_bw_gbs"][vec]
        return np.maximum(out, 1e-9)

    def get_state(self) -> dict:
        return {"nets": {c: n.state_dict() for c, n in self.nets.items()},
                "norm": {c: {"mu": m, "sd": s} for c, (m, s) in self.norm.items()},
                "curves": dict(self.curves)}

    def set_state(self, state: dict) -> None:
        self.nets = {}
        for c, sd in state["nets"].items():
            self.nets[c] = NumpyMLP(sd)
        self.norm = {c: (np.asarray(v["mu"]), np.asarray(v["sd"])) for c, v in state["norm"].items()}
        self.curves = {c: np.asarray(v) for c, v in state["curves"].items()}
