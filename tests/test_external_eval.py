"""Issue 25 steps 3-5: the BF16 tensor-core networks (predictors/tensor_core.py), their split, their tiles and
waves by hand, a user device, FP32 rows unchanged, the external evaluation and notebook 07 in quick mode."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("aiconfigurator_core")

from neusight_core.data import devices, measured_kernels as mk  # noqa: E402
from neusight_core.studies import live_harness
from neusight_core import predictors as P  # noqa: E402
from neusight_core.predictors import common, tensor_core as tc, trees  # noqa: E402

H100 = "NVIDIA_H100_80GB_HBM3"


def _attn_row(kind, B, seq_q, seq_kv, heads, kv_heads, d, window=0):
    raw = pd.DataFrame([{"kernel_source": "x", "batch_size": B, "isl": seq_q, "num_heads": heads,
                         "num_key_value_heads": kv_heads, "head_dim": d, "attn_dtype": "bfloat16",
                         "kv_cache_dtype": "bfloat16", "step": seq_kv - seq_q, "latency": 1.0, "window_size": window}])
    return mk.attention_kernels(raw, kind, "h100_sxm")


# ---------------------------------------------------------------- the split
def _training_gpus(net):
    """The training GPUs network ``net`` trains on: all four; for GEMM_fp8 those with FP8 tensor cores."""
    return ({mk.CATALOGUE[s] for s in mk.fp8_systems("training")} if net == "GEMM_fp8"
            else set(mk.split()["training"]))


def test_training_frame_holds_only_training_gpus(release_root):
    k = mk.training_kernels(tc.NETWORKS)
    assert set(k["device"]) == set(mk.split()["training"])
    assert set(k["role"]) == {"training"}
    assert not set(k["device"]) & set(mk.split()["held_out"])
    assert not k["system"].isin(mk.SEALED).any()
    # each network gets rows of all four training GPUs (GEMM_fp8: the three with FP8 tensor cores), and only those
    nets = tc.network_of(k)
    for n in tc.NETWORKS:
        assert set(k.loc[nets == n, "device"]) == _training_gpus(n), n


def test_fit_records_only_training_gpus(release_root):
    m = tc.TensorCoreNets({"quick_rows_per_gpu": 200, "quick_epochs": 1}, seed=0)
    info = m.fit(mk.training_kernels(tc.NETWORKS), quick=True)
    for n in m.config["networks"]:
        assert info["networks"][n]["devices"] == sorted(_training_gpus(n)), n
    assert "GEMM_fp8" not in info["networks"]            # a config that does not name it trains none
    with pytest.raises(mk.SealedGPUError):
        mk.gemm_rows(["b300_sxm"])


# ---------------------------------------------------------------- tiles and waves by hand
def test_attention_tiles_and_waves_by_hand(release_root):
    dev = common.device_arrays(pd.DataFrame({"op_class": ["ATTN"]}), H100)      # 132 SMs
    assert dev["num_sm"][0] == 132
    # prefill, batch 2, 1000 tokens, 8 heads (GQA 2 KV heads), head 128
    r = _attn_row("prefill", 2, 1000, 1000, 8, 2, 128)
    g = tc.attention_geometry(r, dev, block_q=128)
    assert g["tiles"][0] == 2 * 8 * 8                       # ceil(1000 / 128) = 8 query blocks
    assert g["waves"][0] == 1                               # 128 tiles <= 132 SMs
    pairs = 1000 * 1001 / 2
    assert g["tile_flops"][0] == pytest.approx(4 * 2 * 8 * 128 * pairs / 128)
    # Q block and O block (128 x 128, 2 B), K and V of the 1000 keys (2 B)
    assert g["tile_bytes"][0] == pytest.approx(2 * 2 * 128 * 128 + 2 * 2 * 1000 * 128)
    # 300 tiles: 3 waves on 132 SMs, 2 with two tiles per SM
    r3 = _attn_row("prefill", 3, 1280, 1280, 10, 10, 64)
    assert tc.attention_geometry(r3, dev, 128)["tiles"][0] == 300
    assert tc.attention_geometry(r3, dev, 128)["waves"][0] == 3
    assert tc.attention_geometry(r3, dev, 128, tiles_per_sm=2)["waves"][0] == 2
    # decode: 4 x 8 (batch, KV head) pairs, keys split in floor(132 / 32) = 4 slices (4,096 / 256 = 16 allowed):
    # 128 tiles, one wave, the kernel's bytes shared out
    d = _attn_row("decode", 4, 1, 4096, 32, 8, 128)
    gd = tc.attention_geometry(d, dev)
    assert gd["tiles"][0] == 128 and gd["waves"][0] == 1
    assert gd["tile_bytes"][0] == pytest.approx((d["bytes_read"] + d["bytes_written"]).iloc[0] / 128)
    # a short context limits the split (512 keys: 2 slices); without kv_split one tile per pair
    assert tc.attention_geometry(_attn_row("decode", 4, 1, 512, 32, 8, 128), dev)["tiles"][0] == 64
    assert tc.attention_geometry(d, dev, kv_split=False)["tiles"][0] == 32


def test_gemm_split_k_by_hand(release_root):
    raw = pd.DataFrame({"kernel_source": ["x"], "gemm_dtype": ["bfloat16"], "m": [16], "n": [128], "k": [51200],
                        "latency": [0.01]})
    g = mk.gemm_kernels(raw, "h100_sxm")                   # M = 16, N = 51200 (reduction), K = 128
    dev = common.device_arrays(g, H100)
    one = tc.gemm_geometry(g, dev, [[128, 128]], [1])
    assert one["tiles"][0] == 1 and one["tile_flops"][0] == 2 * 128 * 51200 * 128
    # split-K: every split fits in one wave, so the deepest split allowed (32: 1,600-long slices) is fastest
    sk = tc.gemm_geometry(g, dev, [[128, 128]], [1, 2, 4, 8, 16, 32])
    assert sk["tiles"][0] == 32 and sk["waves"][0] == 1
    assert sk["tile_flops"][0] == 2 * 128 * 1600 * 128
    assert sk["tile_bytes"][0] == 2 * (128 * 1600 + 1600 * 128 + 128 * 128)
    # a 4,096-long reduction cannot be split below 256: at most 16 slices
    raw2 = raw.assign(k=[4096])
    assert tc.gemm_geometry(mk.gemm_kernels(raw2, "h100_sxm"), dev, [[128, 128]], [1, 32])["tiles"][0] == 1
    assert tc.gemm_geometry(mk.gemm_kernels(raw2, "h100_sxm"), dev, [[128, 128]], [1, 16])["tiles"][0] == 16


# ---------------------------------------------------------------- predictions
@pytest.fixture(scope="module")
def small_nets(release_root):
    m = tc.TensorCoreNets({**P.create("neusight").config["tensor_core"], "quick_rows_per_gpu": 300,
                           "quick_epochs": 2}, seed=0)
    m.fit(mk.training_kernels(m.config["networks"]), quick=True)
    return m


def test_user_device_bf16_prediction(small_nets, tmp_path, monkeypatch, fresh_catalogue):
    f = tmp_path / "newgpu.yaml"
    f.write_text("My_Blackwell_X:\n  display_name: My Blackwell X\n  mem_gb: 96\n  mem_bw_gbs: 6000\n"
                 "  num_sm: 120\n  fp32_gflops: 60000\n  l2_mb: 64\n"
                 "  tensor_gflops: {bf16: 1500000}\n  tensor_source: my datasheet\n")
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    devices.reload()
    raw = pd.DataFrame({"kernel_source": "x", "gemm_dtype": "bfloat16", "m": [1, 2048, 8192], "n": [4096] * 3,
                        "k": [4096, 4096, 14336], "latency": [1.0] * 3})
    rows = mk.gemm_kernels(raw, "user")
    rows = pd.concat([rows, _attn_row("prefill", 1, 2048, 2048, 32, 8, 128),
                      _attn_row("decode", 8, 1, 4096, 32, 8, 128)], ignore_index=True)
    ms = small_nets.predict(rows, "My Blackwell X")
    assert np.isfinite(ms).all() and (ms > 0).all()
    # never faster than the roofline at the user's BF16 peak and bandwidth, allowing u up to u_max
    roof = common.roofline_ms(rows, common.device_arrays(rows, "My Blackwell X"))
    u_max = np.array([small_nets.value("u_max", n) for n in tc.network_of(rows)], float)
    assert list(tc.network_of(rows)) == ["GEMM"] * 3 + ["ATTN_prefill", "ATTN_decode"]
    assert (ms >= roof / u_max * (1 - 1e-9)).all()
    # and the user's peak is used: a GPU with twice the BF16 peak predicts a large GEMM faster
    f.write_text(f.read_text().replace("bf16: 1500000", "bf16: 3000000"))
    devices.reload()
    assert small_nets.predict(rows.iloc[[2]], "My Blackwell X")[0] < ms[2]


def test_network_of_routes_only_half_precision_rows():
    rows = pd.DataFrame({"op_class": ["LINEAR", "LINEAR", "BMM", "VEC", "ATTN", "ATTN"],
                         "precision": ["bf16", "fp32", "fp16", "bf16", "bf16", "fp32"],
                         "sub_op": ["", "", "", "", "decode", "prefill"], "B": 1.0, "M": 2.0, "N": 2.0, "K": 2.0,
                         "seq_q": 1.0, "seq_kv": 2.0, "heads": 1.0, "kv_heads": 1.0, "head_dim": 64.0})
    assert list(tc.network_of(rows)) == ["GEMM", "", "GEMM", "", "ATTN_decode", ""]


@pytest.fixture(scope="module")
def neusight_quick(release_root):
    return P.get("neusight", quick=True), P.get("neusight", quick=True, config={"tensor_core": None})


def test_fp32_rows_unchanged_by_tensor_core_networks(neusight_quick):
    from neusight_core.data import dataset
    with_tc, without = neusight_quick
    assert with_tc.tc is not None and set(with_tc.tc.nets) == set(tc.NETWORKS) and without.tc is None
    k = dataset.training_data(quick=True).kernels.sample(2000, random_state=1)
    a, b = with_tc.predict(k, None), without.predict(k, None)
    np.testing.assert_allclose(a, b, rtol=1e-9)
    # a BF16 GEMM goes through the new network, and predict_extrapolated gives the old answer
    g = mk.gemm_rows("h100_sxm").iloc[:50]
    new, old = with_tc.predict(g, None), with_tc.predict_extrapolated(g, None)
    np.testing.assert_allclose(new, with_tc.tc.predict(g), rtol=1e-12)
    np.testing.assert_allclose(old, without.predict(g, None), rtol=1e-9)
    assert not np.allclose(new, old)


def test_external_eval_metrics_by_hand():
    from neusight_core.studies import external_eval as xe
    long = pd.DataFrame({"role": "held_out", "device": "G", "kind": "GEMM", "predictor": "p", "seed": [0, 0, 1, 1],
                         "ape": [10.0, 30.0, 20.0, 20.0], "err": [-10.0, 30.0, 20.0, -20.0]})
    m = xe.metrics(long)
    assert list(m["mape"]) == [20.0, 20.0] and list(m["bias"]) == [10.0, 0.0]
    s = xe.over_seeds(m)
    assert s["mape"].iloc[0] == 20.0 and s["mape_spread"].iloc[0] == 0.0 and s["seeds"].iloc[0] == 2
    # rows is a count (each seed scores the same rows), written as one: 2, not 2.0
    assert pd.api.types.is_integer_dtype(s["rows"]) and s["rows"].iloc[0] == 2
    h = xe.headline(s.assign(p90_ape=28.0, predictor="neusight"))
    assert h["gemm_mape"] == 20.0 and h["attention_mape"] is None
    assert xe.summary_line(h) == "BF16 on unseen Blackwell GPUs, measured by others: GEMM 20.0 %, attention n/a"
    # attention: the mean of the kinds' MAPEs, under the raw or the labelled kind names
    both = pd.concat([s.assign(kind="GEMM"), s.assign(kind="ATTN_prefill", mape=30.0),
                      s.assign(kind="attention decode", mape=40.0)]).assign(p90_ape=1.0, predictor="neusight")
    assert xe.headline(both)["attention_mape"] == 35.0


def test_notebook_07_quick(run_notebook, neusight_quick):
    out, metrics = run_notebook("07_external_validation")
    assert metrics["status"] == "OK"
    assert metrics["summary_line"].startswith("BF16 on unseen Blackwell GPUs, measured by others: GEMM ")
    t = pd.read_csv(out / "tables" / "metrics.csv")
    from neusight_core.studies import external_eval as xe
    assert set(t["predictor"]) == set(xe.COMPARED) >= {"neusight", "roofline", "shape-only tree", "structural tree"}
    assert set(t["device"]) == set(mk.split()["training"] + mk.split()["held_out"])
    assert not t["device"].str.contains("B300|GB300|RTX|B60").any()
    assert math.isfinite(metrics["headline"]["gemm_mape"]) and math.isfinite(metrics["headline"]["attention_mape"])
    assert "attention n/a" not in metrics["summary_line"]
    prov = pd.read_csv(out / "tables" / "provenance.csv")
    assert set(prov["role"]) == {"training", "held_out"}
    assert (out / "figures" / "predicted_vs_measured.png").is_file()
    assert (out / "figures" / "gemm_miss_breakdown.png").is_file()
    miss = pd.read_csv(out / "tables" / "gemm_miss_breakdown.csv")
    assert set(miss["device"]) == set(mk.split()["held_out"])
    assert set(miss["dimension"]) == {"m (tokens)", "FLOPs / byte", "tile (m x k)", "split-K", "waves"}
    assert (out / "summary.md").read_text().count("BF16 on unseen Blackwell GPUs") == 1
    # what the data allows: one scored file per GPU, every other file scored against it on shared shapes
    agree = pd.read_csv(out / "tables" / "framework_agreement.csv")
    assert set(agree["device"]) == set(mk.split()["training"] + mk.split()["held_out"])
    assert (agree.groupby("device")["scored"].sum() == 1).all()
    assert (agree.loc[agree["scored"], "mape_vs_scored"] == 0).all()
    assert (agree.loc[~agree["scored"], "mape_vs_scored"] > 0).all() and (agree["shapes_shared"] > 0).all()
    # and the predictors on every file of the held-out GPUs
    files = pd.read_csv(out / "tables" / "held_out_files.csv")
    assert set(files["device"]) == set(mk.split()["held_out"]) and (files.groupby("device").size() >= 2).all()
    assert files[["neusight", "structural tree"]].notna().all().all()
    assert (out / "figures" / "held_out_files.png").is_file()
    # section 5c: the memory law on measured BF16 element-wise kernels, training and held-out GPUs
    law = pd.read_csv(out / "tables" / "memory_law.csv").set_index("device")
    assert set(law.index) == {"NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "NVIDIA_L40S"} | set(mk.split()["held_out"])
    assert law.loc[list(mk.split()["held_out"]), "law, GPU left out"].isna().all()     # held out: never fitted on
    assert law[["law", "FP32 networks", "roofline"]].notna().all().all()
    assert (out / "figures" / "memory_law.png").is_file() and len(metrics["memory_law"]) == len(law)


def test_roofline_of_fused_attention_uses_the_bf16_tensor_peak(release_root):
    r = _attn_row("prefill", 4, 4096, 4096, 32, 8, 128)
    d = devices.get_device(H100)
    want = max(r["flops"].iloc[0] / (d.gemm_peak_gflops("bf16") * 1e9),
               (r["bytes_read"] + r["bytes_written"]).iloc[0] / (d.mem_bw_gbs * 1e9)) * 1e3
    assert r["flops"].iloc[0] / (d.gemm_peak_gflops("bf16") * 1e9) * 1e3 == pytest.approx(want)   # compute-bound
    roof = P.create("roofline")
    roof.fit()
    assert roof.predict(r, H100)[0] == pytest.approx(want, rel=1e-12)


def test_whatif_label_says_which_bf16_kernels_were_checked(release_root):
    from neusight_core.studies import whatif
    with_tc = whatif.validation("llama2_7b", H100, "bf16", 0, tensor_core=True)
    assert "GEMMs from networks trained on measured kernels" in with_tc and "other kernels untested" in with_tc
    assert "precision bf16 untested" in whatif.validation("llama2_7b", H100, "bf16", 0)
    assert "precision" not in whatif.validation("llama2_7b", H100, "fp32", 0, tensor_core=True)


# ---------------------------------------------------------------- the shape-only tree and the miss analysis
def test_shape_tree_trains_on_training_gpus_and_scales_with_the_peak(small_nets, tmp_path, monkeypatch,
                                                                    fresh_catalogue):
    tree = trees.ShapeTree(small_nets.config, seed=0)
    info = tree.fit(mk.training_kernels(tree.config["networks"]), quick=True)
    for n in tree.config["networks"]:
        assert info["networks"][n]["devices"] == sorted(_training_gpus(n)), n
        assert info["networks"][n]["rows"] == len(_training_gpus(n)) * small_nets.config["quick_rows_per_gpu"], n
    # a GPU twice as fast as any training GPU (peak and bandwidth): a tree of the latency itself could predict
    # nothing below the training GPUs' times; the roofline-ratio target (TREE) scales with the datasheet
    f = tmp_path / "fast.yaml"
    f.write_text("Twice_H100:\n  display_name: Twice H100\n  mem_gb: 80\n  mem_bw_gbs: 6700\n  num_sm: 132\n"
                 "  fp32_gflops: 134000\n  l2_mb: 50\n  tensor_gflops: {bf16: 1979000}\n  tensor_source: test\n")
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    devices.reload()
    g = mk.gemm_rows("h100_sxm")
    g = g[g["M"] >= 4096].iloc[:20]
    fast, h100 = tree.predict(g, "Twice H100"), tree.predict(g, H100)
    assert np.isfinite(fast).all() and (fast < 0.75 * h100).all()
    with pytest.raises(ValueError, match="target 'x' is not"):
        trees.ShapeTree(small_nets.config, tree={"target": "x"}).fit(mk.gemm_rows("h100_sxm").iloc[:50], quick=True)


def test_gemm_choice_names_the_tile_and_split(release_root):
    raw = pd.DataFrame({"kernel_source": ["x", "x"], "gemm_dtype": ["bfloat16"] * 2, "m": [16, 8192], "n": [128, 8192],
                        "k": [51200, 8192], "latency": [0.01, 1.0]})
    g = mk.gemm_kernels(raw, "h100_sxm")
    nets = tc.TensorCoreNets({"gemm_tiles": [[128, 128], [64, 64]], "splits": [1, 2, 4, 8, 16, 32]})
    ch = nets.gemm_choice(pd.concat([g, _attn_row("prefill", 1, 128, 128, 8, 8, 64)], ignore_index=True), H100)
    # 16 x 128 output, reduction 51,200: the 64 x 64 tile (2 tiles) split 32 ways = 64 tiles in one wave; the
    # 128 x 128 tile split 32 ways is 32 tiles of twice the FLOPs, also one wave, so slower
    assert ch.loc[0, ["tile_m", "tile_k", "split", "tiles", "waves"]].tolist() == [64, 64, 32, 64, 1]
    # 8192^3: a 128 x 128 tile reads 2 (2 x 128 x 8192 + 128^2) B = 4.2 MB, 166 us at 3.35 TB/s / 132 SMs, its
    # 268 MFLOP take 36 us at 989 TFLOPS / 132: memory-bound per tile. No split: 4,096 tiles, 32 waves (31.03
    # rounded up), 5.32 ms; split 2: 8,192 tiles of half the bytes, 63 waves (62.06), 5.28 ms: wave quantisation
    # picks split 2; 64 x 64 tiles read as much per tile for a quarter of the work (10.3 ms)
    assert ch.loc[1, ["tile_m", "tile_k", "split", "tiles", "waves"]].tolist() == [128, 128, 2, 8192, 63]
    assert ch.loc[2].isna().all()                            # attention rows: no GEMM choice


def test_miss_breakdown_by_hand():
    from neusight_core.studies import external_eval as xe
    base = pd.DataFrame({"role": "held_out", "device": "G", "kind": "GEMM", "seed": 0,
                         "M": [1.0, 8.0, 2048.0, 20000.0], "N": 4096.0, "K": 4096.0,
                         "arith_intensity": [1.0, 8.0, 500.0, 2000.0], "tile_m": [64.0, 64.0, 128.0, 128.0],
                         "tile_k": [64.0, 64.0, 256.0, 256.0], "split": [8.0, 8.0, 1.0, 1.0],
                         "waves": [1.0, 1.0, 3.0, 100.0]})
    long = pd.concat([base.assign(predictor="neusight", ape=[40.0, 20.0, 10.0, 10.0], err=[-40.0, -20.0, 10.0, -10.0]),
                      base.assign(predictor="structural tree", ape=[5.0, 5.0, 50.0, 70.0], err=0.0),
                      base.assign(role="training", predictor="neusight", ape=99.0, err=99.0)], ignore_index=True)
    m = xe.miss_breakdown(long).set_index(["dimension", "bucket"])
    small = m.loc[("m (tokens)", "<= 16")]
    assert small["rows"] == 2 and small["mape"] == 30.0 and small["bias"] == -30.0
    assert small["share_rows"] == 50.0 and small["error_share"] == 75.0       # 60 of the 80 summed APE points
    assert small["structural tree mape"] == 5.0
    assert m.loc[("m (tokens)", "> 8192"), "mape"] == 10.0
    assert m.loc[("FLOPs / byte", "<= 16"), "rows"] == 2 and m.loc[("FLOPs / byte", "256-1024"), "rows"] == 1
    assert m.loc[("tile (m x k)", "64 x 64"), "mape"] == 30.0 and m.loc[("split-K", "1"), "mape"] == 10.0
    assert m.loc[("waves", "<= 1"), "rows"] == 2 and m.loc[("waves", "> 64"), "rows"] == 1
    # buckets in order of their values, per dimension
    assert list(xe.miss_breakdown(long).query("dimension == 'm (tokens)'")["bucket"]) == ["<= 16", "1024-8192", "> 8192"]
    with pytest.raises(ValueError, match="no GEMM rows of role 'nope'"):
        xe.miss_breakdown(long, role="nope")


# ---------------------------------------------------------------- notebook 06's BF16 rows (issue 25 step 6)
def test_physical_floors_by_hand(release_root):
    from neusight_core.studies import bf16_checks
    k = pd.DataFrame({"op_class": ["LINEAR", "BMM", "VEC", "ATTN"], "precision": ["bf16"] * 4,
                      "flops": [1e12, 2e11, 5e12, 3e11], "count": [3, 1, 1, np.nan]})
    f = bf16_checks.floors(k, H100, weight_bytes=13.5e9)
    d = devices.get_device(H100)
    want = (3e12 + 2e11 + 3e11) / (d.gemm_peak_gflops("bf16") * 1e9) * 1e3        # the VEC row is no GEMM
    assert f["gemm_flops"] == 3.5e12 and f["flops_floor_ms"] == pytest.approx(want)
    assert f["peak_tflops"] == pytest.approx(d.bf16_tensor_gflops / 1e3)            # dense, not the FP32 peak
    assert f["bytes_floor_ms"] == pytest.approx(13.5e9 / (d.mem_bw_gbs * 1e9) * 1e3)
    assert bf16_checks.floors(k.assign(precision="fp32"), H100, 0)["peak_tflops"] == pytest.approx(d.fp32_gflops / 1e3)


def test_llama_floors_table_with_the_roofline(release_root):
    from neusight_core.studies import bf16_checks
    t = bf16_checks.floors_table("llama2_7b", H100, "bf16", seq=256, predictor="roofline", quick=True).set_index("workload")
    # Llama-2-7B: 6.74e9 parameters, 2 bytes each
    assert t.loc["prefill", "weights_gb"] == pytest.approx(6.74e9 * 2 / 1e9, rel=0.01)
    # a GEMM does about 2 x parameters FLOPs per token (plus attention's BMMs)
    assert 2 * 6.5e9 * 256 / 1e12 < t.loc["prefill", "gemm_tflop"] < 2 * 6.74e9 * 256 * 1.2 / 1e12
    assert t.loc["decode", "floor_ms"] == t.loc["decode", "bytes_floor_ms"]          # decode is weight-bound
    # the roofline predicts every kernel at its own floor or slower, so the step never beats its floors
    assert (t["predicted_ms"] >= t["floor_ms"] * (1 - 1e-9)).all()
    assert (t["predicted_ms"] - t["predicted_gemm_ms"] - t["predicted_other_ms"]).abs().max() < 1e-6


def test_bf16_validation_reads_the_logged_held_out_numbers(tmp_path, release_root):
    import json

    from neusight_core.studies import bf16_checks
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"tag": "frozen", "frozen": True}) + "\n" + json.dumps({
        "tag": "held-out-evaluated", "neusight_held_out_mape_mean_over_seeds": {
            "gemm_per_gpu": {"NVIDIA_B200": 12.34, "NVIDIA_GB200": 23.45}, "gemm_p90_per_gpu": {"NVIDIA_B200": 40.0},
            "attention_per_gpu": {"NVIDIA_B200 ATTN_prefill": 31.0, "NVIDIA_B200 ATTN_decode": 41.0}}}) + "\n")
    t = bf16_checks.bf16_validation(log=log).set_index("kernels")
    assert t.loc["GEMM", "held-out MAPE"] == "B200 12.3 %; GB200 23.4 % (P90 B200 40 %)"
    assert "prefill: B200 31.0 %" in t.loc["fused attention", "held-out MAPE"]
    assert "decode: B200 41.0 %" in t.loc["fused attention", "held-out MAPE"]
    assert t.loc["element-wise, softmax, layernorm, copies", "status"].startswith("memory law")
    assert "MEM" in t.loc["element-wise, softmax, layernorm, copies", "op classes"]
    assert "H100" in t.loc["GEMM", "trained on"] and "B200" not in t.loc["GEMM", "trained on"]
    assert bf16_checks.bf16_validation(tensor_core=False, log=log)["status"].str.startswith("extrapolation").all()
    assert "not evaluated" in bf16_checks.bf16_validation(log=tmp_path / "none.jsonl").set_index("kernels").loc["GEMM", "held-out MAPE"]
    # a later evaluation of the GEMMs alone keeps the attention numbers of the last one that measured attention
    with log.open("a") as f:
        f.write(json.dumps({"tag": "held-out-evaluated", "date": "2026-12-01T00:00:00",
                            "neusight_held_out_mape_mean_over_seeds": {"gemm_per_gpu": {"NVIDIA_B200": 9.87}}}) + "\n")
    t = bf16_checks.bf16_validation(log=log).set_index("kernels")
    assert t.loc["GEMM", "held-out MAPE"] == "B200 9.9 %"
    assert "prefill: B200 31.0 %" in t.loc["fused attention", "held-out MAPE"]
    assert "(from the evaluation of " in t.loc["fused attention", "held-out MAPE"]


def test_heatmap_labels_are_compact():
    from neusight_core.reports.plots import compact_number
    assert [compact_number(x) for x in (0.0421, 3.14, 57.2, 840, 999.6, 2570, 25700, 1.3e6, float("nan"))] == \
        ["0.042", "3.1", "57", "840", "1k", "2.6k", "26k", "1.3M", ""]


# ---------------------------------------------------------------- notebook 05: the local GPU as a held-out row
def test_local_gpu_gemms_with_a_fake_timer(neusight_quick, tmp_path):
    from neusight_core.studies import external_eval as xe
    shapes = xe.local_gemm_shapes(n=400, seed=0)
    assert len(shapes) == 400 and set(shapes.columns) >= {"m", "n", "k"}
    db = mk.gemm_rows(["h100_sxm"])
    assert set(zip(shapes.m, shapes.k, shapes.n)) <= set(zip(db.M, db.N, db.K))     # the database's own shapes
    small = pd.DataFrame({"kernel_source": "x", "gemm_dtype": "bfloat16", "m": [1, 64, 256], "n": [128, 256, 64],
                          "k": [64, 128, 512]})
    calls = []

    def timer(fn):                        # a fake clock: runs the BF16 linear on the CPU, time by output size
        y = fn()
        calls.append(tuple(y.shape))
        return 0.01 + 1e-6 * y.shape[0] * y.shape[1]
    rows = xe.measure_local_gemms(small, H100, timer=timer, device="cpu")
    per = live_harness.WARMUP + live_harness.RUNS
    assert calls[:per] == [(1, 128)] * per and len(calls) == 3 * per    # y[m, n], F.linear without bias
    assert list(rows["role"]) == [xe.LOCAL_ROLE] * 3 and (rows["status"] == "OK").all()
    assert list(rows["M"]) == [1, 64, 256] and list(rows["N"]) == [64, 128, 512] and list(rows["K"]) == [128, 256, 64]
    assert list(rows["kind"]) == ["GEMM"] * 3
    # a budget spent before the first call: NaN latency and the reason, nothing raised
    spent = live_harness.TimeBudget(0.0)
    assert xe.measure_local_gemms(small.iloc[:1], H100, timer=timer, budget=spent, device="cpu")["status"].iloc[0].startswith("BUDGET")
    # the check: every predictor on the measured rows, one metrics row each, role "local GPU"
    with_tc, _ = neusight_quick
    import unittest.mock as um
    with um.patch.object(xe, "local_gemm_shapes", lambda n, seed: small):
        got, table = xe.local_gpu_check(H100, n=3, quick=True, timer=timer, device="cpu", neusight=with_tc)
    assert set(table["predictor"]) == set(xe.COMPARED) and set(table["role"]) == {xe.LOCAL_ROLE}
    assert (table["rows"] == 3).all() and table["mape"].notna().all()
    # notebook 07 reads notebook 05's table back
    (tmp_path / "tables").mkdir()
    got.to_csv(tmp_path / "tables" / f"{xe.LOCAL_FILE}.csv", index=False)
    back = xe.local_rows_from(tmp_path)
    assert len(back) == 3 and list(back["kind"]) == ["GEMM"] * 3 and set(back["role"]) == {xe.LOCAL_ROLE}
    assert xe.local_rows_from(tmp_path / "nothing") is None


def test_local_skip_reasons():
    from neusight_core.studies import external_eval as xe
    assert xe.local_skip_reason({"skipped_reason": "no CUDA GPU: x", "device": None}) == "no CUDA GPU: x"
    assert "not in the catalogue" in xe.local_skip_reason({"skipped_reason": None,
                                                          "device": {"known": False, "display_name": "Foo"}})
    assert xe.local_skip_reason({"skipped_reason": None, "device": {"known": True, "name": H100}}) is None


def test_local_check_skips_where_the_database_is_not_installed(monkeypatch):
    """A Python used as it is (NEUSIGHT_PYTHON) may lack aiconfigurator-core: notebook 05 says so, never fails."""
    from neusight_core.studies import external_eval as xe
    from neusight_core.data import measured_kernels as mk

    def gone(root=None):
        raise mk.MeasuredDataError("aiconfigurator-core is not installed: pip install -r requirements.txt")
    monkeypatch.setattr(mk, "data_root", gone)
    why = xe.local_skip_reason({"skipped_reason": None, "device": {"known": True, "name": H100}})
    assert why.startswith("aiconfigurator-core is not installed")


# ---------------------------------------------------------------- issue 34: GEMM structure, the structural tree, targets
def test_gemm_structure_inputs_by_hand(release_root):
    # 8192^3 on the H100 (132 SMs, 989 TFLOPS dense BF16): the recipe's tiles pick 128 x 128 split 2 (test
    # above): 8,192 tiles in 63 waves, the last wave 8,192 - 62 x 132 = 8 tiles -> fill 8192 / (63 x 132)
    g = mk.gemm_kernels(pd.DataFrame({"kernel_source": ["x"], "gemm_dtype": ["bfloat16"], "m": [8192], "n": [8192],
                                      "k": [8192], "latency": [1.0]}), "h100_sxm")
    dev = common.device_arrays(g)
    geo = tc.gemm_geometry(g, dev, [[128, 128], [64, 64]], [1, 2, 4, 8, 16, 32])
    x = tc.gemm_structure(g, dev, geo, ["last_wave_fill", "split_k", "roofline_us", "ridge", "m"])
    assert x.shape == (1, 5)
    assert x[0, 0] == pytest.approx(8192 / (63 * 132))                     # linear, not log2
    assert 2 ** x[0, 1] == pytest.approx(2.0)
    assert 2 ** x[0, 2] == pytest.approx(2 * 8192**3 / 989e12 * 1e6, rel=1e-3)   # compute-bound: FLOPs / peak, us
    assert 2 ** x[0, 3] == pytest.approx(989_000 / float(dev["mem_bw_gbs"][0]), rel=1e-2)   # dense BF16 / bandwidth
    assert 2 ** x[0, 4] == pytest.approx(8192)
    with pytest.raises(ValueError, match="unknown gemm_inputs .*'fill'"):
        tc.gemm_structure(g, dev, geo, ["fill"])


def test_structural_tree_knows_the_gpu_and_refuses_unknown_inputs(release_root):
    g = mk.gemm_rows("h100_sxm").iloc[:40]
    dev = common.device_arrays(g)
    shape, spec = tc.shape_inputs(g, dev, "GEMM"), trees.spec_inputs(g, dev, "GEMM")
    # the spec inputs are the shape inputs plus ridge, SM count, L2, FLOPs per byte and the 128 x 128 wave count
    assert spec.shape[1] == shape.shape[1] + 5 and (spec[:, :shape.shape[1]] == shape).all()
    assert 2 ** spec[0, shape.shape[1] + 1] == pytest.approx(132)
    with pytest.raises(ValueError, match="inputs 'x' is not one of"):
        trees.ShapeTree({"networks": ["GEMM"]}, tree={"inputs": "x"}).fit(g.assign(latency_ms=0.01), quick=True)


def test_targets_by_hand():
    from neusight_core.studies import external_eval as xe
    row = dict(kind="GEMM", rows=10, median_ape=1.0, bias=0.0, seeds=3)
    table = pd.DataFrame([
        dict(row, role="held_out", device="B", predictor="neusight", mape=9.0, p90_ape=20.0, mape_spread=1.0),
        dict(row, role="held_out", device="G", predictor="neusight", mape=11.0, p90_ape=26.0, mape_spread=2.5),
        dict(row, role="training", device="H", predictor="neusight", mape=5.0, p90_ape=9.0, mape_spread=0.1),
        dict(row, role="held_out", device="B", predictor="structural tree", mape=12.0, p90_ape=20.0, mape_spread=0),
        dict(row, role="held_out", device="G", predictor="structural tree", mape=10.0, p90_ape=20.0, mape_spread=0),
        dict(row, kind="attention decode", role="held_out", device="B", predictor="neusight", mape=30.0, p90_ape=1.0,
             mape_spread=0)])
    t = xe.targets(table, 3, {"attention_targets": {"ATTN_decode": 35}}).set_index("target")
    assert list(t["value"]) == [11.0, 26.0, 5.0, 2.5, 1.0, 30.0]
    assert list(t["met"]) == [False, False, True, False, False, True]     # G is 1 point worse than the tree
    one_seed = xe.targets(table, 1)
    assert one_seed.loc[3, "met"] is None and np.isnan(one_seed.loc[3, "value"])


def test_an_ensemble_averages_its_members_utilisations(small_nets):
    """``members: {GEMM: 3}`` (the recipe's): three GEMM networks from different initial weights, one each for the
    attention networks; a prediction is the roofline over the members' mean utilisation, the first member alone is
    the one-network prediction of the same seed."""
    from neusight_core.predictors.features import utilisation
    assert [len(small_nets.nets[n]) for n in tc.NETWORKS] == [3, 1, 1, 3]      # GEMM_fp8 takes GEMM's members
    a, b = (small_nets.nets["GEMM"][i].state_dict() for i in (0, 1))
    assert any(not np.array_equal(a[k], b[k]) for k in a)                     # different draws
    g = mk.gemm_rows("h100_sxm").iloc[:50].reset_index(drop=True)
    dev = common.device_arrays(g)
    X, waves, base = small_nets._inputs(g, dev, "GEMM")
    mu, sd = small_nets.norm["GEMM"]
    us = [utilisation(m((X - mu) / sd), waves) for m in small_nets.nets["GEMM"]]
    u_max = float(small_nets.value("u_max", "GEMM"))
    assert np.allclose(small_nets.predict(g), base / (u_max * np.mean(us, axis=0)), rtol=1e-12)
    one = tc.TensorCoreNets({**small_nets.config, "members": 1, "networks": ["GEMM"]}, seed=0)
    one.fit(mk.training_kernels(["GEMM"]), quick=True)
    assert np.allclose(one.predict(g), base / (u_max * us[0]), rtol=1e-6)


def test_framework_agreement_by_hand():
    """Two files of one GPU: the other framework's latency scored as a prediction of the scored file's, on the
    shapes both measured, and each file's fraction of the dense BF16 peak on its big GEMMs."""
    from neusight_core.studies import external_eval as xe
    peak = devices.get_device(H100).bf16_tensor_gflops * 1e6          # FLOPs per ms
    dims = [(8192.0, 8192.0, 8192.0), (16.0, 4096.0, 4096.0), (32.0, 64.0, 64.0)]
    def file(fw, scored, lat):
        return pd.DataFrame([{"device": H100, "role": "training", "framework": fw, "version": "1", "kernel_source": fw,
                              "scored": scored, "B": np.nan, "M": m, "N": n, "K": k, "flops": 2 * m * n * k,
                              "latency_ms": l, "op_class": "LINEAR", "precision": "bf16"}
                             for (m, n, k), l in zip(dims, lat)])
    big = 2 * 8192.0 ** 3 / peak                 # the big GEMM at the datasheet peak
    a = file("a", True, [big / 0.8, 1.0, 2.0])
    b = file("b", False, [big / 0.6, 1.5, 2.0]).iloc[[0, 1]]          # b did not measure the third shape
    t = xe.framework_agreement(pd.concat([a, b], ignore_index=True)).set_index("framework")
    assert t.loc["a", "shapes_shared"] == 3 and t.loc["a", "mape_vs_scored"] == 0.0
    assert t.loc["b", "shapes_shared"] == 2
    # b against a: |0.8/0.6 - 1| = 33.3 % and 50 %
    assert t.loc["b", "mape_vs_scored"] == pytest.approx((100 / 3 + 50) / 2)
    assert t.loc["b", "bias_vs_scored"] == pytest.approx((100 / 3 + 50) / 2)
    assert t.loc["a", "big_gemm_peak_pct"] == pytest.approx(80.0)
    assert t.loc["b", "big_gemm_peak_pct"] == pytest.approx(60.0)
    assert bool(t.loc["a", "scored"]) and not bool(t.loc["b", "scored"])


def test_held_out_files_and_a_subset_of_predictors_by_hand():
    """One row per held-out GPU and file: the data's agreement with the scored file and each predictor's MAPE,
    the scored file's from the main table and the others' from the per-file table; training GPUs left out."""
    from neusight_core.studies import external_eval as xe
    agree = pd.DataFrame({"device": ["B", "B", "T"], "role": ["held_out", "held_out", "training"],
                          "framework": ["v", "s", "v"], "scored": [True, False, True],
                          "mape_vs_scored": [0.0, 8.0, 0.0]})
    table = pd.DataFrame({"role": ["held_out", "held_out", "held_out", "training"], "device": ["B", "B", "B", "T"],
                          "kind": "GEMM", "predictor": ["neusight", "structural tree", "roofline", "neusight"],
                          "mape": [15.0, 22.0, 57.0, 4.0]})
    by_file = pd.DataFrame({"role": "held_out", "device": "B", "kind": "GEMM", "framework": ["s", "s"],
                            "predictor": ["neusight", "structural tree"], "mape": [19.0, 26.0]})
    f = xe.held_out_files(table, by_file, agree)
    assert list(f["framework"]) == ["v", "s"] and list(f["scored"]) == [True, False]
    assert list(f["neusight"]) == [15.0, 19.0] and list(f["structural tree"]) == [22.0, 26.0]
    assert list(f["mape_vs_scored"]) == [0.0, 8.0] and set(f["device"]) == {"B"}
    assert "roofline" not in f.columns                # scored on the scored file only: not a column here
    # a subsample keeps at most n rows per group, in their order
    d = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 2, "i": range(7)})
    s = xe.subsample(d, ["g"], 3)
    assert list(s.groupby("g").size()) == [3, 2] and s["i"].is_monotonic_increasing
    assert len(xe.subsample(d, ["g"], None)) == 7
    with pytest.raises(ValueError, match="no predictor"):
        xe.predict_all(d, names=("nope",))


