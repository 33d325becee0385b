"""Issue 33: fused (sdpa) attention in the tracer and the engine, the host model, the options."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.data import configs
from neusight_core.cost import engine, host
from neusight_core.tracing import table_info, trace
from neusight_core.question import schema
from neusight_core.cost import request
from neusight_core.cost.scenario import LatencyInputError, PAPER, scenario


@pytest.fixture(scope="module")
def traces():
    """llama2_7b (32 layers, 32 heads) in BF16, both attentions: prefill, decode, training."""
    out = {}
    for att in schema.ATTENTIONS:
        out[att, "prefill"] = trace.trace_model(Step(model="llama2_7b", batch=2, seq=256, mode="inf", dtype="bf16", attention=att))
        out[att, "decode"] = trace.trace_model(Step(model="llama2_7b", batch=2, seq=1, mode="inf", past=256, dtype="bf16", attention=att))
        out[att, "train"] = trace.trace_model(Step(model="llama2_7b", batch=1, seq=128, mode="train", dtype="bf16", attention=att))
    return out


@pytest.mark.parametrize("phase,subs", [("prefill", {"prefill": 32}), ("decode", {"decode": 32}),
                                        ("train", {"prefill": 32, "backward": 32})])
def test_sdpa_trace_one_attention_row_per_layer_and_phase(traces, phase, subs):
    k = traces["sdpa", phase]
    a = k[k["op_class"] == "ATTN"]
    assert a["sub_op"].value_counts().to_dict() == subs
    assert a["layer"].nunique() == 32
    for sub in subs:        # one row per layer for each kind
        assert a[a["sub_op"] == sub]["layer"].is_unique
    # no Q K^T / P V products and no softmax over scores: the S x S matrix never exists
    assert not (k["op_class"] == "BMM").any()
    assert not ((k["op_class"] == "SOFTMAX") & (k["H"] == 256)).any()
    assert a[list(schema.ATTN_COLUMNS)].notna().all().all()


def test_sdpa_geometry_and_flops(traces):
    a = traces["sdpa", "decode"]
    row = a[a["op_class"] == "ATTN"].iloc[0]
    assert (row["B"], row["seq_q"], row["seq_kv"], row["heads"], row["kv_heads"], row["head_dim"]) == \
        (2, 1, 257, 32, 32, 128)
    assert row["flops"] == pytest.approx(4 * 2 * 32 * 128 * 257)       # decode: every cached key once
    p = traces["sdpa", "prefill"]
    row = p[p["op_class"] == "ATTN"].iloc[0]
    assert row["flops"] == pytest.approx(4 * 2 * 32 * 128 * 256 * 257 / 2)   # causal prefill: s(s+1)/2 pairs
    t = traces["sdpa", "train"]
    f, b = (t[(t["op_class"] == "ATTN") & (t["sub_op"] == s) & (t["layer"] == 0)].iloc[0]
            for s in ("prefill", "backward"))
    assert b["flops"] == pytest.approx(schema.ATTN_BACKWARD_FLOPS * f["flops"])
    assert b["phase"] == "bw" and f["phase"] == "fw"
    assert b["module"] == f["module"] == "model.layers.0.self_attn"


def test_sdpa_gqa_heads_and_less_memory(traces):
    k = trace.trace_model(Step(model="llama3_8b", batch=1, seq=64, mode="inf", dtype="bf16", attention="sdpa"))
    a = k[k["op_class"] == "ATTN"].iloc[0]
    assert (a["heads"], a["kv_heads"]) == (32, 8)
    # the eager trace holds S x S scores (and in training keeps them for backward): sdpa's activations are smaller
    for phase in ("prefill", "train"):
        assert (table_info.info(traces["sdpa", phase]).memory["activation_peak_bytes"]
                < table_info.info(traces["eager", phase]).memory["activation_peak_bytes"])


def test_eager_trace_has_no_attention_columns(traces):
    k = traces["eager", "prefill"]
    assert not (k["op_class"] == "ATTN").any()
    assert not set(schema.ATTN_COLUMNS) & set(k.columns)


def test_masked_attention_rows(tmp_path):
    """A full sliding window makes Hugging Face mask a decode step and pack the token's query heads of each KV head
    into the query axis (``pack_gqa``): still one decode kernel per layer over every query head and the window's
    keys, not a prefill of heads / kv_heads tokens. Below the window (no mask) the same rows come from ``enable_gqa``."""
    cfg = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "vocab_size": 1000, "max_position_embeddings": 1024, "sliding_window": 64}
    f = tmp_path / "mistral_small.json"
    f.write_text(json.dumps(cfg))
    for past, kv in ((40, 41), (200, 64)):
        k = trace.trace_model(Step(model=str(f), batch=3, seq=1, mode="inf", past=past, dtype="bf16", attention="sdpa"))
        a = k[k["op_class"] == "ATTN"]
        assert len(a) == 2 and set(a["sub_op"]) == {"decode"}, past
        assert (a[["B", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"]].to_numpy() == [3, 1, kv, 8, 2, 32]).all()
        assert a["flops"].tolist() == [4.0 * 3 * 8 * 32 * kv] * 2
    # a prompt past the window, and one after cached tokens, keep their multi-token rows; under their mask the kernel
    # (not FlashAttention) computes every (query, key) pair, which a causal count would halve
    for b, seq, past in ((1, 100, 0), (3, 10, 40)):
        k = trace.trace_model(Step(model=str(f), batch=b, seq=seq, mode="inf", past=past, dtype="bf16", attention="sdpa"))
        a = k[k["op_class"] == "ATTN"]
        assert set(a["sub_op"]) == {"prefill"}
        assert a["flops"].tolist() == [4.0 * b * 8 * 32 * seq * (seq + past)] * 2


def test_kv_cache_is_what_the_model_caches(tmp_path):
    """The decode step starts from the cache the model keeps: a sliding window's last tokens only (in their own
    storage, as a decode loop leaves them), DeepSeek V2's compressed latent (one head of kv_lora_rank keys and
    rope-part values) instead of per-head keys and values, which it could not be traced with before."""
    def kv_bytes(cfg, past):
        f = tmp_path / f"{cfg['model_type']}.json"
        f.write_text(json.dumps(cfg))
        k = trace.trace_model(Step(model=str(f), batch=2, seq=1, mode="inf", past=past, dtype="bf16", attention="sdpa"))
        return table_info.info(k).memory["kv_cache_bytes"]

    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
               "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "vocab_size": 1000, "max_position_embeddings": 1024, "sliding_window": 64}
    per_token = 2 * 2 * 2 * 32 * 2          # layers x (K, V) x KV heads x head dim x bytes, per sequence
    assert kv_bytes(mistral, 40) == 2 * 40 * per_token
    assert kv_bytes(mistral, 200) == 2 * 63 * per_token          # the window less the token being decoded
    deepseek = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
                "intermediate_size": 512, "moe_intermediate_size": 64, "n_routed_experts": 4, "n_shared_experts": 1,
                "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_attention_heads": 4,
                "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 32,
                "qk_rope_head_dim": 16, "v_head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000,
                "max_position_embeddings": 1024}
    assert kv_bytes(deepseek, 100) == 2 * 2 * 100 * (32 + 16) * 2   # batch x layers x tokens x latent x bytes
    # its complex rotary embedding: views (view_as_complex / _real, the conjugate bit) and one memory-bound polar
    k = trace.trace_model(Step(model=str(tmp_path / "deepseek_v2.json"), batch=1, seq=16, mode="train", dtype="bf16", attention="sdpa"))
    assert not (k["op_class"] == "UNCLASSIFIED").any()
    assert k["aten_op"].str.contains("polar").any()


def test_a_decode_step_of_a_recurrent_model_is_refused_in_one_line(tmp_path):
    """Mamba 2 (state-space layers) and Qwen3-Next (linear attention beside full attention) keep recurrent state, no
    keys and values of past tokens: their prefill is traced, their decode step refused in one line."""
    cfgs = {"mamba2": {"architectures": ["Mamba2ForCausalLM"], "hidden_size": 128, "num_hidden_layers": 2,
                       "vocab_size": 1000, "state_size": 16, "expand": 2, "n_groups": 1, "head_dim": 16, "num_heads": 16},
            "qwen3_next": {"architectures": ["Qwen3NextForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
                           "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "num_experts": 4,
                           "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                           "num_hidden_layers": 4, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
                           "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 4,
                           "linear_num_value_heads": 8, "vocab_size": 1000, "max_position_embeddings": 1024}}
    for mt, cfg in cfgs.items():
        f = tmp_path / f"{mt}.json"
        f.write_text(json.dumps({"model_type": mt, **cfg}))
        att = configs.default_attention(str(f))          # mamba2: eager, its class has no sdpa
        with pytest.warns(UserWarning, match="kept as UNCLASSIFIED"):     # their 1-D convolutions, named
            assert len(trace.trace_model(Step(model=str(f), batch=1, seq=32, mode="inf", dtype="bf16", attention=att))) > 0
        with pytest.raises(configs.TraceError, match=f"a decode step of '{mt}' is not modelled: its cache holds "
                                                     "recurrent state") as e:
            trace.trace_model(Step(model=str(f), batch=1, seq=1, mode="inf", past=16, dtype="bf16", attention=att))
        assert "\n" not in str(e.value)


def hf_model_types_without_sdpa() -> list[str]:
    """Every model type of the installed transformers whose model class (causal LM, else base model, else image
    classifier: what the tracer builds) has ``_supports_sdpa`` False, sorted. Imports every such class: about 12 s."""
    import transformers
    from transformers.models.auto import modeling_auto as ma
    classes = {}
    for mapping in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_MAPPING_NAMES,
                    ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES):
        for mt, cls in mapping.items():
            classes.setdefault(mt, cls if isinstance(cls, str) else cls[0])
    out = []
    for mt, name in classes.items():
        try:
            cls = getattr(transformers, name)
        except Exception:  # noqa: BLE001 - a class this transformers cannot import is no model anyone traces here
            continue
        if not getattr(cls, "_supports_sdpa", False):
            out.append(mt)
    return sorted(out)


def test_no_sdpa_list_is_the_installed_transformers():
    """The shipped list (attention_support.yaml) is what the installed transformers says, for every model type, so
    that a user's config of a type without fused attention (Gemma 2, GPT-OSS, ...) defaults to eager as Hugging Face
    builds it, instead of failing."""
    import transformers
    now = hf_model_types_without_sdpa()
    assert "gemma2" in now and "llama" not in now          # the scan itself sees both kinds
    assert sorted(configs.no_sdpa_model_types()) == now, (
        f"transformers {transformers.__version__} differs from neusight_core/data/attention_support.yaml: write "
        f"no_sdpa_model_types: {now}")


def test_user_config_without_sdpa_defaults_to_eager(tmp_path):
    cfg = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512}
    f = tmp_path / "gemma2_small.json"
    f.write_text(json.dumps(cfg))
    assert configs.default_attention(str(f)) == "eager"
    assert scenario(str(f), "H100", 1, 128, dtype="bf16").attention == "eager"
    with pytest.raises(LatencyInputError, match="gemma2 has no fused"):
        scenario(str(f), "H100", 1, 128, dtype="bf16", attention="sdpa")


def test_default_attention_is_what_hugging_face_picks():
    import transformers
    for name in ("llama2_7b", "gpt2_large", "bert_large", "vit_b16", "resnet50", "switchxl4", "qwen2_5_1_5b"):
        cfg = configs.load_config(name)
        arch = (cfg.architectures or [None])[0]
        cls = getattr(transformers, arch, None) if arch else None
        if cls is None:
            continue
        # resnet has no attention at all: eager means "no fused kernel" there
        want = "sdpa" if getattr(cls, "_supports_sdpa", False) and cfg.model_type != "resnet" else "eager"
        assert configs.default_attention(name) == want, name
    assert scenario("llama2_7b", "H100", 1, 128).attention == "sdpa"
    assert scenario("llama2_7b", "H100", 1, 128).execution == "eager"
    assert scenario("switchxl4", "H100", 1, 128).attention == "eager"


def test_options_validated():
    with pytest.raises(LatencyInputError, match="attention must be one of"):
        scenario("llama2_7b", "H100", 1, 128, attention="flash")
    with pytest.raises(LatencyInputError, match="execution must be one of"):
        scenario("llama2_7b", "H100", 1, 128, execution="compiled")
    with pytest.raises(LatencyInputError, match="no fused"):
        scenario("switchxl4", "H100", 1, 128, attention="sdpa")
    df = engine.predict(request.parse([dict(model="llama2_7b", device="H100", batch=1, seq=64, attention="flash"),
                                       dict(model="llama2_7b", device="H100", batch=1, seq=64, dtype="bf16",
                                            attention="sdpa")]),
                        "roofline")
    assert "attention must be one of" in df["error"].iloc[0]
    assert df["error"].iloc[1] == "" and df["ATTN_ms"].iloc[1] > 0


def test_cli_options():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "neusight_core", "predict", "--model", "llama2_7b", "--device",
                               "H100", "--batch", "1", "--seq", "64", "--dtype", "bf16", "--predictor", "roofline",
                               *args], capture_output=True, text=True)
    bad = run("--attention", "flash")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    ok = run("--attention", "sdpa", "--execution", "graph", "--json")
    assert ok.returncode == 0, ok.stderr
    r = json.loads(ok.stdout)
    assert r["attention"] == "sdpa" and r["execution"] == "graph"
    assert r["e2e_ms"] == pytest.approx(r["kernel_ms"]) and r["host_ms"] == 0


# ---------------------------------------------------------------- execution: the host model
def test_graph_is_the_kernel_sum_and_eager_at_least_the_host():
    reqs = [dict(model="llama2_7b", device="H100", batch=1, seq=1, past=512, dtype="bf16", execution=e)
            for e in ("graph", "eager")]
    df = engine.predict(request.parse(reqs), "roofline", keep_kernels=True)
    g, e = df.iloc[0], df.iloc[1]
    kernels = engine.run_info(df).kernels[0]
    assert g["e2e_ms"] == pytest.approx(kernels["pred_ms"].sum(), rel=1e-12)
    assert g["e2e_ms"] == g["kernel_ms"] and g["host_ms"] == 0 and not g["host_bound"]
    assert e["kernel_ms"] == pytest.approx(g["kernel_ms"], rel=1e-12)
    assert e["host_ms"] == pytest.approx(e["kernels"] * host.launch_us() / 1e3)
    gpu = e["kernel_ms"] + e["kernels"] * host.eager_gap_us() / 1e3
    assert e["e2e_ms"] == pytest.approx(max(gpu, e["host_ms"]))
    assert bool(e["host_bound"]) == (e["host_ms"] > gpu)


def test_host_model_on_a_fake_calibration(monkeypatch):
    step, h, bound = host.step_ms([10.0, 10.0, 10.0], [100, 1000, 1000], ["eager", "eager", "graph"],
                                  per_launch_us=20.0)
    g = host.eager_gap_us()
    np.testing.assert_allclose(step, [10.0 + 100 * g / 1e3, 20.0, 10.0])   # GPU-bound: kernels + the eager gaps
    np.testing.assert_allclose(h, [2.0, 20.0, 0.0])
    assert bound.tolist() == [False, True, False]
    monkeypatch.setenv("NEUSIGHT_HOST_LAUNCH_US", "50")
    assert host.launch_us() == 50
    df = engine.predict(request.parse([dict(model="llama2_7b", device="H100", batch=1, seq=1, past=64, dtype="bf16")]),
                        "roofline")
    assert df["host_ms"].iloc[0] == pytest.approx(df["kernels"].iloc[0] * 50 / 1e3)
    monkeypatch.setenv("NEUSIGHT_HOST_LAUNCH_US", "-3")
    with pytest.raises(ValueError, match="NEUSIGHT_HOST_LAUNCH_US"):
        host.launch_us()
    # the GPU's own cost per eager launch: a given one, the environment's, and 0 (no gap) allowed, negative refused
    step, _, _ = host.step_ms([10.0], [1000], ["eager"], per_launch_us=1.0, gap_us=2.0)
    assert step[0] == pytest.approx(12.0)
    monkeypatch.setenv("NEUSIGHT_EAGER_GAP_US", "0")
    assert host.eager_gap_us() == 0 and host.step_ms([10.0], [1000], ["eager"], per_launch_us=1.0)[0][0] == 10.0
    monkeypatch.setenv("NEUSIGHT_EAGER_GAP_US", "-1")
    with pytest.raises(ValueError, match="NEUSIGHT_EAGER_GAP_US"):
        host.eager_gap_us()


def test_calibration_runs_on_cpu():
    c = host.calibrate(repeats=3)
    assert c["kernels"] > 50 and c["train_kernels"] > 2 * c["kernels"]      # forward + backward of 8 tokens
    assert 0 < c["per_kernel_cpu_us"] < 1000 and 0 < c["train_per_kernel_cpu_us"] < 1000
    assert c["launch_us"] == pytest.approx(c["per_kernel_cpu_us"] + host.CUDA_LAUNCH_EXTRA_US)
    assert "gpu_decode_us" not in c and "on the CPU" in c["launch_source"]


def test_calibration_on_a_gpu_uses_the_tiny_model_run_there(monkeypatch, capsys):
    """With a GPU the per-launch cost is the tiny model's decode step run on it (host-bound by construction), not
    the CPU figure plus a launch cost; the CPU figures are still reported. A fake GPU here: the device's
    ``tiny_step_us`` and launch timing are stand-ins, the CPU run is real."""
    import torch
    real = host.tiny_step_us
    seen = []

    def fake(device, repeats=30):
        seen.append(device)
        if device == "cuda":
            return {"decode_us": 31.0, "train_us": 36.0, "decode_kernels": 161, "train_kernels": 494}
        return real(device, repeats)
    monkeypatch.setattr(host, "tiny_step_us", fake)
    monkeypatch.setattr(host, "_cuda_launch_extra_us", lambda n=5000: 3.9)
    monkeypatch.setattr(host, "queued_launch_us", lambda: {"eager_queued_us": 2.1, "graph_us": 1.0, "n": 500})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    c = host.calibrate(cuda=True, repeats=2)
    assert seen == ["cpu", "cuda"]
    assert c["launch_us"] == 31.0 and c["gpu_train_us"] == 36.0 and "on this GPU" in c["launch_source"]
    assert c["cuda_launch_extra_us"] == 3.9 and c["extra_source"] == "measured here"
    assert c["eager_gap_us"] == pytest.approx(1.1)      # eager minus graph, per queued launch
    assert 0 < c["per_kernel_cpu_us"] < 1000
    from neusight_core.__main__ import main as cli
    monkeypatch.setattr(host, "calibrate", lambda cuda=True, repeats=30: c)
    assert cli(["host", "--repeats", "2"]) == 0
    assert "export NEUSIGHT_EAGER_GAP_US=1.10" in capsys.readouterr().out


def test_the_host_verb_measures_and_says_how_to_use_it(capsys, monkeypatch):
    """`neusight host` runs the calibration here and prints the per-launch cost to give NEUSIGHT_HOST_LAUNCH_US;
    set there, it is the cost in use (what the engine charges per launch: the fake-calibration test above)."""
    import json
    from neusight_core.__main__ import main as cli
    monkeypatch.delenv("NEUSIGHT_HOST_LAUNCH_US", raising=False)
    assert cli(["host", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    import torch
    assert ("no CUDA GPU here" in out) == (not torch.cuda.is_available())    # a GPU's launch is measured there
    assert f"in use now: {host.DEFAULT_LAUNCH_US} us (the default" in out
    export = next(x for x in out.splitlines() if "export NEUSIGHT_HOST_LAUNCH_US=" in x)
    us = float(export.split("=")[1])
    assert us > host.CUDA_LAUNCH_EXTRA_US
    monkeypatch.setenv("NEUSIGHT_HOST_LAUNCH_US", str(us))
    assert cli(["host", "--repeats", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["in_use_us"] == us and got["in_use_source"] == "NEUSIGHT_HOST_LAUNCH_US" and got["kernels"] > 50
    assert cli(["host", "--repeats", "0"]) == 2 and "--repeats must be at least 1" in capsys.readouterr().err


def test_paper_setting_is_the_old_answer():
    """The reproduction's setting (eager attention, kernel sum) answers exactly what the engine answered before
    issue 33 for the same request: the eager trace's kernel sum (Tier 0/1 unchanged)."""
    from neusight_core.cost import tables
    from neusight_core.studies import reproduce
    req = dict(model="gpt2_large", device="H100", batch=4, seq=512, mode="train")
    assert {k: v for k, v in reproduce.option_kwargs("none").items()} == PAPER
    df = engine.predict(request.parse([dict(req, **PAPER)]), "roofline", keep_kernels=True)
    k = tables.kernel_table(Step(model="gpt2_large", batch=4, seq=512, mode="train"))          # the tracer's default: eager attention
    pk = tables.predict_kernels(k, "H100", "roofline")
    assert df["e2e_ms"].iloc[0] == pytest.approx(tables.aggregate(pk)["e2e_ms"], rel=1e-9)
    assert not (engine.run_info(df).kernels[0]["op_class"] == "ATTN").any()


