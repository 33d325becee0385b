"""Issue 36, item 4: the measured-kernel loader checks values, not only columns. A file with a NaN, negative,
zero, infinite or absurd latency, a non-positive dim, or a row faster than the roofline at the GPU's peak (beyond
the stated margins) is refused whole, in one line naming the file; a damaged installed parquet file never loads."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from neusight_core.data import devices, measured_checks, measured_kernels as mk
from tests.test_measured_kernels import _attn_raw, _gemm_raw, _write_parquet

pytestmark = pytest.mark.usefixtures("fresh_catalogue")

GOOD_GEMM = ("torch.nn.functional.linear", "bfloat16", 64, 128, 256, 0.01)
GOOD_ATTN = ("fa3", 2, 128, 8, 2, 64, "bfloat16", "bfloat16", 0, 0, 0.02)


def _gemm(**change):
    row = dict(zip(["kernel_source", "gemm_dtype", "m", "n", "k", "latency"], GOOD_GEMM), **change)
    return mk.gemm_kernels(_gemm_raw([GOOD_GEMM, tuple(row.values())]), "h100_sxm", "vllm", "0.24.0")


def _attn(kind="prefill", **change):
    cols = ["kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype",
            "kv_cache_dtype", "step", "window_size", "latency"]
    row = dict(zip(cols, GOOD_ATTN), **change)
    return mk.attention_kernels(_attn_raw([GOOD_ATTN, tuple(row.values())]), kind, "l40s", "vllm", "0.24.0")


def _refused(frame, *words):
    with pytest.raises(mk.MeasuredDataError) as e:
        measured_checks.validate(frame, "some/file.parquet")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("some/file.parquet: 1 of 2 BF16 rows fail validation"), msg
    for w in words:
        assert w in msg, msg


def test_good_rows_pass():
    for frame in (_gemm(), _attn(), _attn("decode", isl=1, step=127, window_size=64)):
        assert measured_checks.validate(frame, "f") is frame


@pytest.mark.parametrize("latency", [np.nan, -1.0, 0.0, np.inf, -6e307, 1e304])
def test_bad_latencies_are_refused(latency):
    _refused(_gemm(latency=latency), "latency_ms")
    _refused(_attn(latency=latency), "latency_ms")


@pytest.mark.parametrize("column,value,field", [("m", 0, "M"), ("m", -3, "M"), ("k", 0, "N"), ("n", -1, "K")])
def test_non_positive_gemm_dims_are_refused(column, value, field):
    _refused(_gemm(**{column: value}), f"{field}=", "not a positive number")


@pytest.mark.parametrize("column,value,words", [
    ("num_heads", 0, "heads=0"), ("num_key_value_heads", 0, "kv_heads=0"), ("head_dim", 0, "head_dim=0"),
    ("batch_size", 0, "B=0"), ("isl", 0, "seq_q=0"), ("step", -5, "cached tokens"), ("window_size", -1, "window"),
    ("num_key_value_heads", 16, "more KV heads than query heads")])
def test_bad_attention_rows_are_refused(column, value, words):
    _refused(_attn(**{column: value}), words)


def test_faster_than_the_roofline_is_refused_and_the_margins_hold():
    h100 = devices.get_device("NVIDIA_H100_80GB_HBM3")
    m = n = k = 8192
    at_peak = 2.0 * m * n * k / (h100.gemm_peak_gflops("bf16") * 1e9) * 1e3       # ms
    # 1.5 x the dense peak passes (boost clocks; the fastest real row is 1.28 x), 2.5 x does not
    assert len(measured_checks.validate(_gemm(m=m, n=n, k=k, latency=at_peak / 1.5), "f")) == 2
    _refused(_gemm(m=m, n=n, k=k, latency=at_peak / (measured_checks.COMPUTE_MARGIN * 1.25)), "BF16 peak")
    # memory: a 1 x 8192 x 65536 GEMM reads 1 GiB of weights; 5 x the DRAM rate passes (L2), 20 x does not
    byts = 2.0 * (1 * 65536 + 65536 * 8192) + 2.0 * 8192
    at_bw = byts / (h100.mem_bw_gbs * 1e9) * 1e3
    assert len(measured_checks.validate(_gemm(m=1, n=8192, k=65536, latency=at_bw / 5), "f")) == 2
    _refused(_gemm(m=1, n=8192, k=65536, latency=at_bw / (measured_checks.MEMORY_MARGIN * 2)), "memory bandwidth")


def test_a_file_with_a_bad_row_is_named_in_one_line(tmp_path, release_root):
    f = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    _write_parquet(f, _gemm_raw([GOOD_GEMM, GOOD_GEMM[:5] + (-0.5,)]))
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm("h100_sxm", root=tmp_path)
    assert str(e.value).startswith(f"{f}: 1 of 2 BF16 rows fail validation") and "\n" not in str(e.value)
    g = tmp_path / "l40s" / "attention" / "vllm" / "0.24.0" / "generation_attention_perf.parquet"
    _write_parquet(g, _attn_raw([GOOD_ATTN[:2] + (1,) + GOOD_ATTN[3:8] + (127, 0, 0.01),
                                 GOOD_ATTN[:2] + (1, 0) + GOOD_ATTN[4:8] + (127, 0, 0.01)]))
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_attention("l40s", kinds="decode", root=tmp_path)
    assert str(e.value).startswith(f"{g}: 1 of 2 BF16 rows fail validation (first: heads=0")


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_in_an_installed_file_never_load(seed, tmp_path, release_root):
    """20 kB of random bytes in the middle of an installed file: refused (cannot read, or rows that fail), naming it."""
    pytest.importorskip("aiconfigurator_core", reason="aiconfigurator-core is not installed in this environment")
    src = mk.data_root() / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / mk.GEMM_FILE
    dst = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / mk.GEMM_FILE
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    blob, rng = bytearray(dst.read_bytes()), np.random.default_rng(seed)
    at = len(blob) // 2 - 10_000 + int(rng.integers(-len(blob) // 4, len(blob) // 4))
    blob[at:at + 20_000] = rng.bytes(20_000)
    dst.write_bytes(bytes(blob))
    with pytest.raises(mk.MeasuredDataError) as e:
        mk.load_gemm("h100_sxm", root=tmp_path, features=False)
    assert str(e.value).startswith(str(dst)) and "\n" not in str(e.value)
    assert len(mk.load_gemm("h100_sxm", features=False)) > 0      # the intact file loads
