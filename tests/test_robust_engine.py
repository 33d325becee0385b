"""Issue 36 item 1: one bad request never costs the others their answer."""
import numpy as np
import pandas as pd
import pytest

from neusight_core import engine

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
    df = engine.predict([GOOD, bad, GOOD], "roofline")
    assert len(df) == 3
    assert df["error"].iloc[0] == df["error"].iloc[2] == ""
    assert df["e2e_ms"].iloc[0] == df["e2e_ms"].iloc[2] > 0
    if words is None:
        assert df["error"].iloc[1] == ""
    else:
        assert words in df["error"].iloc[1] and np.isnan(df["e2e_ms"].iloc[1])
        assert "\n" not in df["error"].iloc[1]


def test_a_frame_with_an_infinite_cell():
    df = engine.predict(pd.DataFrame([GOOD, dict(GOOD, batch=np.inf)]), "roofline")
    assert df["error"].iloc[0] == "" and "batch must be an integer" in df["error"].iloc[1]