def test_notebook_07_tables_say_their_metric_seeds_and_why_a_cell_is_empty(tmp_path):
    """Each of notebook 07's tables with metric columns has a title line naming the metric and the seeds (and quick
    weights in quick mode); an empty cell of the targets table says why in the Markdown, the CSV keeps its NaN."""
    from neusight_core.reports import report
    from neusight_core.studies import external_eval as xe
    for name in ("metrics", "mape_pivot", "error_vs_tokens_GEMM", "memory_law", "moe_layers", "moe_layers_parallel",
                 "targets", "held_out_files"):
        t = xe.table_title(name, [0, 1, 2])
        assert ("MAPE" in t or "APE" in t) and "seeds 0, 1, 2" in t and "quick" not in t, name
    assert "seed 0 (quick weights" in xe.table_title("metrics", [0], quick=True)
    assert xe.table_title("provenance", [0]) == ""
    targets = pd.DataFrame({"target": ["a", "spread"], "value": [3.0, np.nan], "met": [True, None]})
    report.save_table(targets, tmp_path, "targets", title=xe.table_title("targets", [0]), na=xe.TARGETS_NA)
    md = (tmp_path / "tables" / "targets.md").read_text()
    assert md.startswith(xe.table_title("targets", [0]) + "\n\n|")
    assert xe.TARGETS_NA["value"] in md and xe.TARGETS_NA["met"] in md and "nan" not in md
    assert "3.0" in md and pd.read_csv(tmp_path / "tables" / "targets.csv")["value"].isna().sum() == 1
