"""Comparison with the authors' op graphs, and notebook 02 in quick mode."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from neusight_core.studies import opgraph

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


def _toy_release(tmp_path, monkeypatch, name="toy-train-8-2"):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / f"{name}.csv").write_text(CSV.replace(
        'sendrecv,sendrecv,"[[\'SENDRECV\', (64,)]]","[[\'SENDRECV\', (64,)]]",[],{},{},[],"(1,)"\n', ""))
    monkeypatch.setattr(opgraph.paths, "opgraph_dir", lambda: tmp_path / "g")


def test_authors_graph_as_a_kernel_table(tmp_path, monkeypatch):
    """Every kernel of their graph becomes a row our predictors take: GEMM dims kept, layer copies in
    `count`, element-wise bytes in the training data's convention, MEM bytes as their predictor counts."""
    from neusight_core.data import dataset
    from neusight_core.predictors import common
    _toy_release(tmp_path, monkeypatch)
    k = opgraph.kernel_table("toy-train-8-2", num_layers=3)
    common.check_kernels(k)
    lin = k[(k.op_class == "LINEAR") & (k.phase == "fw")]
    assert sorted(zip(lin.M, lin.N, lin.K, lin["count"])) == [(16, 4, 10, 1), (16, 4, 12, 3), (16, 16, 4, 3)]
    assert (lin.B == 1).all() and (lin.flops == 2 * lin.M * lin.N * lin.K).all()
    assert set(k[k.module == "addmm"].phase) == {"fw", "bw", "acc"}
    ln = k[(k.op_class == "LAYERNORM")]
    assert list(ln["count"]) == [3, 1] and (ln.H == 4).all()
    # layernorm backward is an element-wise mul in their graph (not a layernorm kernel)
    bw = k[(k.module == "transformer_h_0_ln_1") & (k.phase == "bw")]
    assert list(bw.op_class) == ["VEC"] and list(bw.sub_op) == ["mul"]
    ref = dataset.to_kernels(pd.DataFrame({"op": ["mul"], "op_class": ["VEC"], "sub_op": ["mul"], "B": [16.0],
                                           "M": [np.nan], "N": [np.nan], "K": [np.nan], "H": [4.0]}))
    assert bw.bytes_read.iloc[0] == ref.bytes_read.iloc[0] and bw.flops.iloc[0] == ref.flops.iloc[0]
    mem = k[k.op_class == "MEM"]
    assert list(mem.bytes_read) == [4.0 * (16 + 64)] and mem["count"].iloc[0] == 1
    # the same kernels, counted the same way, as the comparison of notebook 02 reads them
    g = opgraph.load_opgraph(tmp_path / "g" / "toy-train-8-2.csv", num_layers=3)
    assert k["count"].sum() == g["count"].sum()
    assert np.isclose((k.flops * k["count"])[k.op_class.isin(["LINEAR", "BMM"])].sum(),
                      (g.flops * g["count"])[g.op_class.isin(["LINEAR", "BMM"])].sum())


def test_authors_graph_refuses_multi_gpu_and_fused_graphs(tmp_path, monkeypatch):
    _toy_release(tmp_path, monkeypatch)
    for name in ("toy-train-8-2-dp4", "toy-inf-8-2-fusion"):
        with pytest.raises(opgraph.OpGraphError, match="single-GPU"):
            opgraph.kernel_table(name, num_layers=3)
    with pytest.raises(opgraph.OpGraphError, match="not found"):
        opgraph.kernel_table("toy-inf-8-4", num_layers=3)
    (tmp_path / "g" / "toy-train-8-4.csv").write_text(CSV)     # a sendrecv kernel: a pipeline graph
    with pytest.raises(opgraph.OpGraphError, match="SENDRECV"):
        opgraph.kernel_table("toy-train-8-4", num_layers=3)


def test_authors_graph_of_the_release_has_our_gemms(release_root):
    """On the real graph: their GEMM FLOPs equal ours (notebook 02), and every row is predictable."""
    from neusight_core.predictors import common
    k = opgraph.kernel_table("bert_large-train-512-2")
    common.check_kernels(k)
    assert set(k.op_class) <= {"BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM", "MEM"}
    assert k[k.op_class != "MEM"][["B", "flops", "bytes_read"]].notna().all().all()
    t = opgraph.compare("bert_large-train-512-2")
    for cls in ("BMM", "LINEAR"):
        mine = (k.flops * k["count"])[k.op_class == cls].sum()
        theirs = t[(t.scope == "total") & (t.op_class == cls)]["flops_theirs"].iloc[0]
        assert np.isclose(mine, theirs)
