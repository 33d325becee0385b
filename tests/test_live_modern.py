"""Notebook 05's modern section (issue 33) on CPU: the measurement loop, the step callables, the predictions."""
import pandas as pd
import pytest
import torch
from transformers import LlamaConfig

from neusight_core.question.step import Step
from neusight_core.cost import engine
from neusight_core import paths
from neusight_core.cost import request
from neusight_core.studies import live_modern as lm

TINY = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=2, vocab_size=128, max_position_embeddings=256)


def test_measures_every_case_on_cpu(tmp_path):
    cases = [lm.ModernCase(TINY, p, 1, 16, a) for p in lm.STEP_PHASES for a in lm.MEASURED_ATTENTIONS]
    rows = lm.run_modern(tmp_path, cases, device="cpu", time_budget_s=120, dtype="fp32", log=lambda s: None)
    assert [r["status"] for r in rows] == ["OK"] * len(cases)
    df = pd.read_csv(tmp_path / "modern_steps.csv")
    assert list(df.columns) == list(lm.STEP_COLUMNS)
    assert (df["events_ms"] > 0).all() and (df["wall_ms"] >= df["host_ms"]).all()
    host = (tmp_path / "modern_host.json").read_text()
    assert "cpu_dispatch_us" in host
    mem = pd.read_csv(tmp_path / "modern_memory_kernels.csv")       # the dry run's small appends, copies, products
    assert set(mem["status"]) == {"OK"} and (mem["achieved_gbs"] > 0).all()
    assert set(mem["aten_op"]) == {"aten.cat.default", "aten.clone.default", "aten.mul.Tensor", "aten._to_copy.default"}
    assert set(mem["memory_kind"]) == {"kv_append", "copy", "mul", "rotary_mul", "to_fp32", "rotate_half"}


def test_budget_leaves_cases_out(tmp_path):
    cases = [lm.ModernCase(TINY, "prefill", 1, 16, "sdpa")] * 2
    rows = lm.run_modern(tmp_path, cases, device="cpu", time_budget_s=0, dtype="fp32", log=lambda s: None)
    assert {r["status"] for r in rows} == {"BUDGET"}


def test_decode_step_decodes_the_same_step_every_call():
    m, cfg = lm.build(TINY, "cpu", torch.float32)
    fn, keep = lm.step_callable(m, cfg, lm.ModernCase(TINY, "decode", 2, 10, "sdpa"), "cpu")
    cache = keep[1]
    from neusight_core.tracing.meta_device_model import cache_tensors
    first = [t.data_ptr() for t in cache_tensors(cache)]
    for _ in range(3):
        fn()
        assert cache.get_seq_length() == 10
        # every call appends to the same contiguous cache, as generation does (a strided view after crop would
        # make the append take the generic copy kernel on a GPU)
        tensors = cache_tensors(cache)
        assert all(t.is_contiguous() for t in tensors)
        assert [t.data_ptr() for t in tensors] == first


def test_attention_switch_changes_the_kernels():
    m, cfg = lm.build(TINY, "cpu", torch.float32)
    lm.set_attention(m, "eager")
    assert m.config._attn_implementation == "eager"
    lm.set_attention(m, "sdpa")
    assert m.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="attention must be"):
        lm.set_attention(m, "flash")


def test_requests_of_measured_steps():
    row = {"model": "llama2_7b", "phase": "decode", "batch": 4, "seq": 2048, "attention": "sdpa"}
    r = lm.request_of(row, "H100", "eager")
    assert (r["seq"], r["past"], r["mode"], r["dtype"], r["execution"]) == (1, 2048, "inf", "bf16", "eager")
    assert lm.request_of(row, "H100", lm.PAPER_SETTING)["attention"] == "eager"
    t = lm.request_of(dict(row, phase="train"), "H100", "graph")
    assert (t["seq"], t["past"], t["mode"]) == (2048, 0, "train")


