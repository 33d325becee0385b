"""Mixture-of-experts models: the experts' grouped GEMMs (transformers' default ``grouped_mm`` experts) as kernel rows,
what an answer says of them, and what is refused (aten_ops.grouped_gemm, docs/recipes.md "Mixture of experts")."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import table_families, trace
from neusight_core.cost import latency
from neusight_core.plans import parallel
from neusight_core.question import schema
from neusight_core.question.schema import OpClass, Precision

E, TOP, H, I = 8, 2, 256, 512          # experts, experts per token, hidden size, each expert's intermediate size


@pytest.fixture
def tiny_moe(tmp_path):
    """A one-layer Mixtral-shaped model: 8 experts of 512, 2 per token."""
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H, "intermediate_size": I,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 1000,
           "max_position_embeddings": 4096, "num_local_experts": E, "num_experts_per_tok": TOP,
           "hidden_act": "silu", "tie_word_embeddings": False}
    p = tmp_path / "tiny_moe.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def _grouped(t):
    return t[t["sub_op"] == schema.GROUPED_GEMM]


def test_the_experts_run_as_grouped_gemms_of_balanced_routing(tiny_moe):
    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="inf", dtype=Precision.BF16, attention="sdpa"))
    assert (t["op_class"] == OpClass.UNCLASSIFIED).sum() == 0        # histc, floor_divide and the GEMMs classified
    g = _grouped(t)
    assert len(g) == 2 and set(g["op_class"]) == {OpClass.BMM}
    S = 2 * 10 * TOP                                                   # routed tokens
    up, down = g.iloc[0], g.iloc[1]
    # gate and up projections of every expert, then the down projection, each one GEMM over the 40 stacked tokens
    assert (up.B, up.M, up.N, up.K) == (1, S, H, 2 * I)
    assert (down.B, down.M, down.N, down.K) == (1, S, I, H)
    assert up.flops == 2.0 * S * H * 2 * I and down.flops == 2.0 * S * I * H
    # every expert is reached: its input, all 8 experts' weights and the offsets are read
    assert up.bytes_read == 2 * S * H + 2 * E * H * 2 * I + 4 * E
    assert up.bytes_written == 2 * S * 2 * I


# other families whose experts run through transformers' grouped_mm, tiny: shared experts (Qwen2-MoE, DeepSeek-V3),
# group-limited routing and MLA (DeepSeek-V3), plain top-k (OLMoE)
OTHERS = {
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "moe_intermediate_size": 64,
                  "shared_expert_intermediate_size": 128, "num_experts": 8, "decoder_sparse_step": 1},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "moe_intermediate_size": 64, "first_k_dense_replace": 1,
                    "n_routed_experts": 8, "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "q_lora_rank": 64,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
    "olmoe": {"architectures": ["OlmoeForCausalLM"], "num_experts": 8},
}


@pytest.mark.parametrize("family", sorted(OTHERS))
def test_other_moe_families_trace_with_every_op_classified(tmp_path, family):
    cfg = {"model_type": family, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 1024,
           "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False, **OTHERS[family]}
    p = tmp_path / f"{family}.json"
    p.write_text(json.dumps(cfg))
    for mode, seq, past in (("inf", 16, 0), ("train", 16, 0), ("inf", 1, 24)):     # prefill, training, decode
        t = trace.trace_model(Step(model=str(p), batch=2, seq=seq, mode=mode, past=past, dtype=Precision.BF16, attention="sdpa"))
        assert (t["op_class"] == OpClass.UNCLASSIFIED).sum() == 0, t[t["op_class"] == OpClass.UNCLASSIFIED].aten_op.unique()
        assert len(_grouped(t)) >= (2 if mode == "inf" else 6)


def test_llama4_dense_experts_are_traced_and_their_split_refused(tmp_path):
    """Llama 4 in transformers runs every expert over every token as batched GEMMs (weighted by the router's
    scores): traced as it runs (its router's log1p classified), but a tensor- or expert-parallel split of those GEMMs
    is not modelled, so it is refused in one line rather than charging each GPU all of them."""
    cfg = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 128,
           "intermediate_size": 64, "intermediate_size_mlp": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 1,
           "interleave_moe_layer_step": 1, "vocab_size": 1000, "max_position_embeddings": 4096}
    p = tmp_path / "llama4.json"
    p.write_text(json.dumps(cfg))
    t = trace.trace_model(Step(model=str(p), batch=2, seq=16, mode="inf", dtype=Precision.BF16, attention="sdpa"))
    assert (t["op_class"] == OpClass.UNCLASSIFIED).sum() == 0    # its fourth layer's attention scaling takes a log1p
    assert t["aten_op"].str.contains("log1p").any()
    experts = t[(t["op_class"] == OpClass.BMM) & t["module"].str.endswith(".experts")]
    assert len(experts) == 8 and set(experts["B"]) == {4}      # two per layer, every expert over all 32 tokens
    for plan in ("tp", "ep"):
        with pytest.raises(parallel.PlanError, match=f"{plan}2: the model's experts run as batched GEMMs") as e:
            parallel.apply_plan(t, plan, 2)
        assert "\n" not in str(e.value)


def test_a_decode_step_reads_only_the_experts_its_token_reaches(tiny_moe):
    t = trace.trace_model(Step(model=tiny_moe, batch=1, seq=1, mode="inf", dtype=Precision.BF16, attention="sdpa", past=16))
    up = _grouped(t).iloc[0]
    assert (up.B, up.M) == (1, TOP)                                    # 2 of the 8 experts, one token each
    assert up.bytes_read == 2 * TOP * H + 2 * TOP * H * 2 * I + 4 * E    # a quarter of the weights


def test_training_adds_the_input_and_weight_gradients_of_each_grouped_gemm(tiny_moe):
    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="train", dtype=Precision.BF16, attention="sdpa"))
    g = _grouped(t)
    fw, bw = g[g["phase"] == "fw"], g[g["phase"] == "bw"]
    assert len(fw) == 2 and len(bw) == 4
    assert bw["flops"].sum() == pytest.approx(2 * fw["flops"].sum())
    # a weight gradient cuts the reduction (the tokens) into the experts' groups, one output each: a batch of 8
    wgrad = bw[bw["B"] == E]
    assert len(wgrad) == 2 and set(wgrad["N"]) == {math.ceil(2 * 10 * TOP / E)} and set(wgrad["M"]) == {H, 2 * I}
    assert set(bw["module"]) == {"model.layers.0.mlp.experts"}


def test_a_moe_model_in_fp32_is_refused_in_one_line(tiny_moe, capsys):
    """torch's grouped GEMM takes bf16 only (its meta kernel refuses fp32): the error says what to do."""
    from neusight_core.__main__ import main
    assert main(["predict", "--model", tiny_moe, "--device", "H100", "--batch", "1", "--seq", "16", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "grouped GEMMs" in err and err.endswith("use --dtype bf16")


def _comm(t, phase):
    c = t[(t["op_class"] == OpClass.COMM) & (t["module"] == "model.layers.0.mlp.experts")]
    return c[c.index < t.index[t["phase"] == "bw"].min()] if phase == "fw" else c[c.index > t.index[t["phase"] == "bw"].min()]


def test_tensor_parallelism_slices_every_expert(tiny_moe):
    """tp: gate and up column-parallel, down row-parallel inside every expert; the activation between them on half the
    intermediate dim; the token gathers whole; one all-reduce of the layer's output (forward) and input gradient."""
    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="train", dtype=Precision.BF16, attention="sdpa"))
    k = parallel.apply_plan(t, "tp", 2)
    g, S = _grouped(k), 2 * 10 * TOP
    up, down = g[g["phase"] == "fw"].iloc[0], g[g["phase"] == "fw"].iloc[1]
    assert (up.B, up.M, up.N, up.K) == (1, S, H, I) and (down.B, down.M, down.N, down.K) == (1, S, I // 2, H)
    assert up.bytes_read == 2 * S * H + 2 * E * H * I + 4 * E            # every expert's half of the weights
    assert g["flops"].sum() == pytest.approx(_grouped(t)["flops"].sum() / 2)
    act = k[k["aten_op"].str.contains("silu.default")]
    assert act["H"].tolist() == [I / 2]
    gather = k[(k["module"] == "model.layers.0.mlp.experts") & (k["phase"] == "fw") & (k["aten_op"] == "aten.index.Tensor")]
    assert (gather["B"] == S).any()                                      # the routed rows are gathered whole
    for ph in ("fw", "bw"):
        assert _comm(k, ph)["comm_bytes"].tolist() == [2.0 * 2 * 10 * H]


def test_expert_parallelism_spreads_the_experts(tiny_moe):
    """ep: each of 2 GPUs holds 4 whole experts and runs the half of the routed rows that reach them; a decode step's
    2 routed rows put one expert's weights on each GPU."""
    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="train", dtype=Precision.BF16, attention="sdpa"))
    k = parallel.apply_plan(t, "ep", 2)
    g, S = _grouped(k), 2 * 10 * TOP
    up = g[g["phase"] == "fw"].iloc[0]
    assert (up.B, up.M, up.N, up.K) == (1, S // 2, H, 2 * I)
    assert up.bytes_read == 2 * (S // 2) * H + 2 * (E // 2) * H * 2 * I + 4 * (E // 2)
    wgrad = g[g["B"] > 1]
    assert set(wgrad["B"]) == {E // 2} and set(wgrad["bytes_written"]) == {2.0 * (E // 2) * H * 2 * I, 2.0 * (E // 2) * I * H}
    assert g["flops"].sum() == pytest.approx(_grouped(t)["flops"].sum() / 2)
    assert k[k["aten_op"].str.contains("silu.default")]["B"].tolist() == [S / 2]
    for ph in ("fw", "bw"):
        assert len(_comm(k, ph)) == 1
    d = parallel.apply_plan(trace.trace_model(Step(model=tiny_moe, batch=1, seq=1, mode="inf", dtype=Precision.BF16, attention="sdpa", past=16)),
                            "ep", 2)
    up = _grouped(d).iloc[0]
    assert (up.M, up.bytes_read) == (1, 2 * H + 2 * H * 2 * I + 4 * (E // 2))


def test_expert_weights_are_split_in_memory(tiny_moe):
    from neusight_core.cost import memory

    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="inf", dtype=Precision.BF16, attention="sdpa"))
    experts = 3 * E * H * I                                          # gate, up and down of every expert
    one = memory.param_counts(t)[0]
    for plan in ("tp", "ep"):
        two = memory.param_counts(parallel.apply_plan(t, plan, 2))[0]
        dense = memory.param_counts(parallel.apply_plan(trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="inf", dtype=Precision.BF16, attention="sdpa")), plan, 2))[0]
        assert two == dense and one - two >= experts / 2


def test_expert_parallelism_refuses_what_it_cannot_split_in_one_line(tiny_moe):
    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=16, mode="inf", dtype=Precision.BF16, attention="sdpa"))
    with pytest.raises(parallel.PlanError, match="ep16: the 8 experts do not spread evenly over 16") as e:
        parallel.apply_plan(t, "ep", 16)
    assert "\n" not in str(e.value)
    from neusight_core.cost.scenario import scenario
    six = tiny_moe.replace(".json", "_6.json")
    with open(tiny_moe) as f, open(six, "w") as g:
        json.dump({**json.load(f), "num_local_experts": 6}, g)
    for model, gpus, msg in ((tiny_moe, 4, None), (six, 4, "the 6 experts"),
                             ("llama3_2_1b", 2, "needs a mixture-of-experts model")):
        if msg is None:                             # 4 heads and 8 experts over 4 GPUs: a valid request
            assert scenario(model, "H100", 2, 16, "inf", dtype="bf16", parallel="ep", gpus=gpus).gpus == gpus
            continue
        with pytest.raises(latency.LatencyInputError, match=msg) as e:
            scenario(model, "H100", 2, 16, "inf", dtype="bf16", parallel="ep", gpus=gpus)
        assert "\n" not in str(e.value)


