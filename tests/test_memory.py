"""Memory footprint (issue 11): the traced activation peak against PyTorch's own allocation records on
small real CPU models, and the fit verdicts of the CLI for Llama-2-70B on H100."""
from __future__ import annotations

import math

import pytest
import transformers

from neusight_core.question.step import Step
from neusight_core.tracing import table_info, trace
from neusight_core.cost import latency, memory, tables
from neusight_core.plans import parallel
from neusight_core.studies import whatif

# Tolerance of the activation peak against PyTorch's measured peak: 3 %. Why so tight: the tracer
# records the same aten ops the CPU runs (meta tensors go through the same decompositions) and
# frees a buffer when Python does, so only allocations inside a CPU kernel that the meta kernel does
# not make can differ (measured here: 0.00 % on every case below; 1 % on GPT-2 small before the
# KV cache was switched off in the measurement as in the tracer). On a GPU, cuBLAS/cuDNN workspaces
# and the caching allocator's rounding add to the measured peak; notebook 05 measures that there.
TOL = 0.03


def _gpt2_small():
    return transformers.GPT2Config(resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, architectures=["GPT2LMHeadModel"])


def _bert_base():
    return transformers.BertConfig(hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                                   architectures=["BertForMaskedLM"])


def _llama_2_layers():
    return transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                    architectures=["LlamaForCausalLM"])


SMALL = {"gpt2-small": _gpt2_small, "bert-base": _bert_base, "llama-2-layers": _llama_2_layers}
CASES = [("gpt2-small", 1, 32, "train"), ("gpt2-small", 2, 32, "inf"), ("bert-base", 2, 32, "train"),
         ("llama-2-layers", 1, 64, "train"), ("llama-2-layers", 4, 64, "train"), ("llama-2-layers", 4, 64, "inf")]


@pytest.fixture(scope="module")
def cpu_models():
    built = {}

    def get(name):
        if name not in built:
            built[name] = memory.build_cpu_model(SMALL[name]())
        return built[name]
    return get


@pytest.mark.parametrize("name,batch,seq,mode", CASES)
def test_activation_peak_matches_pytorch_measured_peak_on_cpu(cpu_models, name, batch, seq, mode):
    cfg = SMALL[name]()
    measured = memory.measure_cpu_peak(cfg, batch, seq, mode, model=cpu_models(name))["peak_bytes"]
    traced = trace.trace_model(Step(model=cfg, batch=batch, seq=seq, mode=mode), authors_heads=False)
    predicted = table_info.info(traced).memory["activation_peak_bytes"]
    assert measured > 1e6
    assert abs(predicted - measured) <= TOL * measured, (name, batch, seq, mode, predicted, measured)


def test_activation_peak_grows_with_batch():
    cfg = _llama_2_layers()
    a1 = table_info.info(trace.trace_model(Step(model=cfg, batch=1, seq=64, mode="train"), authors_heads=False)).memory["activation_peak_bytes"]
    a4 = table_info.info(trace.trace_model(Step(model=cfg, batch=4, seq=64, mode="train"), authors_heads=False)).memory["activation_peak_bytes"]
    assert 1.5 * a1 < a4 < 4 * a1   # batch-independent temporaries (embedding and LM-head gradients) damp it


