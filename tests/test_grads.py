"""Where a training step's gradients start (``--grads``): fresh (PyTorch's default, no accumulation kernels) or
accumulate (the paper's loop: one more kernel per parameter)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neusight_core.question.step import Step
from neusight_core.cost import engine
from neusight_core.cost import request
from neusight_core.tracing import trace_cache
from neusight_core.cost.scenario import PAPER, LatencyInputError, scenario
from neusight_core.studies import live_modern

BASE = dict(model="llama3_2_1b", device="H100", seq=128, mode="train", dtype="bf16", attention="sdpa",
            execution="graph")


@pytest.mark.parametrize("keep_kernels", [False, True], ids=["derived", "traced"])
def test_fresh_gradients_drop_the_accumulation_rows_and_nothing_else(keep_kernels):
    """Fresh = the accumulate answer without its ``acc`` phase: one launch fewer per parameter tensor, the same
    forward and backward; the derived tables (several batches of one model) and the traced ones agree."""
    reqs = [dict(BASE, batch=b, grads=g) for g in ("fresh", "accumulate") for b in (2, 4)]
    df = engine.predict(request.parse(reqs), "roofline", keep_kernels=keep_kernels)
    assert (df["error"] == "").all()
    fresh, acc = df.iloc[:2].reset_index(drop=True), df.iloc[2:].reset_index(drop=True)
    t = trace_cache.trace(Step(model="llama3_2_1b", batch=2, seq=128, mode="train", dtype="bf16", attention="sdpa"))
    n_acc = int(t.loc[t["phase"] == "acc", "count"].sum())
    assert n_acc > 100 and (acc["kernels"] - fresh["kernels"] == n_acc).all()
    assert (fresh["acc_ms"] == 0).all() and (acc["acc_ms"] > 0).all()
    for col in ("fw_ms", "bw_ms"):
        assert fresh[col].to_numpy() == pytest.approx(acc[col].to_numpy(), rel=1e-12)
    assert fresh["e2e_ms"].to_numpy() == pytest.approx((acc["e2e_ms"] - acc["acc_ms"]).to_numpy(), rel=1e-12)
    if keep_kernels:
        kept = engine.run_info(df).kernels
        assert not (kept[0]["phase"] == "acc").any() and (kept[2]["phase"] == "acc").sum() > 0


def test_grads_defaults_and_checks():
    assert scenario("llama3_2_1b", "H100", 2, 128, "train").grads == "fresh"          # what people run
    assert PAPER["grads"] == "accumulate"                                              # the reproduction's
    assert scenario("gpt2_large", "H100", 8, 128, "train", parallel="pp", gpus=2).grads == "accumulate"
    with pytest.raises(LatencyInputError, match="pipeline parallelism .* accumulates"):
        scenario("gpt2_large", "H100", 8, 128, "train", parallel="pp", gpus=2, grads="fresh")
    with pytest.raises(LatencyInputError, match="grads must be one of fresh, accumulate"):
        scenario("llama3_2_1b", "H100", 2, 128, "train", grads="zero")
    # a configuration row names it like any field; inference tables are shared whatever it says
    df = engine.predict(request.parse([dict(BASE, batch=2, grads="kept"), dict(BASE, batch=2, mode="inf", grads="fresh"),
                                       dict(BASE, batch=2, mode="inf", grads="accumulate")]), "roofline")
    assert "grads must be one of" in df["error"].iloc[0]
    assert df["e2e_ms"].iloc[1] == df["e2e_ms"].iloc[2] and (df["error"].iloc[1:] == "").all()


def test_cli_grads():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "neusight_core", "predict", "--model", "llama3_2_1b", "--device",
                               "H100", "--batch", "2", "--seq", "128", "--mode", "train", "--dtype", "bf16",
                               "--predictor", "roofline", "--execution", "graph", *args], capture_output=True, text=True)
    bad = run("--grads", "kept")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    fresh, acc = (json.loads(r.stdout) for r in (run("--json"), run("--grads", "accumulate", "--json")))
    assert fresh["grads"] == "fresh" and acc["grads"] == "accumulate"
    assert fresh["acc_ms"] == 0 and acc["acc_ms"] > 0 and acc["launches"] > fresh["launches"]


def test_recorded_training_steps_are_predicted_from_fresh_gradients():
    """Notebook 05 times a training step with its gradients set to None after each call: predicted as fresh; the
    paper's-setting variant (``PAPER_SETTING``) accumulates them, as the paper's setting did."""
    row = dict(model="llama2_7b", phase="train", batch=1, seq=1024, attention="sdpa")
    assert live_modern.request_of(row, "H100", "graph")["grads"] == "fresh"
    assert live_modern.request_of(row, "H100", live_modern.PAPER_SETTING)["grads"] == "accumulate"
