"""Live-GPU harness, device detection and the 05_live_gpu notebook, all on CPU with fakes."""
from __future__ import annotations

import json

import pandas as pd

import pytest

from neusight_core.question.step import Step
from neusight_core import paths
from neusight_core.studies import live, live_harness, live_kernels
from neusight_core.reports import live_report

GiB = 2**30


class FakeTimer:
    """Returns the given times in order (ms), counting calls; raises `exc` on call number `fail_at`."""

    def __init__(self, times, exc=None, fail_at=None, clock=None, cost_s=0.0):
        self.times, self.calls, self.exc, self.fail_at, self.clock, self.cost_s = list(times), 0, exc, fail_at, clock, cost_s

    def __call__(self, fn):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise self.exc
        if self.clock is not None:
            self.clock.t += self.cost_s
        return self.times[self.calls - 1]


def test_mean_of_five_fastest_of_25_after_warmup():
    warm = [1000.0, 900.0, 800.0]                    # warm-up is slow and must be ignored
    timed = [float(x) for x in range(30, 5, -1)]     # 25 values 30..6
    t = FakeTimer(warm + timed)
    m = live_harness.measure(lambda: None, timer=t)
    assert t.calls == 28 and m.status == "OK" and len(m.times_ms) == 25
    assert m.mean_ms == pytest.approx((6 + 7 + 8 + 9 + 10) / 5)


def test_warmup_values_not_counted_even_if_fastest():
    t = FakeTimer([0.001] * 3 + [5.0] * 25)
    assert live_harness.measure(lambda: None, timer=t).mean_ms == pytest.approx(5.0)


def test_oom_recorded_not_raised():
    import torch
    t = FakeTimer([1.0] * 30, exc=torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), fail_at=5)
    m = live_harness.measure(lambda: None, timer=t)
    assert m.status == "OOM" and m.mean_ms is None and "out of memory" in m.reason


def test_other_errors_propagate():
    t = FakeTimer([1.0] * 30, exc=ValueError("bad shape"), fail_at=2)
    with pytest.raises(ValueError):
        live_harness.measure(lambda: None, timer=t)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_time_budget_never_exceeded():
    clock = Clock()
    budget = live_harness.TimeBudget(10.0, clock=clock)
    t = FakeTimer([1000.0] * 30, clock=clock, cost_s=1.0)   # each call takes 1 s of (fake) wall time
    m = live_harness.measure(lambda: None, timer=t, budget=budget)
    assert m.status == "BUDGET" and m.mean_ms is None
    assert clock.t <= 10.0 and t.calls == 10


def test_budget_sufficient_gives_result():
    clock = Clock()
    t = FakeTimer([2.0] * 28, clock=clock, cost_s=0.002)
    m = live_harness.measure(lambda: None, timer=t, budget=live_harness.TimeBudget(1.0, clock=clock))
    assert m.status == "OK" and m.mean_ms == pytest.approx(2.0)


def test_measure_kernels_cpu_records_budget_and_oom():
    k = live_kernels.kernel_sweep(quick=True)
    assert set(k["op_class"]) == {"LINEAR", "BMM", "VEC", "SOFTMAX", "LAYERNORM"}
    out = live_kernels.measure_kernels(k.head(2), timer=FakeTimer([0.5] * 100), device="cpu")
    assert list(out["status"]) == ["OK", "OK"] and out["measured_ms"].tolist() == [0.5, 0.5]
    clock = Clock()
    clock.t = 5.0
    b = live_harness.TimeBudget(1.0, clock=clock)
    clock.t = 10.0                                             # already over budget
    out = live_kernels.measure_kernels(k.head(2), timer=FakeTimer([0.5] * 100), budget=b, device="cpu")
    assert list(out["status"]) == ["BUDGET", "BUDGET"]


def test_kernel_callables_run_on_cpu():
    for _, row in live_kernels.kernel_sweep(quick=True).iterrows():
        y = live_kernels.kernel_callable(row, device="cpu")()
        assert y.numel() > 0


