"""The predictor registry (issue 23): one entry (plus its module) adds a predictor everywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from neusight_core import paths
from neusight_core.predictors import registry
from neusight_core.predictors.base import KernelPredictor
from neusight_core.predictors.registry import hparams

TOY_MODULE = '''
import neusight_core.predictors.common as common
from neusight_core.predictors.base import KernelPredictor


class ToyPredictor(KernelPredictor):
    """A test predictor written as docs/architecture.md says: no name (the registry key names it), its factor from
    its registry entry's config, a fit that records nothing but its state."""

    def fit(self, train, quick=False):
        self.scale = float(self.config["factor"])
        self.fitted = True

    def _predict_model(self, kernels, device, dev):
        return self.scale * common.roofline_ms(kernels, dev)

    def get_state(self):
        return {"scale": self.scale}

    def set_state(self, state):
        self.scale = float(state["scale"])
'''

TOY_ENTRY = '''
toy:
  label: Toy predictor
  colour: "#123456"
  seeded: false
  reported: true
  class: toy_pred:ToyPredictor
  config: {factor: 2.0}
'''


@pytest.fixture
def toy_env(tmp_path):
    (tmp_path / "toy_pred.py").write_text(TOY_MODULE)
    (tmp_path / "toy.yaml").write_text(TOY_ENTRY)
    trained = tmp_path / "trained"
    trained.mkdir()
    shared = paths.trained_dir() / "datasets"      # the training-record cache, so the toy "training" is quick
    if shared.is_dir():
        (trained / "datasets").symlink_to(shared)
    env = {**os.environ, "NEUSIGHT_PREDICTORS": str(tmp_path / "toy.yaml"), "NEUSIGHT_TRAINED": str(trained),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(paths.REPO_ROOT)]), "TQDM_DISABLE": "1"}
    return env


def _run(env, *args, **kw):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=paths.REPO_ROOT,
                          timeout=600, **kw)


def test_package_registry_lists_every_predictor_once():
    names = registry.names()
    assert len(names) == len(set(names))
    assert {"neusight", "neusight-paper", "roofline", "habitat", "li"} <= set(names)
    assert registry.reported("recipe") == ("neusight-paper", "neusight")
    assert registry.reported("baseline") == ("roofline", "habitat", "li")
    for n in names:         # every entry makes its predictor, named by its key, configured by its recipe or config
        p = registry.create(n, seed=1)
        assert p.name == n and p.seed == 1 and isinstance(p, registry.CLASSES[n])
        assert all(p.config[k] == v for k, v in hparams(n).items())
    assert registry.create("neusight").config != registry.create("neusight-paper").config
    with pytest.raises(registry.UnknownPredictorError, match="unknown predictor 'nope'; choose one of roofline"):
        registry.create("nope")


def test_the_predictor_contract_is_enforced():
    class NoPredict(KernelPredictor):
        def fit(self, train, quick=False):
            pass
    with pytest.raises(TypeError, match="abstract method"):
        NoPredict(name="x")

    class Nameless(NoPredict):
        def _predict_model(self, kernels, device, dev):
            return 0
    with pytest.raises(TypeError, match="has no name: make it with registry.create"):
        Nameless()


def test_a_toy_predictor_from_one_entry_reaches_cli_sweep_tables_and_colours(toy_env, tmp_path):
    r = _run(toy_env, "-m", "neusight_core", "predict", "--model", "gpt2_large", "--device", "H100", "--batch", "1",
             "--seq", "128", "--predictor", "toy", "--execution", "graph", "--json")
    assert r.returncode == 0, r.stderr
    toy = json.loads(r.stdout)
    assert toy["weights"]["predictor"] == "toy"
    meta = json.loads((tmp_path / "trained" / "toy-seed0" / "meta.json").read_text())
    assert meta["name"] == "toy" and meta["config"]["factor"] == 2.0 and meta["info"]["data_checksum"]
    saved = (tmp_path / "trained" / "toy-seed0" / "meta.json").stat().st_mtime_ns
    base = _run(toy_env, "-m", "neusight_core", "predict", "--model", "gpt2_large", "--device", "H100", "--batch",
                "1", "--seq", "128", "--predictor", "roofline", "--execution", "graph", "--json")
    assert base.returncode == 0, base.stderr
    # twice the roofline on every modelled kernel (MEM copies keep the shared memory-bound time): close to 2x
    b = json.loads(base.stdout)["e2e_ms"]
    assert 1.9 * b < toy["e2e_ms"] < 2.0 * b

    out = tmp_path / "sweep.csv"
    r = _run(toy_env, "-m", "neusight_core", "sweep", "--model", "gpt2_large", "--device", "H100", "--batch", "1,2",
             "--seq", "128", "--predictor", "toy,roofline", "--out", str(out))
    assert r.returncode == 0, r.stderr
    import pandas as pd
    swept = pd.read_csv(out)
    assert set(swept.predictor) == {"toy", "roofline"}
    # the sweep's process loaded the weights the first one saved (their checksum matched): not trained again
    assert (tmp_path / "trained" / "toy-seed0" / "meta.json").stat().st_mtime_ns == saved

    script = textwrap.dedent('''
        import json
        from neusight_core.studies import evaluation as ev, kernel_eval as ke, recipe_eval as R, reproduce
        from neusight_core.reports import plots
        configs = reproduce.select_configs(ev.build_index(), True)
        configs = configs[configs["mode"] == "inf"].head(3)
        long = R.sweep_seeded(configs, ["toy"], [0], quick=True, progress=False)
        table = R.recipe_table(R.seed_summary(R.seed_mape(long, configs)), predictors=R.RECIPES + R.BASELINES)
        print(json.dumps({"baselines": list(R.BASELINES), "seeded": "toy" in R.SEEDED, "rows": list(table.predictions),
                          "toy_cells": table.set_index("predictions").loc["toy"].tolist(),
                          "colour": plots.PALETTE.get("Toy predictor"), "label": ke.PRED_LABEL.get("toy"),
                          "order": list(ke.ORDER), "display": ev.PREDICTOR_DISPLAY.get("toy")}))
    ''')
    r = _run(toy_env, "-c", script)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["baselines"][-1] == "toy" and not got["seeded"]
    assert "toy" in got["rows"] and any(c != "—" for c in got["toy_cells"])     # notebook 04's table has its numbers
    assert got["colour"] == "#123456" and got["label"] == "Toy predictor" and got["display"] == "Toy predictor"
    assert got["order"][-1] == "toy"


def test_bad_registry_files_are_one_line_errors(tmp_path, monkeypatch):
    cases = {"notamap.yaml": "- a\n- b\n",
             "nokeys.yaml": "x:\n  label: X\n",
             "badclass.yaml": "x: {label: X, colour: '#000', seeded: false, reported: false, class: nocolon}\n",
             "dup.yaml": "roofline: {label: X, colour: '#000', seeded: false, reported: false, class: a:B}\n",
             "norecipe.yaml": "x: {label: X, colour: '#000', seeded: true, reported: false, class: a:B, recipe: nope.yaml}\n"}
    for fname, text in cases.items():
        (tmp_path / fname).write_text(text)
        monkeypatch.setenv("NEUSIGHT_PREDICTORS", str(tmp_path / fname))
        with pytest.raises(registry.RegistryError) as e:
            registry.entries()
        assert fname in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("NEUSIGHT_PREDICTORS", "")
    assert "toy" not in registry.names()