def test_predictions_and_mape():
    steps = pd.DataFrame([
        {"model": "llama2_7b", "phase": "decode", "batch": 1, "seq": 512, "attention": "sdpa", "status": "OK",
         "kernel_ms": 8.0, "wall_ms": 25.0},
        {"model": "llama2_7b", "phase": "prefill", "batch": 1, "seq": 512, "attention": "sdpa", "status": "OK",
         "kernel_ms": 20.0, "wall_ms": 22.0},
        {"model": "llama2_7b", "phase": "train", "batch": 1, "seq": 128, "attention": "eager", "status": "OOM"}])
    p = lm.predict_steps(steps, predictors=("roofline",))
    assert len(p) == 2 * len(lm.VARIANTS)                 # the OOM row is not predicted
    g = p[p["variant"] == "graph"].reset_index(drop=True)
    direct = engine.predict(request.parse([lm.request_of(r, "H100", "graph") for r in steps.head(2).to_dict("records")]),
                            "roofline")
    assert g["predicted_ms"].tolist() == pytest.approx(direct["e2e_ms"].tolist())
    assert g["measured_ms"].tolist() == [8.0, 20.0]
    e = p[p["variant"] == "eager"]
    assert (e["predicted_ms"] >= e["kernel_pred_ms"]).all() and (e["measured_ms"] == [25.0, 22.0]).all()
    m = lm.step_mape(p)
    ape = (g["error_pct"].abs()).mean()
    assert m.loc[("roofline", "graph"), "mean pooled"] == pytest.approx(round(ape, 1))


def test_section_without_gpu_predicts_the_recorded_run(tmp_path):
    r = lm.section(tmp_path, quick=True, predictors=("roofline",))
    assert r["status"] == "SKIPPED" and "no CUDA GPU" in r["reason"]
    assert r["steps"] is None
    assert set(r["pred"]["run"]) == set(lm.RECORDED) and len(lm.RECORDED) == 9
    assert r["pred"]["predicted_ms"].notna().all()
    # each recorded run is predicted on its own GPU: the H200's faster memory gives it the smaller roofline
    p = r["pred"].query("variant == 'graph'").set_index(["run", "model", "phase", "batch", "seq", "attention"])
    for day in ("2026-11-26", "2026-11-27", "2026-11-28"):
        both = p.loc[f"recorded H100 {day}"].join(p.loc[f"recorded H200 {day}"], lsuffix="_h100", rsuffix="_h200",
                                                  how="inner")
        assert len(both) and (both["predicted_ms_h200"] <= both["predicted_ms_h100"]).all()


