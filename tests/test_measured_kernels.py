"""Issue 25, step 1: the loader of aiconfigurator-core's measured BF16 kernels, its split, its errors and
the catalogue entries of its GPUs. Conversions are checked on rows computed by hand; the tests that read
the installed package (or write parquet files) skip when aiconfigurator-core / pyarrow are not installed."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import yaml

from neusight_core.data import devices, measured_kernels as mk
from neusight_core import paths

NO_PACKAGE = "aiconfigurator-core (pinned in requirements.txt) is not installed in this environment"


pytestmark = pytest.mark.usefixtures("fresh_catalogue")   # conftest: no user devices, catalogue rebuilt


def _gemm_raw(rows):
    return pd.DataFrame(rows, columns=["kernel_source", "gemm_dtype", "m", "n", "k", "latency"])


def _attn_raw(rows):
    cols = ["kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype",
            "kv_cache_dtype", "step", "window_size", "latency"]
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------- conversions, by hand
def test_gemm_row_by_hand():
    raw = _gemm_raw([("torch.nn.functional.linear", "bfloat16", 3, 5, 7, 0.01),
                     ("CutlassFP8ScaledMMLinearKernel", "fp8", 3, 5, 7, 0.005)])
    k = mk.gemm_kernels(raw, "h100_sxm", "vllm", "0.24.0")
    assert len(k) == 1                                   # the FP8 row is not read
    r = k.iloc[0]
    # y[m=3, n=5] = x[3, k=7] @ W[5, 7]^T; ours [M x N] @ [N x K], N the reduction: M=3, N=7, K=5
    assert (r.B, r.M, r.N, r.K) == (1, 3, 7, 5) and np.isnan(r.H)
    assert r.flops == 2 * 3 * 5 * 7 == 210
    assert r.bytes_read == 2 * (3 * 7 + 7 * 5) == 112    # x and W, 2 B each
    assert r.bytes_written == 2 * 3 * 5 == 30            # y
    assert (r.op_class, r.sub_op, r.aten_op, r["dtype"], r.precision) == (
        "LINEAR", "", "aten.mm.default", "bfloat16", "bf16")
    assert (r.device, r.latency_ms, r.framework, r.version, r.kernel_source, r.role) == (
        "NVIDIA_H100_80GB_HBM3", 0.01, "vllm", "0.24.0", "torch.nn.functional.linear", "training")
    # the kernel-table columns of dataset.to_kernels, in its order
    assert list(k.columns[:20]) == ["phase", "aten_op", "op_class", "sub_op", "B", "M", "N", "K", "H", "flops",
                                    "bytes_read", "bytes_written", "dtype", "module", "layer", "count",
                                    "comm_kind", "comm_bytes", "overlap", "stage"]


def test_prefill_rows_by_hand():
    raw = _attn_raw([
        ("fa3", 2, 4, 8, 2, 64, "bfloat16", "bfloat16", 0, 0, 0.02),     # plain causal prefill
        ("fa3", 1, 6, 2, 1, 32, "bfloat16", "bfloat16", 0, 4, 0.03),     # sliding window of 4
        ("fa3", 2, 4, 8, 2, 64, "fp8", "fp8", 0, 0, 0.01),               # FP8 attention: not read
        ("fa3", 2, 4, 8, 2, 64, "bfloat16", "fp8", 0, 0, 0.01),          # FP8 KV cache: not by default
    ])
    k = mk.attention_kernels(raw, "prefill", "l40s", "vllm", "0.24.0")
    assert len(k) == 2
    a, w = k.iloc[0], k.iloc[1]
    # b=2, s=4 tokens, 8 query heads, 2 KV heads, d=64: causal pairs 1+2+3+4 = 10
    assert (a.op_class, a.sub_op, a.B, a.seq_q, a.seq_kv, a.heads, a.kv_heads, a.head_dim, a.window) == (
        "ATTN", "prefill", 2, 4, 4, 8, 2, 64, 0)
    assert a.flops == 4 * 2 * 8 * 64 * 10 == 40960            # 2d for QK^T + 2d for PV per pair
    q = 2 * 2 * 4 * 8 * 64                                    # Q (and O): 2 B x b x s x h x d = 8192
    kv = 2 * 2 * (2 * 4 * 2 * 64)                             # K and V: 2 B x 2 x b x s x h_kv x d = 4096
    assert (a.bytes_read, a.bytes_written) == (q + kv, q) == (12288, 8192)
    assert (a["dtype"], a.precision, a.device, a.kv_dtype, a.latency_ms) == (
        "bfloat16", "bf16", "NVIDIA_L40S", "bfloat16", 0.02)
    assert np.isnan(a.M) and np.isnan(a.N) and np.isnan(a.K)
    # window 4 over 6 tokens: position p sees min(p+1, 4) keys: 1+2+3+4+4+4 = 18 pairs; every key is read
    assert w.flops == 4 * 1 * 2 * 32 * 18
    assert w.bytes_read == 2 * 6 * 2 * 32 + 2 * 2 * 6 * 1 * 32 and w.bytes_written == 2 * 6 * 2 * 32


def test_decode_rows_by_hand():
    raw = _attn_raw([
        ("trtllm_mha", 3, 1, 4, 1, 128, "bfloat16", "bfloat16", 7, 0, 0.004),    # 7 cached + 1 new = 8 keys
        ("trtllm_mha", 3, 1, 4, 1, 128, "bfloat16", "bfloat16", 7, 4, 0.003),    # window 4: 4 keys
        ("trtllm_mha", 3, 1, 4, 1, 128, "bfloat16", "fp8", 7, 0, 0.002),         # FP8 KV cache, 1 B
    ])
    k = mk.attention_kernels(raw, "decode", "h200_sxm", kv_dtypes=("bfloat16", "fp8"))
    full, win, fp8 = (k.iloc[i] for i in range(3))
    assert (full.sub_op, full.seq_q, full.seq_kv) == ("decode", 1, 8)
    assert full.flops == 4 * 3 * 4 * 128 * 8 == 49152
    q = 2 * 3 * 1 * 4 * 128                                   # 3072
    assert full.bytes_read == q + 2 * 2 * 3 * 8 * 1 * 128 == 15360 and full.bytes_written == q
    assert win.flops == 4 * 3 * 4 * 128 * 4 and win.bytes_read == q + 2 * 2 * 3 * 4 * 128
    assert fp8.kv_dtype == "fp8" and fp8.bytes_read == q + 1 * 2 * 3 * 8 * 128 and fp8.flops == full.flops
    assert mk.attention_kernels(raw, "decode", "h200_sxm").shape[0] == 2      # default: BF16 KV cache only


def test_attention_pairs_closed_form_matches_counting():
    for s_q, s_kv, w in [(1, 1, 0), (5, 5, 0), (3, 10, 0), (1, 9, 4), (7, 7, 3), (4, 12, 5), (16, 16, 16)]:
        past = s_kv - s_q
        count = sum(min(p + 1, w) if w else p + 1 for p in range(past, s_kv))
        assert mk.attention_pairs(s_q, s_kv, w) == count


# ---------------------------------------------------------------- the split
def test_split_is_disjoint_and_named_in_the_catalogue():
    s = mk.split()
    assert s["training"] == ("NVIDIA_A100-SXM4-80GB", "NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "NVIDIA_L40S")
    assert s["held_out"] == ("NVIDIA_B200", "NVIDIA_GB200")
    assert s["sealed"] == ("b300_sxm", "gb300", "rtx_pro_6000_server", "b60")
    assert not set(mk.TRAINING) & set(mk.HELD_OUT) and not (set(mk.TRAINING) | set(mk.HELD_OUT)) & set(mk.SEALED)
    assert set(mk.CATALOGUE) == set(mk.TRAINING) | set(mk.HELD_OUT)        # sealed GPUs have no catalogue name
    assert mk.system_names("training", False) == list(mk.TRAINING)
    assert mk.system_names("held_out", False) == list(mk.HELD_OUT)


@pytest.mark.parametrize("name,system", [("h100_sxm", "h100_sxm"), ("H100", "h100_sxm"), ("NVIDIA H200", "h200_sxm"),
                                         ("A100-SXM4-80GB", "a100_sxm"), ("NVIDIA_A100-SXM4-80GB", "a100_sxm"),
                                         ("L40S", "l40s"), ("B200", "b200_sxm"), ("B200 SXM", "b200_sxm"),
                                         ("NVIDIA_GB200", "gb200")])
def test_resolve_names(name, system):
    assert mk.resolve(name) == system


def test_a_gpu_name_means_what_the_catalogue_says():
    """Issue 35, one meaning per name: "A100 SXM" is the catalogue's A100-SXM4-40GB (the release's 4-GPU system),
    so the measured-kernel loader does not read it as the database's 80 GB A100 SXM; it says it is not in the split."""
    from neusight_core.data import devices
    assert devices.get_device("A100 SXM").name == "NVIDIA_A100-SXM4-40GB"
    with pytest.raises(mk.MeasuredDataError, match="'A100 SXM' is not in the measured kernels' split"):
        mk.resolve("A100 SXM")


