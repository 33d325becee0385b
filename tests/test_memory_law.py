"""Issue 33 item 2: BF16 / FP16 memory-bound kernels by the memory law (predictors/memory_law.py), its numbers from
NVIDIA's measured element-wise kernels of the training GPUs; FP32 rows and the paper's recipes untouched."""
import numpy as np
import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.data import measured_kernels
from neusight_core.cost import tables
from neusight_core.predictors import memory_law, training

NO_DB = measured_kernels.unavailable() is not None
GPUS = ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "NVIDIA_L40S")


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(training, "_LAW", None)
    yield
    training._LAW = None


def _vec_rows(moved_bytes, device=None) -> pd.DataFrame:
    """BF16 element-wise rows moving ``moved_bytes`` each (2/3 read, 1/3 written)."""
    b = np.asarray(moved_bytes, float)
    k = pd.DataFrame({"op_class": "VEC", "sub_op": "mulu", "B": b / 3, "M": np.nan, "N": np.nan, "K": np.nan,
                      "H": 1.0, "flops": b / 3, "bytes_read": 2 * b / 3, "bytes_written": b / 3,
                      "precision": "bf16", "count": 1})
    if device is not None:
        k["device"] = device
    return k


def test_fit_recovers_a_known_law():
    want = {"t0_us": 2.5, "eta": 0.8, "beta": 20.0}
    moved = np.geomspace(1e4, 4e9, 60)
    k = pd.concat([_vec_rows(moved, d) for d in GPUS], ignore_index=True)
    k["latency_ms"] = memory_law.time_ms(k, None, want)
    got = memory_law.fit(k)
    for c, v in want.items():
        assert got[c] == pytest.approx(v, rel=1e-4), c


def test_below_the_l2_bandwidth_does_not_matter_above_it_it_does():
    p = memory_law.DEFAULT_LAW
    t0 = p["t0_us"] * 1e-3
    small, large = _vec_rows([16e6]), _vec_rows([2e9])
    h100, h200 = (memory_law.time_ms(small, d, p)[0] for d in ("H100", "H200"))
    assert h200 == pytest.approx(h100, rel=1e-12)           # same SMs, clock and L2: same time
    a, b = ((memory_law.time_ms(large, d, p)[0] - t0) for d in ("H100", "H200"))
    assert b / a == pytest.approx(3430 / 4800, rel=1e-9)    # DRAM-bound: the catalogue's bandwidth ratio
    assert memory_law.time_ms(_vec_rows([0.0]), "H100", p)[0] >= t0          # a fixed time, whatever it moves


def test_it_answers_half_precision_memory_bound_rows_only():
    k = tables.trace(Step(model="llama2_7b", batch=1, seq=64, mode="inf", dtype="bf16", attention="sdpa"))
    rows = memory_law.answers(k)
    assert rows.any()
    path = k["access"].ne("").to_numpy()
    # half-precision rows, and FP32 rows only on one of ATen's slower paths (an upcast, a broadcast FP32 product)
    assert set(k.loc[rows & ~path, "precision"]) <= {"bf16", "fp16"} and (k.loc[rows & path, "precision"] == "fp32").any()
    assert set(k.loc[rows, "op_class"]) <= set(memory_law.LAW_CLASSES) and "LINEAR" not in memory_law.LAW_CLASSES
    assert (k.loc[~rows & k["op_class"].isin(memory_law.LAW_CLASSES), "precision"] == "fp32").all()   # e.g. FP32 pow
    assert not memory_law.answers(tables.trace(Step(model="gpt2_large", batch=1, seq=64, mode="inf"))).any()       # the paper's FP32 tables


