"""Issue 36, item 2: damaged full weights never start an unasked retrain. A question without --full reports the
damaged folder in one line on stderr and answers with the quick weights, as when the full weights are missing."""
from __future__ import annotations

import json
import shutil

import pytest

from neusight_core.data import dataset
from neusight_core.cost import latency
from neusight_core import paths
from neusight_core import predictors as P
from neusight_core.__main__ import main as cli
from neusight_core.data.datafile import CacheWarning
from neusight_core.predictors.base import STATE_FILE, config_hash
from neusight_core.predictors.neusight import NeuSightPredictor

ASK = ["predict", "--model", "gpt2_large", "--device", "H100", "--batch", "1", "--seq", "128"]


@pytest.fixture(scope="module")
def shared_quick(release_root):
    """The quick `neusight` weights of seed 0 in the shared weights folder (trained there once, seconds)."""
    P.get("neusight", quick=True)
    return paths.trained_dir()


@pytest.fixture
def weights(shared_quick, tmp_path, monkeypatch):
    """A temporary weights folder holding a copy of the quick weights and a full-weights folder whose meta.json
    matches the recipe and the training data (so ``is_trained`` says yes) and whose state.npz is the quick one's:
    the test then damages it. Any training of the full weights fails the test."""
    d = tmp_path / "trained"
    d.mkdir()
    for sub in (P.folder("neusight", True, 0).name, "datasets"):
        if (shared_quick / sub).is_dir():
            shutil.copytree(shared_quick / sub, d / sub)
    monkeypatch.setenv("NEUSIGHT_TRAINED", str(d))
    full = P.folder("neusight", False, 0)
    full.mkdir()
    p = P.create("neusight")
    meta = {"name": "neusight", "seed": 0, "config": p.config,
            "config_hash": config_hash("neusight", {**p.config, "seed": 0}),
            "info": {"data_checksum": dataset.training_checksum(quick=False), "train_seconds": 1234.0}}
    (full / "meta.json").write_text(json.dumps(meta, default=str))
    shutil.copy(P.folder("neusight", True, 0) / STATE_FILE, full / STATE_FILE)
    assert P.is_trained("neusight", False, 0)

    real_fit = NeuSightPredictor.fit

    def fit(self, train, quick=False):
        if not quick:
            raise AssertionError("the full neusight weights were retrained unasked")
        return real_fit(self, train, quick)
    monkeypatch.setattr(NeuSightPredictor, "fit", fit)
    latency.loaded_predictor.cache_clear()
    yield full
    latency.loaded_predictor.cache_clear()


def _answer(capsys):
    assert cli(ASK + ["--json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), [x for x in err.splitlines() if x.strip()]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_state_answers_with_quick_weights_and_names_the_file(weights, capsys, damage):
    f = weights / STATE_FILE
    blob = f.read_bytes()
    f.write_bytes({"truncated": blob[: len(blob) // 2], "garbage": b"\x00not a zip" * 100, "empty": b""}[damage])
    r, err = _answer(capsys)
    assert r["weights"]["weights"] == "quick" and r["weights"]["folder"].endswith("neusight-quick-seed0")
    said = [x for x in err if "damaged" in x]
    assert len(said) == 1, err
    assert str(f) in said[0] and "quick weights" in said[0]
    assert not any(x.startswith("training the full") for x in err), err
    assert f.read_bytes() != blob          # nothing rewrote the damaged file (no retraining)


def test_damaged_meta_answers_with_quick_weights_and_names_the_file(weights, capsys):
    (weights / "meta.json").write_text('{"name": "neusight", "conf')
    r, err = _answer(capsys)
    assert r["weights"]["weights"] == "quick"
    said = [x for x in err if "damaged" in x]
    assert len(said) == 1 and str(weights / "meta.json") in said[0], err


def test_intact_full_weights_answer_and_missing_ones_say_nothing_of_damage(weights, capsys):
    r, err = _answer(capsys)                       # the copied quick state loads: it answers as the full weights
    assert r["weights"]["weights"] == "full" and not any("damaged" in x for x in err)
    shutil.rmtree(weights)
    r, err = _answer(capsys)
    assert r["weights"]["weights"] == "quick" and not any("damaged" in x for x in err)
    assert any("not trained here" in x for x in err)


def test_full_flag_still_retrains_damaged_weights(weights, capsys):
    (weights / STATE_FILE).write_bytes(b"")
    assert P.choose_quick("neusight", 0, "full") is False     # asked for: get() warns and retrains (issue 24)
    assert P.full_weights_damage("neusight", 0).startswith(str(weights / STATE_FILE))
    with pytest.raises(AssertionError, match="retrained unasked"), \
            pytest.warns(CacheWarning, match="ignoring damaged weights of 'neusight'"):
        P.get("neusight", quick=False)
