"""End to end (issue 5): model latency through the real tracer and predictors, the CLI, notebook 04."""
import json

import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import latency
from neusight_core.studies import reproduce
from neusight_core.__main__ import main as cli

TINY = {"name": "tiny_gpt2", "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 64, "vocab_size": 128,
        "activation_function": "gelu_new"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, release_root):
    p = tmp_path_factory.mktemp("cfg") / "tiny_gpt2.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def _predict(tiny, **kw):
    # the paper's setting (eager attention, the kernel sum): these tests are about the kernel sums
    args = dict(model=tiny, device="A100-40GB", batch=8, seq=32, mode="train", predictor="roofline", quick=True,
                attention="eager", execution="graph")
    args.update(kw)
    return latency.predict_model(**args)


def test_aggregates_equal_sums_of_the_kernel_predictions(tiny):
    r = _predict(tiny)
    k = r["kernels"]
    assert (k["pred_ms"] > 0).all()
    assert r["fw_ms"] == pytest.approx(k.loc[k.phase == "fw", "pred_ms"].sum())
    assert r["e2e_ms"] == pytest.approx(k["pred_ms"].sum())
    assert sum(r["breakdown"].values()) == pytest.approx(r["e2e_ms"])
    assert r["bw_ms"] > r["fw_ms"]          # backward of a GEMM-heavy model costs more than forward


def test_dp_with_one_gpu_equals_single_gpu(tiny):
    single = _predict(tiny)["e2e_ms"]
    dp1 = _predict(tiny, parallel="dp", gpus=1, link_gbs=600)
    assert dp1["e2e_ms"] == pytest.approx(single, rel=1e-9)
    assert dp1["comm_ms"] == 0.0


@pytest.mark.parametrize("plan", ["tp", "pp"])
def test_tp_pp_communication_time_scales_with_link_bandwidth(tiny, plan):
    # the authors' model (comm bandwidth): the link alone; NCCL's fixed cost per all-reduce is test_collectives.py's
    slow = _predict(tiny, parallel=plan, gpus=2, link_gbs=100, comm="bandwidth")
    fast = _predict(tiny, parallel=plan, gpus=2, link_gbs=400, comm="bandwidth")
    assert slow["comm_ms"] > 0
    assert slow["comm_ms"] == pytest.approx(4 * fast["comm_ms"])
    # compute is untouched by the link: the difference is all communication
    assert slow["fw_ms"] + slow["bw_ms"] == pytest.approx(fast["fw_ms"] + fast["bw_ms"])
    assert slow["e2e_ms"] > fast["e2e_ms"]


