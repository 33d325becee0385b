"""Issue 36 item 8: the smaller faults, each refused in one line naming the problem (or handled) instead of a
silent wrong answer, a traceback or a hang."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from neusight_core.data import configs
from neusight_core import paths
from neusight_core.studies import whatif
from neusight_core.run import executed_notebook, runner
from neusight_core.__main__ import _devices, main as cli


def _err(capsys) -> str:
    return capsys.readouterr().err.strip()


def test_sweep_refuses_a_nan_link(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli(["sweep", "--model", "bert", "--device", "H100", "--batch", "2", "--seq", "128", "--parallel", "dp",
             "--gpus", "2", "--link-gbs", "nan", "--out", str(tmp_path / "s.csv")])
    assert e.value.code == 2
    assert "--link-gbs: link bandwidth must be a positive number of GB/s, got 'nan'" in _err(capsys)
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("argv", [["sweep", "--model", "bert", "--device", "H100", "--batch", "1", "--seq", "128",
                                   "--predictor", "roofline", "--seed", "0,-1", "--out", "x.csv"],
                                  ["train", "--predictor", "roofline", "--seed", "-1"]])
def test_a_negative_seed_is_refused(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli(argv) == 2
    assert _err(capsys) == "error: --seed takes non-negative integers, got -1"


def test_predict_takes_a_seed_and_refuses_a_negative_one(capsys):
    with pytest.raises(SystemExit) as e:
        cli(["predict", "--model", "bert", "--device", "H100", "--batch", "1", "--seq", "128", "--seed", "-1"])
    assert e.value.code == 2 and "--seed: takes non-negative integers, got '-1'" in _err(capsys)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli(["--version"])
    assert e.value.code == 0
    from neusight_core import __version__
    assert __version__ in capsys.readouterr().out


def test_an_alias_and_its_canonical_name_are_one_sweep_row():
    assert _devices("H100,NVIDIA_H100_80GB_HBM3,h100") == ["NVIDIA_H100_80GB_HBM3"]
    assert _devices("H100,NoSuchGPU") == ["NVIDIA_H100_80GB_HBM3", "NoSuchGPU"]   # the unknown one: its row's error


@pytest.mark.parametrize("field, value", [("num_key_value_heads", 0), ("n_positions", 0), ("num_attention_heads", -4),
                                          ("hidden_size", 2.5)])
def test_config_sizes_must_be_positive_integers(field, value):
    d = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_hidden_layers": 2, "vocab_size": 1000, field: value}
    with pytest.raises(configs.TraceError, match=f"{field} must be a positive integer, got {value!r}"):
        configs.load_config(d)


@pytest.mark.parametrize("field, value", [("link_gbs", "1.0e+9"), ("tensor_gflops", "{bf16: 1.0e-9}")])
def test_device_file_ranges_name_the_file_and_field(field, value, tmp_path, monkeypatch, capsys):
    """A device entry out of range is refused when that GPU is asked for, naming the file; the others still answer."""
    f = tmp_path / "mine.yaml"
    f.write_text("MyGPU:\n  display_name: My GPU\n  mem_gb: 24\n  mem_bw_gbs: 1000\n  num_sm: 80\n"
                 f"  fp32_gflops: 40000\n  l2_mb: 40\n  {field}: {value}\n  tensor_source: me\n")
    monkeypatch.setenv("NEUSIGHT_DEVICES", str(f))
    from neusight_core.data import devices
    devices.reload()
    try:
        assert cli(["predict", "--model", "bert", "--device", "MyGPU", "--batch", "1", "--seq", "128",
                    "--predictor", "roofline"]) == 2
        err = _err(capsys)
        assert err.startswith("error: device MyGPU: ") and "is outside the physically plausible range" in err
        assert f"(check {f} and its units)" in err and err.count("\n") == 0
        assert cli(["predict", "--model", "bert", "--device", "H100", "--batch", "1", "--seq", "128",
                    "--predictor", "roofline"]) == 0
    finally:
        monkeypatch.delenv("NEUSIGHT_DEVICES")
        devices.reload()


@pytest.mark.parametrize("price, gpus, message", [(-2.5, 8, "gpu_price_per_hour must be a positive price"),
                                                  ("abc", 8, "gpu_price_per_hour must be a positive price"),
                                                  (None, 0, "max_gpus must be a whole number of GPUs from 1 to 1024"),
                                                  (None, 2.5, "max_gpus must be a whole number")])
def test_notebook_06_parameters_are_checked(price, gpus, message):
    with pytest.raises(ValueError, match=message):
        whatif.check_parameters(price, gpus)
    assert whatif.check_parameters("2.5", 4) == (2.5, 4) and whatif.check_parameters("None", 8) == (None, 8)


@pytest.mark.parametrize("kind", ["fifo", "broken", "missing"])
def test_a_bad_predictor_registry_file_is_one_line_and_never_hangs(tmp_path, kind):
    f = tmp_path / "extra.yaml"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "broken":
        f.write_text("x: [\n")
    env = {**os.environ, "NEUSIGHT_PREDICTORS": str(f)}
    proc = subprocess.run([sys.executable, "-m", "neusight_core", "models"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=paths.REPO_ROOT)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {f}: ")
    assert {"fifo": "is a FIFO, not a regular file", "broken": "cannot read predictor registry",
            "missing": "cannot read (No such file or directory)"}[kind] in proc.stderr


def test_a_full_disk_during_the_html_export_fails_the_notebook(tmp_path, monkeypatch):
    nb = tmp_path / "01_x.ipynb"
    import nbformat
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), nb)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(executed_notebook, "write_atomic", full)
    assert executed_notebook.export_html(nb) == f"disk full while writing {tmp_path / '01_x.html'}"


def test_an_earlier_runs_tarball_is_never_overwritten(tmp_path):
    tar = tmp_path / "neusight_results_run.tar.gz"
    tar.write_bytes(b"earlier run")
    with pytest.raises(runner.UsageError, match="of an earlier run of that name is there and would be overwritten"):
        runner.claim(tmp_path / "run", default=False)
    assert tar.read_bytes() == b"earlier run" and not (tmp_path / "run" / runner.LOCK_FILE).exists()


def test_an_absurd_image_size_says_it_does_not_fit_before_any_time(capsys):
    """ViT-B/16 at 100,000 x 100,000 pixels: the first line says it does not fit (not an answer that reports its
    memory afterwards as if it could run)."""
    assert cli(["predict", "--model", "vit_b16", "--device", "H100", "--batch", "1", "--image-size", "100000",
                "--predictor", "roofline"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("WARNING: does not fit: needs ") and out[0].endswith("has 80 GiB")


def test_the_python_result_names_its_weights_and_the_roofline_has_none(capsys):
    from neusight_core.cost import latency
    r = latency.predict_model("gpt2_large", "H100", batch=1, seq=128, mode="inf", predictor="roofline")
    assert r["weights"]["weights"] == "none (nothing to train)" and r["weights"]["folder"] is None
    assert cli(["predict", "--model", "bert", "--device", "H100", "--batch", "1", "--seq", "128",
                "--predictor", "roofline"]) == 0
    out = capsys.readouterr().out
    assert "roofline: no weights (nothing to train)" in out and "full weights" not in out


def test_devices_lines_fit_a_terminal(capsys):
    assert cli(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 19 and max(map(len, lines)) <= 140
    assert cli(["devices", "--all"]) == 0
    assert "tensor_source" in capsys.readouterr().out
