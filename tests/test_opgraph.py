"""Comparison with the authors' op graphs, and notebook 02 in quick mode."""
from __future__ import annotations

import pytest

from neusight_core import opgraph

CSV = '''Name,OpName,FwOps,BwOps,AccOps,Prev,Next,InputShapes,OutputShape
input_ids,misc,[],[],[],set(),{},[],"(2, 8)"
transformer_wte,EMBEDDING,"[['MEM', ((2, 8), (2, 8, 4))]]",[],[],{},{},[],"(2, 8, 4)"
transformer_h_0_ln_1,VECln,"[['VECln', (16, 4)]]","[['VECmul', (16, 4)]]",[],{},{},[],"(2, 8, 4)"
addmm,Linear,"[['Linear', (16, 4, 12)]]","[['Linear', (16, 12, 4)], ['Linear', (12, 16, 4)]]","[['VECadd', [1, 48]]]",{},{},[],"(16, 12)"
transformer_h_0_mlp_c_proj,Linear,"[['Linear', (16, 16, 4)]]",[],[],{},{},[],"(16, 4)"
add_15,VECadd,"[['VECadd', (16, 4)]]",[],[],{},{},[],"(2, 8, 4)"
sendrecv,sendrecv,"[['SENDRECV', (64,)]]","[['SENDRECV', (64,)]]",[],{},{},[],"(1,)"
transformer_ln_f,VECln,"[['VECln', (16, 4)]]",[],[],{},{},[],"(2, 8, 4)"
lm_head,Linear,"[['Linear', (16, 4, 10)]]",[],[],{},{},[],"(2, 8, 10)"
'''


def test_parse_name():
    d = opgraph.parse_name("gpt3_xl-train-2048-4-pp4_4")
    assert (d["model"], d["mode"], d["seq"], d["batch"], d["plan"], d["n"], d["micro_batches"]) == \
        ("gpt3_xl", "train", 2048, 4, "pp", 4, 4)
    assert opgraph.parse_name("bert_large-inf-512-8-fusion")["fusion"]
    with pytest.raises(opgraph.OpGraphError, match="cannot parse"):
        opgraph.parse_name("nonsense")


def test_one_layer_graph_is_replicated(tmp_path):
    p = tmp_path / "toy-train-8-2.csv"
    p.write_text(CSV)
    g = opgraph.load_opgraph(p, num_layers=3)
    # layer 0 = ln_1 .. add_15 (the residual add after the last module is part of the layer);
    # the pipeline sendrecv and everything after are not
    by = g.groupby("node")["count"].first()
    assert by["transformer_h_0_ln_1"] == 3 and by["addmm"] == 3 and by["add_15"] == 3
    assert by["transformer_wte"] == 1 and by["sendrecv"] == 1 and by["lm_head"] == 1
    lin = g[(g.op_class == "LINEAR") & (g.phase == "fw")]
    assert (lin.flops * lin["count"]).sum() == 3 * (2 * 16 * 4 * 12 + 2 * 16 * 16 * 4) + 2 * 16 * 4 * 10
    assert set(g[g.node == "addmm"].phase) == {"fw", "bw", "acc"}


def test_gpt2_large_gemms_match_the_authors(release_root):
    t = opgraph.compare("gpt2_large-inf-1024-4")
    gemm = t[t.op_class.isin(["GEMM", "BMM", "LINEAR"])]
    assert (gemm.kernels_rel == 0).all()
    assert gemm.flops_rel.abs().max() < 1e-9


def test_notebook_02_quick(run_notebook, release_root):
    out, metrics = run_notebook("02_trace_models")
    assert metrics["status"] == "OK"
    assert metrics["configs"] >= 3
    assert metrics["gemm_flops_max_abs_rel_total"] < 1e-3
    assert metrics["flagged_unexplained"] == 0
    assert max(metrics["trace_s"].values()) < 10
    for f in ("tables/opgraph_comparison.csv", "tables/worst_by_class.md", "tables/trace_times.csv",
              "figures/flops_bytes_per_class.png", "figures/flops_bytes_per_class.pdf", "summary.md"):
        assert (out / f).is_file(), f