def test_a_moe_model_is_traced_for_real_not_derived(tiny_moe):
    fam = table_families.family(tiny_moe, "inf", dtype=Precision.BF16, attention="sdpa")
    assert not fam.ok and "grouped GEMMs" in fam.reason


def test_an_answer_says_its_grouped_gemms_are_an_extrapolation(tiny_moe, capsys):
    r = latency.predict_model(tiny_moe, "H100", 2, 64, "inf", predictor="neusight", quick=True, dtype="bf16")
    k = r["kernels"]
    grouped = (k["sub_op"] == schema.GROUPED_GEMM).to_numpy()
    share = k["pred_ms"].to_numpy()[grouped].sum() / k["pred_ms"].sum()
    assert "grouped GEMMs (2 rows" in r["moe_note"] and f"{share:.0%}" in r["moe_note"]
    assert r["measured_share"]["BMM"] == 0.0 and r["measured_share"]["LINEAR"] == 1.0
    dense = latency.predict_model("llama3_2_1b", "H100", 1, 64, "inf", predictor="neusight", quick=True, dtype="bf16")
    assert dense["moe_note"] == ""
    from neusight_core.__main__ import main
    assert main(["predict", "--model", tiny_moe, "--device", "H100", "--batch", "2", "--seq", "64", "--dtype", "bf16",
                 "--quick"]) == 0
    out = capsys.readouterr().out
    assert "NOTE: the experts of its mixture-of-experts layers run as grouped GEMMs" in out
    assert np.isfinite(r["e2e_ms"]) and r["e2e_ms"] > 0


