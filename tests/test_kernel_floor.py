"""No kernel of a BF16 / FP16 scenario is predicted shorter than its GPU's shortest measured kernel (kernel_floor)."""
import statistics

import numpy as np
import pytest

from neusight_core.cost import kernel_floor, latency
from neusight_core.data import measured_kernels


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(kernel_floor, "_FLOORS", {})
    yield
    kernel_floor._FLOORS.clear()


@pytest.mark.skipif(measured_kernels.unavailable() is not None, reason="aiconfigurator-core is not installed")
def test_floors_are_the_shortest_measured_kernels_of_the_training_gpus(fresh):
    g = measured_kernels.load_gemm("training", features=False)
    want = g.groupby("device")["latency_ms"].min()
    f = kernel_floor.floors()
    assert set(f) == set(want.index) and "NVIDIA_B200" not in f           # held-out GPUs stay sealed
    assert all(f[d] == pytest.approx(want[d], rel=1e-12) for d in f)
    assert 1e-3 < f["NVIDIA_H100_80GB_HBM3"] < 5e-3                        # a few microseconds
    assert kernel_floor.floor_ms() == pytest.approx(statistics.median(f.values()))       # one floor, every GPU


@pytest.mark.skipif(measured_kernels.unavailable() is not None, reason="aiconfigurator-core is not installed")
def test_the_element_wise_floor_is_the_shortest_measured_element_wise_kernel(fresh):
    q = measured_kernels.load_quantize("training")
    want = q.groupby("device")["latency_ms"].min()
    f = kernel_floor.memory_floors()
    assert set(f) == set(want.index) and "NVIDIA_B200" not in f
    assert all(f[d] == pytest.approx(want[d], rel=1e-12) for d in f)
    low = kernel_floor.floor_ms(memory_bound=True)
    assert low == pytest.approx(statistics.median(f.values()))
    assert 0.5e-3 < low < kernel_floor.floor_ms()                   # an element-wise kernel is shorter than a GEMM tile


def test_without_the_database_the_documented_default(fresh, monkeypatch):
    monkeypatch.setattr(measured_kernels, "unavailable", lambda root=None: "not installed")
    assert kernel_floor.floors() == {} and kernel_floor.memory_floors() == {}
    assert kernel_floor.floor_ms() == kernel_floor.DEFAULT_FLOOR_US / 1e3
    assert kernel_floor.floor_ms(memory_bound=True) == kernel_floor.DEFAULT_MEMORY_FLOOR_US / 1e3


def test_bf16_kernels_are_floored_by_their_kind_and_fp32_ones_are_not(fresh):
    floor, low = kernel_floor.floor_ms(), kernel_floor.floor_ms(memory_bound=True)
    kw = dict(model="gpt2_large", device="H100", batch=1, seq=1, past=128, mode="inf", predictor="roofline")
    half = latency.predict_model(dtype="bf16", **kw)
    k = half["kernels"]
    per = k["pred_ms"].to_numpy() / k["count"].to_numpy()
    mem = k["op_class"].isin(kernel_floor.MEMORY_BOUND).to_numpy()
    assert mem.any() and (~mem).any()
    assert per[~mem].min() >= floor * (1 - 1e-12)                  # GEMMs and attention: the GEMM floor
    assert per[mem].min() >= low * (1 - 1e-12)
    assert per[mem].min() < floor * (1 - 1e-6)                      # one token's element-wise kernels: their own floor
    assert half["kernel_ms"] >= half["launches"] * low
    full = latency.predict_model(dtype="fp32", **kw)["kernels"]            # the paper's precision: as before
    assert (full["pred_ms"].to_numpy() / full["count"].to_numpy()).min() < floor / 100
    assert np.isclose(half["kernel_ms"], k["pred_ms"].sum())
