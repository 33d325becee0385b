"""Tier 0: the index read from the raw release files, the table builders, the comparison, notebook 01."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from neusight_core.studies import authors_tables as at
from neusight_core.studies import evaluation as ev
from neusight_core.studies import paper_tables as pt
from neusight_core import paths
from neusight_core.studies import error_metric


@pytest.fixture(scope="module")
def index(release_root):
    return ev.build_index(progress=False)


def test_index_counts_equal_label_files(index):
    files = sorted(paths.labels_dir().glob("*/*.json"))
    by_gpu_mode = Counter((f.parent.name, f.stem.split("-")[1]) for f in files)
    counts = ev.index_counts(index)
    got = {(g, m): int(counts.loc[g, m]) for g in counts.index for m in counts.columns if counts.loc[g, m]}
    assert got == dict(by_gpu_mode)
    assert len(index) == len(files) == 149
    assert not index.duplicated(ev.KEY).any()
    # every option of the release and both vendors are there
    assert set(index["option"]) == set(ev.OPTIONS)
    assert set(index["vendor"]) == {"NVIDIA", "AMD"}


def test_index_agrees_with_authors_summary_csv(index, release_root):
    """The index never reads summary.csv; cross-check its raw-file values against it."""
    s = pd.read_csv(release_root / "summary" / "summary.csv")
    s = s.rename(columns={"device": "gpu", "model_name": "model", "seqlen": "seq"})
    s["option"] = s["option"].fillna("none")
    m = index.merge(s, on=ev.KEY, how="inner")
    assert len(m) == int(index["in_authors_summary"].sum()) == len(s) == 146
    np.testing.assert_allclose(m["label_e2e_ms"], m["label_all_e2e_latency"], rtol=1e-12)
    for p, rel in ev.RELEASE_PREDICTOR_DIR.items():
        a, b = m[f"pred_{p}_ms"].to_numpy(float), m[f"{rel}_all_e2e_latency"].to_numpy(float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), p
        ok = ~np.isnan(a)
        np.testing.assert_allclose(a[ok], b[ok], rtol=1e-12)
    # per-op sums from the per-node CSVs equal the authors' where both exist
    both = m[m["has_per_op"] & m["label_BMM_e2e_latency"].notna() & (m["vendor"] == "NVIDIA")]
    assert len(both) == 70
    np.testing.assert_allclose(both["label_LINEAR_ms"], both["label_Linear_e2e_latency"], rtol=1e-9)
    np.testing.assert_allclose(both["pred_neusight_SOFTMAX_ms"], both["neusight_VECsoftmax_e2e_latency"], rtol=1e-9)


def test_ape_and_mape():
    assert error_metric.ape([100.0], [90.0])[0] == pytest.approx(10.0)
    assert error_metric.ape([50.0], [75.0])[0] == pytest.approx(50.0)
    assert error_metric.mape([100.0, 200.0, np.nan], [110.0, 100.0, 5.0]) == pytest.approx(30.0)
    a = ev.safe_ape([100.0, 0.0, np.nan, 10.0], [80.0, 1.0, 1.0, np.nan])
    assert a[0] == pytest.approx(20.0) and np.isnan(a[1:]).all()


def test_index_ape_columns(index):
    r = index.dropna(subset=["pred_habitat_ms"]).iloc[0]
    assert r["ape_habitat"] == pytest.approx(abs(r["label_e2e_ms"] - r["pred_habitat_ms"]) / r["label_e2e_ms"] * 100)


@pytest.mark.parametrize("name", ["nvidia_inf", "nvidia_train", "amd_inf", "amd_train", "fusion_inf",
                                  "distributed", "fp16mm"])
def test_rebuilt_table_equals_authors(index, name):
    tables = pt.build_tables(index, pt.load_fp16mm())
    diff = at.compare_table(name, tables[name], at.read_authors_table(name))
    expected_cells = {"nvidia_inf": 216, "nvidia_train": 104, "amd_inf": 28, "amd_train": 15,
                      "fusion_inf": 72, "distributed": 33, "fp16mm": 9}[name]
    assert len(diff) == expected_cells
    assert diff["equal"].all(), diff[~diff["equal"]].head()


def test_perop_differences_are_the_missing_switch_labels(index):
    """Table 6 differs only because the release lacks 10 per-node label CSVs; filling exactly
    those from the authors' summary.csv makes every cell equal."""
    diff = at.compare_table("perop", pt.table_perop(index), at.read_authors_table("perop"))
    assert len(diff) == 40 and (~diff["equal"]).sum() > 0
    filled = ev.fill_per_op_from_authors_summary(index)
    assert (filled["per_op_source"] == "authors_summary").sum() == 10
    assert set(filled.loc[filled["per_op_source"] == "authors_summary", "model"]) == {"switchxl4"}
    assert at.compare_table("perop", pt.table_perop(filled), at.read_authors_table("perop"))["equal"].all()
    exc = at.explain_exceptions(diff, index)
    assert len(exc) == (~diff["equal"]).sum() and exc["reason"].str.contains("ABSENT.txt").all()


