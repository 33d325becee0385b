"""The question declared once (step.py): every option is one field of ``step.Scenario`` with its metadata, and
everything that names the options is generated from those fields; the checks that come with the fields."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from neusight_core.cost import engine, latency, sweep
from neusight_core import paths
from neusight_core.question import step
from neusight_core.cost import request, scenario
from neusight_core.tracing import trace_cache
from neusight_core.question.schema import Attention, Comm, Execution, Grads
from neusight_core.question.step import LatencyInputError, Step

CLI = [sys.executable, "-m", "neusight_core"]


def _run(argv, **kw):
    return subprocess.run(CLI + argv, capture_output=True, text=True, cwd=paths.REPO_ROOT, **kw)


# ------------------------------------------------------------------------------ one declaration
def test_the_defaults_are_declared_once_and_read_from_the_fields():
    opts = step.options()
    assert step.INPUTS == list(opts) == [f.name for f in dataclasses.fields(step.Scenario)]
    # the paper's setting: the fields that declare one
    assert step.PAPER == {"attention": Attention.EAGER, "execution": Execution.GRAPH, "grads": Grads.ACCUMULATE,
                          "comm": Comm.BANDWIDTH}
    # the dataclass's defaults are the user's (a rule or a required field has none: scenario() resolves it)
    fields = {f.name: f for f in dataclasses.fields(step.Scenario)}
    assert fields["execution"].default == Execution.EAGER and fields["comm"].default == Comm.NCCL
    for name in ("attention", "grads", "gpus", "link_gbs", "model", "device", "batch"):
        assert fields[name].default is dataclasses.MISSING
    # a question that says nothing gets every plain default as declared
    sc = scenario.scenario("gpt2_large", "H100", 2, 128)
    for name, o in opts.items():
        if o.user is not step.REQUIRED and not isinstance(o.user, step.Rule) and name not in ("seq",):
            assert getattr(sc, name) == o.user, name
    assert (sc.gpus, sc.grads, sc.attention, sc.link_gbs) == (1, Grads.FRESH, Attention.SDPA, None)   # the rules
    # the paper's setting asked for explicitly
    paper = scenario.scenario("gpt2_large", "H100", 2, 128, **step.PAPER)
    assert {k: getattr(paper, k) for k in step.PAPER} == step.PAPER


def test_the_cli_states_the_declared_defaults():
    out = _run(["predict", "--help"], env={**os.environ, "COLUMNS": "400"}).stdout
    for name, o in step.options().items():
        assert "--" + name.replace("_", "-") in out
        if o.paper is not step.REQUIRED:
            assert f"the paper's: {o.paper}" in out
    assert "(default: eager; the paper's: graph)" in out
    assert "4 with --parallel (the paper's setting), else 1" in out


def test_a_step_is_the_table_fields_and_requests_that_share_a_table_share_a_step():
    table = [n for n, o in step.options().items() if o.table]
    assert [f.name for f in dataclasses.fields(Step)] == table
    assert "device" not in table and "execution" not in table and "comm" not in table
    a = scenario.scenario("gpt2_large", "H100", 2, 128, "train", execution="graph")
    b = scenario.scenario("gpt2_large", "A100", 2, 128, "train", execution="eager", comm="bandwidth")
    assert a.step == b.step and hash(a.step) == hash(b.step)          # another GPU or launch mode: the same table
    # a field that does not change the table takes its neutral value: GPUs and gradients outside their use
    inf = scenario.scenario("gpt2_large", "H100", 2, 128, grads="fresh")
    assert inf.step == scenario.scenario("gpt2_large", "H100", 2, 128, grads="accumulate").step
    assert inf.step.grads == Grads.ACCUMULATE
    assert a.step.grads == Grads.FRESH and a.step != scenario.scenario("gpt2_large", "H100", 2, 128, "train",
                                                                        grads="accumulate").step
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.step.batch = 4


def test_the_trace_cache_key_is_read_from_the_step():
    s = Step(model="bert_large", batch=2, seq=64, mode="inf")
    assert trace_cache.trace_kwargs(s) == trace_cache.trace_kwargs(s.replace(fusion=True, parallel="tp", gpus=2))
    assert trace_cache.trace_kwargs(s)["seq"] == 64 and trace_cache.trace_kwargs(s)["past"] == 0
    assert trace_cache.trace_kwargs(s.replace(past=8)) != trace_cache.trace_kwargs(s)
    # a table built after the trace is keyed on the step's other fields too
    got = trace_cache.table_fields(s.replace(parallel="tp", gpus=2))
    assert got == {"fusion": False, "parallel": "tp", "gpus": 2, "micro_batches": 1}


def test_a_kernel_table_says_which_step_it_is_built_for():
    from neusight_core.cost import tables
    from neusight_core.tracing import table_info
    for kw in (dict(), dict(parallel="tp", gpus=2), dict(fusion=True, dtype="bf16", attention="sdpa")):
        st = scenario.scenario("gpt2_large", "H100", 2, 64, **kw).step
        assert table_info.info(tables.kernel_table(st)).step == st
    image = scenario.scenario("resnet50", "A100", 2, image_size=64).step
    assert table_info.info(tables.kernel_table(image)).step == image


TOY = '''
    toy: int = option(Count(), table=True, user=3, help="a toy option of the test", many="toy values")
'''


def test_a_new_option_is_one_field(tmp_path):
    """Declare one field in a copy of the package and nothing else: the CLI's predict and sweep, INPUTS, the sweep's
    columns, predict_model's keywords, scenario_of, the Step and the trace cache's key all know it."""
    pkg = tmp_path / "neusight_core"
    shutil.copytree(paths.REPO_ROOT / "neusight_core", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    src = (pkg / "question" / "step.py").read_text()
    anchor = "\n    def __post_init__(self):"
    assert src.count(anchor) == 1
    (pkg / "question" / "step.py").write_text(src.replace(anchor, textwrap.indent(textwrap.dedent(TOY), "    ").rstrip() + "\n"
                                             + anchor, 1))
    code = textwrap.dedent('''
        import inspect, json, neusight_core
        from neusight_core.cost import latency, sweep
        from neusight_core.question import step
        from neusight_core.cost import request, scenario
        from neusight_core.tracing import trace_cache
        from neusight_core.__main__ import _parser
        assert neusight_core.__file__.startswith(%r), neusight_core.__file__
        sc = request.scenario_of(dict(model="bert_large", device="H100", batch=2, seq=64, toy=5.0))
        plain = scenario.scenario("bert_large", "H100", 2, 64)
        grid = sweep.grid(["bert_large"], ["H100"], [2], [64], toy=[1, 2])
        sub = _parser()._subparsers._group_actions[0].choices
        flags = {name: [a.option_strings for a in p._actions] for name, p in sub.items()}
        print(json.dumps(dict(
            inputs="toy" in step.INPUTS, step=sc.step.toy, default=plain.toy,
            columns=list(grid.columns), toys=grid["toy"].tolist(),
            keyword="toy" in inspect.signature(latency.predict_model).parameters,
            key=trace_cache.trace_kwargs(sc.step).get("toy"),
            predict=["--toy"] in flags["predict"], sweep=["--toy"] in flags["sweep"])))
    ''' % str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "NEUSIGHT_HOME": str(paths.home())})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got.pop("columns")[-1] == "toy" and got.pop("toys") == [1, 2]
    assert got == dict(inputs=True, step=5, default=3, keyword=True, key=5, predict=True, sweep=True)


# ------------------------------------------------------------------------------ the checks that come with the fields
@pytest.mark.parametrize("fusion", [2, 0.5, float("inf"), [1], "maybe"])
def test_fusion_must_be_a_boolean_in_every_entry_point(fusion):
    row = dict(model="gpt2_large", device="H100", batch=1, seq=64, fusion=fusion)
    out = engine.predict(request.parse([row, dict(row, fusion=False)]), "roofline", quick=True)
    assert "fusion must be" in out["error"].iloc[0] and out["error"].iloc[1] == ""
    if not isinstance(fusion, str):
        with pytest.raises(LatencyInputError, match="fusion must be True or False"):
            scenario.scenario("gpt2_large", "H100", 1, 64, fusion=fusion)


def _config(tmp_path, name, **fields):
    base = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 32,
            "vocab_size": 1000, "intermediate_size": 512, "max_position_embeddings": 512}
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({**base, **fields}))
    return str(p)


@pytest.mark.parametrize("kv", [5, 64, 0])
def test_key_value_heads_must_divide_the_heads(tmp_path, kv):
    path = _config(tmp_path, f"kv{kv}", num_key_value_heads=kv)
    with pytest.raises(LatencyInputError, match=f"num_key_value_heads = {kv} must divide the 32 attention heads"):
        scenario.scenario(path, "H100", 1, 16)
    assert scenario.scenario(_config(tmp_path, "kv8", num_key_value_heads=8), "H100", 1, 16).attention == "sdpa"


def test_a_mixture_of_experts_routes_each_token_to_some_experts(tmp_path):
    moe = dict(model_type="mixtral", num_attention_heads=8, num_key_value_heads=2, num_local_experts=4)
    with pytest.raises(LatencyInputError, match="num_experts_per_tok = 0 must be an integer from 1 to its 4"):
        scenario.scenario(_config(tmp_path, "moe0", **moe, num_experts_per_tok=0), "H100", 1, 16)
    with pytest.raises(LatencyInputError, match="num_experts_per_tok = 5"):
        scenario.scenario(_config(tmp_path, "moe5", **moe, num_experts_per_tok=5), "H100", 1, 16)
    assert scenario.scenario(_config(tmp_path, "moe2", **moe, num_experts_per_tok=2), "H100", 1, 16).batch == 1


@pytest.mark.parametrize("window", [0, 1])
def test_a_sliding_window_holds_at_least_two_tokens(tmp_path, window):
    path = _config(tmp_path, f"sw{window}", model_type="mistral", num_key_value_heads=8, sliding_window=window)
    with pytest.raises(LatencyInputError, match=f"sliding_window = {window} must be an integer of at least 2"):
        scenario.scenario(path, "H100", 1, 16)
    ok = _config(tmp_path, "sw_off", model_type="qwen2", num_key_value_heads=8, sliding_window=0,
                 use_sliding_window=False)         # a window that is switched off is not checked
    assert scenario.scenario(ok, "H100", 1, 16).batch == 1


def test_a_tensor_peak_far_below_the_fp32_peak_is_refused(tmp_path, monkeypatch):
    from neusight_core.data import devices
    dev = devices.get_device("H100")
    bad = dataclasses.replace(dev, bf16_tensor_gflops=dev.fp32_gflops / 19_000)
    with pytest.raises(LatencyInputError, match="bf16_tensor_gflops = .* is 19,000x below its FP32 peak"):
        scenario.check_device(bad)
    scenario.check_device(dataclasses.replace(dev, bf16_tensor_gflops=dev.fp32_gflops))       # equal: possible
    for name in devices.list_devices()["name"]:
        scenario.check_device(devices.get_device(name))                                     # the catalogue passes


def test_a_config_field_transformers_refuses_reaches_the_user_whole(tmp_path):
    path = _config(tmp_path, "tie", num_attention_heads=8, tie_word_embeddings="maybe")
    r = _run(["predict", "--model", path, "--device", "H100", "--batch", "1", "--seq", "16", "--predictor",
              "roofline"])
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "tie_word_embeddings" in err and "expected bool" in err and not err.endswith(":")


def test_one_line_joins_a_heading_with_its_reason():
    assert step.one_line("Validation error for field 'x':\n    TypeError: expected bool\nmore") == \
        "Validation error for field 'x': TypeError: expected bool"
    assert step.one_line("first line\nsecond") == "first line" and step.one_line("") == ""


def test_options_are_keywords_of_predict_model_and_an_unknown_one_is_refused():
    params = inspect.signature(latency.predict_model).parameters
    assert set(step.INPUTS) <= set(params)
    with pytest.raises(LatencyInputError, match="unknown option.*colour"):
        latency.predict_model("gpt2_large", "H100", 1, 64, predictor="roofline", quick=True, colour="red")
    with pytest.raises(sweep.SweepInputError, match="unknown option.*colour"):
        sweep.grid(["gpt2_large"], ["H100"], [1], [64], colour="red")


def test_a_sweep_option_value_outside_its_words_is_a_usage_error(tmp_path):
    for flag, value in (("--dtype", "fp64"), ("--mode", "serve"), ("--parallel", "xp")):
        r = _run(["sweep", "--model", "gpt2_large", "--device", "H100", "--batch", "1", "--seq", "64", flag, value,
                  "--out", str(tmp_path / "s.csv")])
        assert r.returncode == 2 and f"{flag} must be of" in r.stderr and value in r.stderr
        assert not (tmp_path / "s.csv").exists()
    # "none" is a plan's value in a sweep (the single-GPU rows beside the planned ones)
    g = sweep.grid(["gpt2_large"], ["H100"], [2], [64], parallel=["none", "dp"], gpus=[None])
    assert g["parallel"].tolist() == ["none", "dp"]
    assert request.scenario_of(g.iloc[0].to_dict()).parallel is None
    assert np.isnan(g["link_gbs"].astype(float)).all()