@pytest.mark.parametrize("props,expected", [
    (live_harness.GpuProperties("NVIDIA H100 80GB HBM3", 80 * GiB, 132), "NVIDIA_H100_80GB_HBM3"),
    (live_harness.GpuProperties("NVIDIA H100 PCIe", 80 * GiB, 114), "NVIDIA_H100_PCIe"),
    (live_harness.GpuProperties("NVIDIA H200", 141 * GiB, 132), "NVIDIA_H200"),
    (live_harness.GpuProperties("NVIDIA A100-PCIE-40GB", 40 * GiB, 108), "NVIDIA_A100-PCIE-40GB"),
    (live_harness.GpuProperties("NVIDIA A100-SXM4-40GB", 40 * GiB, 108), "NVIDIA_A100-SXM4-40GB"),
    (live_harness.GpuProperties("NVIDIA A100 80GB PCIe", 80 * GiB, 108), "NVIDIA_A100_80GB_PCIe"),
])
def test_identify_known(props, expected):
    d = live_harness.identify(props)
    # the catalogue may use its own ids for our spec-sheet additions; the family must still match
    assert d.known and not d.estimated_fields
    assert d.name.replace("-", "_").lower().startswith(expected.replace("-", "_").lower()[:16]), d.name
    if expected == "NVIDIA_H100_80GB_HBM3":
        assert "pcie" not in d.name.lower()
    if expected == "NVIDIA_H100_PCIe":
        assert "pcie" in d.name.lower()


def test_identify_unknown_warns_with_estimated_fields():
    with pytest.warns(UserWarning, match="estimated fields"):
        d = live_harness.identify(live_harness.GpuProperties("Imaginary GPU X9", 24 * GiB, 77))
    assert not d.known and d.name.startswith("UNKNOWN") and "mem_bw_gbs" in d.estimated_fields


def test_unknown_gpu_gets_a_derived_entry_that_predicts(release_root):
    with pytest.warns(UserWarning):
        d = live_harness.identify(live_harness.GpuProperties("Imaginary GPU X9", 24 * GiB, 77))
    dev = d.device
    # measured fields kept, the rest from the nearest-SM-count GPU (V100, 80 SMs) with FLOPS scaled
    assert dev.num_sm == 77 and dev.mem_gb == 24.0 and not dev.training
    from neusight_core.data import devices
    v100 = devices.get_device("Tesla_V100-PCIE-32GB")
    assert dev.fp32_gflops == pytest.approx(v100.fp32_gflops * 77 / 80)
    assert "estimated" in dev.source and "V100" in dev.source
    k = live_kernels.kernel_sweep(quick=True)
    pred, why = live.predict_live_kernels(k, dev, predictor="roofline", quick=True)
    assert why is None and (pred > 0).all()


def test_precision_flags():
    import torch
    live_harness.set_precision("fp32")
    assert torch.backends.cuda.matmul.allow_tf32 is False
    with pytest.raises(ValueError):
        live_harness.set_precision("fp8")


def test_notebook_quick_cpu_skipped(run_notebook):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this test checks the no-GPU path")
    out, metrics = run_notebook("05_live_gpu", time_budget_s=60)
    assert metrics["status"] == "SKIPPED" and metrics["reason"].startswith("no CUDA GPU")
    for name in ("live_kernels", "live_models", "live_llama", "live_vision", "fusion_live", "parallel_live"):
        body = json.loads((out / f"{name}.json").read_text())
        assert body["software"]["torch"] and body["skipped_reason"].startswith("no CUDA GPU")
        assert body["rows"]
        for row in body["rows"]:
            assert all(row[k] is None for k in row if k.startswith("measured"))
    par = json.loads((out / "parallel_live.json").read_text())
    assert any(r["gpus"] == 8 for r in par["rows"])
    # issue 25: the external database's BF16 GEMMs are not measured, and the notebook says why
    assert metrics["bf16_external_gemm"]["skipped_reason"].startswith("no CUDA GPU")
    assert metrics["bf16_external_gemm"]["mape"] is None
    assert not (out / "tables" / "local_gpu_bf16_gemm.csv").exists()
    # issue 33's scoring of the recorded pairs of two machines (step_ranges): a table and its pooled numbers
    two = metrics["modern"]["two_machines_pooled_mape"]
    assert {k.split()[0] for k in two} == {"H100", "H200"} and all(v >= 0 for v in two.values())
    assert (out / "tables" / "live_modern_two_machines.csv").is_file()


def test_measure_model_tiny_on_cpu_inf_and_train():
    from transformers import GPT2Config
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    for mode in ("inf", "train"):
        m = live.measure_model(cfg, 2, 16, mode, timer=FakeTimer([1.0] * 40), device="cpu")
        assert m.status == "OK" and m.mean_ms == pytest.approx(1.0)
    # a real call of the built training step produces gradients-free model afterwards (zero_grad)
    fn = live.model_callable(cfg, 1, 8, "train", device="cpu", num_layers=1)
    fn()


