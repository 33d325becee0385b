"""The claims register computed from a small hand-made index (no release needed)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from neusight_core.data import devices
from neusight_core.studies import claims as cl
from neusight_core.studies import evaluation as ev

H100, A100X4, V100 = "NVIDIA_H100_80GB_HBM3", "NVIDIA_A100-SXM4-40GB", "Tesla_V100-PCIE-32GB"


def _row(gpu, model, mode, seq, batch, option="none", label=100.0, **apes):
    """One index row whose predictions have the given signed APEs (pred = label x (1 + ape/100))."""
    r = {"gpu": gpu, "gpu_short": devices.short_name(gpu), "vendor": "NVIDIA", "model": model, "mode": mode,
         "seq": seq, "batch": batch, "option": option, "label_e2e_ms": label}
    for p in ev.RELEASE_PREDICTORS:
        r[f"pred_{p}_ms"] = label * (1 + apes[p] / 100) if p in apes else np.nan
    return r


@pytest.fixture
def fixture_index():
    rows = [
        # C1: the six H100 GPT3 cells. Habitat mean 121.4, Li et al. 30.8, NeuSight 2.3.
        _row(H100, "gpt3_xl", "inf", 2048, 2, habitat=100.0, li=30.8, neusight=2.0),
        _row(H100, "gpt3_xl", "inf", 2048, 8, habitat=-50.0, li=-30.8, neusight=-2.6),
        _row(H100, "gpt3_xl", "train", 2048, 1, habitat=200.0, li=30.8, neusight=2.3),
        _row(H100, "gpt3_27", "inf", 2048, 2, habitat=128.4, li=30.8, neusight=2.3),
        _row(H100, "gpt3_27", "inf", 2048, 8, habitat=-50.0, li=30.8, neusight=2.3),
        _row(H100, "gpt3_27", "train", 2048, 1, habitat=200.0, li=30.8, neusight=2.3),
        # C12 / C10: A100x4 GPT2-Large b4 DP 12.87, TP 8.40, PP 10.26 (A100 mean 10.51).
        _row(A100X4, "gpt2_large", "train", 1024, 4, "dp4", neusight=12.87),
        _row(A100X4, "gpt2_large", "train", 1024, 4, "tp4", neusight=-8.40),
        _row(A100X4, "gpt2_large", "train", 1024, 4, "pp4_1", neusight=10.26),
        # H100x4: one cell of 20 % -> H100 mean 20, all four cells 12.88.
        _row(H100, "gpt2_large", "train", 1024, 4, "dp4", neusight=20.0),
        # C13: V100 inference mean 5.87 over two Fig. 7 cells, but a training mean far off.
        _row(V100, "bert_large", "inf", 512, 8, neusight=5.0),
        _row(V100, "bert_large", "inf", 512, 16, neusight=6.74),
        _row(V100, "bert_large", "train", 512, 2, neusight=30.0),
    ]
    return pd.DataFrame(rows)


def _get(detail, claim, quantity, aggregation=None):
    d = detail[(detail["claim"] == claim) & (detail["quantity"] == quantity)]
    if aggregation:
        d = d[d["aggregation"] == aggregation]
    else:
        d = d[d["primary"]]
    assert len(d) == 1
    return d.iloc[0]


def test_claims_file_has_every_claim_of_spec():
    reg = cl.load_claims()
    assert [c["id"] for c in reg["claims"]] == [f"C{i}" for i in range(1, 19)]
    assert reg["tolerance"] == "printed"
    for c in reg["claims"]:
        assert c["expected"] and all(isinstance(v, (int, float)) for v in c["expected"].values())
        assert c["text"] and c["source"] and c["how"]
    by_id = {c["id"]: c for c in reg["claims"]}
    assert len(by_id["C13"]["aggregations"]) >= 3 and len(by_id["C14"]["aggregations"]) >= 3


def test_c1_reproduced_from_fixture(fixture_index):
    summary, detail = cl.compute_claims(fixture_index)
    for q, exp in [("Habitat", 121.4), ("Li et al.", 30.8), ("NeuSight", 2.3)]:
        r = _get(detail, "C1", q)
        assert r["n_cells"] == 6 and r["computed"] == pytest.approx(exp, abs=1e-9)
        assert r["verdict"] == "REPRODUCED"
    assert summary.set_index("claim").loc["C1", "verdict"] == "REPRODUCED"


def test_c12_reproduced_and_c10_deviates(fixture_index):
    summary, detail = cl.compute_claims(fixture_index)
    for q, exp in [("DP", 12.87), ("TP", 8.40), ("PP", 10.26)]:
        assert _get(detail, "C12", q)["computed"] == pytest.approx(exp)
    assert summary.set_index("claim").loc["C12", "verdict"] == "REPRODUCED"
    a100 = _get(detail, "C10", "A100x4")
    assert a100["computed"] == pytest.approx((12.87 + 8.40 + 10.26) / 3) and a100["verdict"] == "REPRODUCED"
    h100 = _get(detail, "C10", "H100x4")
    assert h100["verdict"] == "DEVIATES" and h100["difference"] == pytest.approx(20.0 - 6.7)
    s = summary.set_index("claim").loc["C10"]
    assert s["verdict"] == "DEVIATES" and "H100x4 +13.30" in s["note"]


def test_c13_mixes_reproduced_deviates_and_not_computable(fixture_index):
    summary, detail = cl.compute_claims(fixture_index)
    v_inf = _get(detail, "C13", "V100 inf")
    assert v_inf["computed"] == pytest.approx(5.87) and v_inf["verdict"] == "REPRODUCED"
    v_train = _get(detail, "C13", "V100 train")
    assert v_train["verdict"] == "DEVIATES" and v_train["difference"] == pytest.approx(30.0 - 8.91)
    sxm = _get(detail, "C13", "A100-SXM inf")
    assert sxm["verdict"] == "NOT COMPUTABLE" and "no labelled cell" in sxm["reason"] and np.isnan(sxm["computed"])
    # every aggregation is reported, and the claim deviates
    assert detail[detail["claim"] == "C13"]["aggregation"].nunique() >= 3
    assert summary.set_index("claim").loc["C13", "verdict"] == "DEVIATES"


def test_not_computable_without_inputs(fixture_index):
    summary, detail = cl.compute_claims(fixture_index)
    s = summary.set_index("claim")
    # C9 needs the FP16 frame; C6 needs per-op columns; C8 has no AMD rows in the fixture
    assert s.loc["C9", "verdict"] == "NOT COMPUTABLE" and "FP16" in s.loc["C9", "note"]
    assert s.loc["C6", "verdict"] == "NOT COMPUTABLE" and "lacks column" in s.loc["C6", "note"]
    assert s.loc["C8", "verdict"] == "NOT COMPUTABLE"
    fp16 = pd.DataFrame({"B": [1, 2], "M": [8, 8], "N": [8, 8], "K": [8, 8], "label_ms": [1.0, 1.0],
                         "pred_ms": [1.10, 0.84]})
    s2, _ = cl.compute_claims(fixture_index, fp16=fp16)
    assert s2.set_index("claim").loc["C9", "verdict"] == "REPRODUCED"  # (10 + 16) / 2 = 13


def test_missing_prediction_is_not_computable_but_shows_value(fixture_index):
    idx = fixture_index.copy()
    idx.loc[0, "pred_habitat_ms"] = np.nan
    _, detail = cl.compute_claims(idx)
    r = _get(detail, "C1", "Habitat")
    assert r["verdict"] == "NOT COMPUTABLE" and "1 of 6 cells" in r["reason"]
    assert r["n_cells"] == 5 and np.isfinite(r["computed"])


def test_our_predictions_via_predictor_columns(fixture_index):
    idx = fixture_index.copy()
    idx["pred_ours_ms"] = idx["label_e2e_ms"] * 1.5  # 50 % everywhere
    _, detail = cl.compute_claims(idx, predictor_columns={"neusight": "ours"})
    r = _get(detail, "C1", "NeuSight")
    assert r["computed"] == pytest.approx(50.0) and r["verdict"] == "DEVIATES"
    assert _get(detail, "C1", "Habitat")["verdict"] == "REPRODUCED"  # other predictors untouched
    # the same through evaluation.with_predictions
    ours = idx[ev.KEY].assign(e2e_ms=idx["label_e2e_ms"] * 1.5)
    _, d2 = cl.compute_claims(ev.with_predictions(idx, ours))
    assert _get(d2, "C1", "NeuSight")["computed"] == pytest.approx(50.0)


def test_alternative_aggregation_can_reproduce(tmp_path, fixture_index):
    reg = {"tolerance": 0.1, "claims": [{
        "id": "X1", "text": "t", "source": "s", "how": "h", "expected": {"v": 5.87},
        "aggregations": [
            {"name": "train", "cells": ["fig8"], "where": {"gpu": ["V100"]}, "stat": "mean",
             "predictor": "neusight", "quantities": {"v": {}}},
            {"name": "inf", "cells": ["fig7"], "where": {"gpu": ["V100"]}, "stat": "mean",
             "predictor": "neusight", "quantities": {"v": {}}}]}]}
    summary, _ = cl.compute_claims(fixture_index, claims=reg)
    s = summary.iloc[0]
    assert s["verdict"] == "REPRODUCED" and s["aggregation"] == "inf" and "alternative" in s["note"]


def test_malformed_claims_file(tmp_path):
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": [{"id": "X", "text": "t", "source": "s", "how": "h",
                                             "expected": {"a": 1.0}, "aggregations": [
                                                 {"name": "n", "cells": ["fig7"], "quantities": {"b": "neusight"}}]}]}))
    with pytest.raises(cl.ClaimsError, match="claim X"):
        cl.load_claims(p)
    p.write_text("claims: [")
    with pytest.raises(cl.ClaimsError, match="cannot read"):
        cl.load_claims(p)


def test_verdict_counts_and_markdown(fixture_index):
    summary, _ = cl.compute_claims(fixture_index)
    counts = cl.verdict_counts(summary)
    assert sum(counts.values()) == 18 and set(counts) == set(cl.VERDICTS)
    md = cl.claims_markdown(summary)
    assert md.count("\n") == 19 and "| C1 " in md
    assert "| grade " in md and "| note " in md


@pytest.mark.parametrize("written, tol", [("9.7", 0.05), ("12.87", 0.005), ("8.40", 0.005), ("13", 0.5),
                                          ("140", 0.5), ("121.4", 0.05)])
def test_tolerance_follows_printed_precision(written, tol):
    v = yaml.load(f"x: {written}", Loader=cl._Loader)["x"]
    assert cl.printed_tolerance(v) == pytest.approx(tol)
    assert v.text == written


def test_registry_keeps_printed_digits():
    by_id = {c["id"]: c for c in cl.load_claims()["claims"]}
    assert cl.printed_tolerance(by_id["C12"]["expected"]["TP"]) == pytest.approx(0.005)  # written 8.40
    assert cl.printed_tolerance(by_id["C9"]["expected"]["FP16 BMM"]) == pytest.approx(0.5)  # "about 13"
    assert cl.printed_tolerance(by_id["C2"]["expected"]["NeuSight"]) == pytest.approx(0.05)


@pytest.mark.parametrize("expected, computed, g", [
    (9.7, 9.74, "within tolerance"), (9.7, 9.76, "within 10 %"), (15.7, 14.0, "within 2x"),
    (15.7, 7.9, "within 2x"), (15.7, 7.8, "worse"), (2.3, 50.0, "worse"), (2.3, float("nan"), "")])
def test_graded_verdict(expected, computed, g):
    assert cl.grade(expected, computed, 0.05) == g


def test_tolerance_at_printed_precision_changes_verdict(fixture_index):
    # V100 inference mean is 5.87 exactly; a claim printed 5.9 is reproduced (0.05), one printed 5.80 is not
    def reg(expected):
        return {"claims": [{"id": "X", "text": "t", "source": "s", "how": "h", "expected": {"v": expected},
                            "aggregations": [{"name": "inf", "cells": ["fig7"], "where": {"gpu": ["V100"]},
                                              "stat": "mean", "predictor": "neusight", "quantities": {"v": {}}}]}]}
    assert cl.compute_claims(fixture_index, claims=reg(5.9))[0].iloc[0]["verdict"] == "REPRODUCED"
    s = cl.compute_claims(fixture_index, claims=reg(5.8))[0].iloc[0]
    assert s["verdict"] == "DEVIATES" and s["grade"] == "within 10 %"


def test_third_party_claims_registered(fixture_index):
    summary, _ = cl.compute_claims(fixture_index)
    s = summary.set_index("claim")
    assert s.loc["C16", "verdict"] == "NOT COMPUTABLE" and "CNN" in s.loc["C16", "note"]
    assert s.loc["C18", "verdict"] == "NOT COMPUTABLE" and "live H100" in s.loc["C18", "note"]
    assert s.loc["C15", "verdict"] == "REPRODUCED"  # 2.3 on the six H100 GPT3 cells of the fixture
    assert "ResNet-50" in s.loc["C16", "text"] and "97.7" in s.loc["C15", "text"]
    for note in summary["note"]:  # readable without this repository's history
        assert "SPEC" not in note and "the issue" not in note


def test_alternative_aggregation_is_named_in_the_note(fixture_index):
    s = cl.compute_claims(fixture_index)[0].set_index("claim")
    for cid, r in s.iterrows():
        if r["verdict"] == "REPRODUCED" and "alternative" in r["note"]:
            assert "primary aggregation" in r["note"]


def test_agreement_ranking_and_verdict_block(fixture_index):
    idx = fixture_index.copy()
    for p in ("roofline", "habitat", "li"):
        idx[f"pred_{p}_ms"] = idx["label_e2e_ms"] * 1.3
    idx["pred_ours_ms"] = idx["label_e2e_ms"] * 2.5  # worse than every baseline
    a = cl.agreement(idx, ["neusight", "roofline"]).set_index("predictor")
    assert a.loc["roofline", "MAPE (%)"] == pytest.approx(30.0)
    assert {"Pearson r", "Spearman rho"} <= set(a.columns)
    assert cl.ranking(idx, "neusight")["holds"] is True
    assert cl.ranking(idx, "ours")["holds"] is False
    block = cl.verdict_block(idx, ["neusight", "ours", "roofline"], tier=1)
    assert set(block["claims"]) == {"neusight", "ours"} and block["tier"] == 1
    assert sum(v for k, v in block["claims"]["ours"].items() if k != "graded") == 18
    assert block["ranking"]["ours"]["holds"] is False
    assert set(block["correlation"]["ours"]) == {"n", "mape", "pearson", "spearman"}


def test_neusights_own_numbers_are_judged_apart_from_the_baselines(fixture_index):
    """C1 names Habitat, Li et al. and NeuSight: NeuSight's number reproducing while a baseline's misses gives
    NeuSight REPRODUCED and the baselines DEVIATES (the whole claim stays DEVIATES)."""
    idx = fixture_index.copy()
    idx.loc[idx.gpu == H100, "pred_li_ms"] = idx["label_e2e_ms"] * 1.9     # Li et al. 90 % instead of 30.8
    summary, _ = cl.compute_claims(idx)
    c1 = summary.set_index("claim").loc["C1"]
    assert (c1["verdict"], c1["verdict (NeuSight)"], c1["verdict (baselines)"]) == ("DEVIATES", "REPRODUCED", "DEVIATES")
    assert c1["grade (NeuSight)"] == "within tolerance" and "Li et al." in c1["note"]
    c8 = summary.set_index("claim").loc["C8"]      # NeuSight only: no baseline side, and why ours misses AMD
    assert c8["verdict (baselines)"] == "" and "MI100 + MI210" in c8["note"]
    block = cl.verdict_block(idx, ["neusight"], tier=0)
    assert block["claims_neusight"]["neusight"]["REPRODUCED"] > block["claims"]["neusight"]["REPRODUCED"]
    assert block["claims_baselines"]["neusight"]["DEVIATES"] >= 1
    c1_entry = next(c for c in block["claim_list"]["neusight"] if c["claim"] == "C1")
    assert (c1_entry["neusight"], c1_entry["baselines"]) == ("REPRODUCED", "DEVIATES") and "Li et al." in c1_entry["why"]
