"""Each answer's interval (cost/error_model.py, studies/calibration.py): the composition, the calibration, the option."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import engine, error_model as em, scenario, sweep
from neusight_core.question.step import LatencyInputError

PARTS = {"network LINEAR": (0.10, 0.30), "network VEC": (0.05, 0.50)}


def _model(scores=(), **kw) -> em.ErrorModel:
    return em.ErrorModel("neusight", 0, True, shared={k: v[0] for k, v in PARTS.items()},
                         independent={k: v[1] for k, v in PARTS.items()}, scores=tuple(scores), **kw)


# ------------------------------------------------------------------------------ the composition
def test_a_shared_bias_does_not_shrink_with_more_kernels_an_independent_error_does():
    m = em.ErrorModel("x", 0, True, shared={"a": 0.2, "b": 0.0}, independent={"a": 0.0, "b": 0.4})
    for n in (1, 10, 1000):
        t = np.full(n, 1.0 / n)                    # n distinct kernels, the same total time
        shared = em.spread(m, {"a": 1.0}, {"a": float((t**2).sum())}, 1.0, 0.0).sigma
        own = em.spread(m, {"b": 1.0}, {"b": float((t**2).sum())}, 1.0, 0.0).sigma
        assert shared == pytest.approx(0.2)        # the GPU's bias: the same for one kernel or a thousand
        assert own == pytest.approx(0.4 / math.sqrt(n))
    # one kernel launched 1000 times errs 1000 times the same: (count x time)^2, not count x time^2
    assert em.spread(m, {"b": 1.0}, {"b": 1.0}, 1.0, 0.0).sigma == pytest.approx(0.4)


def test_shared_parts_add_linearly_independent_ones_in_quadrature_and_the_host_by_its_share():
    m = _model()
    sp = em.spread(m, {"network LINEAR": 3.0, "network VEC": 1.0}, {"network LINEAR": 4.0, "network VEC": 0.5},
                   4.0, 0.0)
    shared = 3 / 4 * 0.10 + 1 / 4 * 0.05
    own = math.sqrt(4.0 / 16 * 0.30**2 + 0.5 / 16 * 0.50**2)
    assert sp.sigma == pytest.approx(math.hypot(shared, own))
    assert [n for n, _ in sp.parts] == ["network LINEAR", "network VEC"]
    # eager: the step is the slower of the kernels and the host's launches, its error that one's
    host = em.spread(m, {"network LINEAR": 4.0}, {"network LINEAR": 16.0}, 4.0, 12.0)
    assert host.sigma == pytest.approx(em.HOST_SIGMA) and host.top(1).startswith("host")
    assert em.spread(m, {"network LINEAR": 4.0}, {"network LINEAR": 16.0}, 4.0, 3.0).sigma == pytest.approx(
        math.hypot(0.10, 0.30))
    # the calibration scales the kernel part, not the host's spread (measured on machines directly)
    cal = _model(scores=(-2.0, 2.0))
    assert em.spread(cal, {"network LINEAR": 4.0}, {"network LINEAR": 16.0}, 4.0, 3.0).sigma == pytest.approx(
        cal.scale * math.hypot(0.10, 0.30))
    assert em.spread(cal, {"network LINEAR": 4.0}, {"network LINEAR": 16.0}, 4.0, 12.0).sigma == pytest.approx(
        em.HOST_SIGMA)


def test_a_part_without_data_takes_its_nearest_measured_parts_largest_gpu_bias():
    m = _model(shared_outside={"network LINEAR": 0.4, "network VEC": 0.2})
    assert m.part("network LINEAR at half precision") == (0.4, 0.30)       # the same network, another precision
    assert m.part("roofline") == (0.2, 0.50)                                  # the vector classes' networks
    assert m.part("something new") == (0.4, 0.50)                            # nothing near: every measured part


def test_a_gpu_a_part_was_trained_on_gets_that_parts_own_numbers_and_one_outside_the_range_the_largest_bias():
    m = em.ErrorModel("x", 0, True, shared={"network LINEAR": 0.3, "BF16 network GEMM": 0.2},
                      independent={"network LINEAR": 0.4, "BF16 network GEMM": 0.1},
                      shared_outside={"network LINEAR": 0.9, "BF16 network GEMM": 0.5},
                      seen_shared={"network LINEAR": 0.05}, seen_independent={"network LINEAR": 0.2},
                      seen_gpus={"network LINEAR": ["Tesla_T4"]})
    assert m.part("network LINEAR", "Tesla_T4") == (0.05, 0.2)
    assert m.part("network LINEAR", "NVIDIA_L4") == (0.3, 0.4)
    assert m.part("network LINEAR", "NVIDIA_L4", outside=True) == (0.3, 0.4)     # the range is the BF16 networks'
    assert m.part("BF16 network GEMM", "NVIDIA_B200", outside=True) == (0.5, 0.1)


def test_coverage_of_a_synthetic_predictor_with_a_known_error_comes_out_at_nominal():
    """Answers whose log error is a shared GPU bias plus independent kernel errors, drawn as the model says: the
    scale calibrated on some GPUs' answers gives nominal coverage on other GPUs' answers at every level."""
    rng = np.random.default_rng(0)
    m = _model()

    def answers(n_gpus):
        z, sig = [], []
        for _ in range(n_gpus):
            g = rng.normal()                   # the GPU's bias, shared by its parts (they add linearly)
            bias = {p: g * s for p, (s, _) in PARTS.items()}
            for _ in range(20):
                n = int(rng.integers(5, 200))
                t = rng.lognormal(0, 1, n)
                part = rng.choice(list(PARTS), n)
                e = sum(t[part == p].sum() * bias[p] for p in PARTS) / t.sum()
                e += sum((t[part == p] * rng.normal(0, PARTS[p][1], (part == p).sum())).sum() for p in PARTS) / t.sum()
                sp = em.spread(m, {p: t[part == p].sum() for p in PARTS}, {p: (t[part == p] ** 2).sum() for p in PARTS},
                               t.sum(), 0.0)
                z.append(e / sp.sigma)
                sig.append(sp.sigma)
        return np.array(z), np.array(sig)

    z_cal, _ = answers(200)
    z_chk, sig = answers(200)
    cal = _model(scores=np.sort(z_cal))
    assert cal.scale == pytest.approx(1.0, abs=0.06)               # the model is right: nothing to correct
    for c in (0.5, 0.8, 0.95):
        q = cal.scale * cal.quantiles(c)[1]
        assert np.mean(np.abs(z_chk) <= q) == pytest.approx(c, abs=0.03)
    # a model that halves every part is corrected by the calibration: the same coverage, a scale of about 2
    half = em.ErrorModel("x", 0, True, shared={p: s / 2 for p, (s, _) in PARTS.items()},
                         independent={p: u / 2 for p, (_, u) in PARTS.items()}, scores=tuple(np.sort(2 * z_cal)))
    assert half.scale == pytest.approx(2 * cal.scale, rel=1e-9)
    assert np.mean(np.abs(2 * z_chk) <= half.scale * half.quantiles(0.8)[1]) == pytest.approx(0.8, abs=0.03)


def test_the_model_round_trips_through_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(em, "folder", lambda: tmp_path)
    m = _model(scores=(-1.0, 0.5, 2.0), shared_outside={"network LINEAR": 0.3}, seed_sigma=0.02, rows={"n": 3})
    f = em.save(m)
    assert f.name == "neusight-quick-seed0.json" and not list(tmp_path.glob(".*.tmp"))
    assert em.load("neusight", 0, True) == m
    assert em.load("neusight", 0, False) is None
    f.write_text("{ not json")
    assert em.load("neusight", 0, True) is None


# ------------------------------------------------------------------------------ the option
@pytest.mark.parametrize("bad", [0, 1, -1, "text", 0.995, True, "inf"])
def test_a_bad_coverage_gets_one_line_everywhere(bad):
    """(NaN, as everywhere in the API and a frame, is a value not given: the default; the CLI refuses it.)"""
    with pytest.raises(LatencyInputError, match=r"^coverage must be a number from 0.5 to 0.99, got") as e:
        scenario.scenario("gpt2_large", "H100", batch=1, seq=64, coverage=bad)
    assert "\n" not in str(e.value)
    frame = pd.DataFrame([{"model": "gpt2_large", "device": "H100", "batch": 1, "seq": 64, "coverage": bad},
                          {"model": "gpt2_large", "device": "H100", "batch": 1, "seq": 64, "coverage": 0.9}])
    out = sweep.run(frame, "roofline")
    assert "coverage must be a number from 0.5 to 0.99" in out["error"].iloc[0] and out["error"].iloc[1] == ""


@pytest.mark.parametrize("bad", ["0", "1", "nan", "-1", "text"])
def test_the_cli_refuses_a_bad_coverage_in_one_line(bad):
    r = subprocess.run([sys.executable, "-m", "neusight_core", "predict", "--model", "gpt2_large", "--device", "H100",
                        "--batch", "1", "--seq", "64", "--predictor", "roofline", "--coverage", bad],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--coverage: must be a number from 0.5 to 0.99" in r.stderr


# ------------------------------------------------------------------------------ the engine
def test_every_answer_of_a_grid_has_a_finite_interval_that_holds_it():
    g = sweep.grid(["gpt2_large", "bert_large", "llama2_7b"], ["H100", "L4", "NVIDIA_B200"], [1, 4], [128],
                   ["inf", "train"], dtype=["fp32", "bf16"], execution=["eager", "graph"], coverage=[0.5, 0.95])
    g = pd.concat([g, sweep.grid(["gpt2_large"], ["H100"], [8], [256], ["train"], parallel=["dp", "tp", "pp"],
                                 gpus=[4], micro_batches=[1])], ignore_index=True)
    out = engine.predict(_parse(g), "neusight", quick=True, memory_columns=False, error_model=_model(scores=(-1.5, -0.2, 0.3, 1.1)))
    ok = out[out["error"] == ""]
    assert len(ok) >= len(g) - 4 and len(ok) > 100
    assert np.isfinite(ok[["sigma", "lo_ms", "hi_ms"]].to_numpy(float)).all()
    assert (ok["lo_ms"] < ok["e2e_ms"]).all() and (ok["e2e_ms"] < ok["hi_ms"]).all()
    wide = ok[ok["coverage"] == 0.95].reset_index(drop=True)
    narrow = ok[ok["coverage"] == 0.5].reset_index(drop=True)
    assert ((wide["hi_ms"] / wide["e2e_ms"]).to_numpy() > (narrow["hi_ms"] / narrow["e2e_ms"]).to_numpy()).all()
    assert ok["interval_by"].str.len().gt(0).all()
    # the central estimates do not move with the interval
    plain = engine.predict(_parse(g), "neusight", quick=True, memory_columns=False)
    assert np.array_equal(plain["e2e_ms"].to_numpy(float), out["e2e_ms"].to_numpy(float), equal_nan=True)


def _parse(frame):
    from neusight_core.cost.request import parse
    return parse(frame.to_dict("records"))


def test_without_an_error_model_an_answer_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(em, "folder", lambda: tmp_path)
    from neusight_core.cost import latency
    r = latency.predict_model("gpt2_large", "H100", 1, 64, quick=True)
    assert r["interval_ms"] is None and "studies.calibration" in r["interval_note"]
    em.save(_model(scores=(-1.0, 1.0)))
    r = latency.predict_model("gpt2_large", "H100", 1, 64, quick=True, coverage=0.9)
    lo, hi = r["interval_ms"]
    assert lo < r["e2e_ms"] < hi and r["coverage"] == 0.9 and r["interval_by"]
    assert math.log(hi / r["e2e_ms"]) == pytest.approx(_model(scores=(-1.0, 1.0)).quantiles(0.9)[1] * r["sigma"])


def test_neusight_names_what_answers_each_row():
    from collections import Counter

    from neusight_core import predictors as P
    from neusight_core.cost import tables
    from neusight_core.question.step import Step
    p = P.get("neusight", quick=True)
    k = tables.trace(Step(model="llama2_7b", batch=1, seq=64, mode="inf", dtype="bf16", attention="sdpa"))
    got = Counter(p.answered_by(k))
    assert got["BF16 network GEMM"] > 0 and got["BF16 network ATTN_prefill"] > 0 and got["memory law"] > 0
    fp32 = Counter(p.answered_by(tables.trace(Step(model="gpt2_large", batch=1, seq=64, mode="inf"))))
    assert fp32["network LINEAR"] > 0 and not any("BF16" in a for a in fp32)
    assert set(P.get("roofline").answered_by(k)) == {"roofline"}


# ------------------------------------------------------------------------------ the calibration (quick folds)
@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Our recipe's quick error model, made as notebook 03 makes it, into a folder of its own."""
    from neusight_core.studies import calibration as cal
    folder = tmp_path_factory.mktemp("error_models")
    mp = pytest.MonkeyPatch()
    mp.setattr(em, "folder", lambda: folder)
    mp.setattr(cal, "KERNEL_SAMPLE", 400)
    try:
        yield cal, cal.fit("neusight", 0, quick=True, log=lambda *a: None)
    finally:
        mp.undo()