def test_model_built_in_its_dtype_and_not_built_once_budget_is_spent():
    import torch
    from transformers import GPT2Config
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    out = live.model_callable(cfg, 1, 8, "inf", device="cpu", dtype=torch.bfloat16)()
    assert out.logits.dtype == torch.bfloat16
    # a spent budget: no model is built (building one can take minutes), status BUDGET with the reason
    spent = live_harness.TimeBudget(1.0, clock=iter([0.0, 5.0, 5.0]).__next__)
    built = []
    orig = live.model_callable
    live.model_callable = lambda *a, **k: built.append(1) or orig(*a, **k)
    try:
        m = live.measure_model(cfg, 1, 8, "inf", timer=FakeTimer([1.0] * 40), budget=spent, device="cpu")
    finally:
        live.model_callable = orig
    assert m.status == "BUDGET" and "before this model was built" in m.reason and not built


def test_label_gap_flag():
    assert live.label_gap(120.0, 100.0)["flag_stack_differs"] is True
    assert live.label_gap(110.0, 100.0)["flag_stack_differs"] is False
    assert live.label_gap(None, 100.0)["label_gap_pct"] is None


def test_bf16_extension_changes_dtype():
    import torch
    row = live_kernels.kernel_sweep(quick=True).iloc[0]
    cfg = live_harness.HarnessConfig(precision="bf16")
    assert live_kernels.kernel_callable(row, "cpu", dtype=live_harness.harness_dtype(cfg))().dtype == torch.bfloat16
    assert live_kernels.kernel_callable(row, "cpu", dtype=live_harness.harness_dtype(live_harness.HarnessConfig()))().dtype == torch.float32


def test_scenario_tables_show_predictions_and_summary_rows():
    df = pd.DataFrame([{"name": "a", "gpu": "G", "extension": False, "measured_ms": None, "author_label_ms": None,
                        "predicted": {"e2e_ms": 12.5, "fw_ms": 4.0}},
                       {"name": "b", "gpu": "", "extension": True, "measured_ms": 3.0, "author_label_ms": 2.0,
                        "predicted": None}])
    flat = live_report.flat_table(df)
    assert flat.loc[0, "predicted_e2e_ms"] == 12.5 and "predicted" not in flat
    r = {"head": {"predicted_for": "T", "device": None}, "skip": "no GPU", "paper": df,
         "llama": df.iloc[:0], "parallel": df.iloc[:0]}
    md = live_report.summary_markdown(r)
    assert "SKIPPED" in md and "| a | G | 12.5 | SKIPPED | — |" in md and "| b (extension) | T | — | 3.0 | 2.0 |" in md
    # a run without a GPU points to the recorded GPU runs, which exist, and quotes none of their numbers
    assert "docs/tier2.md" in md and (paths.REPO_ROOT / "docs" / "tier2.md").is_file()


def _live_result(**rows):
    empty = pd.DataFrame()
    return {"head": {"predicted_for": "T", "device": None}, "skip": "no CUDA GPU here",
            "kernels": pd.DataFrame({"pred_ms": [1.0], "pred_reason": [None]}),
            "paper": rows.get("paper", empty), "llama": empty, "parallel": empty, "fusion": empty}


def test_failed_prediction_is_failed_not_skipped():
    ok = pd.DataFrame([{"name": "a", "predicted": {"e2e_ms": 1.0}, "predicted_reason": None}])
    assert live_report.outcome(_live_result(paper=ok)) == ("SKIPPED", "no CUDA GPU here")
    bad = pd.DataFrame([{"name": "a", "predicted": None,
                         "predicted_reason": "prediction unavailable: DeviceFileError: bad file x.yaml"}])
    status, reason = live_report.outcome(_live_result(paper=bad))
    assert status == "FAILED" and "1 of 2 predictions failed" in reason and "x.yaml" in reason
    r = _live_result(paper=bad)
    assert live_report.tier2_verdicts(r, status, reason)["summary"] == reason
    assert "**05_live_gpu FAILED**" in live_report.summary_markdown(r)
    # a configuration that cannot run on its GPU is an answer, not a failure
    impossible = pd.DataFrame([{"name": "a", "predicted": None,
                                "predicted_reason": live.NOT_POSSIBLE + "impossible on H100: at least 237 GB"}])
    assert live_report.outcome(_live_result(paper=impossible))[0] == "SKIPPED"
    # a malformed user device file, end to end: every prediction fails
    p, why = live.predict_case(live.LiveCase("a", "gpt2_large", 1, 128, "inf"), "No_Such_GPU", quick=True)
    assert p is None and why.startswith("prediction unavailable")
    # the full run's pipeline-parallel training case is predicted (its micro-batches accumulate their gradients)
    case = live.LiveCase("gpt2_large-train-1024-4-pp4_1", "gpt2_large", 4, 256, "train", "pp", 4, "NVIDIA_A100-SXM4-40GB")
    p, why = live.predict_case(case, case.gpu, quick=True, parallel=case.parallel, gpus=case.gpus, optimizer="none")
    assert why is None and p["e2e_ms"] > 0 and p["acc_ms"] > 0


