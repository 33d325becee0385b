"""Issue 34: a GPU feature that cannot change a kernel's speed must not change its prediction, and a GPU at least as
good in every speed-relevant figure (peaks, bandwidth, SMs, L2) is never predicted slower on the same kernel table.
Two user GPUs made from the H100's catalogue entry: one with 500 GB of memory and nothing else changed, one with
every speed figure 1.25x. Checked for the predictors of notebook 07 (``neusight`` with its BF16 networks and its FP32
networks on FP32 tables, the roofline) on the paper's models and on Llama in BF16."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from neusight_core.data import devices, measured_kernels
from neusight_core.cost import engine
from neusight_core.cost import request

H100 = "NVIDIA_H100_80GB_HBM3"
SPEED = ("mem_bw_gbs", "num_sm", "fp32_gflops", "fp32_vec_gflops", "l2_mb", "tf32_tensor_gflops",
         "fp16_tensor_gflops", "bf16_tensor_gflops")
REQUESTS = [dict(model="gpt2_large", batch=4, seq=1024, mode="inf"),
            dict(model="bert_large", batch=4, seq=512, mode="train"),
            dict(model="gpt3_xl", batch=4, seq=2048, mode="inf"),
            dict(model="llama2_7b", batch=1, seq=2048, mode="inf", dtype="bf16", attention="sdpa", execution="graph"),
            dict(model="llama2_7b", batch=8, seq=1, past=2047, mode="inf", dtype="bf16", attention="sdpa",
                 execution="graph")]


def _entry(dev, **change) -> dict:
    d = dataclasses.asdict(dataclasses.replace(dev, **change))
    out = {k: d[k] for k in ("display_name", "mem_gb", "mem_bw_gbs", "num_sm", "core_per_sm", "freq_mhz",
                             "fp32_gflops", "fp32_vec_gflops", "l2_mb", "link_gbs")}
    out["tensor_gflops"] = {p: d[f"{p}_tensor_gflops"] for p in ("tf32", "fp16", "bf16")}
    out["tensor_source"] = "test"
    return out


@pytest.fixture
def twins(tmp_path, monkeypatch, release_root):
    h = devices.get_device(H100)
    f = tmp_path / "twins.yaml"
    f.write_text(yaml.safe_dump({
        "H100_BIGMEM": _entry(h, display_name="H100 with 500 GB", mem_gb=500.0),
        "H100_FASTER": _entry(h, display_name="H100 x1.25", freq_mhz=h.freq_mhz * 1.25,
                              **{k: getattr(h, k) * 1.25 for k in SPEED if k != "num_sm"},
                              num_sm=int(h.num_sm * 1.25)),
        # one speed figure better at a time (the SM count with the peaks it carries: same per-SM throughput)
        "H100_BW": _entry(h, display_name="H100, 1.5x bandwidth", mem_bw_gbs=h.mem_bw_gbs * 1.5),
        "H100_SM": _entry(h, display_name="H100, 1.25x SMs", num_sm=int(h.num_sm * 1.25),
                          **{k: getattr(h, k) * 1.25 for k in SPEED if k not in ("num_sm", "mem_bw_gbs", "l2_mb")}),
        "H100_L2": _entry(h, display_name="H100, 2x L2", l2_mb=h.l2_mb * 2),
        "H100_PEAK": _entry(h, display_name="H100, 1.5x tensor peaks",
                            **{k: getattr(h, k) * 1.5 for k in SPEED if "tensor" in k})}))
    monkeypatch.setenv("NEUSIGHT_DEVICES", str(f))
    devices.reload()
    yield
    monkeypatch.delenv("NEUSIGHT_DEVICES")
    devices.reload()


@pytest.mark.parametrize("predictor", ["neusight", "roofline"])
def test_memory_alone_changes_nothing_and_a_faster_gpu_is_never_slower(twins, predictor):
    reqs = [{**r, "device": g} for r in REQUESTS for g in (H100, "H100_BIGMEM", "H100_FASTER")]
    out = engine.predict(request.parse(reqs), [predictor], seeds=(0,), quick=True)
    assert (out["error"] == "").all(), out["error"].tolist()
    t = out["e2e_ms"].to_numpy().reshape(len(REQUESTS), 3)
    for r, (base, bigmem, faster) in zip(REQUESTS, t):
        assert bigmem == pytest.approx(base, rel=1e-12), (predictor, r)
        assert faster <= base * (1 + 1e-9), (predictor, r, faster / base)


def test_notebook_07_predictors_on_a_bf16_gemm_table(twins):
    """The BF16 predictors of notebook 07 on 300 of the database's GEMM shapes (H100's file), summed over the table:
    neusight's tensor-core networks, both trees and the roofline (quick settings), against the H100 made better in
    every speed figure at once and in one figure at a time. (Per kernel it does not hold: with 1.25x the SMs the
    GEMM network predicts about half of such rows slower, up to 1.4x, as its last-wave fill input drops; docs/recipes.md.)"""
    import numpy as np

    from neusight_core import predictors as P
    from neusight_core.predictors import trees
    g = measured_kernels.gemm_rows(["h100_sxm"]).sample(300, random_state=0).reset_index(drop=True)
    nets = P.get("neusight", quick=True).tc
    models = {"neusight": nets.predict, "roofline": lambda k, d: P.get("roofline").predict(k, d)}
    for name, settings in (("shape-only tree", trees.TREE), ("structural tree", trees.SPEC_TREE)):
        t = trees.ShapeTree(nets.config, seed=0, tree=settings)
        t.fit(measured_kernels.training_kernels(nets.config["networks"]), quick=True)
        models[name] = t.predict
    for name, predict in models.items():
        base = float(np.sum(predict(g, H100)))
        assert float(np.sum(predict(g, "H100_BIGMEM"))) == pytest.approx(base, rel=1e-12), name
        for better in ("H100_FASTER", "H100_BW", "H100_SM", "H100_L2", "H100_PEAK"):
            t = float(np.sum(predict(g, better)))
            assert t <= base * (1 + 1e-9), (name, better, t / base)


def test_an_answer_says_when_the_gpu_lies_outside_the_bf16_networks_training_gpus(twins):
    """Issue 34's user devices: a BF16 answer from the measured-kernel networks names the GPU figures that lie outside
    the training GPUs' (an extrapolation); the memory alone is no such figure; FP32 answers carry no such note."""
    from neusight_core.cost import latency
    assert latency.range_note(H100) == "" and latency.range_note("H100_BIGMEM") == ""
    note = latency.range_note("H100_FASTER")                       # 1.25x everything: only the SM count leaves the range
    assert "SMs 165 (training GPUs 108-142)" in note and "per SM" not in note
    assert "dense BF16 TFLOPS per SM 15.2" in latency.range_note("NVIDIA_B200")
    ask = dict(model="llama2_7b", batch=1, seq=1, past=511, mode="inf", quick=True, execution="graph")
    assert latency.predict_model(device="H100_FASTER", dtype="bf16", **ask)["range_note"] == note
    assert latency.predict_model(device="H100_FASTER", **ask)["range_note"] == ""              # fp32
    assert latency.predict_model(device="H100_FASTER", dtype="bf16", predictor="roofline", **ask)["range_note"] == ""