def test_the_calibration_reads_only_training_gpus_and_saves_the_model(calibrated):
    cal, m = calibrated
    training = set(cal.training_gpus())
    assert set(m.rows["calibration_gpus"]) == training and not training & set(cal.UNSEEN)
    assert m.rows["calibration_steps"] >= 40 and len(m.scores) == m.rows["calibration_steps"]
    assert 0 < m.scale < 10 and 0 <= m.seed_sigma < 1
    parts = {r["part"]: r for r in m.rows["parts"]}
    assert set(parts["network LINEAR"]["bias_per_gpu"]) == training          # every training GPU left out once
    assert set(m.seen_gpus["network LINEAR"]) == training
    assert m.shared["network LINEAR"] > 0 and m.independent["network VEC"] > 0
    if "BF16 network GEMM" in parts:                                           # with NVIDIA's measured kernels
        assert not set(parts["BF16 network GEMM"]["bias_per_gpu"]) & {"NVIDIA_B200", "NVIDIA_GB200"}
    assert em.load("neusight", 0, True) == m
    assert cal.ensure("neusight", 0, quick=True) == m                          # newer than the weights: kept


def test_a_model_made_by_another_version_of_the_method_is_made_again(calibrated, monkeypatch):
    cal, m = calibrated
    monkeypatch.setattr(cal, "METHOD_VERSION", m.rows["version"] + 1)
    again = cal.ensure("neusight", 0, quick=True, log=lambda *a: None)
    assert again.rows["version"] == m.rows["version"] + 1 and em.load("neusight", 0, True) == again
    assert again.scale == pytest.approx(m.scale) and again.shared == m.shared      # the same data: the same numbers


