"""Serving answers (cost/serving.py): the paged KV cache of its decode steps, the steady-state formulas on
hand-computed cases, the fit of the constants, the KV-cache capacity, bad input, and the measured runs' split."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import serving
from neusight_core.cost.serving import EngineConstants
from neusight_core.question.serving import ServeQuestion
from neusight_core.question.step import LatencyInputError, Step


def _q(**kw):
    base = dict(model="llama3_8b", device="NVIDIA_H100_80GB_HBM3", tp=1, dtype="bf16", engine="vllm", isl=1024,
                osl=128, concurrency=8)
    base.update(kw)
    return ServeQuestion(**base)


# ------------------------------------------------------------------------------ the paged cache
def test_a_paged_cache_writes_only_the_new_tokens():
    from neusight_core.cost import tables
    kw = dict(model="llama3_2_1b", batch=4, seq=1, past=512, dtype="bf16", attention="sdpa")
    append, paged = tables.trace(Step(**kw)), tables.trace(Step(**kw, kv_cache="paged"))
    assert len(append) == len(paged)
    from neusight_core.tracing.trace import PAGED_WRITE
    writes = paged[paged["aten_op"] == PAGED_WRITE]
    layers = 16                                                    # Llama-3.2-1B: a K and a V write per layer
    assert len(writes) == 2 * layers
    # 4 sequences x 8 KV heads x 64 dims x 2 bytes, one new token: not the 513 tokens the append copies
    assert set(writes["bytes_written"]) == {4 * 8 * 64 * 2.0} and set(writes["bytes_read"]) == {4 * 8 * 64 * 2.0}
    moved = (append["bytes_read"] + append["bytes_written"]).sum() - (paged["bytes_read"] + paged["bytes_written"]).sum()
    assert moved == pytest.approx(2 * layers * 2 * 4 * 8 * 64 * 2 * 512, rel=1e-9)   # the copies of the old cache
    # without a cache the kind of cache changes nothing: one table
    assert Step.of(dict(model="m", batch=1, mode="inf", fusion=False, parallel=None, gpus=1, micro_batches=1, past=0,
                        dtype="bf16", attention="sdpa", grads="fresh", kv_cache="paged", seq=8)).kv_cache == "append"


# ------------------------------------------------------------------------------ the formulas
def test_the_steady_state_formulas_on_a_hand_computed_case():
    c = EngineConstants(step_scale=1.0, prefill_share=1.0, ttft_base=2.0, ttft_per_request=0.5)
    a = serving.answer(_q(concurrency=4, osl=11, tp=2), t_dec=2.0, t_pre=10.0, c=c)
    assert a["tpot_ms"] == pytest.approx(2.0 + 4 * 10.0 / 10)           # 6 ms: the step and its share of prefills
    # the step's all-reduces (0.5 of its 2 ms) at half NCCL's cost: 0.25 ms less
    half = EngineConstants(step_scale=1.0, prefill_share=1.0, ttft_base=2.0, ttft_per_request=0.5, comm_scale=0.5)
    assert serving.answer(_q(concurrency=4, osl=11, tp=2), 2.0, 10.0, half, comm_dec=0.5)["tpot_ms"] == pytest.approx(5.75)
    assert a["ttft_ms"] == pytest.approx(10.0 * (2.0 + 0.5 * 3))        # 35 ms
    assert a["e2e_ms"] == pytest.approx(35.0 + 10 * 6.0)                # 95 ms
    assert a["tokens_per_s"] == pytest.approx(1e3 * 4 * 11 / 95)
    assert a["tokens_per_s_per_gpu"] == pytest.approx(a["tokens_per_s"] / 2)
    assert a["requests_per_s"] == pytest.approx(1e3 * 4 / 95)


def test_the_intervals_are_the_normal_quantile_of_the_spread():
    c = EngineConstants(1.0, 1.0, 2.0, 0.5, tpot_sigma=0.1, ttft_sigma=0.5)
    a = serving.answer(_q(concurrency=4, osl=11, coverage=0.8), t_dec=2.0, t_pre=10.0, c=c)
    z = 1.2815515655446004                                  # the normal's 90 % quantile: 80 % between the bounds
    assert a["tpot_lo_ms"] == pytest.approx(6.0 * np.exp(-z * 0.1)) and a["tpot_hi_ms"] == pytest.approx(6.0 * np.exp(z * 0.1))
    assert a["ttft_hi_ms"] / a["ttft_ms"] == pytest.approx(np.exp(z * 0.5))
    wider = serving.answer(_q(concurrency=4, osl=11, coverage=0.95), t_dec=2.0, t_pre=10.0, c=c)
    assert wider["tpot_hi_ms"] > a["tpot_hi_ms"] and wider["tpot_lo_ms"] < a["tpot_lo_ms"]


def test_the_fit_recovers_constants_that_made_the_rows():
    from neusight_core.studies import serving_eval
    true = EngineConstants(step_scale=0.9, prefill_share=0.7, ttft_base=3.0, ttft_per_request=0.2, comm_scale=0.4)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        q = _q(concurrency=int(rng.choice([4, 8, 16, 64])), osl=int(rng.choice([128, 512])), engine="trtllm")
        t_dec, t_pre = float(rng.uniform(3, 20)), float(rng.uniform(10, 100))
        comm = float(rng.choice([0.0, 0.1, 0.3])) * t_dec          # TP 1 rows (none) and TP rows
        a = serving.answer(q, t_dec, t_pre, true, comm)
        rows.append(dict(q.as_dict(), t_dec=t_dec, t_pre=t_pre, comm_dec=comm, error="", ttft_ms=a["ttft_ms"],
                         tpot_ms=a["tpot_ms"]))
    got = serving_eval.fit(pd.DataFrame(rows))["trtllm"]
    for name in ("step_scale", "prefill_share", "ttft_base", "ttft_per_request", "comm_scale"):
        assert getattr(got, name) == pytest.approx(getattr(true, name), abs=2e-3), name
    assert got.rows == 40 and got.tpot_sigma < 1e-3 and got.ttft_sigma < 1e-3      # exact rows: no spread


def test_the_kv_capacity_is_what_the_memory_leaves_in_tokens():
    q = _q(concurrency=10, isl=1000, osl=200)       # the step's cache: 10 x 1,100 tokens
    row = pd.Series({"memory_kv_cache_gib": 11.0, "memory_weights_gib": 20.0, "memory_activations_gib": 2.0})
    cap, most = serving.kv_capacity(q, row, mem_gib=80.0)
    per_token = 11.0 / 11_000
    assert cap == int((0.9 * 80 - 22.0) / per_token)        # 50,000 tokens
    assert most == cap // 1200


def test_an_engine_without_constants_takes_the_one_fitted_on_most_rows(tmp_path):
    from neusight_core.studies import serving_eval
    f = tmp_path / "c.yaml"
    serving_eval.save({"trtllm": EngineConstants(1, 1, 1, 0, rows=100), "sglang": EngineConstants(2, 2, 2, 0, rows=5)},
                      f)
    c, of = serving.constants("vllm", f)
    assert of == "trtllm" and c.step_scale == 1
    assert serving.constants("sglang", f)[1] == "sglang"
    assert not list(tmp_path.glob("*.tmp"))


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("given, says", [
    (dict(concurrency=0), "concurrency must be a positive integer"),
    (dict(osl=1), "output length (OSL) must be an integer of at least 2"),
    (dict(isl=130_000, osl=2_000), "exceed the model's 131,072 positions"),
    (dict(dtype="fp32"), "a serving engine does not serve FP32"),
    (dict(engine="tgi"), "engine must be one of vllm, sglang, trtllm"),
    (dict(batch=4), "unknown option(s) batch"),
])
def test_bad_serving_input_gets_one_line(given, says):
    with pytest.raises(LatencyInputError) as e:
        serving.question("llama3_8b", "H100", **given)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_tensor_parallelism_that_does_not_split_the_heads_is_refused():
    with pytest.raises(LatencyInputError, match="needs the 32 attention heads to split evenly"):
        serving.step_scenarios(serving.question("llama3_8b", "H100", tp=3))


def test_fp8_serving_on_a_gpu_without_fp8_tensor_cores_is_refused():
    with pytest.raises(LatencyInputError, match="has no FP8 tensor cores"):
        serving.step_scenarios(serving.question("llama3_8b", "A100", dtype="fp8"))


def test_one_bad_question_does_not_cost_the_others_their_answer(tmp_path):
    df = serving.predict([dict(model="llama3_2_1b", device="H100", concurrency=4, osl=64, isl=256),
                          dict(model="llama3_2_1b", device="H100", concurrency=0)], quick=True)
    assert df["error"].iloc[0] == "" and df["ttft_ms"].iloc[0] > 0 and df["tpot_ms"].iloc[0] > 0
    assert "concurrency must be a positive integer" in df["error"].iloc[1] and np.isnan(df["tpot_ms"].iloc[1])
    # more requests than the cache holds: answered and marked
    big = serving.predict([dict(model="llama3_8b", device="L4", concurrency=256, isl=4096, osl=1024)], quick=True)
    r = big.iloc[0]
    assert r["error"] == "" and r["fits"] and r["kv_limited"] and r["max_concurrency"] < 256
    assert "queue for a slot" in r["note"]


def test_serve_answers_in_json(capsys):
    from neusight_core.__main__ import main
    assert main(["serve", "--model", "llama3_2_1b", "--device", "H100", "--isl", "256", "--osl", "64",
                 "--concurrency", "4", "--engine", "trtllm", "--quick", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for k in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "kv_capacity_tokens", "max_concurrency"):
        assert r[k] > 0, k
    assert r["tpot_lo_ms"] < r["tpot_ms"] < r["tpot_hi_ms"] and r["coverage"] == 0.8
    assert r["engine"] == "trtllm" and r["constants_of"] == "trtllm"
    assert main(["serve", "--model", "llama3_2_1b", "--device", "H100", "--tp", "3", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: tensor parallelism over 3 GPUs") and "\n" not in err


# ------------------------------------------------------------------------------ the measured runs
def test_the_development_rows_are_the_llama_3_1_family_and_nothing_else():
    from neusight_core.data import serving_runs
    dev, held = serving_runs.development(), serving_runs.held_out()
    assert set(dev["model"]) == {"llama3_8b", "llama3_70b"}
    assert 500 <= len(dev) <= 600 and set(dev["dtype"]) == {"bf16", "fp8"}
    assert not held["model"].str.contains("Llama-3.1").any() and not set(held["id"]) & set(dev["id"])
    assert (dev["ttft_ms"] > 0).all() and (dev["tpot_ms"] > 0).all()


def test_a_tensor_parallel_fp8_gemm_reads_one_byte_per_operand_element():
    """The TP plan recomputes a sliced GEMM's traffic from its dims: an fp8 GEMM's operands stay one byte each."""
    from neusight_core.cost import latency
    k = latency.predict_model("llama3_2_1b", "H100", batch=4, seq=1, past=64, dtype="fp8", parallel="tp", gpus=2,
                              kv_cache="paged", quick=True)["kernels"]
    fp8 = k[(k["op_class"] == "LINEAR") & (k["precision"] == "fp8")]
    assert len(fp8)
    expect = fp8["M"] * fp8["N"] + fp8["N"] * fp8["K"]
    assert np.allclose(fp8["bytes_read"], expect) and np.allclose(fp8["bytes_written"], 2 * fp8["M"] * fp8["K"])


def test_an_answer_outside_the_engines_development_rows_says_what_it_extrapolates():
    c = EngineConstants(1, 1, 1, 0, covers=("llama3_70b / NVIDIA_H200 / fp8", "llama3_8b / NVIDIA_H100_80GB_HBM3 / bf16"))
    assert serving.outside_rows(_q(model="llama3_8b", device="NVIDIA_H100_80GB_HBM3", dtype="bf16"), c) == []
    assert serving.outside_rows(_q(model="qwen3_32b", device="NVIDIA_L4", dtype="bf16"), c) == [
        "model qwen3_32b", "GPU NVIDIA_L4"]
    # each part seen, but never together
    assert serving.outside_rows(_q(model="llama3_8b", device="NVIDIA_H200", dtype="bf16"), c) == [
        "this model, GPU and precision together"]
    assert serving.outside_rows(_q(), EngineConstants(1, 1, 1, 0)) == []     # constants that say nothing of their rows


def _made_rows(noise: float, n_per_group: int = 24, seed: int = 0) -> pd.DataFrame:
    """Rows whose TTFT and TPOT are the serving model's with known constants, in 6 groups of (model, GPU, TP), each
    measured time times exp(noise x a standard normal draw) independent per row."""
    true = EngineConstants(step_scale=0.9, prefill_share=0.7, ttft_base=3.0, ttft_per_request=0.2, comm_scale=0.4)
    rng = np.random.default_rng(seed)
    rows = []
    for model in ("llama3_8b", "llama3_70b"):
        for device, tp in (("NVIDIA_H100_80GB_HBM3", 1), ("NVIDIA_H200", 2), ("NVIDIA_B200", 4)):
            for _ in range(n_per_group):
                q = _q(model=model, device=device, tp=tp, concurrency=int(rng.choice([4, 8, 16, 64])),
                       osl=int(rng.choice([128, 512])), isl=int(rng.choice([1024, 4096])), engine="trtllm")
                t_dec, t_pre = float(rng.uniform(3, 20)), float(rng.uniform(10, 100))
                comm = 0.0 if tp == 1 else 0.2 * t_dec
                a = serving.answer(q, t_dec, t_pre, true, comm)
                e = np.exp(noise * rng.standard_normal(2))
                rows.append(dict(q.as_dict(), t_dec=t_dec, t_pre=t_pre, comm_dec=comm, error="",
                                 ttft_ms=a["ttft_ms"] * e[0], tpot_ms=a["tpot_ms"] * e[1]))
    return pd.DataFrame(rows)


def test_the_floor_of_exact_rows_is_zero_for_the_serving_model_however_rows_are_held_out():
    from neusight_core.studies import serving_eval
    t = serving_eval.floor_table(_made_rows(noise=0.0), seeds=(0,))
    assert set(t["held out"]) == {"nothing (in sample)", *serving_eval.SPLITS}
    assert (t["serving model"] < 0.5).all()          # one set of constants made every group
    assert (t["rows"] == 144).all()


def test_the_floor_shows_noise_no_learner_can_predict():
    from neusight_core.studies import serving_eval
    # independent noise of 0.3 in log: |exp(0.3 z) - 1| averages about 24 %; no model of the inputs can go below it
    t = serving_eval.floor_table(_made_rows(noise=0.3), seeds=(0, 1))
    held = t[t["held out"] != "nothing (in sample)"]
    assert (held["learner"] > 17).all() and (t["serving model"] > 17).all()
    assert (held["serving model"] < 35).all()                          # the right form stays near the noise
    assert (held.loc[held["held out"] == "random rows (10 folds)", "learner: spread over seeds"] > 0).all()


def test_a_group_whose_engine_has_no_other_rows_is_left_out_of_the_group_check():
    from neusight_core.studies import serving_eval
    rows = _made_rows(noise=0.0, n_per_group=6)
    ok = pd.concat([rows.iloc[:6].assign(engine="sglang"), rows.iloc[6:]], ignore_index=True)   # sglang: one group
    held = serving_eval.model_held_out(ok, serving_eval.folds_of(ok, "each TP of a model on a GPU with an engine"))
    assert len(held) == len(rows) - 6 and set(held["engine"]) == {"trtllm"}


def test_the_spread_of_an_answer_is_measured_with_its_group_held_out():
    from neusight_core.studies import serving_eval
    rows = _made_rows(noise=0.0)
    # each (model, GPU, TP) group errs its own way: a bias no constant shared by the groups can absorb
    bias = {k: b for k, b in zip(sorted(set(zip(rows.model, rows.device))), [-0.2, 0.1, 0.25, -0.1, 0.0, 0.15])}
    rows["tpot_ms"] *= np.exp([bias[k] for k in zip(rows.model, rows.device)])
    got = serving_eval.fit(rows)["trtllm"]
    inside = serving_eval.scored(rows, {"trtllm": serving_eval.fit_engine(rows)})
    in_sample = float(np.sqrt(np.mean(np.log(inside.pred_tpot_ms / inside.tpot_ms) ** 2)))
    assert got.tpot_sigma > 1.1 * in_sample > 0.1         # a new group errs more than the groups fitted on
    assert got.ttft_sigma < 1e-3                            # TTFT made exactly: no spread held out either


def test_interval_hits_counts_the_rows_inside_their_interval():
    from neusight_core.studies import serving_eval
    s = pd.DataFrame({"engine": ["vllm", "vllm", "trtllm"], "tpot_ms": [10.0, 30.0, 5.0], "tpot_lo_ms": [8.0, 8.0, 5.0],
                      "tpot_hi_ms": [12.0, 12.0, 6.0], "ttft_ms": [100.0, 100.0, 50.0], "ttft_lo_ms": [90.0, 101.0, 60.0],
                      "ttft_hi_ms": [110.0, 120.0, 70.0]})
    t = serving_eval.interval_hits(s).set_index("engine")
    assert t.loc["vllm", "TPOT inside (%)"] == 50 and t.loc["vllm", "TTFT inside (%)"] == 50
    assert t.loc["trtllm", "TPOT inside (%)"] == 100 and t.loc["trtllm", "TTFT inside (%)"] == 0   # bounds count
    assert t.loc["all", "rows"] == 3 and t.loc["all", "TPOT inside (%)"] == pytest.approx(200 / 3)


def test_an_answer_outside_the_rows_takes_the_wider_spread_of_a_new_configuration():
    c = EngineConstants(1.0, 1.0, 2.0, 0.5, tpot_sigma=0.1, ttft_sigma=0.5, tpot_sigma_outside=0.3,
                        ttft_sigma_outside=0.9, covers=("llama3_8b / NVIDIA_H100_80GB_HBM3 / bf16",))
    z = 1.2815515655446004
    inside = serving.answer(_q(), 2.0, 10.0, c)
    assert inside["tpot_hi_ms"] / inside["tpot_ms"] == pytest.approx(np.exp(z * 0.1))
    other_gpu = serving.answer(_q(device="NVIDIA_H200"), 2.0, 10.0, c)
    assert other_gpu["tpot_hi_ms"] / other_gpu["tpot_ms"] == pytest.approx(np.exp(z * 0.3))
    assert other_gpu["ttft_lo_ms"] / other_gpu["ttft_ms"] == pytest.approx(np.exp(-z * 0.9))
    told = serving.answer(_q(), 2.0, 10.0, c, outside=True)          # e.g. another engine's constants
    assert told["tpot_hi_ms"] / told["tpot_ms"] == pytest.approx(np.exp(z * 0.3))
    narrower = dataclasses.replace(c, tpot_sigma_outside=0.05)         # never narrower than the engine's own spread
    assert serving.answer(_q(device="NVIDIA_H200"), 2.0, 10.0, narrower)["tpot_hi_ms"] == pytest.approx(inside["tpot_hi_ms"])


def test_the_fit_measures_the_spread_of_a_new_model_or_gpu_and_pools_it_for_a_lone_engine():
    from neusight_core.studies import serving_eval
    rows = _made_rows(noise=0.0)
    bias = {k: b for k, b in zip(sorted(set(zip(rows.model, rows.device))), [-0.2, 0.1, 0.25, -0.1, 0.0, 0.15])}
    rows["tpot_ms"] *= np.exp([bias[k] for k in zip(rows.model, rows.device)])
    lone = rows[(rows.model == "llama3_8b") & (rows.device == "NVIDIA_H200")].assign(engine="sglang")
    got = serving_eval.fit(pd.concat([rows, lone], ignore_index=True))
    t = got["trtllm"]
    # what the rows of each model on a GPU, held out whole, err by (the floor's split of the same name)
    held = serving_eval.model_held_out(rows, serving_eval.folds_of(rows, "each model on a GPU with an engine"))
    want = np.sqrt(np.mean(np.log(held.pred_tpot_ms / held.tpot_ms) ** 2))
    assert t.tpot_sigma_outside == pytest.approx(want, abs=1e-4) and want > 0.1
    s = got["sglang"]
    assert s.tpot_sigma_outside == pytest.approx(t.tpot_sigma_outside) and "other engines'" in s.source