def test_tensor_parallel_splits_attention_heads():
    df = engine.predict(request.parse([dict(model="llama2_7b", device="H100", batch=1, seq=256, dtype="bf16",
                                            attention="sdpa", parallel="tp", gpus=4, execution="graph")]),
                        "roofline", keep_kernels=True)
    assert df["error"].iloc[0] == ""
    a = engine.run_info(df).kernels[0]
    a = a[a["op_class"] == "ATTN"]
    assert set(a["heads"]) == {8.0} and set(a["kv_heads"]) == {8.0}


# ---------------------------------------------------------------- BF16 memory-bound rows
def test_half_rows_become_their_byte_equivalent_fp32_kernel():
    from neusight_core.predictors import common
    k = pd.DataFrame({"op_class": ["VEC", "SOFTMAX", "LINEAR", "VEC"], "precision": ["bf16", "bf16", "bf16", "fp32"],
                      "B": [4096.0, 1.0, 1.0, 10.0], "H": [4096.0, 2048.0, np.nan, 7.0], "M": np.nan,
                      "flops": [4096.0 ** 2, 5 * 2048.0, 1e9, 70.0], "bytes_read": [2 * 4096.0 ** 2, 4096.0, 1e6, 280.0],
                      "bytes_written": [2 * 4096.0 ** 2, 4096.0, 1e6, 280.0]})
    out = common.half_as_fp32(k)
    assert out["precision"].tolist() == ["fp32", "fp32", "bf16", "fp32"]
    assert out["B"].tolist()[:2] == [2048.0, 1.0] and out["H"].tolist()[:2] == [4096.0, 1024.0]
    # same bytes, half the elements: 4 bytes per element, the FP32 networks' world
    elements = out["B"] * out["H"]
    assert (out["bytes_read"].iloc[:2] / elements.iloc[:2]).tolist() == [4.0, 4.0]
    assert out["flops"].iloc[0] == k["flops"].iloc[0] / 2
    pd.testing.assert_frame_equal(out.iloc[2:], k.iloc[2:])          # GEMM and FP32 rows untouched