def test_the_check_scores_every_set_and_its_coverage_grows_with_the_nominal(calibrated):
    cal, m = calibrated
    pts = cal.check("neusight", 0, quick=True, model=m, kernel_sample=50)
    sets = set(pts["set"])
    assert {"unseen GPUs (release labels)", "multi-GPU (release labels)"} <= sets
    assert any(s.startswith("recorded H100") for s in sets)
    t = cal.coverage_table(pts, m)
    assert (t["points"] > 0).all() and t[["covered at 50%", "covered at 80%", "covered at 95%"]].notna().all().all()
    # each point's shared spread is a part of its spread; an eager host-bound step's is all of it (one machine's host)
    assert pts["gpu"].notna().all() and (pts["sigma_shared"] <= pts["sigma"] + 1e-12).all()
    assert (pts["sigma_shared"] > 0).all() and (pts["sigma_shared"] < pts["sigma"] - 1e-9).any()
    assert (t["GPUs"] >= 1).all() and (t[cal.CALIBRATED_FROM] <= t[cal.CALIBRATED_TO]).all()
    rel = cal.reliability(pts, m)
    for _, g in rel.groupby("set"):
        assert g["observed"].is_monotonic_increasing        # nested intervals: never fewer points covered
    tg = cal.targets(t)
    assert tg["met"].dtype == bool and tg["target"].str.contains("80 % interval covers").any()


