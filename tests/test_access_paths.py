"""ATen's slower element-wise paths (aten_ops.access, memory_law.PATH_RATE): the tracer labels a row by the kernel
PyTorch runs it on, half-precision tables carry the label and FP32 tables do not, the law answers such rows at the
path's rate, and that rate is what the fit gives on our recorded kernel timings."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from neusight_core.question.step import Step
from neusight_core.tracing import aten_ops, trace
from neusight_core.data import configs
from neusight_core.predictors import memory_law, training
from neusight_core.question.schema import OpClass

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import elementwise_paths  # noqa: E402


def _label(base, ins, out):
    return aten_ops.access(base, OpClass.VEC if base != "cat" else OpClass.MEM, ins, [out])


def test_access_labels_each_kernel_path():
    x, y = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    assert _label("mul", [x, y], x * y) == ""
    w = torch.randn(64, dtype=torch.bfloat16)
    assert _label("mul", [x, w], x * w) == "strided"                 # broadcast weight
    q = torch.randn(1, 16, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, 16, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    assert _label("add", [q, k], q + k) == ""                        # alike transposed views: vectorised
    c = q.contiguous()
    assert _label("add", [q, c], q + c) == "strided"                 # different layouts
    assert _label("_to_copy", [x], x.float()) == "upcast"
    assert _label("_to_copy", [x.float()], x.float().to(torch.bfloat16)) == ""   # a narrowing copy is vectorised
    halves = (q[..., 32:], q[..., :32])
    assert _label("cat", list(halves), torch.cat(halves, -1)) == "strided_cat"
    assert _label("cat", [c, c], torch.cat([c, c], -2)) == ""
    assert aten_ops.access("mm", OpClass.LINEAR, [x], [x]) == ""


def test_sweep_kinds_are_labelled_as_the_tracer_labels_them():
    """The fit reads each timed kernel's label from the tracer's own rule; the slow kinds are the ones it calls slow."""
    got = {k: elementwise_paths.traced_access(k) for k in elementwise_paths.KINDS}
    assert {k for k, v in got.items() if v} == {"weight_mul", "rsqrt_mul_fp32", "rotary_mul", "to_fp32", "rotate_half"}
    assert got["rotate_half"] == "strided_cat" and got["to_fp32"] == "upcast"


def test_half_tables_carry_paths_and_fp32_tables_do_not():
    cfg = configs.load_config("llama3_2_1b")
    cfg.num_hidden_layers = 1
    half = trace.trace_model(Step(model=cfg, batch=1, seq=64, mode="inf", attention="sdpa", dtype="bf16"))
    fp32 = trace.trace_model(Step(model=cfg, batch=1, seq=64, mode="inf", attention="sdpa"))
    assert "access" not in fp32.columns
    counts = half["access"].value_counts()
    # per layer: two RMSNorms (FP32 upcast, broadcast FP32 rsqrt product, broadcast weight product), rotary
    # (two broadcast products and one add of unlike layouts per q and k, rotate_half's cat and neg of a slice)
    assert counts["strided_cat"] == 2 and counts["upcast"] >= 3 and counts["strided"] >= 8
    assert set(half.loc[half["op_class"].isin([OpClass.LINEAR, OpClass.ATTN]), "access"]) == {""}


def test_a_path_row_is_timed_by_its_elements_on_the_sms():
    n = 2.0 ** 26
    row = pd.DataFrame({"op_class": ["VEC", "VEC"], "precision": "bf16", "bytes_read": 2 * n,
                        "bytes_written": 2 * n, "access": ["", "strided"]})
    p = {"t0_us": 2.0, "eta": 0.9, "beta": 18.0}
    t = memory_law.time_ms(row, "H100", p, {"strided": 1.0})
    sm_cycles = 132 * 1980e6
    assert t[1] == pytest.approx((2e-6 + n / sm_cycles) * 1e3, rel=1e-9)
    assert t[0] < t[1]
    # and the same rows without the column (an FP32-era table) are the plain law
    assert memory_law.time_ms(row.drop(columns="access"), "H100", p)[1] == pytest.approx(t[0])
    assert list(memory_law.answers(row.assign(precision="fp32"))) == [False, True]


def test_path_rates_are_the_fit_on_the_recorded_kernels():
    k = elementwise_paths.recorded_kernels()
    assert set(k["device"]) == {"H100", "H200"}
    law = training.memory_law_params()
    got = memory_law.fit_paths(k, law)
    assert set(got) == set(memory_law.PATH_RATE)
    for path, g in got.items():
        assert memory_law.PATH_RATE[path] == pytest.approx(g, abs=5e-4), path
    # the fitted rates explain the slow kinds far better than the law alone (training data: a sanity check)
    big = k[k["elements"] >= memory_law.PATH_FIT_MIN_ELEMENTS]
    slow = big[big["access"] != ""]
    ape = lambda t: float(np.mean(np.abs(t / slow["measured_ms"].to_numpy() - 1)))  # noqa: E731
    assert ape(memory_law.time_ms(slow, None, law)) < 0.15 < ape(memory_law.time_ms(slow.assign(access=""), None, law))