@pytest.mark.slow
def test_notebook_05_with_a_malformed_device_file_is_failed(run_notebook, tmp_path, monkeypatch):
    """Every prediction fails (the catalogue cannot load a user's file): FAILED, never SKIPPED."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("devices:\n  My_GPU: {mem_gb: 48, num_sm: -3}\n")
    monkeypatch.setenv("NEUSIGHT_DEVICES", str(bad))  # the kernel inherits it
    out, metrics = run_notebook("05_live_gpu", time_budget_s=60)
    assert metrics["status"] == "FAILED" and "predictions failed" in metrics["reason"]
    assert "broken.yaml" in metrics["reason"]
    assert metrics["verdicts"]["tier"] == 2 and metrics["verdicts"]["summary"] == metrics["reason"]
    assert "**05_live_gpu FAILED**" in (out / "summary.md").read_text()


def test_a_model_that_fails_to_run_is_recorded_as_error_and_the_run_goes_on():
    from transformers import GPT2Config
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)

    def broken(fn):
        raise RuntimeError("backend compiler failed\nInductorError: no C compiler")
    m = live.measure_model(cfg, 1, 8, "inf", timer=broken, device="cpu")
    assert m.status == "ERROR" and m.reason == "RuntimeError: InductorError: no C compiler"


def test_tier2_verdict_counts_only_rows_that_have_a_label():
    """The first H100 run said '0 of 9' for 6 labelled rows: rows without a label are NaN in the frame."""
    rows = [{"name": "a", "measured_ms": 100.0, "predicted": {"e2e_ms": 110.0}, **live.label_gap(100.0, 102.0)},
            {"name": "b", "measured_ms": 100.0, "predicted": {"e2e_ms": 90.0}, **live.label_gap(100.0, 130.0)},
            {"name": "c", "measured_ms": 50.0, "predicted": {"e2e_ms": 50.0}, **live.label_gap(50.0, None)}]
    r = {**_live_result(paper=pd.DataFrame(rows)), "skip": None, "head": {"predicted_for": "T", "device": {"display_name": "G"}}}
    text = live_report.tier2_verdicts(r, "OK", "")["summary"]
    assert "measured 3 scenarios on G" in text and "MAPE 6.7 % over 3" in text and "extensions" not in text
    assert "1 of 2 more than 15 % apart" in text
    # an extension (a model the paper did not measure) gets its own MAPE, never mixed into the paper's
    ext = {"name": "v", "measured_ms": 10.0, "predicted": {"e2e_ms": 15.0}, "extension": True, **live.label_gap(10.0, None)}
    r["vision"] = pd.DataFrame([ext])
    text = live_report.tier2_verdicts(r, "OK", "")["summary"]
    assert "measured 4 scenarios" in text and "MAPE 6.7 % over 3 (extensions, extrapolated: 50.0 % over 1)" in text


def test_live_model_predictions_count_no_optimizer_state(monkeypatch, tmp_path):
    """The measured training step has no optimizer step, so the predicted memory beside its measured peak holds no
    optimizer state (the first H100 run compared a peak without it to a prediction with AdamW's 8 B per weight)."""
    seen = []
    monkeypatch.setattr(live, "predict_case", lambda *a, **k: seen.append(k) or (None, live.NOT_POSSIBLE + "fake"))
    monkeypatch.setattr(live, "predict_live_kernels", lambda *a, **k: (None, "fake"))
    live.run_live(tmp_path, quick=True, time_budget_s=1)
    model_calls = [k for k in seen if "dtype" in k]
    assert model_calls and all(k["optimizer"] == "none" for k in model_calls)


def test_sections_share_the_budget_and_pass_on_what_they_leave():
    """Kernels 2 : paper models 4 : Llama 2 : vision 2 : fusion 3 of the time left when each section starts."""
    now = [0.0]
    total = live_harness.TimeBudget(130.0, clock=lambda: now[0])
    assert live_harness.section_budget(total, "kernels").seconds == pytest.approx(20.0)
    now[0] = 8.0                                   # the kernels took 8 s of their 20: 122 s left for 4 + 2 + 2 + 3
    assert live_harness.section_budget(total, "paper").seconds == pytest.approx(122.0 * 4 / 11)
    now[0] = 115.0                                 # the models overran: 15 s left for 2 + 2 + 3
    assert live_harness.section_budget(total, "llama").seconds == pytest.approx(15.0 * 2 / 7)
    now[0] = 120.0                                 # 10 s left for 2 + 3
    assert live_harness.section_budget(total, "vision").seconds == pytest.approx(4.0)
    now[0] = 125.0
    assert live_harness.section_budget(total, "fusion").seconds == pytest.approx(5.0)   # the last takes all that is left
    now[0] = 150.0
    assert live_harness.section_budget(total, "fusion").seconds == 0.0


def test_decode_step_on_a_kv_cache_keeps_its_length_from_call_to_call():
    """One decode step after ``past`` cached tokens (the Llama-2 decode scenarios): every timed call sees the
    same cache length, because the step's new entry is cropped off again."""
    import torch
    from transformers import LlamaConfig
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    step = live.model_callable(cfg, 2, 1, "inf", device="cpu", past=16)
    for _ in range(3):
        out = step()
        assert out.logits.shape == (2, 1, 100)
        assert out.past_key_values.get_seq_length() == 16
    # the same step by hand: a fresh prefill of 16 random tokens, then one token, gives a cache of 17 before cropping
    with pytest.raises(ValueError, match="inference only"):
        live.model_callable(cfg, 1, 1, "train", device="cpu", past=16)
    m = live.measure_model(cfg, 1, 1, "inf", timer=FakeTimer([2.0] * 40), device="cpu", past=8)
    assert m.status == "OK" and m.mean_ms == pytest.approx(2.0)
    assert torch.is_grad_enabled()


def test_recorded_run_predicted_again_with_every_seed(tmp_path):
    """benchmarks/tier2_seeds.py: a recorded table (here one made up row per table) predicted per seed; the
    APE is against the recorded measurement, FP32 for the paper table and BF16 for the Llama-2 one."""
    pd.DataFrame([{"name": "gpt2_large-inf-128-1", "model": "gpt2_large", "batch": 1, "seq": 128, "mode": "inf",
                   "past": 0, "precision": "fp32", "measured_ms": 10.0, "predicted_e2e_ms": 11.0}]
                 ).to_csv(tmp_path / "live_paper.csv", index=False)
    pd.DataFrame([{"name": "x", "model": "gpt2_large", "batch": 1, "seq": 128, "mode": "inf", "past": 0,
                   "precision": "bf16", "measured_ms": None, "predicted_e2e_ms": 3.0}]
                 ).to_csv(tmp_path / "live_llama.csv", index=False)      # nothing measured: no row
    # an image model recorded before LiveCase had an image_size: its side in seq
    pd.DataFrame([{"name": "resnet50-inf-224px-32", "model": "resnet50", "batch": 32, "seq": 224, "mode": "inf",
                   "past": 0, "measured_ms": 20.0, "predicted_e2e_ms": 21.0}]).to_csv(tmp_path / "live_vision.csv",
                                                                                    index=False)
    t = live_report.recorded_predictions(tmp_path, "NVIDIA_H100_80GB_HBM3", seeds=(0, 1), quick=True)
    vision = t[t["table"] == "live_vision"]
    assert len(vision) == 2 and vision["pred_ms"].gt(0).all() and (vision["measured_ms"] == 20.0).all()
    t = t[t["table"] != "live_vision"]
    assert list(t["seed"]) == [0, 1] and set(t["table"]) == {"live_paper"} and set(t["precision"]) == {"fp32"}
    assert (t["measured_ms"] == 10.0).all() and t["pred_ms"].gt(0).all()
    assert t["ape"].to_numpy() == pytest.approx((t["pred_ms"] - 10.0).abs().to_numpy() * 10)
    assert t["pred_ms"].iloc[0] != t["pred_ms"].iloc[1]           # two seeds, two networks


def test_image_models_run_on_cpu_inference_and_training():
    """ResNet and ViT (issue 26) take a batch of square images of side ``seq``; a decode step is refused."""
    from transformers import ResNetConfig, ViTConfig
    resnet = ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck", num_labels=10)
    vit = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, patch_size=8,
                    image_size=16, num_labels=10)
    for cfg, side in ((resnet, 32), (vit, 64)):     # the ViT is built for the side asked, not its config's 16
        assert live.model_callable(cfg, 2, side, "inf", device="cpu")().logits.shape == (2, 10)
        m = live.measure_model(cfg, 2, side, "train", timer=FakeTimer([2.0] * 40), device="cpu")
        assert m.status == "OK" and m.mean_ms == pytest.approx(2.0)
    with pytest.raises(ValueError, match="image model"):
        live.model_callable(resnet, 1, 32, "inf", device="cpu", past=4)
    scen = live.vision_scenarios()
    assert {s.model for s in scen} == {"resnet50", "vit_b16"} and {s.mode for s in scen} == {"inf", "train"}
    assert all(s.extension and s.seq is None and s.image_size == s.tracer_size == 224 and s.size == {"image_size": 224}
               for s in scen) and len(live.vision_scenarios(quick=True)) == 1


