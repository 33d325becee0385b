"""Fusion keeps FLOPs and cuts bytes; DP/TP/PP split FLOPs and carry the expected communication."""
from __future__ import annotations

from collections import Counter

import pytest

from neusight_core.question.step import Step
from neusight_core.plans import fusion, parallel
from neusight_core.tracing import table_info, trace

B, S, D, V = 4, 8, 64, 100
T = B * S
TINY = {"name": "tiny_gpt2", "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": D, "n_head": 4, "n_layer": 4, "n_positions": 32, "vocab_size": V,
        "activation_function": "gelu_new"}
N_PARAMS = V * D + 32 * D + 4 * (2 * D + (D * 3 * D + 3 * D) + (D * D + D) + 2 * D
                                 + (D * 4 * D + 4 * D) + (4 * D * D + D)) + 2 * D
GEMM = ["LINEAR", "BMM"]


@pytest.fixture(scope="module")
def inf():
    return trace.trace_model(Step(model=TINY, batch=B, seq=S, mode="inf"))


@pytest.fixture(scope="module")
def train():
    return trace.trace_model(Step(model=TINY, batch=B, seq=S, mode="train"))


def gemm_flops(df, phases=("fw", "bw")):
    return df[df.op_class.isin(GEMM) & df.phase.isin(phases)].flops.sum()


def total_bytes(df):
    return (df.bytes_read + df.bytes_written).sum()


@pytest.mark.parametrize("mode", ["inf", "train"])
def test_fusion_reduces_bytes_and_keeps_flops(mode, inf, train):
    k = inf if mode == "inf" else train
    f = fusion.fuse(k)
    assert f.flops.sum() == pytest.approx(k.flops.sum(), rel=1e-12)
    assert total_bytes(f) < 0.8 * total_bytes(k)
    assert len(f) < len(k)
    # GEMMs are never merged: same kernels, same bytes
    g0, g1 = k[k.op_class.isin(GEMM)], f[f.op_class.isin(GEMM)]
    assert Counter(map(tuple, g0[["M", "N", "K"]].values)) == Counter(map(tuple, g1[["M", "N", "K"]].values))
    assert total_bytes(g0) == total_bytes(g1)


def test_fusion_merges_the_gelu_chain(inf):
    f = fusion.fuse(inf)
    act = f[f.module == "transformer.h.0.mlp.act"]
    # GELU-tanh is 8 element-wise kernels eagerly: one fused kernel, reading and writing [T x 4D] once
    assert len(act) == 1 and act.sub_op.iloc[0] == "fused" and act.op_class.iloc[0] == "VEC"
    assert act.flops.iloc[0] == 8 * T * 4 * D
    assert act.bytes_read.iloc[0] == 4 * T * 4 * D and act.bytes_written.iloc[0] == 4 * T * 4 * D


@pytest.mark.parametrize("n", [2, 4])
def test_dp_splits_batch_and_allreduces_every_gradient(n, train):
    p = parallel.apply_plan(train, "dp", n)
    assert gemm_flops(p) == pytest.approx(gemm_flops(train) / n, rel=1e-12)
    comm = p[p.op_class == "COMM"]
    assert set(comm.comm_kind) == {"allreduce"} and comm.overlap.all()
    assert comm.comm_bytes.sum() == 4 * N_PARAMS       # every gradient once (tied wte/lm_head once)
    assert (comm.phase == "comm").all()
    # each all-reduce comes after the last gradient kernel of its module
    last_bw = p.index[p.phase.isin(["bw", "acc"])].max()
    assert comm.index.min() < last_bw
    inf_dp = parallel.apply_plan(trace.trace_model(Step(model=TINY, batch=B, seq=S, mode="inf")), "dp", n)
    assert not (inf_dp.op_class == "COMM").any()


