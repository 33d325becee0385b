"""Issue 36, item 3: an FP32 question does not need the BF16 database. Without the optional aiconfigurator-core
package (faked missing here), training `neusight` from an empty weights folder trains and saves the FP32 networks,
FP32 questions answer, BF16 GEMM / attention rows are refused in one line naming the package; once the package is
back, the BF16 networks are trained alone and saved beside the FP32 ones."""
from __future__ import annotations

import importlib.resources
import json

import numpy as np
import pytest

from neusight_core.cost import latency
from neusight_core.data import measured_kernels as mk
from neusight_core import paths
from neusight_core import predictors as P
from neusight_core.__main__ import main as cli
from neusight_core.predictors.common import PredictorInputError
from tests.test_predictors import kernel_rows

ROWS = 300          # training records per class: the library test trains in seconds


@pytest.fixture
def no_package(monkeypatch):
    """aiconfigurator_core as if it were not installed: importlib.resources cannot find it."""
    real = importlib.resources.files

    def files(anchor, *a, **k):
        if anchor == mk.PACKAGE:
            raise ModuleNotFoundError(f"No module named {anchor!r}")
        return real(anchor, *a, **k)
    monkeypatch.setattr(importlib.resources, "files", files)
    assert "aiconfigurator-core is not installed" in mk.unavailable()


@pytest.fixture
def empty_weights(tmp_path, monkeypatch, release_root):
    d = tmp_path / "trained"
    d.mkdir()
    shared = paths.trained_dir() / "datasets"           # the training-record cache, if built: no rebuild
    if shared.is_dir():
        import shutil
        shutil.copytree(shared, d / "datasets")
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(d))
    latency.loaded_predictor.cache_clear()
    yield d
    latency.loaded_predictor.cache_clear()


def _rows(precision):
    k = kernel_rows([("LINEAR", "", 1, 512, 1024, 768, np.nan), ("VEC", "add", 64, np.nan, np.nan, np.nan, 4096)])
    k["precision"] = precision
    return k


def test_fp32_networks_train_and_save_without_the_bf16_database(empty_weights, no_package, capsys):
    p = P.get("neusight", quick=True, rows=ROWS)
    f = P.folder("neusight", True, 0, None, ROWS)
    meta = json.loads((f / "meta.json").read_text())
    assert "aiconfigurator-core is not installed" in meta["info"]["tensor_core"]["missing"]
    assert set(p.nets) >= {"LINEAR", "VEC"} and not p.tc.nets
    assert "without its BF16 tensor-core networks" in capsys.readouterr().err
    fp32 = p.predict(_rows("fp32"), "H100")
    assert np.isfinite(fp32).all() and (fp32 > 0).all()
    for q in (p, P.get("neusight", quick=True, rows=ROWS)):           # as trained, and as loaded again
        with pytest.raises(PredictorInputError) as e:
            q.predict(_rows("bf16"), "H100")
        msg = str(e.value)
        assert "\n" not in msg and "aiconfigurator-core" in msg and "FP32 questions answer" in msg
        assert np.isfinite(q.predict_extrapolated(_rows("bf16"), "H100")).all()   # asked for: still answers
        assert np.allclose(q.predict(_rows("fp32"), "H100"), fp32)


def test_the_bf16_networks_are_added_once_the_package_is_back(empty_weights, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(mk, "data_root", lambda root=None: (_ for _ in ()).throw(
            mk.MeasuredDataError("aiconfigurator-core is not installed: faked")))
        before = P.get("neusight", quick=True, rows=ROWS)
    assert not before.tc.nets
    if mk.unavailable():
        pytest.skip("aiconfigurator-core is not installed here: nothing to complete the weights with")
    after = P.get("neusight", quick=True, rows=ROWS)
    assert set(after.tc.nets) == {"GEMM", "ATTN_prefill", "ATTN_decode", "GEMM_fp8"} and after.missing_networks is None
    bf16 = after.predict(_rows("bf16"), "H100")
    assert np.isfinite(bf16).all() and (bf16 > 0).all()
    # the FP32 networks are those trained without the package; the completed weights are saved
    assert np.array_equal(after.predict(_rows("fp32"), "H100"), before.predict(_rows("fp32"), "H100"))
    meta = json.loads((P.folder("neusight", True, 0, None, ROWS) / "meta.json").read_text())
    assert "missing" not in meta["info"]["tensor_core"] and "GEMM" in meta["info"]["tensor_core"]["networks"]


def test_cli_fp32_question_answers_and_bf16_is_one_line(empty_weights, no_package, capsys):
    ask = ["predict", "--model", "gpt2_large", "--device", "H100", "--batch", "1", "--seq", "128", "--quick"]
    assert cli(ask) == 0
    out, err = capsys.readouterr()
    assert "end-to-end" in out and "quick weights" in out
    assert (P.folder("neusight", True, 0) / "state.npz").is_file()
    assert cli(ask + ["--dtype", "bf16"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "aiconfigurator-core is not installed" in err[0], err
