"""Tracer: hand-computed GEMM dims and FLOPs of tiny GPT-2 and BERT, forward and backward."""
from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import aten_ops, table_info, trace
from neusight_core.question import schema

B, S = 2, 8
T = B * S  # tokens

TINY_GPT2 = {"name": "tiny_gpt2", "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
             "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 32, "vocab_size": 100,
             "activation_function": "gelu_new"}
TINY_BERT = {"name": "tiny_bert", "model_type": "bert", "architectures": ["BertLMHeadModel"],
             "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
             "intermediate_size": 128, "max_position_embeddings": 32, "vocab_size": 100,
             "type_vocab_size": 2, "hidden_act": "gelu"}
D, NH, HD, V = 64, 4, 16, 100


def gemms(df, phase, cls):
    d = df[(df.phase == phase) & (df.op_class == cls)]
    return Counter(tuple(int(x) for x in r) for r in d[["B", "M", "N", "K"]].itertuples(index=False))


def linear_fw(shapes):
    """[(in, out)] -> forward GEMMs (1, T, in, out): [T x in] @ [in x out], N = reduction."""
    return Counter((1, T, i, o) for i, o in shapes)


def attn_bmm_fw():
    # scores = Q K^T: [s x hd] @ [hd x s]; context = P V: [s x s] @ [s x hd]; per (batch, head)
    return Counter({(B * NH, S, HD, S): 1, (B * NH, S, S, HD): 1})


def bmm_bw(fw: Counter) -> Counter:
    """d/dA = G B^T -> (B, M, K, N); d/dB = A^T G -> (B, N, M, K)."""
    out = Counter()
    for (b, m, n, k), c in fw.items():
        out[(b, m, k, n)] += c
        out[(b, n, m, k)] += c
    return out


def scale(c: Counter, n: int) -> Counter:
    return Counter({k: v * n for k, v in c.items()})


def flops(c: Counter) -> float:
    return sum(2.0 * b * m * n * k * cnt for (b, m, n, k), cnt in c.items())


@pytest.fixture(scope="module")
def gpt2():
    return trace.trace_model(Step(model=TINY_GPT2, batch=B, seq=S, mode="inf")), trace.trace_model(Step(model=TINY_GPT2, batch=B, seq=S, mode="train"))


@pytest.fixture(scope="module")
def bert():
    # the config's own head (BertLMHeadModel); the authors' heads are tested below
    return (trace.trace_model(Step(model=TINY_BERT, batch=B, seq=S, mode="inf"), authors_heads=False),
            trace.trace_model(Step(model=TINY_BERT, batch=B, seq=S, mode="train"), authors_heads=False))


GPT2_LAYER = [(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)]  # c_attn, attn c_proj, c_fc, mlp c_proj
BERT_LAYER = [(D, D), (D, D), (D, D), (D, D), (D, 128), (128, D)]  # q, k, v, out, ffn in, ffn out


def test_tiny_gpt2_forward_gemms(gpt2):
    inf, train = gpt2
    want_lin = scale(linear_fw(GPT2_LAYER), 2) + linear_fw([(D, V)])  # 2 layers + tied lm_head
    assert gemms(inf, "fw", "LINEAR") == want_lin
    assert gemms(inf, "fw", "BMM") == scale(attn_bmm_fw(), 2)
    # forward of training = forward of inference (same GEMMs, same FLOPs)
    assert gemms(train, "fw", "LINEAR") == want_lin
    got = inf[inf.op_class.isin(["LINEAR", "BMM"])].flops.sum()
    assert got == flops(want_lin) + flops(scale(attn_bmm_fw(), 2))
    # every row's FLOPs are 2 B M N K
    g = inf[inf.op_class == "LINEAR"]
    assert (g.flops == 2 * g.B * g.M * g.N * g.K).all()