def test_attention_backward_is_predicted_as_its_forward_times_the_flop_ratio():
    from neusight_core.cost import tables
    t = trace.trace_model(Step(model="llama2_7b", batch=1, seq=128, mode="train", dtype="bf16", attention="sdpa"))
    a = t[(t["op_class"] == "ATTN") & (t["layer"] == 0)].reset_index(drop=True)
    p = tables.predict_kernels(a, "H100", "neusight", quick=True)
    fw, bw = (p.loc[p["sub_op"] == s, "pred_ms"].iloc[0] for s in ("prefill", "backward"))
    assert bw == pytest.approx(schema.ATTN_BACKWARD_FLOPS * fw, rel=1e-9)


def test_execution_table_side_by_side_against_the_floor():
    from neusight_core.studies import bf16_checks
    t = bf16_checks.execution_table(gpus=["H100"], quick=True, predictor="roofline")
    assert (t["error"] == "").all()
    assert len(t) == 2 * len(bf16_checks.EXECUTION_VARIANTS)
    for work, g in t.groupby("workload"):
        v = g.set_index("variant")
        graph, eager = v.loc["sdpa, graph"], v.loc["sdpa, eager PyTorch"]
        assert graph["e2e_ms"] == graph["kernel_ms"] and eager["kernel_ms"] == pytest.approx(graph["kernel_ms"])
        assert eager["e2e_ms"] == pytest.approx(max(eager["kernel_ms"], eager["host_ms"]))
        # the roofline of every kernel is never below the floor of the whole step
        assert (g["e2e_ms"] >= g["floor_ms"]).all() and g["floor_ms"].notna().all()
        assert set(g["fit"]) == {"fits"}