def test_the_validation_rows_are_the_traced_rows(tiny_moe):
    """notebook 07's MoE layers (studies/moe_eval.py) are scored on the rows a trace emits (and its tp / ep split, one
    GPU's), not on a copy of its arithmetic that could drift: same dims, FLOPs and bytes."""
    import pandas as pd
    from neusight_core.studies import moe_eval

    t = trace.trace_model(Step(model=tiny_moe, batch=2, seq=10, mode="inf", dtype=Precision.BF16, attention="sdpa"))
    cols = ["op_class", "sub_op", "B", "M", "N", "K", "flops", "bytes_read", "bytes_written"]
    for plan, tp, ep in ((None, 1, 1), ("tp", 2, 1), ("ep", 1, 2), ("ep", 1, 4)):
        traced = _grouped(parallel.apply_plan(t, plan, tp * ep) if plan else t)
        layer = pd.DataFrame({"num_tokens": [20], "topk": [TOP], "num_experts": [E], "hidden_size": [H],
                              "inter_size": [I], "kernel_source": ["any_gated"], "device": ["NVIDIA_H100_80GB_HBM3"],
                              "moe_tp_size": [tp], "moe_ep_size": [ep]})
        built = moe_eval.kernels(layer)
        assert built[cols].astype(float, errors="ignore").astype(str).values.tolist() == \
            traced[cols].astype(float, errors="ignore").astype(str).values.tolist(), plan
    before = moe_eval.kernels(layer.assign(moe_ep_size=1), classified=False)
    assert set(before.op_class) == {OpClass.UNCLASSIFIED} and (before.bytes_read > moe_eval.kernels(
        layer.assign(moe_ep_size=1)).bytes_read - 1).all()