def test_tiny_gpt2_backward_gemms(gpt2):
    _, train = gpt2
    # GPT-2 Conv1D: y = x W (W is [in x out]): dX = dY W^T -> (T, out, in); dW = X^T dY -> (in, T, out)
    want = Counter()
    for i, o in GPT2_LAYER * 2:
        want[(1, T, o, i)] += 1
        want[(1, i, T, o)] += 1
    # tied lm_head is nn.Linear with W [V x D]: dX = dY W -> (T, V, D); dW = dY^T X -> (V, T, D)
    want[(1, T, V, D)] += 1
    want[(1, V, T, D)] += 1
    assert gemms(train, "bw", "LINEAR") == want
    assert gemms(train, "bw", "BMM") == bmm_bw(scale(attn_bmm_fw(), 2))
    # backward GEMMs are attributed to the module they differentiate
    bw = train[(train.phase == "bw") & (train.op_class == "LINEAR")]
    assert set(bw.module) >= {"transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "lm_head"}
    assert set(bw.layer) == {-1, 0, 1}


def test_tiny_bert_forward_and_backward_gemms(bert):
    inf, train = bert
    # BertLMHeadModel: 2 layers + prediction-head transform (D x D) + decoder (D x V)
    want_fw = scale(linear_fw(BERT_LAYER), 2) + linear_fw([(D, D), (D, V)])
    assert gemms(inf, "fw", "LINEAR") == want_fw
    assert gemms(inf, "fw", "BMM") == scale(attn_bmm_fw(), 2)
    # nn.Linear y = x W^T + b: dX = dY W -> (T, out, in); dW = dY^T X -> (out, T, in)
    want_bw = Counter()
    for (_, t, i, o), c in want_fw.items():
        want_bw[(1, t, o, i)] += c
        want_bw[(1, o, t, i)] += c
    assert gemms(train, "bw", "LINEAR") == want_bw
    assert gemms(train, "bw", "BMM") == bmm_bw(scale(attn_bmm_fw(), 2))
    ln = inf[inf.op_class == "LAYERNORM"]
    assert len(ln) == 1 + 2 * 2 + 1 and set(ln.H) == {D} and set(ln.B) == {T}
    sm = inf[inf.op_class == "SOFTMAX"]
    assert len(sm) == 2 and set(sm.B) == {B * NH * S} and set(sm.H) == {S}


@pytest.mark.parametrize("fix", ["gpt2", "bert"])
def test_training_gemm_flops_about_three_times_forward(fix, request):
    inf, train = request.getfixturevalue(fix)
    g = ["LINEAR", "BMM"]
    fw = inf[inf.op_class.isin(g)].flops.sum()
    tr = train[train.op_class.isin(g) & train.phase.isin(["fw", "bw"])].flops.sum()
    assert tr / fw == pytest.approx(3.0, rel=0.01)


def test_training_phases_and_accumulation(gpt2):
    _, train = gpt2
    assert set(train.phase) == {"fw", "bw", "acc"}
    # one accumulation kernel per parameter (tied wte/lm_head counted once)
    acc = train[train.phase == "acc"]
    n_params = 2 + 2 * 12 + 2  # wte, wpe; per layer 12 tensors; ln_f weight+bias
    assert len(acc) == n_params
    assert (acc.op_class == "VEC").all() and (acc.sub_op == "add").all()
    no_acc = trace.trace_model(Step(model=TINY_GPT2, batch=B, seq=S, mode="train", grads="fresh"))
    assert "acc" not in set(no_acc.phase)


def test_kernel_table_columns_and_bytes(gpt2):
    inf, _ = gpt2
    assert list(inf.columns)[:len(trace.KERNEL_COLUMNS)] == trace.KERNEL_COLUMNS
    assert set(inf.op_class) <= set(schema.OP_CLASSES)
    assert table_info.info(inf).unclassified == {}
    # the first GEMM (c_attn) reads X [T x D], W [D x 3D], bias [3D] and writes [T x 3D], FP32
    first = inf[inf.op_class == "LINEAR"].iloc[0]
    assert first.bytes_read == 4 * (T * D + D * 3 * D + 3 * D)
    assert first.bytes_written == 4 * T * 3 * D
    # inference: no dropout kernels (eval mode); training: dropout appears
    assert not inf.aten_op.str.contains("dropout").any()


def test_unclassified_ops_are_kept_and_counted(monkeypatch):
    import torch

    out = torch.empty(4, 8, device="meta")
    c = aten_ops.classify("some_new_op", (), {}, [out], [out])
    assert c[0] == "UNCLASSIFIED" and c[1] == "" and c[6] == 8
    # an op the tables do not know (here: tanh, removed from them) is kept, counted and reported
    monkeypatch.delitem(aten_ops.UNARY, "tanh")
    with pytest.warns(UserWarning, match="UNCLASSIFIED"):
        df = trace.trace_model(Step(model=TINY_GPT2, batch=B, seq=S, mode="inf"))
    un = df[df.op_class == "UNCLASSIFIED"]
    assert len(un) == 2 and set(un.aten_op) == {"aten.tanh.default"}     # one per layer (GELU-tanh)
    assert table_info.info(df).unclassified == {"aten.tanh.default": 2}
    assert (un.flops == 0).all() and (un.bytes_read > 0).all()


def test_llama_config_traces(tmp_path):
    df = trace.trace_model(Step(model="llama2_7b", batch=1, seq=16, mode="inf"))
    lin = df[df.op_class == "LINEAR"]
    # 32 layers x (q, k, v, o, gate, up, down) + lm_head
    assert len(lin) == 32 * 7 + 1
    assert set(lin[lin.module.str.endswith("mlp.down_proj")].N) == {11008}


@pytest.mark.parametrize("bad, match", [
    (dict(model={"model_type": "no_such_model"}, batch=1, seq=8), "unsupported model type"),
    (dict(model=TINY_GPT2, batch=0, seq=8), "batch must be a positive integer"),
    (dict(model=TINY_GPT2, batch=1, seq=-3), "seq must be a positive integer"),
    (dict(model=TINY_GPT2, batch=1, seq=64), "exceeds"),
    (dict(model="no_such_name", batch=1, seq=8), "unknown model config"),
    (dict(model=TINY_GPT2, batch=1, seq=8, mode="bwd"), "mode must be"),
])
def test_bad_input_gives_one_line_error(bad, match):
    with pytest.raises(trace.TraceError, match=match) as e:
        trace.trace_model(Step(**bad))
    assert "\n" not in str(e.value)


def test_switch_routing_stand_in_fills_experts_up_to_capacity():
    cfg = {"name": "tiny_switch", "model_type": "switch_transformers",
           "architectures": ["SwitchTransformersForConditionalGeneration"], "d_model": 32, "d_ff": 64,
           "d_kv": 8, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2, "num_experts": 4,
           "expert_capacity": 3, "encoder_sparse_step": 2, "decoder_sparse_step": 2,
           "num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1, "vocab_size": 50}
    for mode in ("inf", "train"):
        df = trace.trace_model(Step(model=cfg, batch=2, seq=16, mode=mode))
        wi = df[(df.phase == "fw") & df.module.str.contains(r"experts\.expert_\d\.wi$")]
        # 16 tokens / 4 experts = 4 per sequence, capped at capacity 3 -> 3 x batch 2 = 6 rows
        assert len(wi) == 2 * 4 and set(wi.M) == {6} and set(wi.K) == {64}


def test_bert_uses_the_authors_heads_by_default():
    inf = trace.trace_model(Step(model=TINY_BERT, batch=B, seq=S, mode="inf"))
    train = trace.trace_model(Step(model=TINY_BERT, batch=B, seq=S, mode="train"))
    assert table_info.info(inf).model_class == "BertForSequenceClassification"
    assert table_info.info(train).model_class == "BertForPreTraining"
    lin = gemms(inf, "fw", "LINEAR")
    # pooler on the first token of each sequence, then a 2-way classifier; no vocabulary GEMM
    assert lin[(1, B, D, D)] == 1 and lin[(1, B, D, 2)] == 1
    assert not any(k[3] == V for k in lin)
    tl = gemms(train, "fw", "LINEAR")
    assert tl[(1, T, D, V)] == 1 and tl[(1, B, D, 2)] == 1   # MLM decoder + next-sentence head


def test_training_dropout_is_one_fused_kernel_as_on_cuda(gpt2):
    _, train = gpt2
    fw = train[train.phase == "fw"]
    assert (fw.aten_op == "aten.native_dropout.default").sum() == 1 + 2 * 3   # embeddings + 3 per layer
    assert not fw.aten_op.str.contains("bernoulli").any()
    assert (train.aten_op == "aten.native_dropout_backward.default").sum() == 7


@pytest.mark.parametrize("name, b, s, mode", [("gpt3_27", 1, 2048, "train"), ("llama2_70b", 1, 4096, "inf")])
def test_the_benchmark_workloads_trace_whole(benchmark, name, b, s, mode):
    """The benchmark workloads trace whole, every kernel classified (their speed: benchmarks/trace_speed.py; a timed
    assertion here would flake on a busy machine)."""
    k = benchmark.pedantic(trace.trace_model, args=(Step(model=name, batch=b, seq=s, mode=mode),), rounds=1, iterations=1)
    assert table_info.info(k).unclassified == {}
    assert len(k) > 1000


def test_decode_step_on_a_kv_cache(tmp_path):
    """One new token per sequence attending to past + 1 keys: BMMs (B*heads, 1, hd, past+1) and back."""
    import json
    cfg = tmp_path / "tiny_gpt2.json"
    cfg.write_text(json.dumps(dict(TINY_GPT2, n_positions=64)))
    k = trace.trace_model(Step(model=str(cfg), batch=B, seq=1, mode="inf", past=31))
    assert gemms(k, "fw", "BMM") == Counter({(B * NH, 1, HD, 32): 2, (B * NH, 1, 32, HD): 2})
    assert set(k.loc[k.op_class == "LINEAR", "M"]) == {B}       # one token per sequence
    with pytest.raises(trace.TraceError, match="inference only"):
        trace.trace_model(Step(model=str(cfg), batch=B, seq=1, mode="train", past=3))
    with pytest.raises(trace.TraceError, match="positions"):
        trace.trace_model(Step(model=str(cfg), batch=B, seq=8, mode="inf", past=60))


@pytest.mark.parametrize("mode, grads", [("train", False), ("train", True), ("inf", True)])
def test_a_reused_model_traces_as_a_new_one(mode, grads, monkeypatch):
    """``reusing_models``: one model built for several (batch, seq) points, each table (and its memory timeline) as a
    model built afresh gives; a gradient left by one training step must not turn the next into accumulation."""
    built = []
    real_build = trace.build_model
    monkeypatch.setattr(trace, "build_model", lambda *a, **k: built.append(1) or real_build(*a, **k))
    points = [(2, 8), (4, 16), (2, 8)]
    fresh = [trace.trace_model(Step(model=TINY_GPT2, batch=b, seq=s, mode=mode, grads="accumulate" if grads else "fresh")) for b, s in points]
    assert len(built) == 3
    built.clear()
    with trace.reusing_models({}):
        reused = [trace.trace_model(Step(model=TINY_GPT2, batch=b, seq=s, mode=mode, grads="accumulate" if grads else "fresh")) for b, s in points]
    assert len(built) == 1
    for a, b in zip(fresh, reused):
        cols = [c for c in a.columns if c not in ("reads", "writes")]   # buffer keys are storage addresses
        pd.testing.assert_frame_equal(a[cols], b[cols])
        ma, mb = table_info.info(a).memory, table_info.info(b).memory
        assert ma["activation_peak_bytes"] == mb["activation_peak_bytes"] > 0
        assert table_info.info(a).config == table_info.info(b).config
    assert (fresh[0]["phase"] == "acc").any() == (mode == "train" and grads)
