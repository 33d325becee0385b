"""Tile sizes for kernels whose tile is not known (any kernel-table row, any GPU).

Training records carry their tile (GEMM from the kernel name, element-wise from the grid). To predict
a kernel we pick the tile of the nearest training record of the same op class (SPEC 3.1):

* ``scaled`` (default): first the reference GPU -- the GPU itself when it is a training GPU, else the
  nearest training GPU in z-scored log2 hardware features (SMs, FP32 peak, bandwidth, L2, memory) --
  then, among that GPU's records, the nearest in log2 dims (GEMM: B, M, N, K; vector: B, H).
* ``authors``: the authors' choice, unnormalised Euclidean distance over the raw dims and raw GPU
  features across all records (large numbers such as bandwidth dominate).

A tie (two records at the same distance with different tiles: M and K swapped, for instance) goes to the record
that comes first in the training data, and across training GPUs to the GPU first by name. (Until 2026-11-27 a
k-d tree answered, whose choice among tied records followed its own traversal. Of the 149 labelled configurations
one moved: OPT-1.3B inference at batch 2, seq 2048 on the V100, whose (64, 2048, 64, 2048) batched matmul is as far
from two records with different tiles; by 0.54-0.57 %, and the Tier 1 Fig. 7 mean of seeds 0-2 9.129 -> 9.139 %.)

Softmax and layernorm need no lookup: one row per tile.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.question import schema
from neusight_core.question.schema import OpClass

LOOKUP_FEATURES = ("num_sm", "fp32_gflops", "mem_bw_gbs", "l2_mb", "mem_gb")
#: the GPU features that can change a kernel's speed: ``memory=False`` looks tiles up on these alone
SPEED_HW = ("num_sm", "fp32_gflops", "mem_bw_gbs", "l2_mb")
LOOKUP_CLASSES = (OpClass.BMM, OpClass.LINEAR, OpClass.VEC)


def _dims(df: pd.DataFrame, cls: str) -> np.ndarray:
    cols = ("B", "M", "N", "K") if cls in schema.GEMM_CLASSES else ("B", "H")
    return np.stack([np.maximum(df[c].fillna(1).to_numpy(float), 1.0) for c in cols], axis=1)


def _hw(dev, fields=LOOKUP_FEATURES) -> np.ndarray:
    return np.array([float(getattr(dev, f)) for f in fields])


#: query rows x records per block of the brute-force search (32 MB of float64 per temporary)
_BLOCK = 1 << 22


def _nearest(cols: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(squared distance, index) of the nearest point (``cols``: one row per coordinate) to each query row; a
    tie goes to the lower index. Brute force in blocks: a question asks tens of distinct shapes and a sweep a
    few hundred per class, against 1-40 k records of one GPU; a k-d tree's import and build cost a new process
    more (0.35 s of its 1.1 s) than this search."""
    n = cols.shape[1]
    dist, idx = np.empty(len(queries)), np.empty(len(queries), dtype=np.int64)
    step = max(1, _BLOCK // max(n, 1))
    for s in range(0, len(queries), step):
        q = queries[s:s + step]
        d, tmp = np.zeros((len(q), n)), np.empty((len(q), n))
        for j in range(cols.shape[0]):
            np.subtract(cols[j][None, :], q[:, j, None], out=tmp)
            d += np.square(tmp, out=tmp)
        i = d.argmin(1)
        idx[s:s + step], dist[s:s + step] = i, d[np.arange(len(q)), i]
    return dist, idx


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
        self._groups: dict = {}     # (cls, training GPU) -> (columns, tiles, memo)

    # ------------------------------------------------------------ fit / state
    def fit(self, kernels: pd.DataFrame) -> "TileLookup":
        """Remember (device, dims, tile) of every training record of the classes that need a lookup."""
        for cls in LOOKUP_CLASSES:
            df = kernels[kernels["op_class"] == cls]
            if df.empty:
                continue
            tiles = (df[["tile_m", "tile_k"]] if cls in schema.GEMM_CLASSES else df[["tile"]].assign(z=0.0)).to_numpy(float)
            self.records[cls] = {"device": df["device"].astype(str).tolist(), "dims": _dims(df, cls), "tiles": tiles}
        self._groups = {}
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
    def reference_device(self, device, cls: str | None = None) -> str:
        """The training GPU whose tiles stand in for ``device`` (itself when it is one); with ``cls``, among the
        training GPUs that have records of that class."""
        dev = devices.get_device(device)
        names = sorted({n for c, r in self.records.items() if cls in (None, c) for n in r["device"]})
        if dev.name in names:
            return dev.name
        feats = np.log2(np.stack([_hw(devices.get_device(n), self.hw) for n in names]))
        mu, sd = feats.mean(0), feats.std(0) + 1e-9
        target = (np.log2(_hw(dev, self.hw)) - mu) / sd
        dist = (((feats - mu) / sd - target) ** 2).sum(1)
        return names[int(np.argmin(dist))]

    def _group(self, cls: str, name: str):
        """The records of one training GPU in the look-up's space (log2 dims for ``scaled``, raw dims for
        ``authors``), as columns, with their tiles and a memo of the answers given so far (a sweep asks the same
        shapes for every GPU)."""
        if (cls, name) not in self._groups:
            r = self.records[cls]
            sel = np.array([d == name for d in r["device"]])
            pts = np.log2(r["dims"][sel]) if self.method == "scaled" else r["dims"][sel]
            self._groups[(cls, name)] = (np.ascontiguousarray(pts.T), r["tiles"][sel], {})
        return self._groups[(cls, name)]

    def _nearest(self, cls: str, name: str, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(squared distance, tile row) of the nearest record of training GPU ``name`` to each query row."""
        cols, tiles, memo = self._group(cls, name)
        keys = [q.tobytes() for q in queries]
        todo = [i for i, k in enumerate(keys) if k not in memo]
        if todo:
            dist, idx = _nearest(cols, queries[todo])
            for i, d, j in zip(todo, dist, idx):
                memo[keys[i]] = (d, j)
        found = [memo[k] for k in keys]
        return np.array([d for d, _ in found]), tiles[np.array([j for _, j in found], dtype=np.int64)]

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
            shapes, row_shape = np.unique(_dims(kernels.iloc[rows], cls), axis=0, return_inverse=True)
            if self.method == "scaled":
                _, tiles = self._nearest(cls, self.reference_device(dev, cls), np.log2(shapes))
            else:
                # the authors' distance over (dims, GPU features): every record of a training GPU shares its
                # features, so it is that GPU's nearest record in dims plus the GPU's distance, least over GPUs
                # (a tie keeps the GPU first by name)
                best, tiles = np.full(len(shapes), np.inf), np.zeros((len(shapes), 2))
                target = _hw(dev, self.hw)
                for name in sorted({d for d in self.records[cls]["device"]}):
                    dist, found = self._nearest(cls, name, shapes)
                    dist = dist + ((_hw(devices.get_device(name), self.hw) - target) ** 2).sum()
                    better = dist < best
                    best[better], tiles[better] = dist[better], found[better]
            tiles = tiles[row_shape.reshape(-1)]
            if cls in schema.GEMM_CLASSES:
                tile_m[rows], tile_k[rows] = tiles[:, 0], tiles[:, 1]
            else:
                tile[rows] = tiles[:, 0]
        return tile_m, tile_k, tile