def test_conv_kernel_sweep_is_resnet50s_training_convolutions_and_runs_on_cpu():
    import torch
    from neusight_core.tracing import trace_cache
    k = live_kernels.conv_kernel_sweep()
    model, batch, size = live_kernels.CONV_SWEEP
    t = trace_cache.trace(Step(model=model, batch=batch, seq=size, mode="train"))
    conv = t[t["op_class"] == "CONV"]
    # every convolution of the step, once per distinct shape, with how often it runs
    assert int(k["count"].sum()) == int(conv["count"].sum()) and set(k["sub_op"]) == {"fwd", "dgrad", "wgrad"}
    assert not k.duplicated(["sub_op", "conv_cin", "conv_cout", "conv_k", "conv_in", "conv_stride"]).any()
    assert {(1, 1), (3, 2), (7, 2), (3, 1)} <= set(zip(k["conv_k"].astype(int), k["conv_stride"].astype(int)))
    quick = live_kernels.conv_kernel_sweep(quick=True)
    assert sorted(quick["sub_op"]) == ["dgrad", "fwd", "wgrad"] and (quick["B"] == 2).all()
    # each row's call returns the tensor its kind produces: output, grad of the input, grad of the weight
    for _, row in quick.iterrows():
        n, cin, cout, kk, side = (int(row[c]) for c in ("B", "conv_cin", "conv_cout", "conv_k", "conv_in"))
        y = live_kernels.kernel_callable(row, device="cpu")()
        out = (side + 2 * int(row["conv_pad"]) - kk) // int(row["conv_stride"]) + 1
        want = {"fwd": (n, cout, out, out), "dgrad": (n, cin, side, side), "wgrad": (cout, cin, kk, kk)}
        assert tuple(y.shape) == want[row["sub_op"]] and torch.isfinite(y).all()