@pytest.mark.parametrize("n", [2, 4])
def test_tp_splits_gemms_and_adds_megatron_allreduces(n, train):
    p = parallel.apply_plan(train, "tp", n)
    assert gemm_flops(p) == pytest.approx(gemm_flops(train) / n, rel=1e-12)
    fw = p[(p.phase == "fw") & (p.op_class == "LINEAR")]
    c_attn = fw[fw.module == "transformer.h.0.attn.c_attn"].iloc[0]
    assert (c_attn.M, c_attn.N, c_attn.K) == (T, D, 3 * D / n)        # column-parallel
    c_proj = fw[fw.module == "transformer.h.0.attn.c_proj"].iloc[0]
    assert (c_proj.M, c_proj.N, c_proj.K) == (T, D / n, D)            # row-parallel
    bmm = p[(p.phase == "fw") & (p.op_class == "BMM")]
    assert set(bmm.B) == {B * 4 / n}                                   # heads split
    comm = p[p.op_class == "COMM"]
    assert set(comm.comm_kind) == {"allreduce"} and not comm.overlap.any()
    act = 4 * T * D
    # per layer 2 in forward (attn out, FC2) + 2 in backward (QKV, FC1 input grads);
    # embedding (fw), LM-head input grad (bw), 3 scalars per token of the vocab-parallel loss
    assert len(comm) == 4 * 4 + 1 + 1 + 3
    assert comm.comm_bytes.sum() == (4 * 4 + 2) * act + 3 * 4 * T
    # layer norms are replicated, not split
    ln = p[(p.op_class == "LAYERNORM") & (p.phase == "fw")]
    assert set(ln.B) == {T}