SEALED_NAMES = ["b300_sxm", "B300", "NVIDIA B300 SXM6 AC", "gb300", "NVIDIA GB300", "rtx_pro_6000_server",
                "RTX PRO 6000 Server", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "b60", "B60"]


@pytest.mark.parametrize("name", SEALED_NAMES)
def test_sealed_gpus_are_refused_before_any_file_is_opened(name, monkeypatch, tmp_path):
    def no_access(*a, **k):
        raise AssertionError("a sealed GPU's request reached the files")
    monkeypatch.setattr(mk, "data_root", no_access)
    monkeypatch.setattr(mk, "read_table", no_access)
    monkeypatch.setattr(mk, "kernel_files", no_access)
    for call in (lambda: mk.load_gemm(name, root=tmp_path), lambda: mk.load_attention(name, root=tmp_path),
                 lambda: mk.load_gemm(["h100_sxm", name]), lambda: mk.resolve(name)):
        with pytest.raises(mk.SealedGPUError) as e:
            call()
        assert "sealed" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["a30", "l4", "h100_pcie", "a100_pcie", "A100", "T4", "no such gpu"])
def test_gpus_outside_the_split_are_refused(name):
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm(name)
    assert not isinstance(e.value, mk.SealedGPUError) and "\n" not in str(e.value)