def test_kernel_mape_per_kind_with_convs_by_sub_op():
    k = pd.DataFrame({"op_class": ["LINEAR", "LINEAR", "CONV", "CONV", "CONV"],
                      "sub_op": ["", "", "fwd", "wgrad", "wgrad"],
                      "measured_ms": [1.0, 2.0, 1.0, 1.0, None], "pred_ms": [1.1, 1.8, 0.5, 3.0, 1.0]})
    t = live_kernels.kernel_mape(k).set_index("kind")
    assert list(t.index) == ["LINEAR", "CONV fwd", "CONV wgrad"]      # an unmeasured row is not counted
    assert t.loc["LINEAR", "MAPE %"] == pytest.approx(10.0) and t.loc["LINEAR", "bias %"] == pytest.approx(0.0)
    assert t.loc["CONV wgrad", "kernels"] == 1 and t.loc["CONV wgrad", "bias %"] == pytest.approx(200.0)


def test_kernel_scatter_colours_convs_by_kind(tmp_path):
    from neusight_core.reports import plots, report
    k = pd.DataFrame({"op_class": ["LINEAR", "CONV", "CONV", "CONV"], "sub_op": ["", "fwd", "dgrad", "wgrad"],
                      "measured_ms": [1.0, 2.0, 3.0, None], "pred_ms": [1.2, 1.5, 6.0, 2.0]})
    fig = plots.plot_live_kernels(k)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["LINEAR", "CONV fwd", "CONV dgrad"]
    assert ax.get_xscale() == "log" and len(ax.collections) == 3
    report.save_figure(fig, tmp_path, "k")
    assert (tmp_path / "figures" / "k.png").is_file()