@pytest.mark.parametrize("model,mode,seq,past", [("llama2_7b", "inf", 300, 0), ("gpt2_large", "train", 200, 0),
                                                 ("llama2_7b", "inf", 1, 512)])
def test_sdpa_tables_are_derived_exactly(model, mode, seq, past):
    """Shape derivation (table_families.py) covers fused-attention tables: the ATTN rows' FLOPs are b s^2, their geometry
    linear in s, inside its basis; a sweep of sdpa tables need not trace each one."""
    from neusight_core.tracing import table_families
    fam = table_families.family_for(model, 4, seq, mode, past=past, dtype="bf16", attention="sdpa", allow_fixed=True)
    assert fam is not None and fam.ok, getattr(fam, "reason", None)
    real = trace.trace_model(Step(model=model, batch=4, seq=seq, mode=mode, past=past, dtype="bf16", attention="sdpa"))
    assert (real["op_class"] == "ATTN").any()
    assert table_families.compare(fam.table(4, seq), real) == ""


def test_traced_scope_is_what_the_tracer_emits_and_all_the_scoped_network_trains_on(traces):
    """Issue 33 item 6: a network with ``traced_scope`` trains on the database's attention rows whose shapes the tracer
    emits (no sliding window, head dim <= 256) and on nothing else; every row a trace emits is in that scope."""
    from neusight_core.predictors import tensor_core as tc
    for (att, phase), k in traces.items():
        assert tc.traced_scope(k).all(), (att, phase)
    gqa = trace.trace_model(Step(model="llama3_2_1b", batch=1, seq=1, mode="inf", past=64, dtype="bf16", attention="sdpa"))
    assert tc.traced_scope(gqa).all()
    rows = pd.DataFrame({"op_class": "ATTN", "sub_op": "decode", "precision": "bf16", "device": ["g"] * 6,
                         "B": 1.0, "seq_q": 1.0, "seq_kv": 512.0, "heads": 8.0, "kv_heads": 8.0,
                         "head_dim": [64.0, 128.0, 256.0, 512.0, 128.0, 128.0],
                         "window": [np.nan, 0.0, 0.0, 0.0, 128.0, np.nan], "latency_ms": 0.01,
                         "M": np.nan, "N": np.nan, "K": np.nan})
    assert tc.traced_scope(rows).tolist() == [True, True, True, False, False, True]
    cfg = {**tc.DEFAULTS, "rows_per_gpu": 100}
    assert len(tc.training_rows(rows, "ATTN_decode", cfg, False, 0)) == 6
    kept = tc.training_rows(rows, "ATTN_decode", {**cfg, "traced_scope": ["ATTN_decode"]}, False, 0)
    assert kept["head_dim"].tolist() == [64.0, 128.0, 256.0, 128.0]
    assert len(tc.training_rows(rows, "ATTN_decode", {**cfg, "traced_scope": ["ATTN_prefill"]}, False, 0)) == 6


def test_the_default_eager_gap_is_the_recorded_measurement():
    """host.EAGER_GAP_US is the mean of the lent H100's and H200's eager-minus-graph time per queued launch, as
    their queued_launch.json files hold it (docs/tier2/2026-11-28-*), not a number tuned on the steps."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "docs" / "tier2"
    gaps = [json.loads((root / run / "queued_launch.json").read_text())
            for run in ("2026-11-28-h100-paths", "2026-11-28-h200-modern-paths")]
    assert all(g["n"] == 500 for g in gaps)
    assert host.EAGER_GAP_US == pytest.approx(np.mean([g["eager_queued_us"] - g["graph_us"] for g in gaps]), abs=0.005)