def test_nothing_in_the_project_unseals():
    """Only an explicit allow_sealed set to true reads a sealed GPU; no code, notebook or script passes it."""
    hits = []
    for folder in ("neusight_core", "notebooks", "benchmarks", "scripts", "tests"):
        for f in (paths.REPO_ROOT / folder).rglob("*"):
            if f.suffix in (".py", ".ipynb", ".sh", ".yaml", ".md") and f.is_file():
                text = f.read_text(errors="replace")
                if re.search(r"allow_sealed\s*=\s*True", text):
                    hits.append(str(f))
    assert hits == []


def test_no_sealed_gpu_in_the_catalogue(release_root):
    names = " ".join(list(devices.list_devices()["name"]) + list(devices.list_devices()["display_name"]))
    for sealed in ("B300", "GB300", "RTX PRO 6000", "RTX_PRO_6000", "B60"):
        assert sealed.lower() not in names.lower()


# ---------------------------------------------------------------- errors: missing package, changed layout
def test_missing_package_is_one_line(monkeypatch):
    def gone(name):
        raise ModuleNotFoundError(f"No module named {name!r}")
    monkeypatch.setattr(mk.importlib.resources, "files", gone)
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm("h100_sxm")
    msg = str(e.value)
    assert "aiconfigurator-core is not installed" in msg and "requirements.txt" in msg and "\n" not in msg


def _write_parquet(path, frame):
    pytest.importorskip("pyarrow", reason="pyarrow (pinned with aiconfigurator-core) is not installed")
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path)


def test_changed_layout_is_one_line(tmp_path):
    gemm = _gemm_raw([("torch.nn.functional.linear", "bfloat16", 3, 5, 7, 0.01)])
    _write_parquet(tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet",
                   gemm.drop(columns="latency"))
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm("h100_sxm", root=tmp_path, features=False)
    assert "gemm_perf.parquet: missing column(s) latency" in str(e.value) and "\n" not in str(e.value)

    attn = _attn_raw([("fa3", 2, 4, 8, 2, 64, "bfloat16", "bfloat16", 0, 0, 0.02)])
    _write_parquet(tmp_path / "h100_sxm" / "attention" / "vllm" / "0.24.0" / "context_attention_perf.parquet",
                   attn.drop(columns=["num_key_value_heads", "step"]))
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_attention("h100_sxm", kinds="prefill", root=tmp_path, features=False)
    assert "missing column(s) num_key_value_heads, step" in str(e.value) and "\n" not in str(e.value)

    # no files for a GPU, no file of an op, an unreadable file: one line each
    for call, words in [(lambda: mk.load_gemm("l40s", root=tmp_path), "no measured data for l40s"),
                        (lambda: mk.load_attention("h100_sxm", kinds="decode", root=tmp_path),
                         "no generation_attention_perf.parquet"),
                        (lambda: mk.load_gemm("h100_sxm", frameworks=["sglang"], root=tmp_path),
                         "for framework(s) sglang")]:
        with pytest.raises(mk.MeasuredDataError) as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "h200_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a parquet file\n" * 10)
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm("h200_sxm", root=tmp_path)
    assert "cannot read" in str(e.value) and "\n" not in str(e.value)


