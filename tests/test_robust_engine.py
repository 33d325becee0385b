"""Issue 36 item 1: one bad request never costs the others their answer."""
import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import engine
from neusight_core.cost import request

GOOD = dict(model="gpt2_large", device="H100", batch=2, seq=128)


@pytest.mark.parametrize("bad,words", [
    (dict(GOOD, batch=float("inf")), "batch must be an integer"),
    (dict(GOOD, seq=float("inf")), "seq must be an integer"),
    (dict(GOOD, batch=10 ** 30), "batch must be an integer"),
    (dict(GOOD, past=float("nan")), None),                     # NaN = not given: the default, no error
    (dict(GOOD, gpus=float("inf"), parallel="dp"), "gpus must be an integer"),
    ("gpt2_large", "a request is a Scenario or a dict"),
    (None, "a request is a Scenario or a dict"),
    (7, "a request is a Scenario or a dict"),
])
def test_a_bad_request_gets_its_error_and_the_others_their_answer(bad, words):
    df = engine.predict(request.parse([GOOD, bad, GOOD]), "roofline")     # dicts through the engine's adapter
    assert len(df) == 3
    assert df["error"].iloc[0] == df["error"].iloc[2] == ""
    assert df["e2e_ms"].iloc[0] == df["e2e_ms"].iloc[2] > 0
    if words is None:
        assert df["error"].iloc[1] == ""
    else:
        assert words in df["error"].iloc[1] and np.isnan(df["e2e_ms"].iloc[1])
        assert "\n" not in df["error"].iloc[1]


def test_a_frame_with_an_infinite_cell():
    from neusight_core.cost import sweep
    df = sweep.run(pd.DataFrame([GOOD, dict(GOOD, batch=np.inf)]), "roofline", progress=False)
    assert df["error"].iloc[0] == "" and "batch must be an integer" in df["error"].iloc[1]
    with pytest.raises(TypeError, match="not a frame: sweep.run"):    # the engine takes scenarios only
        engine.predict(pd.DataFrame([GOOD]), "roofline")


def test_every_sweep_row_says_whether_it_fits():
    """Issue 36 item 5: a run that cannot happen is marked in its own row, from every entry point."""
    from neusight_core.cost import sweep
    df = sweep.sweep(["llama2_70b", "gpt2_large"], ["P4"], [64], [512], ["train"], predictors=["roofline"],
                     progress=False)
    big, small = df.iloc[0], df.iloc[1]
    assert big["memory_fits"] is False or big["memory_fits"] == False  # noqa: E712 - object column
    assert big["memory_verdict"].startswith("does not fit: needs 2") and "has 8 GiB" in big["memory_verdict"]
    # the traced tables' footprints, not a lower bound: GPT-2 Large training at batch 64 is far over 8 GiB too
    assert small["memory_fits"] == False and small["memory_verdict"].startswith("does not fit: needs")  # noqa: E712
    # derived tables in the engine get the same verdict; traced ones keep their footprint's
    e = engine.predict(request.parse([dict(model="llama2_70b", device="P4", batch=1, seq=128)]), "roofline")
    assert e["memory_verdict"].iloc[0].startswith("does not fit")


def test_an_unknown_predictor_costs_only_its_rows_with_the_default_weights():
    """``quick=None`` (the default: the weights the CLI would pick) looks at every named predictor first; an unknown
    name must not stop the others (it raised for the whole call)."""
    df = engine.predict(request.parse([GOOD]), ["roofline", "oracle"])
    assert df["error"].iloc[0] == "" and df["e2e_ms"].iloc[0] > 0
    assert "UnknownPredictorError" in df["error"].iloc[1] and pd.isna(df["e2e_ms"].iloc[1])
