"""GPU catalogue: release JSONs as shipped, spec-sheet additions, lookup, user files, bad files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neusight_core.data import devices

GiB = 2**30


pytestmark = pytest.mark.usefixtures("fresh_catalogue")   # conftest: no user devices, catalogue rebuilt


def test_release_devices_are_read_exactly_as_shipped(release_root):
    files = sorted((release_root / "data" / "device_configs").glob("*.json"))
    assert len(files) >= 13
    for f in files:
        raw = json.loads(f.read_text())
        d = devices.get_device(f.stem)
        assert d.name == f.stem and d.display_name == raw["Device"]
        assert (d.mem_gb, d.mem_bw_gbs, d.num_sm, d.core_per_sm, d.freq_mhz, d.l2_mb) == (
            raw["Dev_Mem"], raw["Mem_Bw"], raw["Num_Sm"], raw["Core_Per_SM"], raw["Freq"], raw["L2Cache"])
        assert d.fp32_gflops == raw.get("SingleFLOPs", raw.get("SingleFLOPsMM"))
        assert d.fp32_vec_gflops == raw.get("SingleFLOPs", raw.get("SingleFLOPsVEC"))
        assert "release" in d.source


def test_training_gpus_are_the_papers_five(release_root):
    names = {d.name for d in devices.training_devices("NVIDIA")}
    assert names == {"Tesla_P4", "Tesla_P100-PCIE-16GB", "Tesla_V100-PCIE-32GB", "Tesla_T4",
                     "NVIDIA_A100-PCIE-40GB"}
    assert {d.name for d in devices.training_devices("AMD")} == {"AMD_Instinct_MI100", "AMD_Instinct_MI210"}
    for unseen in ("H100", "L4", "A100-80GB"):
        assert not devices.get_device(unseen).training


def test_device_list_roles(release_root):
    """``neusight devices`` says what each GPU is to the predictors; the release's FP16 variant of the H100 (whose
    FP32 fields hold tensor-core figures) is not shown as one more GPU of the catalogue."""
    rows = {line.split()[0]: line for line in devices.describe().splitlines()[1:-1]}
    assert rows["NVIDIA_H100_80GB_HBM3_TP"].endswith("variant (paper's FP16 study)")
    assert rows["Tesla_T4"].endswith("training")
    assert rows["NVIDIA_L4"].endswith("unseen (paper)")
    assert rows["NVIDIA_B200"].endswith("catalogue")


@pytest.mark.parametrize("name,sm,tflops,bw", [
    ("NVIDIA_H100_PCIe", 114, 51.2, 2000), ("NVIDIA_H200", 132, 67.0, 4800),
    ("NVIDIA_A100-SXM4-80GB", 108, 19.5, 2039), ("NVIDIA_L40S", 142, 91.6, 864), ("NVIDIA_B200", 148, 80.0, 8000),
])
def test_spec_sheet_gpus(name, sm, tflops, bw):
    d = devices.get_device(name)
    assert (d.num_sm, d.fp32_gflops / 1000, d.mem_bw_gbs) == (sm, tflops, bw)
    assert "datasheet" in d.source.lower() and not d.training
    # FP32 peak = 2 x cores x clock, within 1 %: the derived clocks are consistent with the peak
    assert abs(2 * d.num_sm * d.core_per_sm * d.freq_mhz / 1e3 / d.fp32_gflops - 1) < 0.01


@pytest.mark.parametrize("key,expected", [
    ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3"), ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
    ("H100", "NVIDIA_H100_80GB_HBM3"), ("h100-sxm", "NVIDIA_H100_80GB_HBM3"), ("H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
    ("A100-40GB", "NVIDIA_A100-PCIE-40GB"), ("A100-80GB", "NVIDIA_A100_80GB_PCIe"), ("Tesla T4", "Tesla_T4"),
    ("v100", "Tesla_V100-PCIE-32GB"), ("H100-PCIe", "NVIDIA_H100_PCIe"), ("NVIDIA B200", "NVIDIA_B200"),
    ("MI250", "AMD_Instinct_MI250"), ("H100-TP", "NVIDIA_H100_80GB_HBM3_TP"),
])
def test_lookup(release_root, key, expected):
    assert devices.get_device(key).name == expected


def test_unknown_gpu_lists_close_names(release_root):
    with pytest.raises(devices.UnknownDeviceError, match="close names: .*H100") as e:
        devices.get_device("H10O")
    assert "\n" not in str(e.value)


def test_nvlink_bandwidths(release_root):
    assert devices.get_device("H100").link_gbs == 900
    assert devices.get_device("A100-40GB").link_gbs == 600
    assert devices.get_device("L4").link_gbs is None


@pytest.mark.parametrize("props,expected", [
    (("NVIDIA H100 80GB HBM3", 80 * GiB, 132), "NVIDIA_H100_80GB_HBM3"),   # never the FP16 _TP variant
    (("NVIDIA H100 PCIe", 80 * GiB, 114), "NVIDIA_H100_PCIe"),
    (("NVIDIA H200", 141 * GiB, 132), "NVIDIA_H200"),
    (("NVIDIA A100-SXM4-80GB", 80 * GiB, 108), "NVIDIA_A100-SXM4-80GB"),
    (("NVIDIA A100 80GB PCIe", 80 * GiB, 108), "NVIDIA_A100_80GB_PCIe"),
    (("NVIDIA L4", 22 * GiB, 58), "NVIDIA_L4"),          # real L4 reports 58 SMs; the release says 60
    (("Tesla V100-PCIE-32GB", 32 * GiB, 80), "Tesla_V100-PCIE-32GB"),
    (("NVIDIA H100 80GB HBM3 (renamed)", 80 * GiB, 132), "NVIDIA_H100_80GB_HBM3"),
])
def test_device_from_properties(release_root, props, expected):
    assert devices.device_from_properties(*props).name == expected


def test_device_from_properties_unknown(release_root):
    assert devices.device_from_properties("Imaginary GPU X9", 24 * GiB, 77) is None


def test_user_device_from_yaml_via_env(release_root, tmp_path, monkeypatch):
    f = tmp_path / "mygpu.yaml"
    f.write_text("My_GPU_9000:\n  display_name: My GPU 9000\n  aliases: [G9000]\n  mem_gb: 48\n"
                 "  mem_bw_gbs: 1000\n  num_sm: 100\n  fp32_gflops: 40000\n  l2_mb: 32\n  training: true\n")
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    d = devices.get_device("g9000")
    assert d.name == "My_GPU_9000" and d.num_sm == 100 and d.mem_bw_gbs == 1000
    assert not d.training                      # user GPUs never join the training set
    assert d.freq_mhz == pytest.approx(40000e3 / (2 * 100 * 128))
    assert devices.device_from_properties("My GPU 9000", 48 * GiB, 100).name == "My_GPU_9000"
    assert "My_GPU_9000" in set(devices.list_devices()["name"])


def test_user_geforce_without_display_name(release_root, tmp_path, monkeypatch):
    """A workstation GPU described by its datasheet figures alone: no display name needed (it defaults to the name
    with spaces, which is what torch reports for a GeForce card), and it answers to its model number without the
    vendor and brand words, as catalogue GPUs answer to theirs."""
    f = tmp_path / "rtx.yaml"
    f.write_text("NVIDIA_GeForce_RTX_5090:\n  mem_gb: 32\n  mem_bw_gbs: 1792\n  num_sm: 170\n  fp32_gflops: 104800\n"
                 "  l2_mb: 96\n  tensor_gflops: {bf16: 209500}\n  tensor_source: NVIDIA RTX Blackwell whitepaper\n")
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    for name in ("RTX 5090", "rtx_5090", "GeForce RTX 5090", "NVIDIA GeForce RTX 5090"):
        d = devices.get_device(name)
        assert d.name == "NVIDIA_GeForce_RTX_5090" and d.display_name == "NVIDIA GeForce RTX 5090"
    assert devices.device_from_properties("NVIDIA GeForce RTX 5090", 32 * GiB, 170).name == "NVIDIA_GeForce_RTX_5090"


def test_user_device_release_json_in_user_devices_folder(tmp_path, monkeypatch):
    # a home without the release: spec-sheet and user GPUs still work, release GPUs are reported missing
    monkeypatch.setenv("NEUSIGHT_HOME", str(tmp_path))
    (tmp_path / "user_devices").mkdir()
    (tmp_path / "user_devices" / "NVIDIA_RTX_9090.json").write_text(json.dumps({
        "Device": "NVIDIA RTX 9090", "Dev_Mem": 32, "Mem_Bw": 1800, "Num_Sm": 170, "Core_Per_SM": 128,
        "Freq": 2400, "SingleFLOPs": 104000, "L2Cache": 96}))
    assert devices.get_device("NVIDIA RTX 9090").name == "NVIDIA_RTX_9090"
    assert devices.get_device("B200").num_sm == 148
    with pytest.raises(devices.UnknownDeviceError, match="not provisioned"):
        devices.get_device("Tesla_P4")


@pytest.mark.parametrize("suffix,text,match", [
    (".yaml", "X:\n  display_name: X\n  mem_gb: [1\n", "not valid YAML"),
    (".json", "{\"Device\": \"X\", ", "not valid JSON"),
    (".yaml", "X:\n  display_name: X\n  mem_gb: 8\n", "missing field"),
    (".yaml", "X:\n  display_name: X\n  mem_gb: lots\n  mem_bw_gbs: 1\n  num_sm: 1\n  fp32_gflops: 1\n  l2_mb: 1\n",
     "'mem_gb' must be a number"),
    (".yaml", "X:\n  display_name: X\n  mem_gb: -8\n  mem_bw_gbs: 1\n  num_sm: 1\n  fp32_gflops: 1\n  l2_mb: 1\n",
     "must be positive"),
    (".json", json.dumps({"Device": "X", "Dev_Mem": 8}), "missing field"),
    (".yaml", "- just a list\n", "expected a mapping"),
    (".yaml", "H100:\n  display_name: Dup\n  mem_gb: 8\n  mem_bw_gbs: 1\n  num_sm: 1\n  fp32_gflops: 1\n  l2_mb: 1\n",
     "already refers to"),
])
def test_malformed_device_file_one_line_error(release_root, tmp_path, monkeypatch, suffix, text, match):
    f = tmp_path / f"bad{suffix}"
    f.write_text(text)
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    with pytest.raises(devices.DeviceFileError, match=match) as e:
        devices.get_device("H100")
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg


def test_missing_user_device_path_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(tmp_path / "nope.yaml"))
    with pytest.raises(devices.DeviceFileError, match="does not exist"):
        devices.get_device("B200")


# Issue 24: hostile device files. Each gets one line naming the file (and the field), never a hang,
# a bare Python error or a silently accepted number.
_OK = "  display_name: X\n  mem_gb: 8\n  mem_bw_gbs: 100\n  fp32_gflops: 1000\n  l2_mb: 4\n"


_HOSTILE = [
    ("inf_sm.yaml", "X:\n" + _OK + "  num_sm: .inf\n", "'num_sm' must be a finite number, got inf"),
    ("bool_sm.yaml", "X:\n" + _OK + "  num_sm: true\n", "'num_sm' must be a number, not true/false"),
    ("half_sm.yaml", "X:\n" + _OK + "  num_sm: 8.5\n", "'num_sm' must be a whole number, got 8.5"),
    ("nan_bw.yaml", "X:\n" + _OK.replace("mem_bw_gbs: 100", "mem_bw_gbs: .nan") + "  num_sm: 8\n", "'mem_bw_gbs' must be a finite number"),
    ("zero_l2.yaml", "X:\n" + _OK.replace("l2_mb: 4", "l2_mb: 0") + "  num_sm: 8\n", "'l2_mb' must be positive, got 0"),
    ("neg_mem.json", json.dumps({"X": {"display_name": "X", "mem_gb": -8, "mem_bw_gbs": 100, "num_sm": 8,
                                       "fp32_gflops": 1000, "l2_mb": 4}}), "'mem_gb' must be positive, got -8"),
    ("inf_link.yaml", "X:\n" + _OK + "  num_sm: 8\n  link_gbs: .inf\n", "'link_gbs' must be a finite number"),
    ("zero_link.yaml", "X:\n" + _OK + "  num_sm: 8\n  link_gbs: 0\n", "'link_gbs' must be positive"),
    ("inf_tensor.yaml", "X:\n" + _OK + "  num_sm: 8\n  tensor_gflops: {fp16: .inf}\n  tensor_source: me\n",
     "'tensor_gflops.fp16' must be a finite number"),
    ("neg_tensor.yaml", "X:\n" + _OK + "  num_sm: 8\n  tensor_gflops: {bf16: -5}\n  tensor_source: me\n",
     "'tensor_gflops.bf16' must be positive"),
    ("bool_tensor.yaml", "X:\n" + _OK + "  num_sm: 8\n  tensor_gflops: {tf32: true}\n  tensor_source: me\n",
     "'tensor_gflops.tf32' must be a number, not true/false"),
    ("fp4_tensor.yaml", "X:\n" + _OK + "  num_sm: 8\n  tensor_gflops: {fp4: 5000}\n  tensor_source: me\n",
     "must map tf32/fp16/bf16/fp8 to dense GFLOPS, got 'fp4'"),
    ("list_tensor.yaml", "X:\n" + _OK + "  num_sm: 8\n  tensor_gflops: []\n", "must map tf32/fp16/bf16"),
    ("inf_release.json", '{"Device": "X", "Dev_Mem": 8, "Mem_Bw": 100, "Num_Sm": Infinity, "Core_Per_SM": 64, '
                         '"Freq": 1000, "SingleFLOPs": 1000, "L2Cache": 4}', "'Num_Sm' must be a finite number"),
    ("link_release.json", '{"Device": "X", "Dev_Mem": 8, "Mem_Bw": 100, "Num_Sm": 8, "Core_Per_SM": 64, '
                          '"Freq": 1000, "SingleFLOPs": 1000, "L2Cache": 4, "link_gbs": 1e999}',
     "'link_gbs' must be a finite number"),
    ("latin1.yaml", b"X:\n  display_name: Gr\xe4fik\n", r"not UTF-8 text \(byte 0xe4"),
]


@pytest.mark.parametrize("name,body,match", _HOSTILE, ids=[h[0] for h in _HOSTILE])
def test_hostile_device_file_names_the_file(release_root, tmp_path, monkeypatch, name, body, match):
    f = tmp_path / name
    f.write_bytes(body if isinstance(body, bytes) else body.encode())
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    with pytest.raises(devices.DeviceFileError, match=match) as e:
        devices.get_device("H100")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}: ")


def test_user_release_json_keeps_its_link_and_tensor_peaks(release_root, tmp_path, monkeypatch):
    # a release-style user JSON's link_gbs / tensor_gflops were silently dropped before issue 24
    f = tmp_path / "RTX_X.json"
    f.write_text(json.dumps({"Device": "RTX X", "Dev_Mem": 8, "Mem_Bw": 100, "Num_Sm": 8, "Core_Per_SM": 64,
                             "Freq": 1000, "SingleFLOPs": 1000, "L2Cache": 4, "link_gbs": 50,
                             "tensor_gflops": {"fp16": 8000}, "tensor_source": "my datasheet"}))
    monkeypatch.setenv(devices.ENV_USER_DEVICES, str(f))
    d = devices.get_device("RTX X")
    assert (d.link_gbs, d.gemm_peak_gflops("fp16"), d.gemm_peak_gflops("bf16")) == (50, 8000, 1000)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_in_device_folder_is_refused_not_read(release_root, tmp_path):
    # reading a FIFO blocks until a writer comes: the old loader hung every command. A subprocess with
    # a timeout, so that a regression fails instead of hanging the suite.
    folder = tmp_path / "devs"
    folder.mkdir()
    fifo = folder / "pipe.yaml"
    os.mkfifo(fifo)
    env = {**os.environ, devices.ENV_USER_DEVICES: str(folder)}
    try:
        r = subprocess.run([sys.executable, "-m", "neusight_core", "devices"], env=env, capture_output=True,
                           text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        pytest.fail("the device catalogue blocked on a FIFO named *.yaml")
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {fifo}: is a FIFO, not a regular file (device files must be regular files)"