def _synthetic_points(n_gpus: int, per_gpu: int, shared: float, seed: int = 0) -> pd.DataFrame:
    """Points of a calibrated predictor: each GPU's points share one normal draw (spread ``shared``), each adds its own
    (the rest of a unit spread)."""
    rng = np.random.default_rng(seed)
    gpu = np.repeat(np.arange(n_gpus), per_gpu)
    err = shared * rng.standard_normal(n_gpus)[gpu] + np.sqrt(1 - shared**2) * rng.standard_normal(len(gpu))
    y = 10.0 * np.exp(err)
    return pd.DataFrame({"set": "s", "measured_lo": y, "measured_hi": y, "estimate": 10.0, "sigma": 1.0,
                         "widest": "x", "gpu": gpu.astype(str), "sigma_shared": shared})


def test_a_calibrated_model_covers_nominal_on_independent_points_and_wanders_on_few_gpus():
    from neusight_core.studies import calibration as cal
    lo, hi = cal.calibrated_range(_synthetic_points(20, 150, 0.0))
    assert 76 < lo < 80 < hi < 84                       # 3,000 independent points: near nominal
    lo3, hi3 = cal.calibrated_range(_synthetic_points(3, 1000, 0.95))
    assert lo3 < 50 and hi3 > 98                        # three GPUs' biases: all three inside happens often
    # the check set's own points land inside the range a calibrated model gives them
    pts = _synthetic_points(20, 150, 0.0, seed=3)
    m = em.ErrorModel("neusight", 0, True, shared={}, independent={})
    t = cal.coverage_table(pts, m)
    c = cal.consistency(t)
    assert int(t["GPUs"].iloc[0]) == 20 and bool(c["inside"].iloc[0])
    # a predictor whose errors are twice its stated spread falls outside it
    doubled = 10.0 * (pts["measured_lo"] / 10.0) ** 2
    wide = pts.assign(measured_lo=doubled, measured_hi=doubled)
    assert not bool(cal.consistency(cal.coverage_table(wide, m))["inside"].iloc[0])