def test_written_layout_loads_and_window_is_optional(tmp_path, release_root):
    gemm = _gemm_raw([("torch.nn.functional.linear", "bfloat16", 3, 5, 7, 0.01)])
    for ver in ("0.5.6.post2", "0.5.14"):          # newest by version order, not by string order
        _write_parquet(tmp_path / "h100_sxm" / "gemm" / "sglang" / ver / "gemm_perf.parquet",
                       gemm.assign(latency=0.02 if ver == "0.5.14" else 0.09))
    k = mk.load_gemm("h100_sxm", root=tmp_path)
    assert list(k["version"]) == ["0.5.14"] and list(k["latency_ms"]) == [0.02]
    assert k["num_sm"].iloc[0] == devices.get_device("H100").num_sm        # device features joined
    assert len(mk.load_gemm("h100_sxm", root=tmp_path, versions="all")) == 2
    attn = _attn_raw([("fa2", 1, 1, 2, 1, 64, "bfloat16", "bfloat16", 3, 0, 0.001)]).drop(columns="window_size")
    _write_parquet(tmp_path / "a100_sxm" / "attention" / "vllm" / "0.14.0" / "generation_attention_perf.parquet", attn)
    a = mk.load_attention("a100_sxm", kinds="decode", root=tmp_path)
    assert (a["window"].iloc[0], a["seq_kv"].iloc[0], a["device"].iloc[0]) == (0, 4, "NVIDIA_A100-SXM4-80GB")


# ---------------------------------------------------------------- the installed package
@pytest.fixture
def package():
    return pytest.importorskip("aiconfigurator_core", reason=NO_PACKAGE)


def test_available_lists_the_split(package):
    a = mk.available()
    for s in mk.TRAINING + mk.HELD_OUT:
        mine = a[a["system"] == s]
        assert {"gemm", "attention"} <= set(mine["op"]) and set(mine["device"]) == {mk.CATALOGUE[s]}
    sealed = a[a["role"] == "sealed"]
    assert set(sealed["system"]) <= set(mk.SEALED) and (sealed["framework"] == "").all()
    assert len(sealed) == sealed["system"].nunique()                       # one row each, folder not opened


def test_training_frames_hold_only_training_gpus(package, release_root):
    g = mk.load_gemm("training", frameworks=["vllm"])
    assert set(g["device"]) == set(mk.split()["training"]) and set(g["role"]) == {"training"}
    assert (g["op_class"] == "LINEAR").all() and (g["precision"] == "bf16").all()
    a = mk.load_attention("training", kinds="decode", frameworks=["vllm"])
    assert set(a["device"]) == set(mk.split()["training"]) and set(a["sub_op"]) == {"decode"}
    for frame in (g, a):
        assert not set(frame["device"]) & set(mk.split()["held_out"])
        assert not set(frame["system"]) & set(mk.SEALED)
        assert (frame["latency_ms"] > 0).all() and (frame["flops"] > 0).all()


def test_package_rows_as_pinned(package, release_root):
    """A real H100 SXM row converted as by hand, and the row counts of the pinned 0.12.0 (a changed
    package shows here)."""
    g = mk.load_gemm("H100", frameworks=["vllm"])
    assert len(g) == 35742 and set(g["kernel_source"]) == {"torch.nn.functional.linear"}
    r = g[(g["M"] == 32768) & (g["K"] == 65536) & (g["N"] == 12288)].iloc[0]     # m, n, k = 32768, 65536, 12288
    assert r.flops == 2 * 32768 * 65536 * 12288 and r.bytes_written == 2 * 32768 * 65536
    assert 0.8 < r.flops / (r.latency_ms * 1e-3) / 989.4e12 < 1.0          # near the dense BF16 peak
    a = len(mk.load_gemm("a100_sxm", frameworks=["vllm"]))
    assert a == 9240                                                       # kernel_source vllm_default


# ---------------------------------------------------------------- catalogue entries
SPEC_WORDS = {"fp32": "FP32", "bandwidth": "TB/s|GB/s", "memory": r"\d+ ?GB", "sms": "SM", "l2": "L2"}


def test_catalogue_entries_of_the_split(release_root):
    spec = yaml.safe_load(devices.CATALOGUE_YAML.read_text())
    for name in mk.split()["training"] + mk.split()["held_out"]:
        d = devices.get_device(name)
        assert d.name == name and not d.training                  # never training GPUs of the FP32 predictors
        for field in ("mem_gb", "mem_bw_gbs", "num_sm", "fp32_gflops", "l2_mb", "bf16_tensor_gflops"):
            assert getattr(d, field) > 0
        assert "BF16" in d.tensor_source
        if name in spec["spec_sheet"]:                            # our entries: every number has its source
            for what, pattern in SPEC_WORDS.items():
                assert re.search(pattern, d.source), f"{name}: no source for {what}"
            if d.link_gbs:
                assert "NVLink" in d.source
        else:                                                     # the release's JSON (H100 SXM)
            assert d.source.startswith("authors' release data/device_configs/")
    gb = devices.get_device("GB200")
    assert (gb.bf16_tensor_gflops, gb.fp32_gflops, gb.mem_bw_gbs, gb.mem_gb) == (2.5e6, 8e4, 8000, 186)