@pytest.mark.parametrize("n", [2, 4])
def test_pp_assigns_stages_and_sends_boundary_activations(n, train):
    p = parallel.apply_plan(train, "pp", n)
    assert gemm_flops(p) == pytest.approx(gemm_flops(train), rel=1e-12)   # one copy of every kernel
    st = p[p.layer >= 0].groupby("layer").stage.unique()
    assert all(len(s) == 1 for s in st)
    assert [s[0] for s in st] == [L * n // 4 for L in range(4)]
    per_stage = p[p.op_class.isin(GEMM) & (p.layer >= 0)].groupby("stage").flops.sum()
    assert len(per_stage) == n and per_stage.max() == pytest.approx(per_stage.min())
    assert p[p.module == "lm_head"].stage.unique().tolist() == [n - 1]
    comm = p[p.op_class == "COMM"]
    assert set(comm.comm_kind) == {"sendrecv"} and len(comm) == 2 * (n - 1)
    assert set(comm.comm_bytes) == {4 * T * D}
    mb = parallel.apply_plan(train, "pp", n, micro_batches=2)
    assert set(mb[mb.op_class == "COMM"].comm_bytes) == {4 * T * D / 2}
    assert gemm_flops(mb) == pytest.approx(gemm_flops(train) / 2, rel=1e-12)


@pytest.mark.parametrize("plan, n, mb, match", [
    ("zz", 2, 1, "unknown parallel plan"),
    ("dp", 0, 1, "positive integer"),
    ("dp", 3, 1, "not divisible"),
    ("pp", 8, 1, "fewer than 8 stages"),
    ("pp", 2, 3, "not divisible by 3 micro-batches"),
])
def test_bad_plan_gives_one_line_error(plan, n, mb, match, train):
    with pytest.raises(parallel.PlanError, match=match) as e:
        parallel.apply_plan(train, plan, n, micro_batches=mb)
    assert "\n" not in str(e.value)


def test_plans_keep_a_fused_table_fused(inf):
    f = fusion.fuse(inf)
    p = parallel.apply_plan(f, "dp", 2)
    assert table_info.info(p).fused and (p.sub_op == "fused").any()
    assert len(p) == len(fusion.fuse(trace.trace_model(Step(model=TINY, batch=B // 2, seq=S, mode="inf"))))


def _llama70b(layers=2, **over):
    """The catalogue's Llama-2-70B config (64 query heads, 8 KV heads, head dim 128), with fewer layers."""
    import json

    from neusight_core.data import configs
    cfg = json.loads((configs.OUR_CONFIGS_DIR / "llama2_70b.json").read_text())
    return {**cfg, "name": "llama2_70b_short", "num_hidden_layers": layers, **over}


@pytest.mark.parametrize("mode", ["inf", "train"])
def test_tp_beyond_kv_heads_replicates_kv_heads(mode):
    # issue 24: TP 64 of Llama-2-70B (8 KV heads) split the K/V projections 64 ways (1/8 of a head each).
    # Megatron/vLLM replicate KV heads instead: every GPU keeps one KV head (128 features) at TP 8 and TP 64,
    # while Q is split 64 ways (128 features = 1 of 64 heads).
    from neusight_core.cost import memory
    k = trace.trace_model(Step(model=_llama70b(), batch=1, seq=16, mode=mode, past=8 if mode == "inf" else 0))
    t8, t64 = parallel.apply_plan(k, "tp", 8), parallel.apply_plan(k, "tp", 64)

    def gemms(t, leaf):
        g = t[(t.op_class == "LINEAR") & t.module.str.endswith(leaf)]
        return g[["M", "N", "K", "flops", "bytes_read", "bytes_written"]].to_numpy()

    for leaf in ("k_proj", "v_proj"):
        assert (gemms(t8, leaf) == gemms(t64, leaf)).all(), leaf
    fw8 = t8[(t8.phase == "fw") & t8.module.str.endswith(("q_proj", "k_proj", "v_proj"))]
    fw64 = t64[(t64.phase == "fw") & t64.module.str.endswith(("q_proj", "k_proj", "v_proj"))]
    # by hand: T = 16 tokens x 8192 in; q: 8192 / n out features, k and v: one head of 128 at both sizes
    assert fw64.groupby(fw64.module.str.rpartition(".")[2])["K"].first().to_dict() == {
        "q_proj": 128, "k_proj": 128, "v_proj": 128}
    assert fw8.groupby(fw8.module.str.rpartition(".")[2])["K"].first().to_dict() == {
        "q_proj": 1024, "k_proj": 128, "v_proj": 128}
    assert set(fw64[fw64.module.str.endswith("k_proj")].flops) == {2.0 * 16 * 8192 * 128}
    # forward kernels between the projections and the attention BMMs work on one query head and one KV
    # head per GPU at TP 64: rotary embedding on 16 tokens x 1 head, repeat_kv copies one head to one head
    attn = t64[(t64.phase == "fw") & (t64.module == "model.layers.0.self_attn")]
    assert set(attn[(attn.op_class == "VEC") & (attn.H == 128)].B) == {16.0}
    copies = attn[attn.aten_op == "aten.clone.default"]
    assert len(copies) >= 2 and (copies.bytes_read == copies.bytes_written).all()
    # memory: the same K/V weights per GPU (1/8 of them) and the same KV cache (one head) at TP 8 and TP 64
    kvw = parallel.kv_ways(table_info.info(k).config, 64)
    assert kvw == 8 and memory._tp_share("model.layers.0.self_attn.k_proj.weight", 64, kvw) == 1 / 8
    m8, m64 = memory.footprint(t8), memory.footprint(t64)
    if mode == "inf":
        assert m64["kv_cache_gib"] == m8["kv_cache_gib"] == table_info.info(k).memory["kv_cache_bytes"] / 8 / memory.GIB
    # from TP 8 to TP 64 every split parameter shrinks from 1/8 to 1/64 except K and V, which stay at 1/8
    kv = ("k_proj.weight", "v_proj.weight")
    others = sum(v for p, v in table_info.info(k).params.items() if memory._tp_share(p, 8) == 1 / 8 and not p.endswith(kv))
    assert m8["params_per_gpu"] - m64["params_per_gpu"] == pytest.approx(others * (1 / 8 - 1 / 64))


def test_tp_kv_heads_that_split_unevenly_is_one_line_error():
    from neusight_core.cost import latency
    # 40 query heads (head dim 32), 8 KV heads: 5 GPUs split the query heads but neither split nor replicate KV
    k = trace.trace_model(Step(model=_llama70b(hidden_size=1280, intermediate_size=2048, num_attention_heads=40), batch=1, seq=8, mode="inf"))
    with pytest.raises(parallel.PlanError, match="the 8 key/value heads can neither be split evenly over 5 GPUs"):
        parallel.apply_plan(k, "tp", 5)
    # TP that does not divide the query heads stays the request's error (before any tracing)
    with pytest.raises(latency.LatencyInputError, match="needs the 64 attention heads to split evenly"):
        latency.predict_model("llama2_70b", "H100", 1, 16, "inf", parallel="tp", gpus=3, predictor="roofline")
