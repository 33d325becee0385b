"""engine.predict: one tidy row per scenario x predictor x seed, errors recorded per row, and the same numbers
as latency.predict_model (quick predictors from artifacts/trained)."""
from __future__ import annotations

import pytest

from neusight_core.cost import engine, latency
from neusight_core import predictors
from neusight_core.cost import request, scenario

SCENARIOS = [
    scenario.scenario("gpt2_large", "H100", 2, 128, "inf", **scenario.PAPER),
    *request.parse([
        dict(model="bert_large", device="L4", batch=4, seq=128, mode="train", dtype="bf16", **scenario.PAPER),
        dict(model="gpt2_large", device="H100", batch=4, seq=64, mode="train", parallel="tp", gpus=2, **scenario.PAPER)]),
]


def test_one_row_per_scenario_predictor_seed_with_the_documented_columns():
    out = engine.predict(SCENARIOS, ["neusight", "roofline"], seeds=(0, 1), quick=True)
    assert list(out.columns) == engine.RESULT_COLUMNS
    # neusight x 2 seeds, roofline x 2 seeds (the seed picks its weights), 3 scenarios each, predictor-major
    assert len(out) == 4 * len(SCENARIOS)
    assert out.groupby(["predictor", "seed"]).size().to_dict() == {("neusight", 0): 3, ("neusight", 1): 3,
                                                                  ("roofline", 0): 3, ("roofline", 1): 3}
    assert (out["error"] == "").all(), out["error"].tolist()
    assert out["e2e_ms"].gt(0).all()
    # the per-class columns add up to the end-to-end time of a single-GPU scenario
    one = out[(out["parallel"] == "") & (out["predictor"] == "neusight")]
    assert one[engine.CLASS_MS].sum(axis=1).to_numpy() == pytest.approx(one["e2e_ms"].to_numpy(), rel=1e-9)
    # two seeds are two networks: not the same numbers
    ns = out[out["predictor"] == "neusight"]
    assert (ns[ns.seed == 0]["e2e_ms"].to_numpy() != ns[ns.seed == 1]["e2e_ms"].to_numpy()).all()
    # memory columns of every traced table, with a verdict
    assert out["memory_total_gib"].gt(0).all() and set(out["memory_verdict"]) == {"fits"}
    tp = out[out["parallel"] == "tp"]
    assert tp["comm_ms"].gt(0).all() and tp["gpus"].eq(2).all()


def test_an_invalid_scenario_gets_its_one_line_error_and_the_others_are_computed():
    bad = [dict(model="gpt2_large", device="H100", batch=0, seq=128),
           dict(model="gpt2_large", device="NoSuchGPU", batch=2, seq=128),
           dict(model="gpt2_large", device="H100", batch=2, seq=128, gpus=2),   # GPUs without a plan
           dict(model="gpt2_large", device="H100", batch=2, seq=128, colour="red")]
    out = engine.predict(SCENARIOS[:1] + request.parse(bad), ["roofline"], quick=True)
    assert len(out) == 5
    assert out["error"].iloc[0] == "" and out["e2e_ms"].iloc[0] > 0
    errs = out["error"].iloc[1:].tolist()
    assert all(e and "\n" not in e for e in errs), errs
    assert "batch" in errs[0] and "NoSuchGPU" in errs[1] and "parallel plan" in errs[2] and "colour" in errs[3]
    assert out["e2e_ms"].iloc[1:].isna().all() and out["memory_total_gib"].iloc[1:].isna().all()