def test_measured_moe_layers_are_scored_without_sealed_gpus():
    from neusight_core.data import measured_kernels as mk
    import pandas as pd
    from neusight_core.studies import moe_eval

    if mk.unavailable():
        pytest.skip(mk.unavailable())
    layers = moe_eval.rows()
    assert set(layers.role) <= {"training", "held_out"} and len(layers) > 1000
    assert set(layers.device) >= {"NVIDIA_H100_80GB_HBM3", "NVIDIA_B200"}
    some = layers.groupby("device").head(3).reset_index(drop=True)
    long = moe_eval.predict(some, seeds=(0,), quick=True)
    assert set(long.predictor) == set(moe_eval.SCORED) and np.isfinite(long.pred_ms).all() and (long.pred_ms > 0).all()
    t = moe_eval.table(long)
    assert len(t) == some.groupby(["device", "framework", "kernel_source"]).ngroups
    assert {"neusight mape", f"{moe_eval.OLD_TRACER} mape", "roofline bias"} <= set(t.columns)
    # a count of layers, not a float mean over seeds
    assert pd.api.types.is_integer_dtype(t["layers"])


def test_measured_layers_of_parallel_groups_are_scored_per_split():
    from neusight_core.data import measured_kernels as mk
    from neusight_core.studies import moe_eval

    if mk.unavailable():
        pytest.skip(mk.unavailable())
    layers = moe_eval.rows(parallel=True, sample=60)
    assert layers.groupby("device").size().max() == 60 and (layers.moe_tp_size * layers.moe_ep_size > 1).any()
    long = moe_eval.predict(layers, seeds=(0,), quick=True, before=False)
    assert set(long.predictor) == {"neusight", "roofline"}
    t = moe_eval.by_parallel(long)
    assert set(t.split) <= {"one GPU", "tp", "ep", "tp x ep"} and {"tp", "ep"} <= set(t.split)
    assert t.layers.sum() == len(layers) and (t[t.split == "one GPU"].gpus == 1).all()
    # a layer split 4 ways runs a quarter of the GEMMs' FLOPs on each GPU
    k = moe_eval.kernels(layers)
    four = layers.index[(layers.moe_tp_size * layers.moe_ep_size == 4).to_numpy()]
    one = moe_eval.kernels(layers.loc[four].assign(moe_tp_size=1, moe_ep_size=1).reset_index(drop=True))
    mine = k[k._layer.isin(four)].flops.to_numpy()
    assert mine.sum() == pytest.approx(one.flops.sum() / 4, rel=0.02)


