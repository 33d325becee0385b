"""Fusion keeps FLOPs and cuts bytes; DP/TP/PP split FLOPs and carry the expected communication."""
from __future__ import annotations

from collections import Counter

import pytest

from neusight_core import fusion, parallel, trace

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
    return trace.trace_model(TINY, B, S, "inf")


@pytest.fixture(scope="module")
def train():
    return trace.trace_model(TINY, B, S, "train")


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
    inf_dp = parallel.apply_plan(trace.trace_model(TINY, B, S, "inf"), "dp", n)
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
    assert p.attrs.get("fused") and (p.sub_op == "fused").any()
    assert len(p) == len(fusion.fuse(trace.trace_model(TINY, B // 2, S, "inf")))