def test_the_module_on_its_own_says_skipped_without_a_gpu(tmp_path):
    """``python -m neusight_core.studies.live_modern`` (benchmarks/gpu_session.sh's last step) on a machine without
    a CUDA GPU: one SKIPPED line with the reason and exit 0, as the notebook says it; nothing written."""
    import subprocess
    import sys
    from neusight_core import paths
    from neusight_core.studies import live_harness
    if live_harness.no_gpu_reason() is None:
        pytest.skip("this machine has a CUDA GPU: the module measures")
    r = subprocess.run([sys.executable, "-m", "neusight_core.studies.live_modern", "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.startswith("SKIPPED: no CUDA GPU") and len(r.stdout.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()


def test_memory_kernels_are_the_tracers_kv_cache_appends():
    """A row of ``live_kernels.memory_kernel_sweep`` is the row the tracer writes for the same append (a BF16 decode
    step's torch.cat of each layer's cache), and its kernel makes that append."""
    from neusight_core.tracing import trace
    from neusight_core.studies import live_kernels
    b, past = 2, 40
    t = trace.trace_model(Step(model=TINY, batch=b, seq=1, mode="inf", past=past, dtype="bf16", attention="sdpa"))
    cat = t[(t["aten_op"] == "aten.cat.default") & (t["B"] > past)]        # the KV appends (not rotary halves)
    assert len(cat) == 2 * TINY.num_hidden_layers                        # keys and values, every layer
    d = TINY.hidden_size // TINY.num_attention_heads
    sweep = live_kernels.memory_kernel_sweep(appends=[(b, TINY.num_key_value_heads, past, d)])
    row = sweep[sweep["aten_op"] == "aten.cat.default"].iloc[0]
    for c in ("op_class", "sub_op", "B", "H", "bytes_read", "bytes_written"):
        assert (cat[c] == row[c]).all(), c
    y = live_kernels.kernel_callable(row, device="cpu")()
    assert tuple(y.shape) == (b * TINY.num_key_value_heads, past + 1, d) and y.dtype == torch.bfloat16
    strided = sweep[sweep["cache_layout"] == "strided"].iloc[0]
    assert strided["aten_op"] == "aten.cat.default" and strided["bytes_read"] == row["bytes_read"]
    z = live_kernels.kernel_callable(strided, device="cpu")()
    assert z.shape == y.shape and z.is_contiguous()
    copy = live_kernels.kernel_callable(sweep[sweep["aten_op"] == "aten.clone.default"].iloc[0], device="cpu")()
    assert copy.shape == y.shape


def test_a_failing_memory_kernel_sweep_costs_the_steps_nothing(tmp_path, monkeypatch):
    """The memory kernels run first on a GPU session's short budget: their failure is one log line, and the steps
    are still measured."""
    from neusight_core.studies import live_kernels

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(live_kernels, "memory_kernel_sweep", boom)
    logs = []
    rows = lm.run_modern(tmp_path, [lm.ModernCase(TINY, "prefill", 1, 16, "sdpa")], device="cpu", time_budget_s=60,
                         dtype="fp32", log=logs.append)
    assert [r["status"] for r in rows] == ["OK"]
    assert "[modern] memory kernels failed: RuntimeError: boom" in logs


def test_elementwise_sweep_rows_are_the_tracers_rows_of_llama_prefill():
    """The element-wise rows of the memory sweep (``live_kernels.ELEMENTWISE``) are what the tracer writes for the
    same kernels of Llama-2-7B's 2,048-token BF16 prefill: the rotary q * cos (32 heads x 2,048 x 128), the RMSNorm
    upcast, a contiguous product of the MLP's size and rotate_half's cat; and each kernel makes a tensor of that row's output."""
    from neusight_core.tracing import trace_cache
    from neusight_core.studies import live_kernels as lk
    t = trace_cache.trace(Step(model="llama2_7b", batch=1, seq=2048, mode="inf", dtype="bf16", attention="sdpa"))
    t = t[t["layer"] == 0]
    cols = ("op_class", "aten_op", "B", "H", "flops", "bytes_read", "bytes_written", "precision")
    want = {"rotary_mul": t[(t["module"].str.endswith("self_attn")) & (t["aten_op"] == "aten.mul.Tensor")].iloc[0],
            "to_fp32": t[(t["aten_op"] == "aten._to_copy.default") & (t["precision"] == "fp32")].iloc[0],
            "mul": t[(t["module"].str.endswith(".mlp")) & (t["aten_op"] == "aten.mul.Tensor")].iloc[0],
            "rotate_half": t[(t["module"].str.endswith("self_attn")) & (t["aten_op"] == "aten.cat.default")].iloc[0]}
    sweep = lk.memory_kernel_sweep(appends=[], elementwise=[(32 * 2048, 128, "rotary_mul"), (2048, 4096, "to_fp32"),
                                                                 (2048, 11008, "mul"), (32 * 2048, 128, "rotate_half")])
    assert list(sweep["memory_kind"]) == ["rotary_mul", "to_fp32", "mul", "rotate_half"]
    for _, row in sweep.iterrows():
        tr = want[row["memory_kind"]]
        for c in cols:
            assert row[c] == tr[c], (row["memory_kind"], c, row[c], tr[c])
    small = lk.memory_kernel_sweep(quick=True)
    for _, row in small[small["memory_kind"].isin(lk.ELEMENTWISE_KINDS)].iterrows():
        y = lk.kernel_callable(row, device="cpu")()
        assert y.numel() * y.element_size() == row["bytes_written"], row["memory_kind"]


def test_recorded_agreement_takes_one_run_as_the_prediction_of_the_other(tmp_path, monkeypatch):
    """Two runs of one GPU kind on their common OK steps: |a / b - 1| by phase and pooled, both directions; a step
    only one run has, or a failed one, is left out."""
    import pandas as pd
    from neusight_core.studies import live_modern
    base = dict(model="m", batch=1, seq=8, attention="sdpa", status="OK")
    a = pd.DataFrame([dict(base, phase="decode", kernel_ms=1.0, wall_ms=10.0),
                      dict(base, phase="train", kernel_ms=4.0, wall_ms=8.0),
                      dict(base, phase="prefill", kernel_ms=9.0, wall_ms=9.0)])
    b = pd.DataFrame([dict(base, phase="decode", kernel_ms=1.0, wall_ms=8.0),
                      dict(base, phase="train", kernel_ms=5.0, wall_ms=8.0),
                      dict(base, phase="prefill", kernel_ms=1.0, wall_ms=1.0, status="FAILED")])
    for name, df in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        df.to_csv(tmp_path / name / "modern_steps.csv", index=False)
    monkeypatch.setattr(live_modern, "RECORDED", {"run a": ("H100", str(tmp_path / "a")),
                                                  "run b": ("H100", str(tmp_path / "b"))})
    t = live_modern.recorded_agreement().set_index(["measured", "taken as prediction"])
    assert set(t["steps"]) == {2} and "prefill" not in t.columns
    assert t.loc[("eager walls", "run a"), "decode"] == 25.0 and t.loc[("eager walls", "run b"), "decode"] == 20.0
    assert t.loc[("kernel sums", "run a"), "train"] == 20.0 and t.loc[("kernel sums", "run a"), "pooled"] == 10.0
    monkeypatch.setattr(live_modern, "STRIDED_APPENDS", {"run a"})     # another harness: not compared
    assert live_modern.recorded_agreement().empty


def test_a_run_without_its_csv_is_read_from_its_console():
    """The H200 run of 2026-11-28 lost its modern_steps.csv (the device returns 8 files); benchmarks/modern_steps.py
    --console reads its 32 steps from the section's log, in the CSV's columns, and they predict like a CSV's."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import modern_steps
    s = modern_steps.steps_from_console("docs/tier2/2026-11-28-h200-modern-paths")
    assert len(s) == 32 and (s["status"] == "OK").all()
    assert set(s["phase"]) == {"prefill", "decode", "train"} and set(s["attention"]) == {"sdpa", "eager"}
    assert (s["kernel_ms"] > 0).all() and (s["wall_ms"] >= s["kernel_ms"] * 0.9).all() and s["graph_ms"].isna().sum() == 12
    row = s[(s["model"] == "llama3_8b") & (s["phase"] == "train") & (s["attention"] == "eager")].iloc[0]
    assert (row["wall_ms"], row["kernel_ms"], row["kernels"]) == (182.08, 115.31, 4715)     # its log line
    p = lm.predict_steps(s.head(3), "H200", ("roofline",))
    assert len(p) == 9 and p["error_pct"].notna().all()
    # the CSV written from it (--save), which RECORDED reads as "recorded H200 2026-11-28 (2)", holds the same steps
    saved = pd.read_csv(paths.REPO_ROOT / lm.RECORDED["recorded H200 2026-11-28 (2)"][1] / "modern_steps.csv")
    assert list(saved.columns) == list(lm.STEP_COLUMNS)
    pd.testing.assert_frame_equal(saved[list(s.columns)].fillna({"graph_status": ""}), s, check_dtype=False)


def test_modern_tables_name_their_metric_variants_and_seeds():
    """The modern-step tables' columns say "mean pooled", not what is averaged: their title lines name the metric,
    the paper's-setting variant and the seeds the numbers are over."""
    t = lm.table_title("mape", [0, 1, 2], "recorded H100 2026-11-28")
    assert t.startswith("recorded H100 2026-11-28: MAPE (%)") and "seeds 0, 1, 2" in t and lm.PAPER_SETTING in t
    assert "seed 0" in lm.table_title("two_machines") and "MAPE (%)" in lm.table_title("two_machines")
    assert "MAPE (%)" in lm.table_title("run_to_run") and "no seed" in lm.table_title("run_to_run")