def test_the_grouped_gemm_timing_runs_dry_on_the_cpu_and_reports_no_numbers(tmp_path):
    """benchmarks/grouped_gemm.py, the prepared device check of torch._grouped_mm: on the CPU its code path runs and
    the CSV says DRY RUN with no measured time; balanced offsets spread the rows as the tracer assumes."""
    import importlib.util
    import pandas as pd
    from neusight_core import paths

    spec = importlib.util.spec_from_file_location("grouped_gemm", paths.REPO_ROOT / "benchmarks" / "grouped_gemm.py")
    gg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gg)
    assert gg.balanced_offsets(2, 8).tolist() == [1, 2, 2, 2, 2, 2, 2, 2]
    assert gg.balanced_offsets(20, 8).tolist() == [3, 6, 9, 12, 14, 16, 18, 20]
    assert gg.main(["--out", str(tmp_path), "--dry-run"]) == 0
    csv = pd.read_csv(tmp_path / "grouped_gemm.csv")
    assert len(csv) == 6 and csv["measured_ms"].isna().all() and csv["status"].str.startswith("DRY RUN").all()
    assert (csv["neusight_ms"] > 0).all() and set(csv["projection"]) == {"up", "down"}
    block = pd.read_csv(tmp_path / "moe_block.csv")              # the whole Hugging Face MoE block, routing included
    assert len(block) == 2 and block["measured_ms"].isna().all() and block["status"].str.startswith("DRY RUN").all()
    assert (block["neusight_ms"] > 0).all() and (block["kernels"] > 10).all()


def test_the_what_if_splits_mixtral_where_one_gpu_does_not_hold_it(monkeypatch):
    """notebook 06's grid (full runs) asks Mixtral 8x7B in bf16 only: tensor-parallel on an 80 GB H100 (93 GB of
    weights), one GPU on a 141 GB H200, and labelled a mixture-of-experts extrapolation."""
    from neusight_core.studies import whatif

    full = whatif.scenarios(False)
    assert {s["model"] for s in full} >= set(whatif.MOE_MODELS)
    assert not {s["model"] for s in whatif.scenarios(True)} & set(whatif.MOE_MODELS)
    one = [s for s in full if s["model"] == "mixtral_8x7b" and s["workload"] == "decode" and s["batch"] == 1]
    monkeypatch.setattr(whatif, "scenarios", lambda quick=False: one)
    r = whatif.run(gpus=["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"], quick=True, predictor="roofline")
    assert r["dtype"].tolist() == ["bf16", "bf16"]                    # no fp32 row: grouped GEMMs take bf16 only
    assert r["plan"].tolist() == ["tp2", "1 GPU"] and (r["latency_ms"] > 0).all()
    assert (r["mem_total_gib"].iloc[1] / r["mem_total_gib"].iloc[0]) == pytest.approx(2, rel=0.02)
    assert r["validation"].str.contains("mixture of experts").all()