def test_neusight_uses_it_for_those_rows_and_nothing_else():
    from neusight_core import predictors
    p = predictors.get("neusight", quick=True)
    k = tables.trace(Step(model="llama2_7b", batch=1, seq=64, mode="inf", dtype="bf16", attention="sdpa")).reset_index(drop=True)
    rows = memory_law.answers(k)
    got = p.predict(k, "H200")
    assert np.allclose(got[rows], memory_law.time_ms(k[rows], "H200", training.memory_law_params()), rtol=1e-12)
    before = p.predict_extrapolated(k, "H200")          # the FP32 networks' path, as before the law
    fp32 = (k["precision"] == "fp32").to_numpy() & ~rows
    assert fp32.any() and np.allclose(got[fp32], before[fp32], rtol=1e-12)
    assert not np.allclose(got[rows], before[rows])


@pytest.mark.skipif(NO_DB, reason="aiconfigurator-core is not installed")
def test_its_numbers_are_the_fit_on_the_training_gpus(fresh):
    q = measured_kernels.load_quantize("training")
    assert set(q["device"]) == set(GPUS)                  # no FP8 on the A100: no such kernels; held out unread
    assert set(q["kernel_source"]) == set(measured_kernels.QUANTIZE_SOURCES)
    assert np.allclose(q["bytes_read"], 2 * q["bytes_written"])
    got = training.memory_law_params()
    assert got == pytest.approx(memory_law.fit(q))
    assert got == pytest.approx(memory_law.DEFAULT_LAW, rel=1e-4)   # the documented default is that fit
    with pytest.raises(measured_kernels.SealedGPUError):
        measured_kernels.load_quantize("B300")


def test_without_the_database_the_documented_default(fresh, monkeypatch):
    monkeypatch.setattr(measured_kernels, "unavailable", lambda root=None: "not installed")
    assert training.memory_law_params() == memory_law.DEFAULT_LAW


@pytest.mark.skipif(NO_DB, reason="aiconfigurator-core is not installed")
def test_notebook_07_table_scores_each_gpu_with_the_law_left_out_on_training_gpus_only():
    from neusight_core.studies import memory_bound_eval as mbe
    k = mbe.rows()
    k = k.groupby("device").sample(40, random_state=0).reset_index(drop=True)
    long = mbe.predict_all(k, seeds=(0,), quick=True)
    t = mbe.table(long).set_index("device")
    assert set(t.loc[t.role == "training"].index) == set(GPUS)
    assert t.loc[t.role == "held_out", "law, GPU left out"].isna().all()
    assert t.loc[t.role == "training", "law, GPU left out"].notna().all()
    law = long[long.predictor == "law"]
    assert (law.predicted_ms >= mbe.kernel_floor.floor_ms(memory_bound=True) * (1 - 1e-12)).all()  # as the engine
    # the left-out fit is not the all-GPU fit: on the left-out GPU its numbers differ
    h100 = long[long.device == GPUS[0]]
    assert not np.allclose(h100[h100.predictor == "law"].predicted_ms, h100[h100.predictor == "law, GPU left out"].predicted_ms)


def test_a_table_of_several_gpus_is_answered_as_each_gpu_alone():
    """The engine predicts with ``device=None`` and a device column. Until the eleventh session that path converted
    BF16 element-wise rows to FP32 before splitting by GPU, so the law never answered them there (the FP32
    networks did) while a call with one device used the law: both must give the same numbers."""
    from neusight_core import predictors
    p = predictors.get("neusight", quick=True)
    k = tables.trace(Step(model="llama2_7b", batch=1, seq=64, mode="inf", dtype="bf16", attention="sdpa")).reset_index(drop=True)
    both = pd.concat([k.assign(device="H100"), k.assign(device="H200")], ignore_index=True)
    got = p.predict(both, None)
    assert np.allclose(got[: len(k)], p.predict(k, "H100"), rtol=1e-12)
    assert np.allclose(got[len(k):], p.predict(k, "H200"), rtol=1e-12)
    law = memory_law.answers(k) & (k["op_class"] == "VEC").to_numpy()
    assert law.any() and np.allclose(got[: len(k)][law], memory_law.time_ms(k[law], "H100", training.memory_law_params()), rtol=1e-12)