def test_cli_predict_json_on_tiny_config(tiny, capsys):
    rc = cli(["predict", "--model", tiny, "--device", "H100", "--batch", "2", "--seq", "16", "--mode", "train",
              "--predictor", "roofline", "--quick", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("e2e_ms", "fw_ms", "bw_ms"):
        assert out[key] > 0
    assert out["device"] == "NVIDIA_H100_80GB_HBM3"


@pytest.mark.parametrize("args,needle", [
    (["--device", "H999"], "H999"),
    (["--model", "no_such_model"], "no_such_model"),
    (["--batch", "0"], "batch"),
])
def test_cli_bad_input_is_one_line(tiny, capsys, args, needle):
    base = {"--model": tiny, "--device": "H100", "--batch": "2", "--seq": "16"}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["predict", "--predictor", "roofline", "--quick"] + [x for kv in base.items() for x in kv]
    rc = cli(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: ") and "\n" not in err and needle in err


def test_cli_lists_devices_and_models(capsys, release_root):
    assert cli(["devices"]) == 0
    assert "NVIDIA_H100_80GB_HBM3" in capsys.readouterr().out
    assert cli(["models"]) == 0
    out = capsys.readouterr().out
    assert "gpt3_27" in out and "llama2_70b" in out


def test_option_mapping():
    paper = {"attention": "eager", "execution": "graph", "grads": "accumulate",   # the authors' loop kept gradients
             "comm": "bandwidth"}                                                # and their network model
    assert reproduce.option_kwargs("none") == paper
    assert reproduce.option_kwargs("fusion") == {**paper, "fusion": True}
    assert reproduce.option_kwargs("dp4") == {**paper, "parallel": "dp", "gpus": 4}
    assert reproduce.option_kwargs("pp4_1") == {**paper, "parallel": "pp", "gpus": 4, "micro_batches": 1}
    with pytest.raises(ValueError, match="zz9"):
        reproduce.option_kwargs("zz9")


def test_a_failing_configuration_is_recorded_not_invented(tiny):
    idx = pd.DataFrame([
        {"gpu": "NVIDIA_A100-PCIE-40GB", "model": tiny, "mode": "inf", "seq": 16, "batch": 2, "option": "none",
         "label_e2e_ms": 1.0},
        {"gpu": "NO_SUCH_GPU", "model": tiny, "mode": "inf", "seq": 16, "batch": 2, "option": "none",
         "label_e2e_ms": 1.0},
    ])
    out = reproduce.predict_configs(idx, predictors=("roofline",), quick=True, progress=False)
    assert out.loc[0, "ours_roofline_ms"] > 0 and out.loc[0, "ours_error"] == ""
    assert np.isnan(out.loc[1, "ours_roofline_ms"]) and "NO_SUCH_GPU" in out.loc[1, "ours_error"]
    assert np.isnan(out.loc[1, "ours_roofline_ape"])


def test_notebook_04_quick(run_notebook):
    out, metrics = run_notebook("04_reproduce_paper")
    assert metrics["status"] == "OK"
    assert metrics["configurations"] == len(reproduce.QUICK_CONFIGS) and metrics["failed"] == 0
    ours = pd.read_csv(out / "tables" / "per_config.csv")
    assert (ours["ours_neusight_ms"] > 0).all()
    # the APE column is computed from the label and our prediction, not copied
    ape = 100 * (ours["ours_neusight_ms"] - ours["label_e2e_ms"]).abs() / ours["label_e2e_ms"]
    assert np.allclose(ape, ours["ours_neusight_ape"])
    assert (out / "figures" / "nvidia_inf_ours.png").exists()
    assert metrics["prediction_time_s"]["warm"] < metrics["prediction_time_s"]["cold"]
    assert "Tier 1" in (out / "summary.md").read_text()
    # Tier 1 fidelity: both recipes over seeds, claims per recipe, ablation table
    assert set(metrics["claims_per_recipe"]) == {"neusight", "neusight-paper"}
    assert len(metrics["seeds"]) == 2
    per_seed = pd.read_csv(out / "tables" / "mape_per_seed.csv")
    assert set(per_seed[per_seed.predictor == "neusight-paper"]["seed"]) == {0, 1}
    assert set(per_seed[per_seed.predictor == "neusight"]["seed"]) == {0, 1}
    versus = pd.read_csv(out / "tables" / "ours_vs_authors_recipe.csv")
    from neusight_core.studies.recipe_eval import TARGETS
    assert "beats every seed" in versus and set(TARGETS) <= set(versus["group"])
    assert (out / "figures" / "recipes_per_gpu.png").exists() and (out / "figures" / "ablation.png").exists()
    abl = pd.read_csv(out / "tables" / "ablation.csv")
    # the base row trains on the ablation's reduced data (quick: 300 records per class), and its label says so
    assert abl["row"].iloc[0] == "neusight-paper (base), trained on 300 records per class"
    assert abl["row"].iloc[-1] == "all = neusight"
    assert "300 raw records per op class" in (out / "tables" / "ablation.md").read_text().splitlines()[0]
    # the graph row: both recipes' trained seeds on our trace and on the authors' graph
    from neusight_core.studies import recipe_eval as R, recipe_studies as S
    graph = pd.read_csv(out / "tables" / "ablation_graph.csv")
    assert list(graph["row"]) == [n for r in R.RECIPES for n in S.graph_names(r, ("authors", "no_mask"))]
    assert graph.filter(like=" mean").notna().all().all() and len(metrics["ablation_graph"]) == 6
    assert (out / "figures" / "ablation_graph.png").exists() and (out / "tables" / "ablation_graph_per_gpu.md").exists()


def test_missing_model_config_is_named_for_every_predictor():
    idx = pd.DataFrame([{"gpu": "NVIDIA_L4", "model": "switch4", "mode": "inf", "seq": 512, "batch": 1,
                         "option": "none", "label_e2e_ms": 1.0}])
    out = reproduce.predict_configs(idx, predictors=("roofline", "li"), quick=True, progress=False)
    err = out.loc[0, "ours_error"]
    assert err.startswith("all predictors: the authors' release ships no model config for 'switch4'")
    assert err.endswith("cannot be traced")  # a whole sentence, not cut


def test_small_kernel_report_passes_quick_on(monkeypatch):
    """Quick runs must never train the full predictors (it cost notebook 04 quick ~9 min)."""
    seen = {}

    def fake(model, dev, batch, seq, mode, **kw):
        seen.update(kw)
        raise RuntimeError("stop here")
    monkeypatch.setattr(reproduce.latency, "predict_model", fake)
    with pytest.raises(RuntimeError, match="stop here"):
        reproduce.small_kernel_report("gpt2_large", "H100", 1, 128, "inf", quick=True)
    assert seen.get("quick") is True