def test_engine_equals_predict_model_and_takes_predictor_objects():
    obj = predictors.get("neusight", quick=True, seed=1)
    kw = dict(model="gpt2_large", device="H100", batch=4, seq=64, mode="train", parallel="pp", gpus=2,
              micro_batches=2)
    ref = latency.predict_model(predictor=obj, quick=True, **kw)
    out = engine.predict(request.parse([kw]), [("ours s1", obj)], quick=True)
    row = out.iloc[0]
    assert row["predictor"] == "ours s1" and row["seed"] == 1 and row["error"] == ""
    for c in engine.PHASE_COLUMNS:
        assert row[c] == pytest.approx(ref[c], rel=1e-9, abs=1e-12), c
    assert row["memory_total_gib"] == pytest.approx(ref["memory"]["total_gib"], rel=1e-12)
    # the kernel table predict_model returns sums to its own phases
    assert ref["kernels"]["pred_ms"].sum() == pytest.approx(ref["fw_ms"] + ref["bw_ms"] + ref["acc_ms"]
                                                            + ref["comm_ms"], rel=1e-9)


def test_the_engine_takes_scenarios_and_dicts_go_through_the_adapter():
    """Issue 35: a typed request. The engine refuses a dict in one line (``request.parse`` is the adapter); what
    the adapter makes of a dict is predicted as the Scenario built by hand."""
    kw = dict(model="gpt2_large", device="H100", batch=2, seq=128, mode="inf", **scenario.PAPER)
    with pytest.raises(TypeError, match=r"takes Scenarios .*request.parse\(dicts\).*not a dict"):
        engine.predict([SCENARIOS[0], kw], "roofline")
    parsed = request.parse([kw, dict(kw, batch="two"), 7])
    assert parsed[0] == SCENARIOS[0] and isinstance(parsed[1], request.Rejected) and "batch" in parsed[1].error
    assert "not a int" in parsed[2].error
    out = engine.predict(parsed, "roofline", quick=True)
    assert out["e2e_ms"].iloc[0] == engine.predict(SCENARIOS[:1], "roofline", quick=True)["e2e_ms"].iloc[0]
    assert out["error"].iloc[0] == "" and out["batch"].iloc[1] == "two" and out["error"].iloc[1].startswith("SweepInputError")


def test_keep_kernels_gives_each_row_its_kernel_table():
    out = engine.predict(SCENARIOS[:2], ["roofline"], quick=True, keep_kernels=True)
    run = engine.run_info(out)
    assert len(run.kernels) == len(run.memory) == 2 and run.tables == 2 and run.total_s >= run.predict_s > 0
    assert engine.run_info(out[out["e2e_ms"] > 0]) is run        # pandas' copies share it, kernel tables and all
    for i, k in enumerate(run.kernels):
        assert k["pred_ms"].sum() == pytest.approx(out["e2e_ms"].iloc[i], rel=1e-9)
        assert k["count"].sum() == out["kernels"].iloc[i]


def test_one_predictor_object_or_pair_is_one_predictor():
    roof = predictors.get("roofline", quick=True)
    by_name = engine.predict(SCENARIOS[:1], "roofline", quick=True)
    for arg, label in ((roof, "roofline"), (("rf", roof), "rf")):
        out = engine.predict(SCENARIOS[:1], arg, quick=True)
        assert len(out) == 1 and out["predictor"].iloc[0] == label and out["error"].iloc[0] == ""
        assert out["e2e_ms"].iloc[0] == by_name["e2e_ms"].iloc[0]


def test_jobs_are_typed_predictor_seed_pairs():
    """Issue 35: the engine runs a list of jobs (predictor, seed, trained object or None) built from what a caller
    gives: names once per seed, an object or a (label, object) pair once with its own seed."""
    class Trained:
        name, seed = "mine", 7

        def predict(self, kernels, device):
            raise AssertionError("not called here")
    obj = Trained()
    assert request.jobs("roofline", 2) == [request.Job("roofline", 2)]
    assert request.jobs(["neusight", "li"], (0, 1)) == [("neusight", 0, None), ("neusight", 1, None),
                                                      ("li", 0, None), ("li", 1, None)]
    assert request.jobs(obj, (0, 1)) == [request.Job("mine", 7, obj)]
    assert request.jobs([("variant A", obj), "roofline"], [3]) == [("variant A", 7, obj), ("roofline", 3, None)]