def test_llama2_70b_training_does_not_fit_one_h100_and_the_cli_says_so_first(capsys):
    from neusight_core.__main__ import main
    rc = main(["predict", "--model", "llama2_70b", "--device", "H100", "--batch", "1", "--seq", "4096",
               "--mode", "train", "--predictor", "roofline"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("WARNING: does not fit: needs ") and out[0].endswith("has 80 GiB")
    needed = float(out[0].split("needs ")[1].split(" GiB")[0])
    assert needed > 16 * 68e9 / 2**30       # at least weights + grads + AdamW state, 16 B per parameter
    assert any("end-to-end" in line for line in out)   # the latency is still printed


def test_llama2_70b_tp8_reports_per_gpu_memory():
    k = tables.trace(Step(model="llama2_70b", batch=1, seq=4096, mode="train"))
    whole = memory.footprint(k, "H100")
    tp = memory.footprint(parallel.apply_plan(k, "tp", 8), "H100")
    assert tp["per_gpu"] and tp["gpus"] == 8
    # the split linears and the embeddings are >99 % of the parameters: close to 1/8 each
    assert tp["weights_gib"] == pytest.approx(whole["weights_gib"] / 8, rel=0.02)
    assert tp["optimizer_gib"] == pytest.approx(whole["optimizer_gib"] / 8, rel=0.02)
    assert whole["activations_gib"] / 8 < tp["activations_gib"] < whole["activations_gib"] / 2
    assert not tp["fits"] and tp["verdict"].endswith("per GPU, has 80 GiB")   # AdamW training: still too big
    # bf16 inference of the same model on 8 H100 fits per GPU (weights ~ 69e9 x 2 B / 8)
    r = latency.predict_model("llama2_70b", "H100", 1, 512, "inf", predictor="roofline", parallel="tp",
                              gpus=8, dtype="bf16")
    assert r["memory"]["fits"] and r["memory"]["verdict"] == "fits"
    assert r["memory"]["weights_gib"] == pytest.approx(69e9 * 2 / 8 / 2**30, rel=0.03)


def test_optimizer_and_dtype_accounting():
    k32 = trace.trace_model(Step(model=_llama_2_layers(), batch=1, seq=16, mode="train"), authors_heads=False)
    kb = trace.trace_model(Step(model=_llama_2_layers(), batch=1, seq=16, mode="train", dtype="bf16"), authors_heads=False)
    n = sum(table_info.info(k32).params.values())
    f32 = memory.footprint(k32)
    fb = memory.footprint(kb)
    assert f32["weights_gib"] * 2**30 == 4 * n and fb["weights_gib"] * 2**30 == 2 * n
    assert f32["optimizer_gib"] * 2**30 == 8 * n                  # AdamW moments
    assert fb["optimizer_gib"] * 2**30 == 12 * n                  # + FP32 master weights
    assert memory.footprint(kb, master_weights=False)["optimizer_gib"] * 2**30 == 8 * n
    assert memory.footprint(k32, optimizer="sgd")["optimizer_gib"] * 2**30 == 4 * n
    assert fb["activations_gib"] < 0.75 * f32["activations_gib"]
    with pytest.raises(memory.MemoryInputError, match="optimizer must be one of"):
        memory.footprint(k32, optimizer="lion")


def test_kv_cache_of_a_decode_step():
    cfg = _llama_2_layers()
    k = trace.trace_model(Step(model=cfg, batch=2, seq=1, mode="inf", past=100, dtype="bf16"), authors_heads=False)
    kv = table_info.info(k).memory["kv_cache_bytes"]
    assert kv == 2 * 2 * 4 * 100 * 64 * 2 * 2     # layers x (K, V) x kv heads x past x head dim x batch x 2 B
    assert memory.footprint(k)["kv_cache_gib"] * 2**30 == kv
    assert not math.isnan(memory.footprint(k)["activations_gib"])


def test_every_training_configuration_the_authors_measured_is_predicted_to_fit():
    # a label means the run fitted on that GPU (their loop: no optimizer step -> optimizer="none")
    d = whatif.label_fit_check()
    measured = d[d.authors_label]
    assert len(measured) >= 30
    assert measured.predicted_fits.all(), measured[~measured.predicted_fits]
    # and most of the grid they did not measure would not have fitted (e.g. GPT-2 Large b4 on L4/V100)
    assert (~d[~d.authors_label].predicted_fits).mean() > 0.6


def test_tp_split_of_a_table_with_shared_metadata_equals_the_unshared_one():
    """A traced table's ``TableInfo`` is shared by every copy pandas makes (not deep-copied); splitting for tensor
    parallelism gives the split a new record, leaves the original's untouched, and equals the split of a table
    whose record is a deep copy."""
    import copy
    import dataclasses

    import pandas as pd

    k = tables.trace(Step(model="llama2_7b", batch=1, seq=128, mode="inf", past=0, dtype="bf16"))
    info = table_info.info(k)
    assert table_info.info(k.copy()) is info and table_info.info(k[k["phase"] == "fw"]) is info
    plain = table_info.attach(k.copy(), dataclasses.replace(info, **{f.name: copy.deepcopy(getattr(info, f.name))
                                                                       for f in dataclasses.fields(info)}))
    assert table_info.info(plain) is not info and table_info.info(plain) == info
    before = copy.deepcopy(dataclasses.asdict(info))
    a, b = parallel.apply_plan(plain, "tp", 4), parallel.apply_plan(k, "tp", 4)
    assert table_info.info(k) is info and dataclasses.asdict(info) == before and info.plan is None
    assert table_info.info(b).plan == "tp" and table_info.info(b).gpus == 4
    cols = [c for c in a.columns if c not in ("reads", "writes")]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert memory.footprint(a) == memory.footprint(b)


def test_whatif_gives_no_time_to_a_run_that_cannot_happen_and_its_heat_map_says_why():
    """Issue 36 item 6: Llama-2-13B in bf16 (26 GB of weights) does not fit on P4s (8 GB) split over 2, and fits
    split over 8 T4s (16 GB) without NVLink: neither gets a time, and each heat-map cell says why; H100 does."""
    from neusight_core.reports import plots
    res = whatif.run(gpus=["Tesla_P4", "Tesla_T4", "NVIDIA_H100_80GB_HBM3"], dtypes=("bf16",), quick=True,
                     predictor="roofline", max_gpus=2)
    r = res[(res.model == "llama2_13b") & (res.workload == "prefill") & (res.batch == 1)].set_index("gpu")
    assert r.loc["Tesla_P4", "fit"].startswith("does not fit on 2: needs ")
    assert math.isnan(r.loc["Tesla_P4", "latency_ms"]) and math.isnan(r.loc["Tesla_P4", "tokens_per_s"])
    assert r.loc["Tesla_T4", "fit"] == "fits on 2 (tp2); no NVLink: TP latency not modelled"
    assert math.isnan(r.loc["Tesla_T4", "latency_ms"])
    assert r.loc["NVIDIA_H100_80GB_HBM3", "fit"] == "fits" and r.loc["NVIDIA_H100_80GB_HBM3", "latency_ms"] > 0
    assert not res[res.fit.str.startswith("does not fit")]["latency_ms"].notna().any()
    sel = res[res.model == "llama2_13b"].assign(gpu_short=lambda d: d["gpu"])
    fig = plots.plot_latency_heatmap(sel, "t", "n")
    cells = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "does not\nfit" in cells and "tp2:\nno link" in cells
    plots.plt.close(fig)
