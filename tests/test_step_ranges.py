"""The two-machine scoring (studies/step_ranges.py): a prediction between a step's two measurements is exact."""
import numpy as np
import pandas as pd
import pytest

from neusight_core import paths
from neusight_core.studies import live_modern, step_ranges


def test_error_is_zero_inside_the_range_and_relative_to_the_nearer_end_outside():
    e = step_ranges.range_error_pct([10, 8, 12, 5, 30, 10], [8, 8, 8, 10, 10, 10], [12, 12, 12, 20, 20, 10])
    assert e.tolist() == pytest.approx([0.0, 0.0, 0.0, -50.0, 50.0, 0.0])
    # with one measurement (lo == hi) it is the plain signed error
    assert step_ranges.range_error_pct([11.0], [10.0], [10.0]) == pytest.approx([10.0])


def _pred(run, rows):
    base = dict(model="m", batch=1, seq=8, attention="sdpa", predictor="roofline", seed=0)
    return pd.DataFrame([dict(base, run=run, **r) for r in rows])


def test_pairs_score_the_steps_both_runs_measured():
    """Two runs' per-run predictions of the same steps: each step is scored once against both measurements; a step
    one run lacks is left out; a pair whose run is missing gives nothing; MAPE by phase and pooled."""
    a = _pred("a", [dict(phase="decode", variant="eager", measured_ms=20.0, predicted_ms=25.0),
                    dict(phase="train", variant="eager", measured_ms=100.0, predicted_ms=60.0),
                    dict(phase="prefill", variant="eager", measured_ms=10.0, predicted_ms=9.0)])
    b = _pred("b", [dict(phase="decode", variant="eager", measured_ms=30.0, predicted_ms=25.0),
                    dict(phase="train", variant="eager", measured_ms=80.0, predicted_ms=60.0)])
    pairs = {("H100", "contiguous"): ("a", "b"), ("H200", "contiguous"): ("a", "missing")}
    r = step_ranges.range_frame(pd.concat([a, b]), pairs)
    assert len(r) == 2 and set(r["GPU"]) == {"H100"} and "prefill" not in set(r["phase"])
    got = r.set_index("phase")
    assert got.loc["decode", "error_pct"] == 0.0                    # 25 lies between 20 and 30
    assert got.loc["train", "error_pct"] == pytest.approx(-25.0)    # 60 against the nearer 80
    assert (got.loc["train", "lo"], got.loc["train", "hi"]) == (80.0, 100.0)
    m = step_ranges.range_mape(pd.concat([a, b]), pairs)
    row = m.loc[("H100", "contiguous", "roofline", "eager")]
    assert (row["mean decode"], row["mean train"], row["mean pooled"], row["steps"]) == (0.0, 25.0, 12.5, 2)
    assert step_ranges.range_mape(a, pairs).empty


def test_the_pairs_are_two_recorded_machines_of_one_gpu_kind_and_harness():
    for (gpu, harness), runs in step_ranges.PAIRS.items():
        assert len(set(runs)) == 2
        for name in runs:
            run_gpu, folder = live_modern.RECORDED[name]
            assert run_gpu == gpu and (paths.REPO_ROOT / folder / "modern_steps.csv").is_file()
            assert (name in live_modern.STRIDED_APPENDS) == (harness == "strided")
    # the same machine's repeat minutes later is not a second machine
    assert all("H100 2026-11-28 (2)" not in n for runs in step_ranges.PAIRS.values() for n in runs)


def test_the_recorded_pairs_are_scored_from_the_sections_predictions(tmp_path):
    """Notebook 05 without a GPU: its section's predictions of the recorded runs give every pair a score, and a
    prediction inside a pair's range is never worse than against either run alone."""
    s = live_modern.section(tmp_path, quick=True, predictors=("roofline",))
    r = step_ranges.range_frame(s["pred"])
    assert set(zip(r["GPU"], r["harness"])) == set(step_ranges.PAIRS)
    for (a, b) in step_ranges.PAIRS.values():
        pa = s["pred"][s["pred"]["run"] == a].set_index(live_modern.STEP_KEY + ["variant"])
        pb = s["pred"][s["pred"]["run"] == b].set_index(live_modern.STEP_KEY + ["variant"])
        both = pa.join(pb, lsuffix="_a", rsuffix="_b", how="inner")
        assert np.allclose(both["predicted_ms_a"], both["predicted_ms_b"])       # one prediction per step
        rr = r[r["runs"] == f"{a} | {b}"].set_index(live_modern.STEP_KEY + ["variant"])
        j = rr.join(both, how="inner")
        assert len(j) == len(rr) > 0
        assert (j["error_pct"].abs() <= np.minimum(j["error_pct_a"].abs(), j["error_pct_b"].abs()) + 1e-9).all()
