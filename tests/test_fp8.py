"""FP8 as a precision (issue 63, item 1): the catalogue's FP8 peaks and the refusal without them, the tracer's fp8
rows, one byte per weight, the FP8 GEMM network's rows and data, and the CLI round trip."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import latency, memory
from neusight_core.data import devices
from neusight_core.data import measured_kernels as mk
from neusight_core.predictors import tensor_core
from neusight_core.question.schema import Precision
from neusight_core.question.step import LatencyInputError, Step
from neusight_core.tracing import trace


def test_fp8_peaks_where_the_datasheets_give_them_and_none_elsewhere(release_root):
    # dense FP8 (half the datasheets' "with sparsity" figures)
    for gpu, peak in (("H100", 1978900), ("H200", 1978900), ("H100-PCIe", 1513000), ("L40S", 733000),
                      ("L4", 242500), ("B200", 4500000), ("GB200", 5000000)):
        d = devices.get_device(gpu)
        assert d.has_tensor_peak("fp8") and d.gemm_peak_gflops("fp8") == peak, gpu
    for gpu in ("A100", "A100-SXM4-80GB", "V100", "T4", "P100", "P4", "MI100", "MI210", "MI250", "H100-TP"):
        assert not devices.get_device(gpu).has_tensor_peak("fp8"), gpu


@pytest.mark.parametrize("gpu", ["A100", "V100", "T4", "P100", "MI250"])
def test_fp8_without_fp8_tensor_cores_is_a_one_line_refusal(gpu, release_root):
    with pytest.raises(LatencyInputError, match="has no FP8 tensor cores") as e:
        latency.predict_model("llama2_7b", gpu, 1, 64, "inf", predictor="roofline", dtype="fp8")
    assert "\n" not in str(e.value)


def test_fp8_training_is_refused(release_root):
    with pytest.raises(LatencyInputError, match="inference only"):
        latency.predict_model("llama2_7b", "H100", 1, 64, "train", predictor="roofline", dtype="fp8")


def test_fp8_trace_is_bf16_with_its_layers_linear_gemms_in_fp8():
    k16 = trace.trace_model(Step(model="llama2_7b", batch=1, seq=32, mode="inf", dtype="bf16", attention="sdpa"))
    k8 = trace.trace_model(Step(model="llama2_7b", batch=1, seq=32, mode="inf", dtype="fp8", attention="sdpa"))
    assert len(k8) == len(k16) and (k8["op_class"].to_numpy() == k16["op_class"].to_numpy()).all()
    fp8 = (k8["precision"] == "fp8").to_numpy()
    layer_linear = ((k16["op_class"] == "LINEAR") & (k16["layer"] >= 0)).to_numpy()
    assert layer_linear.any() and (fp8 == layer_linear).all()
    # the head's GEMM and everything else stay as in bf16
    same = ~fp8
    assert (k8["precision"].to_numpy()[same] == k16["precision"].to_numpy()[same]).all()
    assert (k8.loc[(k8["op_class"] == "LINEAR") & (k8["layer"] < 0), "precision"] == "bf16").all()
    np.testing.assert_allclose(k8["bytes_read"].to_numpy()[same], k16["bytes_read"].to_numpy()[same])
    # W8A8: the operands at one byte, the output BF16, the same FLOPs
    np.testing.assert_allclose(k8["bytes_read"].to_numpy()[fp8], k16["bytes_read"].to_numpy()[fp8] / 2)
    np.testing.assert_allclose(k8["bytes_written"], k16["bytes_written"])
    np.testing.assert_allclose(k8["flops"], k16["flops"])


def test_fp8_counts_one_byte_per_weight():
    k16 = trace.trace_model(Step(model="llama2_7b", batch=1, seq=32, mode="inf", dtype="bf16"))
    k8 = trace.trace_model(Step(model="llama2_7b", batch=1, seq=32, mode="inf", dtype="fp8"))
    f16, f8 = memory.footprint(k16), memory.footprint(k8)
    params = f8["params_per_gpu"]
    assert params == f16["params_per_gpu"] > 6e9
    assert f8["weights_gib"] * 2**30 == pytest.approx(params * 1.0)          # one byte per weight
    assert f16["weights_gib"] == pytest.approx(2 * f8["weights_gib"])
    # activations are BF16 in both
    assert f8["activations_gib"] == pytest.approx(f16["activations_gib"])


def test_fp8_rows_go_to_the_fp8_network():
    rows = pd.DataFrame({"op_class": ["LINEAR", "LINEAR", "BMM", "LINEAR", "ATTN"],
                         "precision": ["fp8", "bf16", "fp8", "fp32", "bf16"],
                         "B": [1, 1, 4, 1, 1], "M": [8, 8, 8, 8, np.nan], "N": [64, 64, 64, 64, np.nan],
                         "K": [32, 32, 32, 32, np.nan]})
    assert tensor_core.network_of(rows).tolist() == ["GEMM_fp8", "GEMM", "GEMM_fp8", "", ""]
    # GEMM_fp8 shares GEMM's settings where a {network: value} setting does not name it
    c = {**tensor_core.DEFAULTS, "members": {"GEMM": 3, "ATTN_prefill": 1}, "u_max": {"GEMM_fp8": 5, "GEMM": 2}}
    assert tensor_core.setting(c, "members", "GEMM_fp8") == 3 and tensor_core.setting(c, "u_max", "GEMM_fp8") == 5
    with pytest.raises(KeyError):
        tensor_core.setting(c, "members", "ATTN_decode")


def test_fp8_gemm_row_by_hand():
    raw = pd.DataFrame([("torch.nn.functional.linear", "bfloat16", 3, 5, 7, 0.01),
                        ("CutlassFP8ScaledMMLinearKernel", "fp8", 3, 5, 7, 0.005)],
                       columns=list(mk.GEMM_COLUMNS))
    k = mk.gemm_kernels(raw, "h100_sxm", "vllm", "0.24.0", "fp8")
    assert len(k) == 1
    r = k.iloc[0]
    assert (r.M, r.N, r.K, r.flops) == (3, 7, 5, 210)
    assert r.bytes_read == 1 * (3 * 7 + 7 * 5) and r.bytes_written == 2 * 3 * 5     # FP8 in, BF16 out
    assert (r.precision, r["dtype"], r.latency_ms) == ("fp8", "bfloat16", 0.005)


@pytest.fixture(scope="module")
def package():
    return pytest.importorskip("aiconfigurator_core", reason="aiconfigurator-core is not installed")


def test_fp8_network_trains_on_the_training_gpus_only(package, release_root):
    t = mk.training_kernels(("GEMM_fp8",))
    assert set(t["precision"]) == {"fp8"}
    # the training GPUs with FP8 tensor cores: never A100 (none), never a held-out or sealed GPU
    assert set(t["device"]) == {mk.CATALOGUE[s] for s in ("h100_sxm", "h200_sxm", "l40s")}
    assert not set(t["system"]) & set(mk.HELD_OUT + mk.SEALED)
    assert (tensor_core.network_of(t) == "GEMM_fp8").all()


def test_fp8_round_trip_through_the_cli(capsys, release_root):
    from neusight_core.__main__ import main
    args = ["predict", "--model", "llama2_7b", "--batch", "1", "--seq", "64", "--dtype", "fp8",
            "--predictor", "roofline", "--json"]
    assert main(args + ["--device", "H100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dtype"] == "fp8" and out["e2e_ms"] > 0
    assert main(args + ["--device", "A100"]) != 0
    err = capsys.readouterr().err.strip()
    assert "has no FP8 tensor cores" in err and len(err.splitlines()) == 1


def test_the_quantiser_is_the_memory_law_over_the_activation():
    from neusight_core.predictors import memory_law
    law = dict(memory_law.DEFAULT_LAW)
    rows = pd.DataFrame({"op_class": ["LINEAR"] * 2, "precision": ["fp8"] * 2, "B": [1, 2], "M": [16, 4096],
                         "N": [4096, 8192], "K": [4096, 1024], "device": ["NVIDIA_H100_80GB_HBM3"] * 2})
    none = tensor_core.TensorCoreNets({"fp8_quantiser": "none"})
    assert (none.quantiser_ms(rows, None, "GEMM_fp8", None) == 0).all()
    static = tensor_core.TensorCoreNets({"fp8_quantiser": "static"})
    e = np.array([16 * 4096, 2 * 4096 * 8192], float)          # B x M x N: the activation, N the reduction
    vec = pd.DataFrame({"op_class": "VEC", "precision": "bf16", "bytes_read": 2 * e, "bytes_written": e})
    np.testing.assert_allclose(static.quantiser_ms(rows, "H100", "GEMM_fp8", law),
                               memory_law.time_ms(vec, "H100", law))
    dynamic = tensor_core.TensorCoreNets({"fp8_quantiser": "dynamic"}).quantiser_ms(rows, "H100", "GEMM_fp8", law)
    assert (dynamic > static.quantiser_ms(rows, "H100", "GEMM_fp8", law)).all()
    # only the FP8 network has one; a law is needed; a word outside QUANTISERS is refused
    assert (static.quantiser_ms(rows, "H100", "GEMM", law) == 0).all()
    with pytest.raises(ValueError, match="no"):
        static.quantiser_ms(rows, "H100", "GEMM_fp8", None)
    with pytest.raises(ValueError, match="fp8_quantiser"):
        tensor_core.TensorCoreNets({"fp8_quantiser": "fast"}).quantiser("GEMM_fp8")


def test_the_recipe_gives_the_fp8_network_its_own_inputs_and_leaves_gemm_as_it_was():
    from neusight_core import predictors
    nets = predictors.create("neusight").tc
    assert "GEMM_fp8" in nets.config["networks"]
    # GEMM reads what it read before GEMM_fp8 came (its weights are unchanged); GEMM_fp8 no per-GPU ridge
    assert nets.value("gemm_inputs", "GEMM") == ["last_wave_fill", "split_k", "roofline_us", "ridge",
                                                 "flops_per_byte", "m", "n", "k"]
    assert "ridge" not in nets.value("gemm_inputs", "GEMM_fp8")
    assert "flops_per_byte" not in nets.value("gemm_inputs", "GEMM_fp8")


def test_completing_weights_without_the_fp8_network_gives_a_whole_training(package, release_root, tmp_path,
                                                                           monkeypatch):
    """benchmarks/fp8_gemm.py ``complete``: weights saved by the recipe before GEMM_fp8 came, completed, are the
    weights a whole training gives (quick weights)."""
    import sys
    from neusight_core import paths, predictors
    from neusight_core.predictors.base import read_state
    sys.path.insert(0, str(paths.REPO_ROOT / "benchmarks"))
    import fp8_gemm
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path))
    whole = predictors.get("neusight", quick=True, seed=0)
    f = predictors.folder("neusight", True, 0)
    want = read_state(f)
    # the same weights as the recipe before GEMM_fp8 would have saved them
    for c in (whole.config["tensor_core"], whole.tc.config):
        c["networks"] = [n for n in c["networks"] if n != "GEMM_fp8"]
        c["gemm_inputs"] = c["gemm_inputs"]["GEMM"]
        c.pop("fp8_quantiser")
    whole.tc.nets.pop("GEMM_fp8")
    whole.tc.norm.pop("GEMM_fp8")
    whole.save(f)
    assert not predictors.is_trained("neusight", True, 0)
    assert fp8_gemm.complete(0, True) == ["GEMM_fp8"]
    assert predictors.is_trained("neusight", True, 0)
    got = read_state(f)
    a, b = want["tensor_core"]["nets"]["GEMM_fp8"], got["tensor_core"]["nets"]["GEMM_fp8"]
    for ma, mb in zip(a, b, strict=True):
        for k in ma:
            np.testing.assert_array_equal(np.asarray(ma[k]), np.asarray(mb[k]))
    assert fp8_gemm.complete(0, True) == []           # current weights: nothing to do
