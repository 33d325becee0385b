"""Issue 35 item 4: notebook 07's tree baselines are registered predictors (``tree-shape``, ``tree-structural``):
their weights are plain arrays (no pickle), a saved tree predicts what scikit-learn's model predicted, to the bit,
and they answer through the same API as every predictor."""
from __future__ import annotations

import numpy as np
import pytest

from neusight_core.cost import latency
from neusight_core.predictors import registry
from neusight_core.predictors import training, trees


@pytest.mark.parametrize("settings", [trees.TREE, trees.SPEC_TREE], ids=["shape", "structural"])
def test_a_tree_as_arrays_predicts_what_sklearn_predicts(settings):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(800, 5))
    X[rng.random(X.shape) < 0.05] = np.nan              # missing values take the split's side for them
    y = np.sin(np.nan_to_num(X[:, 0])) + np.nan_to_num(X[:, 1]) ** 2 + 0.1 * rng.normal(size=800)
    model = trees.regressor({**settings, "max_iter": 40}, seed=0).fit(X, y)
    Xt = rng.normal(size=(300, 5))
    Xt[rng.random(Xt.shape) < 0.05] = np.nan
    a = trees.tree_arrays(model)
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in a.values())
    assert np.array_equal(trees.predict_arrays(a, Xt), model.predict(Xt))


def test_the_tree_baselines_are_registered_and_answer_like_any_predictor(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path))
    assert {"tree-shape", "tree-structural"} <= set(registry.names())
    assert not {"tree-shape", "tree-structural"} & set(registry.reported())      # not in the Tier 1 tables
    p = training.get("tree-structural", quick=True, seed=0)
    assert p.name == "tree-structural" and p.config["tree"] == "structural"
    assert set(p.tree.models) >= {"GEMM"}
    back = training.load("tree-structural", training.folder("tree-structural", True, 0))
    args = dict(dtype="bf16", quick=True)
    r1 = latency.predict_model("llama2_7b", "H100", 1, 512, predictor=p, **args)
    r2 = latency.predict_model("llama2_7b", "H100", 1, 512, predictor=back, **args)
    assert r1["e2e_ms"] == r2["e2e_ms"] > 0
    # its BF16 GEMM rows are the tree's, not the roofline's; an FP32 table is all roofline
    roof = latency.predict_model("llama2_7b", "H100", 1, 512, predictor="roofline", **args)
    assert r1["kernel_ms"] != pytest.approx(roof["kernel_ms"], rel=1e-6)
    fp32 = dict(quick=True)
    assert (latency.predict_model("gpt2_large", "H100", 1, 128, predictor=p, **fp32)["kernel_ms"]
            == pytest.approx(latency.predict_model("gpt2_large", "H100", 1, 128, predictor="roofline",
                                                   **fp32)["kernel_ms"], rel=1e-12))
    with pytest.raises(ValueError, match="tree must be one of shape, structural, got 'forest'"):
        registry.create("tree-shape", 0, {"tree": "forest"}).fit(None, quick=True)
