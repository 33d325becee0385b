"""The tile look-up (predictors/tiles.py): the tile of the nearest training record, by brute force in blocks."""
import numpy as np
import pandas as pd
import pytest

from neusight_core.data import devices
from neusight_core.predictors import tiles

GPUS = ("Tesla_T4", "Tesla_V100-PCIE-32GB", "Tesla_P4")


def _records(n: int, rng) -> pd.DataFrame:
    gemm = pd.DataFrame({"op_class": "LINEAR", "device": rng.choice(GPUS, n),
                         "B": rng.integers(1, 64, n), "M": rng.integers(1, 4096, n), "N": rng.integers(1, 4096, n),
                         "K": rng.integers(1, 4096, n), "tile_m": rng.choice([32, 64, 128], n),
                         "tile_k": rng.choice([32, 64, 128], n)})
    vec = pd.DataFrame({"op_class": "VEC", "device": rng.choice(GPUS, n), "B": rng.integers(1, 4096, n),
                        "H": rng.integers(1, 8192, n), "tile": rng.choice([128, 256, 512, 1024], n)})
    return pd.concat([gemm, vec], ignore_index=True).astype({c: float for c in ("B", "M", "N", "K", "H")})


def _queries(n: int, rng) -> pd.DataFrame:
    return pd.DataFrame({"op_class": rng.choice(["LINEAR", "VEC", "SOFTMAX"], n), "B": rng.integers(1, 64, n),
                         "M": rng.integers(1, 4096, n), "N": rng.integers(1, 4096, n), "K": rng.integers(1, 4096, n),
                         "H": rng.integers(1, 8192, n)}).astype({c: float for c in ("B", "M", "N", "K", "H")})


def _expected(records: pd.DataFrame, q: pd.Series, gpu: str, method: str, fields) -> float | None:
    """The tile by the definition, one query at a time: least distance over every record of the class (authors:
    raw dims and raw GPU features; scaled: log2 dims among the reference GPU's records); None on a tie."""
    cls = q["op_class"]
    rec = records[records.op_class == cls]
    cols = ["B", "M", "N", "K"] if cls == "LINEAR" else ["B", "H"]
    dims, x = rec[cols].to_numpy(float), q[cols].to_numpy(float)
    if method == "authors":
        per_gpu = {d: [float(getattr(devices.get_device(d), f)) for f in fields] for d in GPUS}
        hw = np.array([per_gpu[d] for d in rec.device])
        target = np.array([float(getattr(devices.get_device(gpu), f)) for f in fields])
        dist = ((dims - x) ** 2).sum(1) + ((hw - target) ** 2).sum(1)
    else:
        dist = np.where(rec.device.to_numpy() == gpu, ((np.log2(dims) - np.log2(x)) ** 2).sum(1), np.inf)
    order = np.argsort(dist)
    if np.isclose(dist[order[0]], dist[order[1]], rtol=1e-9, atol=0):
        return None
    best = rec.iloc[order[0]]
    return best["tile_m"] * 1000 + best["tile_k"] if cls == "LINEAR" else best["tile"]


@pytest.mark.parametrize("method,memory", [("authors", True), ("authors", False), ("scaled", True)])
def test_the_look_up_answers_the_nearest_training_record(method, memory, monkeypatch):
    rng = np.random.default_rng(3)
    records, queries = _records(400, rng), _queries(60, rng)
    lookup = tiles.TileLookup(method, memory).fit(records)
    monkeypatch.setattr(tiles, "_BLOCK", 50)          # several blocks per query set: the split must not matter
    for gpu in ("Tesla_T4", "Tesla_V100-PCIE-32GB"):
        tile_m, tile_k, tile = lookup.lookup(queries, gpu)
        checked = 0
        for i, q in queries.iterrows():
            got = (tile_m[i] * 1000 + tile_k[i]) if q.op_class == "LINEAR" else tile[i]
            if q.op_class == "SOFTMAX":
                assert np.isnan(tile_m[i]) and np.isnan(tile[i])       # one row per tile: no look-up
                continue
            want = _expected(records, q, gpu, method, lookup.hw)
            if want is not None:
                assert got == want, (gpu, dict(q))
                checked += 1
        assert checked > 30


def test_a_tie_goes_to_the_earlier_record_and_the_memo_keeps_answers_stable():
    records = pd.DataFrame({"op_class": "LINEAR", "device": "Tesla_T4", "B": [1.0, 1.0], "M": [64.0, 256.0],
                            "N": [128.0, 128.0], "K": [128.0, 128.0], "tile_m": [32.0, 128.0], "tile_k": [32.0, 64.0]})
    q = pd.DataFrame({"op_class": ["LINEAR"] * 3, "B": 1.0, "M": [160.0, 250.0, 160.0], "N": 128.0, "K": 128.0})
    lookup = tiles.TileLookup("authors").fit(records)
    first = lookup.lookup(q, "Tesla_T4")
    # 160 is 96 from both records: the earlier one (32 x 32); 250 is nearer the second
    assert list(first[0]) == [32.0, 128.0, 32.0] and list(first[1]) == [32.0, 64.0, 32.0]
    again = lookup.lookup(q.iloc[::-1].reset_index(drop=True), "Tesla_T4")
    assert list(again[0]) == [32.0, 128.0, 32.0][::-1]


def test_a_training_gpu_without_records_of_a_class_is_not_its_reference():
    """A GPU with GEMM records but no element-wise ones: the scaled look-up of a VEC row on it takes the nearest GPU
    that has them (an empty set of records had no nearest one)."""
    rng = np.random.default_rng(5)
    records = _records(100, rng)
    records = records[~((records.op_class == "VEC") & (records.device == "Tesla_T4"))]
    lookup = tiles.TileLookup("scaled").fit(records)
    assert lookup.reference_device("Tesla_T4") == "Tesla_T4"
    assert lookup.reference_device("Tesla_T4", "VEC") in ("Tesla_V100-PCIE-32GB", "Tesla_P4")
    _, _, tile = lookup.lookup(_queries(20, rng).assign(op_class="VEC"), "Tesla_T4")
    assert np.isfinite(tile).all()
