"""Tile sizes for kernels whose tile is not known (any kernel-table row, any GPU).

Training records carry their tile (GEMM from the kernel name, element-wise from the grid). To predict
a kernel we pick the tile of the nearest training record of the same op class (SPEC 3.1):

* ``scaled`` (default): first the reference GPU -- the GPU itself when it is a training GPU, else the
  nearest training GPU in z-scored log2 hardware features (SMs, FP32 peak, bandwidth, L2, memory) --
  then, among that GPU's records, the nearest in log2 dims (GEMM: B, M, N, K; vector: B, H).
* ``authors``: the authors' choice, unnormalised Euclidean distance over the raw dims and raw GPU
  features across all records (large numbers such as bandwidth dominate).

Softmax and layernorm need no lookup: one row per tile.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core import devices, schema
from neusight_core.schema import OpClass

LOOKUP_FEATURES = ("num_sm", "fp32_gflops", "mem_bw_gbs", "l2_mb", "mem_gb")
#: the GPU features that can change a kernel's speed: ``memory=False`` looks tiles up on these alone
SPEED_HW = ("num_sm", "fp32_gflops", "mem_bw_gbs", "l2_mb")
LOOKUP_CLASSES = (OpClass.BMM, OpClass.LINEAR, OpClass.VEC)


def _dims(df: pd.DataFrame, cls: str) -> np.ndarray:
    cols = ("B", "M", "N", "K") if cls in schema.GEMM_CLASSES else ("B", "H")
    return np.stack([np.maximum(df[c].fillna(1).to_numpy(float), 1.0) for c in cols], axis=1)


def _hw(dev, fields=LOOKUP_FEATURES) -> np.ndarray:
    return np.array([float(getattr(dev, f)) for f in fields])


class TileLookup:
    def __init__(self, method: str = "scaled", memory: bool = True):
        """``memory``: whether the GPU features of the look-up include the memory capacity (the authors' do; it
        cannot change a kernel's speed, and a GPU that differs from another only in memory must get its tiles)."""
        if method not in ("scaled", "authors"):
            raise ValueError(f"tile lookup method must be 'scaled' or 'authors', not {method!r}")
        self.method = method
        self.memory = bool(memory)
        self.hw = LOOKUP_FEATURES if self.memory else SPEED_HW
        self.records: dict = {}     # cls -> {"device": [...], "dims": array, "tiles": array (n, 2)}
        self._trees: dict = {}

    # ------------------------------------------------------------ fit / state
    def fit(self, kernels: pd.DataFrame) -> "TileLookup":
        """Remember (device, dims, tile) of every training record of the classes that need a lookup."""
        for cls in LOOKUP_CLASSES:
            df = kernels[kernels["op_class"] == cls]
            if df.empty:
                continue
            tiles = (df[["tile_m", "tile_k"]] if cls in schema.GEMM_CLASSES else df[["tile"]].assign(z=0.0)).to_numpy(float)
            self.records[cls] = {"device": df["device"].astype(str).tolist(), "dims": _dims(df, cls), "tiles": tiles}
        self._trees = {}
        return self

    def state(self) -> dict:
        out = {"method": self.method, "memory": self.memory, "records": {}}
        for c, r in self.records.items():
            names = sorted(set(r["device"]))
            codes = np.array([names.index(d) for d in r["device"]], dtype=np.int64)
            out["records"][c] = {"names": names, "codes": codes, "dims": r["dims"], "tiles": r["tiles"]}
        return out

    @classmethod
    def from_state(cls, state: dict) -> "TileLookup":
        t = cls(state["method"], bool(state.get("memory", True)))
        for c, r in state["records"].items():
            names = list(r["names"])
            t.records[c] = {"device": [names[i] for i in np.asarray(r["codes"])],
                            "dims": np.asarray(r["dims"], float), "tiles": np.asarray(r["tiles"], float)}
        return t

    # ------------------------------------------------------------ lookup
    def reference_device(self, device) -> str:
        """The training GPU whose tiles stand in for ``device`` (itself when it is one)."""
        dev = devices.get_device(device)
        names = sorted({n for r in self.records.values() for n in r["device"]})
        if dev.name in names:
            return dev.name
        feats = np.log2(np.stack([_hw(devices.get_device(n), self.hw) for n in names]))
        mu, sd = feats.mean(0), feats.std(0) + 1e-9
        target = (np.log2(_hw(dev, self.hw)) - mu) / sd
        dist = (((feats - mu) / sd - target) ** 2).sum(1)
        return names[int(np.argmin(dist))]

    def _tree(self, cls: str, key):
        if (cls, key) not in self._trees:
            from scipy.spatial import cKDTree     # here, not at import: 0.3 s that only a look-up needs
            r = self.records[cls]
            if self.method == "scaled":
                sel = np.array([d == key for d in r["device"]])
                pts = np.log2(r["dims"][sel])
                self._trees[(cls, key)] = (cKDTree(pts), r["tiles"][sel])
            else:
                # one catalogue look-up per training GPU, not per record (tens of thousands of them)
                by_name = {d: _hw(devices.get_device(d), self.hw) for d in set(r["device"])}
                hw = np.stack([by_name[d] for d in r["device"]])
                self._trees[(cls, key)] = (cKDTree(np.concatenate([r["dims"], hw], 1)), r["tiles"])
        return self._trees[(cls, key)]

    def lookup(self, kernels: pd.DataFrame, device) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tile_m, tile_k, tile) per row; NaN where the class needs no lookup."""
        n = len(kernels)
        tile_m, tile_k, tile = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        cls_col = kernels["op_class"].to_numpy()
        dev = devices.get_device(device)
        for cls in LOOKUP_CLASSES:
            rows = np.flatnonzero(cls_col == cls)
            if rows.size == 0 or cls not in self.records:
                continue
            q = _dims(kernels.iloc[rows], cls)
            if self.method == "scaled":
                tree, tiles = self._tree(cls, self.reference_device(dev))
                _, idx = tree.query(np.log2(q))
            else:
                tree, tiles = self._tree(cls, "all")
                _, idx = tree.query(np.concatenate([q, np.tile(_hw(dev, self.hw), (len(q), 1))], 1))
            if cls in schema.GEMM_CLASSES:
                tile_m[rows], tile_k[rows] = tiles[idx, 0], tiles[idx, 1]
            else:
                tile[rows] = tiles[idx, 0]
        return tile_m, tile_k, tile