def test_compare_table_detects_a_changed_cell(index):
    ours = pt.table_nvidia_inf(index)
    theirs = at.read_authors_table("nvidia_inf")
    cell = (("NVIDIA_H100_80GB_HBM3", "NeuSight"), ("BERT-Large", 8))
    ours.loc[cell] = theirs.loc[cell] + 0.2
    diff = at.compare_table("nvidia_inf", ours, theirs)
    bad = diff[~diff["equal"]]
    assert len(bad) == 1 and bad.iloc[0]["row"] == "NVIDIA_H100_80GB_HBM3 / NeuSight"
    ours.loc[cell] = theirs.loc[cell] + 0.01  # same at printed precision
    assert at.compare_table("nvidia_inf", ours, theirs)["equal"].all()


def test_with_predictions_substitutes_ours(index):
    plain = index[index["option"] == "none"]
    ours = plain[ev.KEY].assign(e2e_ms=plain["label_e2e_ms"].to_numpy() * 1.25).iloc[:-5]
    sub = ev.with_predictions(index, ours, predictor="neusight")
    t = pt.table_nvidia_inf(sub, {"neusight": "NeuSight (ours)"})
    vals = t.to_numpy(float)
    assert np.allclose(vals[~np.isnan(vals)], 25.0)
    assert sub["pred_neusight_ms"].isna().sum() > index["pred_neusight_ms"].isna().sum()
    # as an extra predictor next to the authors'
    both = ev.with_predictions(index, ours, predictor="ours")
    t2 = pt.table_nvidia_inf(both, {"neusight": "NeuSight", "ours": "NeuSight (ours)"})
    assert t2.index.get_level_values("predictor").unique().tolist() == ["NeuSight", "NeuSight (ours)"]
    with pytest.raises(ev.EvaluationError, match="lacks column"):
        ev.with_predictions(index, ours.drop(columns="batch"))


def _tiny_release(tmp_path, body: str):
    lab = tmp_path / "labels" / "NVIDIA_L4"
    lab.mkdir(parents=True)
    (lab / "bert_large-inf-512-8.json").write_text(
        json.dumps({"num_layer": 24, "e2e_latency": 10.0, "fw_latency": 10.0, "bwall_latency": 0}))
    bad = lab / "gpt2_large-inf-1024-4.json"
    bad.write_text(body)
    (tmp_path / "pred").mkdir()
    return tmp_path / "labels", bad


@pytest.mark.parametrize("body, what", [
    ('{"num_layer": 24, "e2e_latency": 1', "not valid JSON"),
    ('{"num_layer": 24, "fw_latency": 1, "bwall_latency": 0}', "missing key 'e2e_latency'"),
    ('{"num_layer": 24, "e2e_latency": "fast", "fw_latency": 1, "bwall_latency": 0}', "finite non-negative"),
    ('[1, 2]', "expected a JSON object"),
])
def test_malformed_label_json_names_the_file(tmp_path, body, what):
    labels, bad = _tiny_release(tmp_path, body)
    with pytest.raises(ev.LabelFileError) as e:
        ev.build_index(labels, tmp_path / "pred", tmp_path / "graphs", progress=False)
    msg = str(e.value)
    assert str(bad) in msg and what in msg and "\n" not in msg


def test_bad_config_name_and_tiny_index(tmp_path):
    labels, bad = _tiny_release(tmp_path, json.dumps({"num_layer": 36, "e2e_latency": 20.0,
                                                      "fw_latency": 20.0, "bwall_latency": 0}))
    idx = ev.build_index(labels, tmp_path / "pred", tmp_path / "graphs", progress=False)
    assert len(idx) == 2 and idx["pred_neusight_ms"].isna().all() and not idx["has_per_op"].any()
    bad.rename(bad.with_name("gpt2_large-inference-1024-4.json"))
    with pytest.raises(ev.LabelFileError, match="gpt2_large-inference-1024-4.json"):
        ev.build_index(labels, tmp_path / "pred", tmp_path / "graphs", progress=False)


# Notebook 01 quick is executed once, the way JupyterLab runs it, by
# tests/test_evaluator.py::test_notebook_01_runs_from_its_own_folder_with_clean_outputs, which checks its tables too.
